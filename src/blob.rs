//! The bytes of a model, shared by the key, its backend session and the builder, and never copied once read:
//! a `Vec` behind an `Arc` (an `Arc<[u8]>` would take one more copy of every payload, hundreds of MB at RDB
//! load, to move the bytes next to its counters).

use std::sync::Arc;

pub type Blob = Arc<Vec<u8>>;
