//! maxmemory for requests that are small on the wire but allocate much (a zero-filled TENSORSET of a big shape):
//! Redis checks deny-oom commands only against the memory in use *before* the command runs.

use redis_module::raw;

use crate::error::{Error, Result};

/// Requests allocating less than this are not checked (the check reads INFO memory).
const CHECK_FROM: usize = 1 << 20;

/// Redis's own deny-oom reply.
const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

/// Refuses with Redis's OOM error when maxmemory is set and `extra` more bytes would pass it.
pub fn check_room(ctx: *mut raw::RedisModuleCtx, extra: usize) -> Result<()> {
    if extra < CHECK_FROM {
        return Ok(());
    }
    // SAFETY: ctx is the command's context (main thread); the INFO data is read and freed here.
    let (used, max) = unsafe {
        let (Some(get), Some(field), Some(free)) = (
            raw::RedisModule_GetServerInfo,
            raw::RedisModule_ServerInfoGetFieldUnsigned,
            raw::RedisModule_FreeServerInfo,
        ) else {
            return Ok(());
        };
        let info = get(ctx, c"memory".as_ptr());
        if info.is_null() {
            return Ok(());
        }
        let mut err = 0;
        let used = field(info, c"used_memory".as_ptr(), &mut err);
        let max = field(info, c"maxmemory".as_ptr(), &mut err);
        free(ctx, info);
        (used, max)
    };
    if max > 0 && used.saturating_add(extra as u64) > max {
        return Err(Error::Plain(OOM.into()));
    }
    Ok(())
}
