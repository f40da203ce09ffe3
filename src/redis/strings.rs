//! Redis strings the module creates itself (for AOF, replication and key names), freed on drop.

use std::os::raw::c_char;

use redis_module::raw;

pub struct OwnedStrings(pub Vec<*mut raw::RedisModuleString>);

impl OwnedStrings {
    pub fn new<T: AsRef<[u8]>>(items: &[T]) -> OwnedStrings {
        OwnedStrings(
            items
                .iter()
                .map(|b| {
                    let b = b.as_ref();
                    // SAFETY: a NULL context makes a string we own; Redis copies the `b.len()` bytes.
                    unsafe {
                        raw::RedisModule_CreateString.expect("API initialised")(
                            std::ptr::null_mut(),
                            b.as_ptr() as *const c_char,
                            b.len(),
                        )
                    }
                })
                .collect(),
        )
    }

    /// Keeps argv strings alive past the command (no copy: Redis strings are reference counted).
    pub fn retain(argv: &[*mut raw::RedisModuleString]) -> OwnedStrings {
        for &s in argv {
            // SAFETY: s is a live argv string; retaining adds a reference that Drop releases.
            unsafe { raw::RedisModule_RetainString.expect("API initialised")(std::ptr::null_mut(), s) };
        }
        OwnedStrings(argv.to_vec())
    }
}

impl Drop for OwnedStrings {
    fn drop(&mut self) {
        for &s in &self.0 {
            // SAFETY: each string was created or retained with a NULL context by this value, once.
            unsafe { raw::RedisModule_FreeString.expect("API initialised")(std::ptr::null_mut(), s) };
        }
    }
}

// SAFETY: the strings are only created, retained and freed on the main thread; they travel through worker
// threads inside completions that are run or dropped on the main thread (a build thread only reads the bytes
// of retained argv strings, see `handlers::shared::ArgBytes`).
unsafe impl Send for OwnedStrings {}
