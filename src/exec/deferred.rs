//! Models that arrive from an RDB, the AOF, a primary or RESTORE, built off the main thread (load-time
//! `DEFERRED_MODEL_BUILD yes`): the server finishes loading and serves every other key while they build, and a
//! request for a model still building waits on its worker until it is ready.
//!
//! A model whose build crashes the process (a backend bug no admission check knows of) would otherwise take the
//! server down at every restart. So builds go one at a time through a journal file in Redis's working
//! directory (`redisai-builds.journal`): a build's line is written before it starts and removed once it ends.
//! A line found there when the module next builds names a model whose build crashed the process: that model is
//! kept with its data and not built again (its runs reply why), until the operator deletes the line or stores
//! the model again.

use crate::blob::Blob;
use std::collections::HashSet;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use crate::backends::LoadedModel;
use crate::error::{Error, Result};

pub const JOURNAL: &str = "redisai-builds.journal";

/// A model's handle: set once, by its build.
pub type Handle = OnceLock<Result<Box<dyn LoadedModel>>>;

/// Models waiting for their build, and deferred builds that failed (INFO).
static PENDING: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

pub fn counts() -> (u64, u64) {
    (PENDING.load(Ordering::Relaxed), FAILED.load(Ordering::Relaxed))
}

struct Job {
    key: Vec<u8>,
    blob: Blob,
    handle: Arc<Handle>,
    build: Box<dyn FnOnce() -> Result<Box<dyn LoadedModel>> + Send>,
}

/// Queues `build` to set `handle` on the builder thread; builds it here if that thread cannot start.
pub fn submit(
    key: &[u8],
    blob: Blob,
    handle: Arc<Handle>,
    build: impl FnOnce() -> Result<Box<dyn LoadedModel>> + Send + 'static,
) {
    PENDING.fetch_add(1, Ordering::Relaxed);
    let job = Job { key: key.to_vec(), blob, handle, build: Box::new(build) };
    match builder() {
        Some(tx) => {
            if let Err(e) = tx.send(job) {
                run(e.into_inner());
            }
        }
        None => run(job),
    }
}

fn builder() -> Option<&'static Sender<Job>> {
    static TX: OnceLock<Option<Sender<Job>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        std::thread::Builder::new()
            .name("ai:modelbuild".into())
            .spawn(move || rx.into_iter().for_each(run))
            .ok()
            .map(|_| tx)
    })
    .as_ref()
}

/// The journal, read on first use (from Redis's working directory, where Redis keeps its RDB and AOF).
fn journal() -> &'static Mutex<Journal> {
    static JOURNAL_FILE: LazyLock<Mutex<Journal>> =
        LazyLock::new(|| Mutex::new(Journal::open(std::path::Path::new(JOURNAL))));
    &JOURNAL_FILE
}

fn run(job: Job) {
    let Job { key, blob, handle, build } = job;
    let id = fingerprint(&blob);
    let built = if Arc::strong_count(&handle) == 1 {
        // The key was deleted or replaced before its turn: nothing will ever run it.
        Err(Error::NotBuilt("the model was removed before it was built".into()))
    } else if journal().lock().crashed.contains(&id) {
        crate::log::warning(&format!(
            "redisai: model '{}' is not built: its build crashed the server before ({JOURNAL})",
            String::from_utf8_lossy(&key)
        ));
        Err(Error::NotBuilt(format!(
            "the model's build crashed the server before; it is kept with its data but not built (remove its line \
             from {JOURNAL} or store it again)"
        )))
    } else {
        journal().lock().begin(id, &key);
        fault_injection::during_build(&key);
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(build))
            .unwrap_or_else(|_| Err(Error::Internal("internal error while building the model".into())));
        journal().lock().end();
        built
    };
    if let Err(e) = &built {
        FAILED.fetch_add(1, Ordering::Relaxed);
        crate::log::warning(&format!(
            "redisai: model '{}' was loaded with its data but cannot run: {e}",
            String::from_utf8_lossy(&key)
        ));
    }
    let _ = handle.set(built);
    PENDING.fetch_sub(1, Ordering::Relaxed);
}

/// A client stored a model and it was built (AI.MODELSTORE, on its build thread): if its bytes are quarantined,
/// they are not any more. Only read with DEFERRED_MODEL_BUILD, whose journal this is.
pub fn built_by_client(blob: &[u8]) {
    if !crate::config::CONFIG.read().deferred_model_build || journal().lock().crashed.is_empty() {
        return;
    }
    let id = fingerprint(blob);
    journal().lock().forget(id);
}

/// A 64-bit fingerprint of the model's bytes, stable across builds of the module (unlike std's hasher): FNV-1a's
/// step over 8-byte words, each followed by a shift-xor so that high bits reach the low ones. Byte-at-a-time
/// FNV took 1.2 s of CPU for 800 MB of models at RDB load, on the builder thread beside the loading main thread.
pub fn fingerprint(blob: &[u8]) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut words = blob.chunks_exact(8);
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ blob.len() as u64;
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(PRIME);
        h ^= h >> 29;
    }
    words.remainder().iter().fold(h, |h, &b| (h ^ b as u64).wrapping_mul(PRIME))
}

/// The journal: lines `<fingerprint> <key>` of builds that crashed the process, plus the one running.
struct Journal {
    path: Option<std::path::PathBuf>,
    crashed: HashSet<u64>,
    lines: Vec<String>,
}

impl Journal {
    fn open(path: &std::path::Path) -> Journal {
        let lines: Vec<String> = std::fs::read_to_string(path)
            .map(|text| text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect())
            .unwrap_or_default();
        let crashed = lines.iter().filter_map(|l| parse_line(l)).collect();
        Journal { path: Some(path.to_path_buf()), crashed, lines }
    }

    fn begin(&mut self, id: u64, key: &[u8]) {
        let name: String = String::from_utf8_lossy(key).chars().map(|c| if c.is_control() { '?' } else { c }).collect();
        let mut lines = self.lines.clone();
        lines.push(format!("{id:016x} {name}"));
        self.write(&lines);
    }

    fn end(&mut self) {
        let lines = self.lines.clone();
        self.write(&lines);
    }

    fn forget(&mut self, id: u64) {
        if self.crashed.remove(&id) {
            self.lines.retain(|l| parse_line(l) != Some(id));
            let lines = self.lines.clone();
            self.write(&lines);
        }
    }

    /// Replaces the file (synced: the line must be on disk before a crash can happen); none once empty.
    fn write(&self, lines: &[String]) {
        let Some(path) = &self.path else { return };
        let result = if lines.is_empty() {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            std::fs::File::create(path).and_then(|mut f| {
                f.write_all(lines.iter().map(|l| format!("{l}\n")).collect::<String>().as_bytes())?;
                f.sync_all()
            })
        };
        if let Err(e) = result {
            crate::log::warning(&format!("redisai: cannot write {}: {e}", path.display()));
        }
    }
}

fn parse_line(line: &str) -> Option<u64> {
    u64::from_str_radix(line.split_whitespace().next()?, 16).ok()
}

/// For the crash-recovery flow test only: `REDISAI_TEST_CRASH_BUILDING=<key>` in the server's environment makes
/// the process abort once that key's deferred build has started, as a crashing backend would. Read once; unset
/// (every real deployment) it does nothing.
mod fault_injection {
    use std::sync::OnceLock;

    pub fn during_build(key: &[u8]) {
        static KEY: OnceLock<Option<Vec<u8>>> = OnceLock::new();
        let target =
            KEY.get_or_init(|| std::env::var_os("REDISAI_TEST_CRASH_BUILDING").map(|v| v.into_encoded_bytes()));
        if target.as_deref() == Some(key) {
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_left_in_the_journal_quarantines_that_model() {
        let dir = std::env::temp_dir().join(format!("redisai-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(JOURNAL);
        let _ = std::fs::remove_file(&path);
        let mut j = Journal::open(&path);
        assert!(j.crashed.is_empty());
        // every byte and the length count
        let base = vec![7u8; 1000];
        let fp = fingerprint(&base);
        for i in [0, 7, 8, 500, 999] {
            let mut other = base.clone();
            other[i] ^= 1;
            assert_ne!(fingerprint(&other), fp, "{i}");
        }
        assert_ne!(fingerprint(&base[..999]), fp);
        assert_ne!(fingerprint(&[0u8; 16]), fingerprint(&[0u8; 17]));
        j.begin(fingerprint(b"model a"), b"a\nkey");
        // The process "crashes" here: the line stays.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{:016x} a?key\n", fingerprint(b"model a")));
        let mut j = Journal::open(&path);
        assert!(j.crashed.contains(&fingerprint(b"model a")));
        assert!(!j.crashed.contains(&fingerprint(b"model b")));
        // A clean build leaves only the crashed line behind.
        j.begin(fingerprint(b"model b"), b"b");
        j.end();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        j.forget(fingerprint(b"model b"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        // Stored again by a client: no longer quarantined.
        j.forget(fingerprint(b"model a"));
        assert!(j.crashed.is_empty() && !path.exists());
        // No crashed line and a clean build: no file.
        let mut j = Journal::open(&path);
        assert!(j.crashed.is_empty());
        j.begin(1, b"c");
        j.end();
        assert!(!path.exists());
        assert_eq!(fingerprint(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(parse_line("zz key"), None);
    }
}
