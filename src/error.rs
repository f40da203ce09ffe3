//! One error type for the whole module, a variant per cause (parse, missing key, wrong type, backend, refused,
//! timeout, memory, permission, ...). `Display` gives RedisAI's text *without* the `ERR ` prefix;
//! [`Error::reply_text`] adds the prefix for the errors where RedisAI sent one (most, not all): the one place
//! that decides it. Nothing matches on an error's text.

use thiserror::Error;

pub use crate::limits::MAX_TENSOR_BYTES;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// The name as RedisAI's reply gave it: upper case where RedisAI formatted the text itself, the registered
    /// lower-case name where it called RedisModule_WrongArity (AI.MODELSTORE, AI.SCRIPTSTORE) on Redis 7.
    #[error("wrong number of arguments for '{0}' command")]
    WrongArity(&'static str),
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    #[error("tensor key is empty or in a different shard")]
    TensorKeyEmpty,
    #[error("invalid data type")]
    InvalidDataType,
    #[error("invalid or negative value found in tensor shape")]
    InvalidShape,
    #[error("tensor size exceeds the limit of {MAX_TENSOR_BYTES} bytes")]
    TensorTooLarge,
    #[error("tensor rank exceeds the limit of {} dimensions", crate::limits::MAX_DIMS)]
    TensorRankTooLarge,
    #[error("a single binary string should come after the BLOB argument in 'AI.TENSORSET' command")]
    BlobArgument,
    #[error("data length does not match tensor shape and type")]
    DataLength,
    #[error("BOOL tensor elements must be 0 or 1")]
    BoolValue,
    #[error("Number of string elements in data blob does not match tensor length")]
    StringElements,
    #[error("STRING tensor elements must be valid UTF-8")]
    StringUtf8,
    #[error("wrong number of values was given in 'AI.TENSORSET' command")]
    ValuesCount,
    #[error("invalid value")]
    InvalidValue,
    #[error("C-string value contains null character")]
    NulInString,
    #[error("unsupported data format")]
    UnsupportedFormat,
    #[error("both BLOB and VALUES specified")]
    BothBlobAndValues,
    #[error("Invalid DEVICE")]
    InvalidDevice,
    #[error("unsupported backend")]
    UnsupportedBackend,
    #[error("model key is empty")]
    ModelKeyEmpty,
    #[error("script key is empty")]
    ScriptKeyEmpty,
    #[error("Cannot run RedisAI command within a transaction or a LUA script")]
    InTransaction,
    #[error("cannot find run info for key")]
    NoRunInfo,
    /// A persisted payload that cannot be decoded (corrupt file, wrong layout, forward version).
    #[error("corrupt {what} payload: {why}")]
    Rdb { what: &'static str, why: String },
    /// A command's (or the module's load-time) arguments are wrong, in RedisAI's words; `prefixed`: RedisAI
    /// sent it with `ERR ` (most parser texts; a few went out bare).
    #[error("{text}")]
    Parse { text: String, prefixed: bool },
    /// A backend's own failure (ONNX Runtime, TensorFlow, LiteRT, libtorch, a script's result), in its words,
    /// which RedisAI sent without `ERR `.
    #[error("{0}")]
    Backend(String),
    /// A backend library that is not there or cannot load, or a device that cannot be used (a GPU without CUDA,
    /// a queue that cannot start).
    #[error("{0}")]
    Unavailable(String),
    /// What a model produced does not fit the request (its number of outputs or inputs, the batch it returned).
    #[error("{0}")]
    Mismatch(String),
    /// The caller's ACL forbids it; `prefixed` as RedisAI or Redis sent the text (`NOPERM …` alone is Redis's).
    #[error("{text}")]
    Permission { text: String, prefixed: bool },
    /// Redis's own deny-oom refusal: over `maxmemory`.
    #[error("OOM command not allowed when used memory > 'maxmemory'.")]
    OutOfMemory,
    /// A model kept with its bytes whose deferred build did not (or will not) happen (DEFERRED_MODEL_BUILD).
    #[error("{0}")]
    NotBuilt(String),
    /// The module's own failure: a caught panic, a run that lost its operation. Never expected.
    #[error("{0}")]
    Internal(String),
    /// A run or load stopped by a bound the module enforces (the backend memory bound, a sandbox refusal), in
    /// the words RedisAI or the backend used; `prefixed`: sent with `ERR ` (as admission refusals are). Kept
    /// apart from other failures for AI.INFO's `errors_refused`.
    #[error("{text}")]
    Refused { text: String, prefixed: bool },
    /// A run the kill switch stopped at MODEL_EXECUTION_TIMEOUT, in the backend's words (AI.INFO's
    /// `errors_timeout`); `prefixed` as for `Refused`.
    #[error("{text}")]
    TimedOut { text: String, prefixed: bool },
    /// A script function returned something other than tensors: an error only when OUTPUTS were asked for
    /// (RedisAI's text, no `ERR `).
    #[error("{0}")]
    NonTensorResult(String),
}

impl Error {
    /// The text sent to the client: `ERR ` + message, except where RedisAI sent none.
    pub fn reply_text(&self) -> String {
        if self.prefixed() {
            format!("ERR {self}")
        } else {
            self.to_string()
        }
    }

    /// Whether the reply puts `ERR ` in front of the text: the one place that decides it.
    fn prefixed(&self) -> bool {
        match self {
            Error::WrongType | Error::Backend(_) | Error::OutOfMemory | Error::NonTensorResult(_) => false,
            Error::Parse { prefixed, .. }
            | Error::Permission { prefixed, .. }
            | Error::Refused { prefixed, .. }
            | Error::TimedOut { prefixed, .. } => *prefixed,
            _ => true,
        }
    }

    /// A parse error RedisAI sent with `ERR `.
    pub fn parse(text: impl Into<String>) -> Self {
        Error::Parse { text: text.into(), prefixed: true }
    }

    /// A parse error RedisAI sent bare.
    pub fn parse_verbatim(text: impl Into<String>) -> Self {
        Error::Parse { text: text.into(), prefixed: false }
    }

    /// A refusal sent as RedisAI sent backend texts, without `ERR `.
    pub fn refused(text: impl Into<String>) -> Self {
        Error::Refused { text: text.into(), prefixed: false }
    }

    /// This error, known to be the kill switch's doing; the client's text stays the same.
    pub fn timed_out(self) -> Self {
        Error::TimedOut { prefixed: self.prefixed(), text: self.to_string() }
    }

    pub fn rdb(what: &'static str, why: impl Into<String>) -> Self {
        Error::Rdb { what, why: why.into() }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_follow_redisai() {
        assert_eq!(Error::InvalidValue.reply_text(), "ERR invalid value");
        assert_eq!(Error::WrongType.reply_text(), "WRONGTYPE Operation against a key holding the wrong kind of value");
        assert_eq!(
            Error::parse_verbatim("Unsupported command within DAG").reply_text(),
            "Unsupported command within DAG"
        );
        assert_eq!(Error::parse("Invalid DEVICE").reply_text(), "ERR Invalid DEVICE");
        assert_eq!(Error::Backend("Input dimension mismatch".into()).reply_text(), "Input dimension mismatch");
        assert_eq!(Error::OutOfMemory.reply_text(), "OOM command not allowed when used memory > 'maxmemory'.");
        assert_eq!(Error::Internal("lost".into()).reply_text(), "ERR lost");
        assert_eq!(
            Error::WrongArity("AI.TENSORGET").reply_text(),
            "ERR wrong number of arguments for 'AI.TENSORGET' command"
        );
        assert_eq!(Error::TensorTooLarge.reply_text(), "ERR tensor size exceeds the limit of 4294967296 bytes");
    }
}
