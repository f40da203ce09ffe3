//! Frees big values (models with their backend sessions, large blobs) on a background thread, so that
//! replacing or deleting a key never stalls Redis's main thread (a 134 MB model took 26 ms to free there).

use std::sync::OnceLock;

use crossbeam_channel::Sender;

type Garbage = Box<dyn Send>;

/// Values at least this big (bytes) are freed in the background; smaller ones inline (a hand-off costs more).
pub const THRESHOLD: usize = 1 << 20;

fn sender() -> Option<&'static Sender<Garbage>> {
    static TX: OnceLock<Option<Sender<Garbage>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = crossbeam_channel::unbounded::<Garbage>();
        std::thread::Builder::new()
            .name("ai:lazyfree".into())
            .spawn(move || {
                for garbage in rx {
                    // A panicking destructor must not end the thread (the next value would leak).
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(garbage)));
                }
            })
            .ok()
            .map(|_| tx)
    })
    .as_ref()
}

/// Drops `value` on the background thread (or here, if the thread could not start).
pub fn drop_later<T: Send + 'static>(value: T) {
    match sender() {
        Some(tx) => {
            if let Err(e) = tx.send(Box::new(value)) {
                drop(e.into_inner());
            }
        }
        None => drop(value),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;

    struct Flag(Arc<AtomicBool>, std::thread::ThreadId);
    impl Drop for Flag {
        fn drop(&mut self) {
            assert_ne!(std::thread::current().id(), self.1);
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn drops_on_another_thread() {
        let dropped = Arc::new(AtomicBool::new(false));
        drop_later(Flag(dropped.clone(), std::thread::current().id()));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !dropped.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(dropped.load(Ordering::SeqCst));
    }
}
