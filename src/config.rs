//! Module configuration: load-time arguments (`--loadmodule libredisai.so KEY VAL ...`, docs/commands.md, Load-time arguments).

use crate::error::{Error, Result};
use crate::tensor::parse_i64;

/// Upper bound on worker threads per device queue: far above any core count, low enough that a
/// typo cannot make the module spawn thousands of threads.
pub const MAX_THREADS_PER_QUEUE: i64 = 256;

/// The default INLINE_THRESHOLD (µs), measured with `make bench` (docs/benchmarks.md): runs this short cost
/// less on the main thread than handing them to a worker does, and stay far from PING's 5 ms p99 target.
pub const DEFAULT_INLINE_THRESHOLD_US: u64 = 100;

/// Largest INLINE_THRESHOLD (µs): an inline run may hold the main thread for ten times the threshold.
pub const MAX_INLINE_THRESHOLD_US: i64 = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub backends_path: Option<String>,
    /// Backend libraries named at load time: (backend name as given upper-cased, path).
    pub backend_libs: Vec<(String, String)>,
    pub threads_per_queue: usize,
    pub intra_op_parallelism: usize,
    pub inter_op_parallelism: usize,
    pub model_chunk_size: usize,
    pub model_execution_timeout_ms: u64,
    pub backend_memory_limit_mb: u64,
    /// The bound on backend memory when BACKEND_MEMORY_LIMIT is not given (bytes; 0: none): derived at load
    /// time from `maxmemory` and the machine's memory, so that one model cannot take Redis down.
    pub default_memory_bound: u64,
    /// Model runs whose recent runs averaged at most this many µs run inline on the main thread (0: never;
    /// exec/inline.rs). Load-time `INLINE_THRESHOLD`, and AI.CONFIG INLINE_THRESHOLD.
    pub inline_threshold_us: u64,
    /// Whether AI.CONFIG LOADBACKEND / BACKENDSPATH work at runtime (load-time `RUNTIME_BACKEND_LOADING no`
    /// forbids them, so that not even an admin client can make the server load a library through the module).
    pub runtime_backend_loading: bool,
    /// Models from RDB/AOF/replication/RESTORE are built on a background thread after they are loaded, one at a
    /// time through a crash journal (exec/deferred.rs): load-time `DEFERRED_MODEL_BUILD yes`.
    pub deferred_model_build: bool,
    /// AI.INFO's and INFO's timings, percentiles and error kinds (stats.rs): load-time `DETAILED_STATS no` turns
    /// them off, to measure what they cost (bench/ab_workloads.py).
    pub detailed_stats: bool,
    /// Directory of libredisai.so (where the TORCH backend library and the worker sit by default).
    pub module_dir: Option<String>,
    /// Backends run in worker processes (load-time `EXECUTION_MODE ISOLATED`; src/isolation/), not in Redis's.
    pub isolated: bool,
    /// The worker executable (load-time `WORKER_PATH`); by default `redisai-worker` beside libredisai.so.
    pub worker_path: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backends_path: None,
            backend_libs: Vec::new(),
            threads_per_queue: 1,
            intra_op_parallelism: 0,
            inter_op_parallelism: 0,
            model_chunk_size: 511 * 1024 * 1024,
            model_execution_timeout_ms: 5000,
            backend_memory_limit_mb: 0,
            default_memory_bound: 0,
            inline_threshold_us: DEFAULT_INLINE_THRESHOLD_US,
            runtime_backend_loading: true,
            deferred_model_build: false,
            detailed_stats: true,
            module_dir: None,
            isolated: false,
            worker_path: None,
        }
    }
}

impl Config {
    /// MODEL_EXECUTION_TIMEOUT: how long one backend run (or script call) may take before the kill switch stops it.
    pub fn execution_limit(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.model_execution_timeout_ms)
    }

    /// The intra-op threads a backend session gets: INTRA_OP_PARALLELISM when given, else the cores shared by
    /// the queue's THREADS_PER_QUEUE workers (each run has a session, and its pool, of its own: 4 workers with
    /// a pool of every core each would run 4x more threads than cores, and spinning threads on an oversubscribed
    /// machine are worse than sleeping ones); 0, the backend's default (every core), with one worker.
    pub fn intra_op_threads(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        default_intra_op(self.intra_op_parallelism, self.threads_per_queue, cores)
    }
}

fn default_intra_op(given: usize, threads_per_queue: usize, cores: usize) -> usize {
    match (given, threads_per_queue) {
        (0, 0 | 1) => 0,
        (0, workers) => (cores / workers).max(1),
        (n, _) => n,
    }
}

fn positive(key: &str, val: &[u8], max: i64) -> Result<i64> {
    match parse_i64(val) {
        Some(v) if v > 0 && v <= max => Ok(v),
        _ => Err(arg_error(key, val)),
    }
}

fn yes_no(key: &str, val: &[u8]) -> Result<bool> {
    match val.to_ascii_lowercase().as_slice() {
        b"yes" => Ok(true),
        b"no" => Ok(false),
        _ => Err(arg_error(key, val)),
    }
}

/// 0..=MAX_INLINE_THRESHOLD_US (µs).
pub fn inline_threshold(val: &[u8]) -> Option<u64> {
    parse_i64(val).filter(|v| (0..=MAX_INLINE_THRESHOLD_US).contains(v)).map(|v| v as u64)
}

fn arg_error(key: &str, val: &[u8]) -> Error {
    Error::parse(format!("error processing argument: {key} {}", String::from_utf8_lossy(val)))
}

impl Config {
    /// Parses `KEY VAL` pairs. BACKENDSPATH is applied first whatever its position, as in RedisAI.
    pub fn from_args(args: &[&[u8]]) -> Result<Config> {
        if !args.len().is_multiple_of(2) {
            return Err(Error::parse("load-time arguments must come in KEY VALUE pairs"));
        }
        let mut c = Config::default();
        for pair in args.chunks_exact(2) {
            let (key, val) = (String::from_utf8_lossy(pair[0]).to_ascii_uppercase(), pair[1]);
            let text = || String::from_utf8(val.to_vec()).map_err(|_| arg_error(&key, val));
            match key.as_str() {
                "BACKENDSPATH" => c.backends_path = Some(text()?),
                "TF" | "TFLITE" | "TORCH" | "ONNX" => c.backend_libs.push((key.clone(), text()?)),
                "THREADS_PER_QUEUE" => c.threads_per_queue = positive(&key, val, MAX_THREADS_PER_QUEUE)? as usize,
                "INTRA_OP_PARALLELISM" => c.intra_op_parallelism = positive(&key, val, 1024)? as usize,
                "INTER_OP_PARALLELISM" => c.inter_op_parallelism = positive(&key, val, 1024)? as usize,
                "MODEL_CHUNK_SIZE" => c.model_chunk_size = positive(&key, val, i64::MAX)? as usize,
                "MODEL_EXECUTION_TIMEOUT" => {
                    let v = positive(&key, val, i64::MAX)?;
                    if v < 1000 {
                        return Err(arg_error(&key, val));
                    }
                    c.model_execution_timeout_ms = v as u64;
                }
                "BACKEND_MEMORY_LIMIT" => c.backend_memory_limit_mb = positive(&key, val, i64::MAX)? as u64,
                "INLINE_THRESHOLD" => {
                    c.inline_threshold_us = inline_threshold(val).ok_or_else(|| arg_error(&key, val))?
                }
                "RUNTIME_BACKEND_LOADING" => c.runtime_backend_loading = yes_no(&key, val)?,
                "DEFERRED_MODEL_BUILD" => c.deferred_model_build = yes_no(&key, val)?,
                "DETAILED_STATS" => c.detailed_stats = yes_no(&key, val)?,
                "EXECUTION_MODE" => {
                    c.isolated = match val.to_ascii_uppercase().as_slice() {
                        b"ISOLATED" => true,
                        b"IN_PROCESS" => false,
                        _ => return Err(arg_error(&key, val)),
                    }
                }
                "WORKER_PATH" => c.worker_path = Some(text()?),
                _ => return Err(arg_error(&key, val)),
            }
        }
        Ok(c)
    }
}

impl Config {
    /// How many bytes a backend may hold for models and runs: BACKEND_MEMORY_LIMIT (in MB, as RedisAI) when
    /// given, else the default bound (see `default_memory_bound`). 0 means unbounded.
    pub fn backend_memory_bound(&self) -> u64 {
        if self.backend_memory_limit_mb > 0 {
            self.backend_memory_limit_mb.saturating_mul(1_000_000)
        } else {
            self.default_memory_bound
        }
    }
}

/// The default backend memory bound: `maxmemory` when set (the operator's own bound on Redis), else half of
/// the memory the process may use (the machine's, or its cgroup's limit when lower), leaving the other half
/// to the data Redis holds. `maxmemory` 0 means unset.
pub fn default_memory_bound(maxmemory: u64) -> u64 {
    if maxmemory > 0 {
        maxmemory
    } else {
        machine_memory() / 2
    }
}

/// Physical memory, or the cgroup (v2 or v1) limit when it is lower; 0 when unknown.
pub fn machine_memory() -> u64 {
    // SAFETY: sysconf only reads system constants.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let phys = if pages > 0 && page > 0 { pages as u64 * page as u64 } else { 0 };
    let cgroup = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|s| s.trim().parse::<u64>().ok())
        .min();
    match cgroup {
        Some(c) if c > 0 && (phys == 0 || c < phys) => c,
        _ => phys,
    }
}

/// The module's configuration, set at load time (and by AI.CONFIG where RedisAI allows it).
pub static CONFIG: std::sync::LazyLock<parking_lot::RwLock<Config>> =
    std::sync::LazyLock::new(|| parking_lot::RwLock::new(Config::default()));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intra_op_threads_share_the_cores_among_a_queue_s_workers() {
        assert_eq!(default_intra_op(0, 1, 16), 0, "one worker: the backend's default, every core");
        assert_eq!(default_intra_op(0, 4, 16), 4);
        assert_eq!(default_intra_op(0, 4, 2), 1, "never 0 threads");
        assert_eq!(default_intra_op(3, 4, 16), 3, "INTRA_OP_PARALLELISM given wins");
    }

    fn parse(s: &str) -> Result<Config> {
        let words: Vec<&[u8]> = s.split_whitespace().map(str::as_bytes).collect();
        Config::from_args(&words)
    }

    #[test]
    fn parses_and_validates() {
        let c = parse("THREADS_PER_QUEUE 4 onnx /x/libonnxruntime.so MODEL_EXECUTION_TIMEOUT 1000").unwrap();
        assert_eq!(c.threads_per_queue, 4);
        assert_eq!(c.backend_libs, vec![("ONNX".to_string(), "/x/libonnxruntime.so".to_string())]);
        assert_eq!(parse("").unwrap(), Config::default());
        assert!(!parse("RUNTIME_BACKEND_LOADING no").unwrap().runtime_backend_loading);
        assert_eq!(parse("INLINE_THRESHOLD 0").unwrap().inline_threshold_us, 0);
        assert_eq!(parse("").unwrap().inline_threshold_us, DEFAULT_INLINE_THRESHOLD_US);
        assert!(parse("INLINE_THRESHOLD 10001").is_err() && parse("INLINE_THRESHOLD -1").is_err());
        assert!(parse("runtime_backend_loading YES").unwrap().runtime_backend_loading);
        assert!(parse("DEFERRED_MODEL_BUILD yes").unwrap().deferred_model_build);
        assert!(!parse("").unwrap().deferred_model_build);
        assert!(parse("").unwrap().detailed_stats && !parse("DETAILED_STATS no").unwrap().detailed_stats);
        for bad in [
            "RUNTIME_BACKEND_LOADING 0",
            "DEFERRED_MODEL_BUILD 1",
            "THREADS_PER_QUEUE 0",
            "THREADS_PER_QUEUE 100000",
            "MODEL_EXECUTION_TIMEOUT 999",
            "FOO 1",
            "TF",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse("THREADS_PER_QUEUE x").unwrap_err().reply_text(),
            "ERR error processing argument: THREADS_PER_QUEUE x"
        );
    }
}
