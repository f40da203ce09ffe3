//! The name of the threads a backend starts. A new Linux thread takes its creator's name, and backends start
//! their pools while a model loads or a session is made: ONNX Runtime's intra-op threads showed as
//! `ai:modelstore` (the store's thread, long gone) or as another queue worker (`ai:CPU:0`) in `top -H`, `perf`
//! and /proc. Each load runs under its backend's name instead (`ai:onnx`, `ai:tf`, ...), then the thread's own
//! name comes back.

use std::ffi::CStr;

use crate::backend_kind::BackendKind;

/// The name of the threads `kind` starts while it loads a model or makes a session (the kernel keeps 15 bytes).
fn of(kind: BackendKind) -> &'static CStr {
    match kind {
        BackendKind::Onnx => c"ai:onnx",
        BackendKind::Tf => c"ai:tf",
        BackendKind::TfLite => c"ai:tflite",
        BackendKind::Torch => c"ai:torch",
    }
}

/// Runs `f` with the calling thread named after `kind`, and restores its name after, also when `f` panics.
pub fn named<T>(kind: BackendKind, f: impl FnOnce() -> T) -> T {
    let _restore = Rename::to(of(kind));
    f()
}

/// The thread's name before `to`, given back on drop (`None`: it could not be read, so it is left alone).
struct Rename(Option<[u8; 16]>);

impl Rename {
    fn to(name: &CStr) -> Rename {
        let mut old = [0u8; 16];
        // SAFETY: PR_GET_NAME writes at most 16 bytes (the name and its NUL) into the buffer it is given.
        if unsafe { libc::prctl(libc::PR_GET_NAME, old.as_mut_ptr()) } != 0 {
            return Rename(None);
        }
        // SAFETY: PR_SET_NAME reads a NUL-terminated string, which `name` is, alive for the call.
        unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
        Rename(Some(old))
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
                let inner = named(BackendKind::Onnx, || {
                    assert_eq!(current(), "ai:onnx");
                    std::thread::spawn(current).join().ok()
                });
                assert_eq!(inner.as_deref(), Some("ai:onnx"), "a thread started inside takes the name");
                assert_eq!(current(), "ai:test");
                let _ = std::panic::catch_unwind(|| named(BackendKind::Tf, || panic!("a failed load")));
                assert_eq!(current(), "ai:test", "restored after a panic too");
            })
            .and_then(|h| h.join().map_err(|_| std::io::Error::other("the test thread panicked")))
            .expect("test thread");
    }
}
