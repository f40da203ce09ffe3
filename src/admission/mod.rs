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

/// Refuses a model whose bytes ask for something a client that may store models must not get.
pub fn check(backend: BackendKind, blob: &[u8]) -> Result<()> {
    let refused = match backend {
        BackendKind::Onnx => onnx::check(blob),
        BackendKind::Tf => tensorflow::check(blob),
        BackendKind::TfLite => tflite::check(blob),
        // Checked by the backend library once libtorch has parsed the archive (torch/src/shim.cpp).
        BackendKind::Torch => Ok(()),
    };
    // RedisAI sent ONNX Runtime's refusal of external data as it was, without `ERR `; our own texts have it.
    refused.map_err(|e| if e == onnx::EXTERNAL_DATA { Error::Plain(e) } else { Error::Generic(e) })
}
