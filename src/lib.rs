//! redisai-rs: a Redis module that stores tensors, models and scripts and runs inference next to the
//! data, compatible with RedisAI 1.2.7. `redis/` is the only FFI layer; the rest is plain Rust.

pub mod admission;
pub mod backend_kind;
pub mod backends;
pub mod blob;
pub mod caller;
pub mod clock;
pub mod commands;
pub mod config;
pub mod device;
pub mod error;
pub mod exec;
pub mod histogram;
pub mod isolation;
pub mod limits;
pub mod log;
pub mod model;
pub mod rdb;
mod redis;
pub mod reply;
pub mod run_history;
pub mod script;
pub mod script_spec;
pub mod stats;
pub mod tensor;
