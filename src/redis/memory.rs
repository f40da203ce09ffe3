//! maxmemory for requests that are small on the wire but allocate much (a zero-filled TENSORSET of a big shape):
//! Redis checks deny-oom commands only against the memory in use *before* the command runs.

use crate::error::{Error, Result};
use crate::redis::ctx::Ctx;

/// Requests allocating less than this are not checked (the check reads INFO memory).
const CHECK_FROM: usize = 1 << 20;

/// Refuses with Redis's OOM error when maxmemory is set and `extra` more bytes would pass it.
pub fn check_room(ctx: Ctx<'_>, extra: usize) -> Result<()> {
    if extra < CHECK_FROM {
        return Ok(());
    }
    let Some((used, max)) = memory_info(ctx) else { return Ok(()) };
    if max > 0 && used.saturating_add(extra as u64) > max {
        return Err(Error::OutOfMemory);
    }
    Ok(())
}

/// `(used_memory, maxmemory)` from INFO memory, on the main thread (or under the global lock).
fn memory_info(ctx: Ctx<'_>) -> Option<(u64, u64)> {
    // SAFETY: ctx is a live context on the main thread; the INFO data is read and freed here.
    unsafe {
        let (Some(get), Some(field), Some(free)) = (
            api_opt!(RedisModule_GetServerInfo),
            api_opt!(RedisModule_ServerInfoGetFieldUnsigned),
            api_opt!(RedisModule_FreeServerInfo),
        ) else {
            return None;
        };
        let info = get(ctx.as_ptr(), c"memory".as_ptr());
        if info.is_null() {
            return None;
        }
        let mut err = 0;
        let used = field(info, c"used_memory".as_ptr(), &mut err);
        let max = field(info, c"maxmemory".as_ptr(), &mut err);
        free(ctx.as_ptr(), info);
        Some((used, max))
    }
}

/// Redis's `maxmemory` (0: unset), for the default backend memory bound.
pub fn maxmemory(ctx: Ctx<'_>) -> u64 {
    memory_info(ctx).map_or(0, |(_, max)| max)
}
