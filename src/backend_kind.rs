//! The four backends, as named in commands and numbered in the RDB: a leaf, so that admission and the backends
//! name a backend without depending on models.

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Tf,
    TfLite,
    Torch,
    Onnx,
}

impl BackendKind {
    const ALL: [BackendKind; 4] = [BackendKind::Tf, BackendKind::TfLite, BackendKind::Torch, BackendKind::Onnx];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Tf => "TF",
            BackendKind::TfLite => "TFLITE",
            BackendKind::Torch => "TORCH",
            BackendKind::Onnx => "ONNX",
        }
    }
    pub fn parse(s: &[u8]) -> Result<BackendKind> {
        BackendKind::ALL
            .into_iter()
            .find(|b| b.name().as_bytes().eq_ignore_ascii_case(s))
            .ok_or(Error::UnsupportedBackend)
    }
    /// The number RedisAI writes to the RDB.
    pub fn code(self) -> u64 {
        self as u64
    }
    pub fn from_code(c: u64) -> Option<BackendKind> {
        BackendKind::ALL.get(c as usize).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_and_codes() {
        for b in BackendKind::ALL {
            assert_eq!(BackendKind::parse(b.name().to_lowercase().as_bytes()), Ok(b));
            assert_eq!(BackendKind::from_code(b.code()), Some(b));
        }
        assert_eq!(BackendKind::Onnx.code(), 3);
        assert_eq!(BackendKind::parse(b"PYTORCH"), Err(Error::UnsupportedBackend));
    }
}
