//! Logging for pure code: the Redis layer installs a sink that writes to the Redis log; without one
//! (unit tests) messages go to stderr.

use std::sync::OnceLock;

static SINK: OnceLock<fn(&str)> = OnceLock::new();

pub fn set_sink(f: fn(&str)) {
    let _ = SINK.set(f);
}

pub fn warning(msg: &str) {
    match SINK.get() {
        Some(f) => f(msg),
        None => eprintln!("{msg}"),
    }
}
