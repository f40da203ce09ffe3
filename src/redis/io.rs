//! `RedisModuleIO` as the pure codec's `RdbRead` / `RdbWrite`.

use std::os::raw::c_char;

use redis_module::raw;

use crate::error::{Error, Result};
use crate::rdb::{RdbRead, RdbWrite};

pub struct Io(pub *mut raw::RedisModuleIO);

impl Io {
    fn check(&self) -> Result<()> {
        // SAFETY: self.0 is the live IO handle Redis passed to the rdb_load callback we are inside of.
        if unsafe { api_opt!(RedisModule_IsIOError).is_some_and(|f| f(self.0) != 0) } {
            Err(Error::rdb("rdb", "I/O error while reading"))
        } else {
            Ok(())
        }
    }
}

impl RdbRead for Io {
    fn read_unsigned(&mut self) -> Result<u64> {
        // SAFETY: as in `check`; Redis initialised the function pointer before any callback runs.
        let v = unsafe { api!(RedisModule_LoadUnsigned)(self.0) };
        self.check().map(|_| v)
    }

    fn read_buffer(&mut self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_buffer_into(&mut out)?;
        Ok(out)
    }

    fn read_buffer_into(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let mut len = 0usize;
        // SAFETY: as in `check`; `len` outlives the call.
        let ptr = unsafe { api!(RedisModule_LoadStringBuffer)(self.0, &mut len) };
        self.check()?;
        if ptr.is_null() {
            return Err(Error::rdb("rdb", "missing string"));
        }
        // SAFETY: Redis returned `len` readable bytes at `ptr`, allocated with RedisModule_Alloc; we copy
        // them out and hand the block back to RedisModule_Free exactly once.
        unsafe {
            out.extend_from_slice(std::slice::from_raw_parts(ptr as *const u8, len));
            api!(RedisModule_Free)(ptr.cast());
        }
        Ok(())
    }
}

impl RdbWrite for Io {
    fn write_unsigned(&mut self, v: u64) {
        // SAFETY: self.0 is the live IO handle of the rdb_save callback we are inside of.
        unsafe { api!(RedisModule_SaveUnsigned)(self.0, v) }
    }

    fn write_buffer(&mut self, b: &[u8]) {
        // SAFETY: as above; `b` is valid for `b.len()` bytes during the call (Redis copies it).
        unsafe { api!(RedisModule_SaveStringBuffer)(self.0, b.as_ptr() as *const c_char, b.len()) }
    }
}
