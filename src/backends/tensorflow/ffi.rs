//! The part of TensorFlow's C API this backend uses, opened with `dlopen` from a path we choose (so the
//! module loads, and serves everything else, without libtensorflow).

use std::ffi::{c_char, c_int, c_void};

pub enum Status {}
pub enum Graph {}
pub enum Buffer {}
pub enum ImportOptions {}
pub enum Operation {}
pub enum SessionOptions {}
pub enum Session {}
pub enum Tensor {}

/// `TF_Output`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Output {
    pub oper: *mut Operation,
    pub index: c_int,
}

/// `TF_TString` is 24 opaque bytes.
#[repr(C, align(8))]
pub struct TString {
    _bytes: [u8; 24],
}

// TF_DataType values.
pub const TF_FLOAT: c_int = 1;
pub const TF_DOUBLE: c_int = 2;
pub const TF_INT32: c_int = 3;
pub const TF_UINT8: c_int = 4;
pub const TF_INT16: c_int = 5;
pub const TF_INT8: c_int = 6;
pub const TF_STRING: c_int = 7;
pub const TF_INT64: c_int = 9;
pub const TF_BOOL: c_int = 10;
pub const TF_UINT16: c_int = 17;

super::super::dl::dl_api! {
    version = "TF_Version": fn() -> *const c_char;
    new_status = "TF_NewStatus": fn() -> *mut Status;
    delete_status = "TF_DeleteStatus": fn(*mut Status);
    get_code = "TF_GetCode": fn(*const Status) -> c_int;
    message = "TF_Message": fn(*const Status) -> *const c_char;
    new_graph = "TF_NewGraph": fn() -> *mut Graph;
    delete_graph = "TF_DeleteGraph": fn(*mut Graph);
    new_buffer_from_string = "TF_NewBufferFromString": fn(*const c_void, usize) -> *mut Buffer;
    delete_buffer = "TF_DeleteBuffer": fn(*mut Buffer);
    new_import_options = "TF_NewImportGraphDefOptions": fn() -> *mut ImportOptions;
    delete_import_options = "TF_DeleteImportGraphDefOptions": fn(*mut ImportOptions);
    import_graph_def = "TF_GraphImportGraphDef": fn(*mut Graph, *const Buffer, *const ImportOptions, *mut Status);
    operation_by_name = "TF_GraphOperationByName": fn(*mut Graph, *const c_char) -> *mut Operation;
    operation_num_outputs = "TF_OperationNumOutputs": fn(*mut Operation) -> c_int;
    operation_op_type = "TF_OperationOpType": fn(*mut Operation) -> *const c_char;
    new_session_options = "TF_NewSessionOptions": fn() -> *mut SessionOptions;
    delete_session_options = "TF_DeleteSessionOptions": fn(*mut SessionOptions);
    set_config = "TF_SetConfig": fn(*mut SessionOptions, *const c_void, usize, *mut Status);
    new_session = "TF_NewSession": fn(*mut Graph, *const SessionOptions, *mut Status) -> *mut Session;
    close_session = "TF_CloseSession": fn(*mut Session, *mut Status);
    delete_session = "TF_DeleteSession": fn(*mut Session, *mut Status);
    session_run = "TF_SessionRun": fn(
        *mut Session, *const Buffer,
        *const Output, *const *mut Tensor, c_int,
        *const Output, *mut *mut Tensor, c_int,
        *const *const Operation, c_int,
        *mut Buffer, *mut Status
    );
    allocate_tensor = "TF_AllocateTensor": fn(c_int, *const i64, c_int, usize) -> *mut Tensor;
    delete_tensor = "TF_DeleteTensor": fn(*mut Tensor);
    tensor_data = "TF_TensorData": fn(*const Tensor) -> *mut c_void;
    tensor_byte_size = "TF_TensorByteSize": fn(*const Tensor) -> usize;
    num_dims = "TF_NumDims": fn(*const Tensor) -> c_int;
    dim = "TF_Dim": fn(*const Tensor, c_int) -> i64;
    tensor_type = "TF_TensorType": fn(*const Tensor) -> c_int;
    string_init = "TF_StringInit": fn(*mut TString);
    string_copy = "TF_StringCopy": fn(*mut TString, *const c_char, usize);
    string_data = "TF_StringGetDataPointer": fn(*const TString) -> *const c_char;
    string_size = "TF_StringGetSize": fn(*const TString) -> usize;
}
