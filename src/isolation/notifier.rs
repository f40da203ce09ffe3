//! The eventfd that tells Redis's main thread that a worker has answered posted runs (post.rs), or has exited:
//! one for all workers, watched by Redis's event loop.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

static NOTIFY: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// The eventfd, made at the first call; `None` when the kernel refused one (then nothing is posted).
pub fn notifier() -> Option<&'static OwnedFd> {
    NOTIFY
        .get_or_init(|| {
            // SAFETY: eventfd with flags only.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            // SAFETY: a fresh descriptor nobody else owns.
            (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .as_ref()
}

/// Makes it readable (a worker's exit: its posted runs are to be collected).
pub fn notify() {
    if let Some(Some(fd)) = NOTIFY.get() {
        signal(fd);
    }
}

/// Makes an eventfd readable: this process's, or in a worker the copy Redis handed it.
pub fn signal(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live local to an eventfd the caller holds.
    unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
}

/// Empties it (the event loop's callback), so that it is readable again only once written again.
pub fn drain() {
    if let Some(Some(fd)) = NOTIFY.get() {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local from our non-blocking eventfd.
        unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    }
}
