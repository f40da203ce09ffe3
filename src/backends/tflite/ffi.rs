//! The part of LiteRT's C API (`litert/c/*.h`, libLiteRt.so from the PyPI `ai-edge-litert` wheel) this
//! backend uses. LiteRT's 2.x ABI keeps `LiteRtLayout` (68 bytes) and `LiteRtRankedTensorType` (72 bytes)
//! stable; the unit test below pins those sizes.

use std::ffi::{c_char, c_int, c_void};

pub enum Environment {}
pub enum Model {}
pub enum Options {}
pub enum CompiledModel {}
pub enum Signature {}
pub enum Subgraph {}
pub enum LiteTensor {}
pub enum TensorBuffer {}

pub type Status = c_int;
pub const OK: Status = 0;
pub const HW_ACCELERATOR_CPU: c_int = 1;
pub const BUFFER_TYPE_HOST_MEMORY: c_int = 1;
pub const LOCK_READ: c_int = 0;
pub const LOCK_WRITE: c_int = 1;
pub const MAX_RANK: usize = 8;

/// `LiteRtLayout`: `unsigned rank : 7; bool has_strides : 1;` share the first 4 bytes (GCC/Clang).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Layout {
    pub rank_and_flags: u32,
    pub dims: [i32; MAX_RANK],
    pub strides: [u32; MAX_RANK],
}

impl Layout {
    pub fn new(dims: &[i32]) -> Layout {
        let mut l = Layout { rank_and_flags: dims.len() as u32 & 0x7f, ..Layout::default() };
        l.dims[..dims.len()].copy_from_slice(dims);
        l
    }
    pub fn dims(&self) -> &[i32] {
        &self.dims[..((self.rank_and_flags & 0x7f) as usize).min(MAX_RANK)]
    }
}

/// `LiteRtRankedTensorType`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct RankedTensorType {
    pub element_type: c_int,
    pub layout: Layout,
}

// LiteRtElementType (= TfLiteType) values.
pub const FLOAT32: c_int = 1;
pub const INT32: c_int = 2;
pub const UINT8: c_int = 3;
pub const INT64: c_int = 4;
pub const BOOL: c_int = 6;
pub const INT16: c_int = 7;
pub const INT8: c_int = 9;
pub const FLOAT64: c_int = 11;
pub const UINT16: c_int = 17;

pub type CancelCheck = extern "C" fn(*mut c_void) -> bool;

super::super::dl::dl_api! {
    create_environment = "LiteRtCreateEnvironment": fn(c_int, *const c_void, *mut *mut Environment) -> Status;
    destroy_environment = "LiteRtDestroyEnvironment": fn(*mut Environment);
    create_model_from_buffer = "LiteRtCreateModelFromBuffer":
        fn(*mut Environment, *const c_void, usize, *mut *mut Model) -> Status;
    destroy_model = "LiteRtDestroyModel": fn(*mut Model);
    create_options = "LiteRtCreateOptions": fn(*mut *mut Options) -> Status;
    destroy_options = "LiteRtDestroyOptions": fn(*mut Options);
    set_hw_accelerators = "LiteRtSetOptionsHardwareAccelerators": fn(*mut Options, c_int) -> Status;
    create_compiled_model = "LiteRtCreateCompiledModel":
        fn(*mut Environment, *mut Model, *mut Options, *mut *mut CompiledModel) -> Status;
    destroy_compiled_model = "LiteRtDestroyCompiledModel": fn(*mut CompiledModel);
    num_signatures = "LiteRtGetNumModelSignatures": fn(*mut Model, *mut usize) -> Status;
    signature = "LiteRtGetModelSignature": fn(*mut Model, usize, *mut *mut Signature) -> Status;
    num_signature_inputs = "LiteRtGetNumSignatureInputs": fn(*mut Signature, *mut usize) -> Status;
    num_signature_outputs = "LiteRtGetNumSignatureOutputs": fn(*mut Signature, *mut usize) -> Status;
    signature_input = "LiteRtGetSignatureInputTensorByIndex": fn(*mut Signature, usize, *mut *mut LiteTensor) -> Status;
    signature_output = "LiteRtGetSignatureOutputTensorByIndex":
        fn(*mut Signature, usize, *mut *mut LiteTensor) -> Status;
    main_subgraph_index = "LiteRtGetMainModelSubgraphIndex": fn(*mut Model, *mut usize) -> Status;
    subgraph = "LiteRtGetModelSubgraph": fn(*mut Model, usize, *mut *mut Subgraph) -> Status;
    num_subgraph_inputs = "LiteRtGetNumSubgraphInputs": fn(*mut Subgraph, *mut usize) -> Status;
    num_subgraph_outputs = "LiteRtGetNumSubgraphOutputs": fn(*mut Subgraph, *mut usize) -> Status;
    subgraph_input = "LiteRtGetSubgraphInput": fn(*mut Subgraph, usize, *mut *mut LiteTensor) -> Status;
    subgraph_output = "LiteRtGetSubgraphOutput": fn(*mut Subgraph, usize, *mut *mut LiteTensor) -> Status;
    tensor_name = "LiteRtGetTensorName": fn(*mut LiteTensor, *mut *const c_char) -> Status;
    ranked_tensor_type = "LiteRtGetRankedTensorType": fn(*mut LiteTensor, *mut RankedTensorType) -> Status;
    resize_input = "LiteRtCompiledModelResizeInputTensor":
        fn(*mut CompiledModel, usize, usize, *const c_int, usize) -> Status;
    output_layouts = "LiteRtGetCompiledModelOutputTensorLayouts":
        fn(*mut CompiledModel, usize, usize, *mut Layout, bool) -> Status;
    set_cancellation = "LiteRtSetCompiledModelCancellationFunction":
        fn(*mut CompiledModel, *mut c_void, CancelCheck) -> Status;
    create_managed_buffer = "LiteRtCreateManagedTensorBuffer":
        fn(*mut Environment, c_int, *const RankedTensorType, usize, *mut *mut TensorBuffer) -> Status;
    destroy_buffer = "LiteRtDestroyTensorBuffer": fn(*mut TensorBuffer);
    lock_buffer = "LiteRtLockTensorBuffer": fn(*mut TensorBuffer, *mut *mut c_void, c_int) -> Status;
    unlock_buffer = "LiteRtUnlockTensorBuffer": fn(*mut TensorBuffer) -> Status;
    run = "LiteRtRunCompiledModel":
        fn(*mut CompiledModel, usize, usize, *mut *mut TensorBuffer, usize, *mut *mut TensorBuffer) -> Status;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_sizes_match_litert_2() {
        assert_eq!(std::mem::size_of::<Layout>(), 68);
        assert_eq!(std::mem::size_of::<RankedTensorType>(), 72);
        let l = Layout::new(&[3, 2]);
        assert_eq!(l.rank_and_flags, 2);
        assert_eq!(l.dims(), &[3, 2]);
    }
}
