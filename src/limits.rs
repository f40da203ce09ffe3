//! Size limits that both the error texts and the tensor code name: a leaf, so that neither imports the other.

/// Largest tensor payload accepted from a client or an RDB file. Bounds every allocation a
/// declared shape can cause, so a typo in a shape is an error reply rather than an abort in Redis.
pub const MAX_TENSOR_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// Largest tensor rank: the RDB format (ours and RedisAI's loader) takes at most this many dimensions.
pub const MAX_DIMS: usize = 64;
