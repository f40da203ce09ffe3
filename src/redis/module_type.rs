//! A Redis data type whose values are `Arc<T>`: the pairing of a type and its Rust value is part of the type
//! (`ModuleType<Tensor>`), so a key cannot be read or written as the wrong value. A value is stored as the
//! `Arc`'s own pointer (`Arc::into_raw`), without a box around it: one allocation less per key.

use std::marker::PhantomData;
use std::os::raw::c_void;
use std::sync::Arc;

use redis_module::native_types::RedisType;
use redis_module::raw;

pub struct ModuleType<T> {
    pub raw: RedisType,
    values: PhantomData<fn() -> T>,
}

impl<T> ModuleType<T> {
    pub const fn new(name: &'static str, encver: i32, methods: raw::RedisModuleTypeMethods) -> Self {
        ModuleType { raw: RedisType::new(name, encver, methods), values: PhantomData }
    }

    /// What Redis stores for `value` (from `set`, RDB load and COPY); Redis hands it back to the callbacks.
    pub fn into_value(value: Arc<T>) -> *mut c_void {
        Arc::into_raw(value) as *mut c_void
    }

    /// The value behind a pointer Redis passes to a callback or returns for a key.
    ///
    /// # Safety
    /// `value` came from `into_value` of this type and Redis still holds it (the callback, or the open key,
    /// outlives the reference).
    pub unsafe fn value<'a>(value: *const c_void) -> &'a T {
        // SAFETY: see the contract: a live `Arc<T>`'s pointer.
        unsafe { &*(value as *const T) }
    }

    /// A new reference to the value (work that outlives the key shares it).
    ///
    /// # Safety
    /// As for `value`.
    pub unsafe fn clone_value(value: *const c_void) -> Arc<T> {
        // SAFETY: a live `Arc<T>`'s pointer: adding a count and taking it as an `Arc` leaves Redis's own intact.
        unsafe {
            Arc::increment_strong_count(value as *const T);
            Arc::from_raw(value as *const T)
        }
    }

    /// Takes Redis's reference back (the free callback, or a value Redis refused).
    ///
    /// # Safety
    /// `value` came from `into_value` of this type and is given back exactly once; Redis never uses it again.
    pub unsafe fn take_value(value: *mut c_void) -> Arc<T> {
        // SAFETY: see the contract.
        unsafe { Arc::from_raw(value as *const T) }
    }
}
