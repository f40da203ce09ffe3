//! Redis strings the module creates itself (for AOF, replication and key names), freed on drop.

use std::os::raw::c_char;

use redis_module::raw;

pub struct OwnedStrings(pub smallvec::SmallVec<[*mut raw::RedisModuleString; 8]>);

impl OwnedStrings {
    pub fn new<T: AsRef<[u8]>>(items: &[T]) -> OwnedStrings {
        let mut owned = OwnedStrings(smallvec::SmallVec::new());
        for b in items {
            owned.add(b.as_ref());
        }
        owned
    }

    /// A new string holding a copy of `b`, owned (and freed) with the others.
    pub fn add(&mut self, b: &[u8]) -> *mut raw::RedisModuleString {
        // SAFETY: a NULL context makes a string we own; Redis copies the `b.len()` bytes.
        let s = unsafe { api!(RedisModule_CreateString)(std::ptr::null_mut(), b.as_ptr() as *const c_char, b.len()) };
        self.0.push(s);
        s
    }

    /// Keeps argv strings alive past the command (no copy: Redis strings are reference counted).
    pub fn retain(argv: &[*mut raw::RedisModuleString]) -> OwnedStrings {
        for &s in argv {
            // SAFETY: s is a live argv string; retaining adds a reference that Drop releases.
            unsafe { api!(RedisModule_RetainString)(std::ptr::null_mut(), s) };
        }
        OwnedStrings(argv.iter().copied().collect())
    }
}

impl Drop for OwnedStrings {
    fn drop(&mut self) {
        for &s in &self.0 {
            // SAFETY: each string was created or retained with a NULL context by this value, once.
            unsafe { api!(RedisModule_FreeString)(std::ptr::null_mut(), s) };
        }
    }
}

// SAFETY: the strings are only created, retained and freed on the main thread; they travel through worker
// threads inside completions that are run or dropped on the main thread (a build thread only reads the bytes
// of retained argv strings, see `PinnedArgs`).
unsafe impl Send for OwnedStrings {}

/// Whether `pin_retained` works on this server.
pub fn can_pin() -> bool {
    api_opt!(RedisModule_TrimStringAllocation).is_some()
}

/// Makes `s`, an argument of the running command that the module has retained, keep its buffer where it is,
/// so that its address may be kept past the command. When a module command returns, Redis trims every argument
/// the module retained whose buffer is more than a tenth unused (`RedisModuleCommandDispatcher`: a big argument
/// can be the client's query buffer itself), and that trim may move the buffer. Trimming now, before the
/// address is taken, leaves the later trim nothing to do. False where the server cannot trim a string for a
/// module (before Redis 7.0): the caller must not keep the address. Main thread only.
pub fn pin_retained(s: *mut raw::RedisModuleString) -> bool {
    match api_opt!(RedisModule_TrimStringAllocation) {
        Some(trim) => {
            // SAFETY: s is a live argument string of the running command, on the main thread; trimming only
            // reallocates its buffer, whose address nobody has taken yet.
            unsafe { trim(s) };
            true
        }
        None => false,
    }
}

/// The arguments of the running command, retained and pinned (`pin_retained`) so that their bytes stay where
/// they are after the command returns, for a build on another thread. The value owns the retained strings, so
/// the bytes it hands out (`slices`) live exactly as long as it does.
pub struct PinnedArgs {
    strings: OwnedStrings,
    bytes: Vec<(*const u8, usize)>,
}

// SAFETY: the pointers are only read, through `&self`, and point into the strings this value retains; Redis never
// changes an argv string's bytes once the command has run, and pinning keeps its trim of retained arguments after
// the command from moving them.
unsafe impl Send for PinnedArgs {}

impl PinnedArgs {
    /// Retains and pins `argv` (the running command's arguments, main thread). `Err`: the server cannot pin a
    /// string; the retained strings come back (the caller copies what it needs instead). The command's own views
    /// of its arguments (`Cmd::args`) may be stale afterwards: the caller reads them only through this value.
    pub fn pin(argv: &[*mut raw::RedisModuleString]) -> Result<PinnedArgs, OwnedStrings> {
        let strings = OwnedStrings::retain(argv);
        let mut bytes = Vec::with_capacity(strings.0.len());
        for &s in &strings.0 {
            if !pin_retained(s) {
                return Err(strings);
            }
            let mut len = 0usize;
            let p = raw::string_ptr_len(s, &mut len) as *const u8;
            bytes.push((p, len));
        }
        Ok(PinnedArgs { strings, bytes })
    }

    /// The arguments' bytes.
    pub fn slices(&self) -> Vec<&[u8]> {
        // SAFETY: each (pointer, length) is a buffer of a string `self.strings` retains, pinned in place and
        // never written again: valid for as long as `self` is borrowed.
        self.bytes.iter().map(|&(p, n)| unsafe { std::slice::from_raw_parts(p, n) }).collect()
    }

    /// The retained strings (to replicate the command once the build is stored).
    pub fn into_strings(self) -> OwnedStrings {
        self.strings
    }
}

/// A BLOB argument kept as a tensor's data instead of being copied (`AI.TENSORSET … BLOB`, at least
/// `tensor::ADOPT_FROM` bytes): Redis strings are reference counted, so retaining the argument is free.
pub struct AdoptedString {
    s: *mut raw::RedisModuleString,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are never changed once adopted (Redis does not modify an argument after its command, the
// trim after it has nothing to do (`pin_retained`), and nothing else stores this string: slowlog entries copy
// arguments this long), so they may be read from any thread; the reference count is only changed on the main
// thread or under the GIL (see Drop).
unsafe impl Send for AdoptedString {}
// SAFETY: as above: shared access only reads the bytes.
unsafe impl Sync for AdoptedString {}

impl AdoptedString {
    /// Keeps `s` (an argv string of the running command, on the main thread) alive with the tensor; None where
    /// its buffer could move after the command (`pin_retained`), and the caller copies the bytes instead.
    pub fn adopt(s: *mut raw::RedisModuleString) -> Option<std::sync::Arc<dyn crate::tensor::ExternalBytes>> {
        // SAFETY: s is a live argv string; retaining adds the reference that Drop releases.
        unsafe { api!(RedisModule_RetainString)(std::ptr::null_mut(), s) };
        // Held from here on, so that Drop releases the reference whatever happens next.
        let mut kept = AdoptedString { s, ptr: std::ptr::null(), len: 0 };
        if !pin_retained(s) {
            return None;
        }
        kept.ptr = raw::string_ptr_len(s, &mut kept.len) as *const u8;
        Some(std::sync::Arc::new(kept))
    }
}

impl crate::tensor::ExternalBytes for AdoptedString {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` belong to the retained string, unchanged while it is held.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for AdoptedString {
    /// A tensor can be dropped off the main thread (a run holding the last reference, the lazy-free thread, a
    /// script's `redis.execute('DEL', …)` on a worker that holds the lock): Redis's reference counts are not
    /// atomic, so the release happens under the lock, the one this thread holds or taken for it.
    fn drop(&mut self) {
        // SAFETY: retained once in `adopt`, released once here, under Redis's lock.
        super::gil::with_gil(|| unsafe { api!(RedisModule_FreeString)(std::ptr::null_mut(), self.s) });
    }
}
