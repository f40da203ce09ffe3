//! Model admission: every serialized model is checked before a backend sees it, on every way in (MODELSTORE,
//! MODELSET, RESTORE, RDB/AOF load, replication all end in `backends::load_model`). Models are untrusted input:
//! a model that could reach the server's files, network or processes, or load code, or whose calls recurse
//! (`callgraph.rs`: a function or subgraph that reaches itself, nesting past a bound), is refused with an error
//! that names what was found. The checks are pure parsing (no backend library needed) so that they also run
//! where the backend is missing, and unit tests exercise them without a server. TORCH is checked inside the
//! backend library (the TorchScript graphs only exist after libtorch has read the archive).
//! See docs/security.md for the threat model and what each check refuses and why.

pub(crate) mod callgraph;
pub mod onnx;
pub mod protobuf;
pub mod tensorflow;
pub mod tflite;

use crate::backend_kind::BackendKind;
use crate::error::{Error, Result};

/// A name from a model, printable and short enough for an error reply (no CR/LF can reach RESP).
pub(crate) fn show(name: &[u8]) -> String {
    const MAX: usize = 64;
    let mut s = name[..name.len().min(MAX)].escape_ascii().to_string();
    if name.len() > MAX {
        s.push_str("...");
    }
    s
}

/// Why a model was refused: the text, and whether it is a text RedisAI sent as it was (ONNX Runtime's refusal of
/// external data, without `ERR `) rather than our own (with `ERR `).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub text: String,
    pub verbatim: bool,
}

impl From<String> for Rejection {
    fn from(text: String) -> Rejection {
        Rejection { text, verbatim: false }
    }
}

impl From<&str> for Rejection {
    fn from(text: &str) -> Rejection {
        Rejection::from(text.to_string())
    }
}

impl From<Rejection> for Error {
    fn from(r: Rejection) -> Error {
        Error::Refused { text: r.text, prefixed: !r.verbatim }
    }
}

/// Refuses a model whose bytes ask for something a client that may store models must not get.
pub fn check(backend: BackendKind, blob: &[u8]) -> Result<()> {
    let refused = match backend {
        BackendKind::Onnx => onnx::check(blob),
        BackendKind::Tf => tensorflow::check(blob).map_err(Rejection::from),
        BackendKind::TfLite => tflite::check(blob).map_err(Rejection::from),
        // Checked by the backend library once libtorch has parsed the archive (torch/src/shim.cpp).
        BackendKind::Torch => Ok(()),
    };
    refused.map_err(Error::from)
}
