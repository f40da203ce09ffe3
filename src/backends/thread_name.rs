//! The name of the threads a backend starts. A new Linux thread takes its creator's name, and backends start
//! their pools while a model loads or a session is made: ONNX Runtime's intra-op threads showed as
//! `ai:modelstore` (the store's thread, long gone) or as another queue worker (`ai:CPU:0`) in `top -H`, `perf`
//! and /proc. Each load runs under its backend's name instead (`ai:onnx`, `ai:tf`, ...), then the thread's own
//! name comes back.

use std::ffi::CString;

use crate::backend_kind::BackendKind;

/// The name of the threads `kind` starts while it loads a model or makes a session.
pub fn of(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Onnx => "ai:onnx",
        BackendKind::Tf => "ai:tf",
        BackendKind::TfLite => "ai:tflite",
        BackendKind::Torch => "ai:torch",
    }
}

/// Runs `f` with the calling thread named `name` (at most 15 bytes are kept), and restores its name after,
/// also when `f` panics.
pub fn named<T>(name: &str, f: impl FnOnce() -> T) -> T {
    let _restore = Rename::to(name);
    f()
}

/// The thread's name before `to`, given back on drop (`None`: it could not be read, so it is left alone).
struct Rename(Option<[u8; 16]>);

impl Rename {
    fn to(name: &str) -> Rename {
        let mut old = [0u8; 16];
        // SAFETY: PR_GET_NAME writes at most 16 bytes (the name and its NUL) into the buffer it is given.
        let got = unsafe { libc::prctl(libc::PR_GET_NAME, old.as_mut_ptr()) } == 0;
        let short: Vec<u8> = name.bytes().filter(|&b| b != 0).take(15).collect();
        if let (true, Ok(new)) = (got, CString::new(short)) {
            // SAFETY: PR_SET_NAME reads a NUL-terminated string, which `new` is, alive for the call.
            unsafe { libc::prctl(libc::PR_SET_NAME, new.as_ptr()) };
            return Rename(Some(old));
        }
        Rename(None)
    }
}

impl Drop for Rename {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            // SAFETY: `old` is what PR_GET_NAME wrote: NUL-terminated within its 16 bytes.
            unsafe { libc::prctl(libc::PR_SET_NAME, old.as_ptr()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() -> String {
        std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default().trim_end().to_string()
    }

    #[test]
    fn names_the_threads_started_inside_and_restores() {
        std::thread::Builder::new()
            .name("ai:test".into())
            .spawn(|| {
                let inner = named("ai:onnx-and-a-long-tail", || {
                    assert_eq!(current(), "ai:onnx-and-a-l", "15 bytes kept");
                    std::thread::spawn(current).join().ok()
                });
                assert_eq!(inner.as_deref(), Some("ai:onnx-and-a-l"), "a thread started inside takes the name");
                assert_eq!(current(), "ai:test");
                let _ = std::panic::catch_unwind(|| named("ai:tf", || panic!("a failed load")));
                assert_eq!(current(), "ai:test", "restored after a panic too");
            })
            .and_then(|h| h.join().map_err(|_| std::io::Error::other("the test thread panicked")))
            .expect("test thread");
    }
}
