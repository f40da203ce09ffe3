//! `libredisai_torch.so`: the module's libtorch backend behind the C ABI of `src/backends/torch_abi.rs`.
//! Tensors go through `tch`; the TorchScript parts tch lacks go through `shim.cpp`; what models and scripts may
//! reach, and the memory and time they may take, is `sandbox.cpp`'s (installed by `rai_torch_configure`).

#[path = "../../src/backends/torch_abi.rs"]
mod abi;

use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use abi::{StrView, TensorOut, TensorView};
use tch::{Kind, Tensor};

extern "C" {
    fn rai_shim_set_host(host: *const abi::HostApi);
    fn rai_shim_configure(memory_bound: u64, err: *mut *mut c_char) -> i32;
    fn rai_shim_live_bytes() -> u64;
    fn rai_shim_next_block_written(n: u64);
    fn rai_shim_torch_version() -> *const c_char;
    fn rai_shim_free_string(s: *mut c_char);
    fn rai_shim_free_array(a: *mut *mut c_void);
    fn rai_shim_module_load(
        data: *const c_char,
        len: usize,
        gpu: i32,
        names: *mut *mut c_char,
        noutputs: *mut usize,
        err: *mut *mut c_char,
        code: *mut i32,
    ) -> *mut c_void;
    fn rai_shim_module_forward(
        module: *mut c_void,
        inputs: *const *const c_void,
        n: usize,
        timeout_ms: u64,
        outs: *mut *mut *mut c_void,
        nout: *mut usize,
        err: *mut *mut c_char,
    ) -> i32;
    fn rai_shim_module_free(module: *mut c_void);
    fn rai_shim_script_compile(
        src: *const c_char,
        len: usize,
        gpu: i32,
        err: *mut *mut c_char,
        code: *mut i32,
    ) -> *mut c_void;
    fn rai_shim_script_free(script: *mut c_void);
    fn rai_shim_script_check_entry(script: *mut c_void, name: *const c_char, err: *mut *mut c_char) -> i32;
    fn rai_shim_script_run(
        script: *mut c_void,
        name: *const c_char,
        call: i32,
        tensors: *const *const c_void,
        n: usize,
        list_from: libc::c_long,
        keys: *const *const c_char,
        key_lens: *const usize,
        nkeys: usize,
        args: *const *const c_char,
        arg_lens: *const usize,
        nargs: usize,
        timeout_ms: u64,
        outs: *mut *mut *mut c_void,
        nout: *mut usize,
        err: *mut *mut c_char,
    ) -> i32;
}

/// The module's dtype order (`DataType::ALL`): FLOAT DOUBLE INT8 INT16 INT32 INT64 UINT8 UINT16 BOOL STRING.
const NAMES: [&str; 10] = ["FLOAT", "DOUBLE", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "BOOL", "STRING"];

fn kind_of(dtype: u32) -> Result<Kind, String> {
    Ok(match dtype {
        0 => Kind::Float,
        1 => Kind::Double,
        2 => Kind::Int8,
        3 => Kind::Int16,
        4 => Kind::Int,
        5 => Kind::Int64,
        6 => Kind::Uint8,
        8 => Kind::Bool,
        d => {
            return Err(format!(
                "{} tensors are not supported by the TORCH backend",
                NAMES.get(d as usize).unwrap_or(&"?")
            ))
        }
    })
}

fn dtype_of(kind: Kind) -> Result<u32, String> {
    Ok(match kind {
        Kind::Float => 0,
        Kind::Double => 1,
        Kind::Int8 => 2,
        Kind::Int16 => 3,
        Kind::Int => 4,
        Kind::Int64 => 5,
        Kind::Uint8 => 6,
        Kind::Bool => 8,
        k => return Err(format!("the model returned a tensor of unsupported type {k:?}")),
    })
}

/// The sandbox's memory-bound text (torch/src/sandbox.cpp), which libtorch errors raised through tch carry.
const MEMORY_ERROR: &str = "TORCH memory limit exceeded, memory allocation failed.";

/// A tch error as the client gets it: the plain memory-bound text when the allocator refused.
fn tch_error(e: tch::TchError) -> String {
    let s = e.to_string();
    if s.contains(MEMORY_ERROR) {
        MEMORY_ERROR.to_string()
    } else {
        s
    }
}

/// # Safety
/// `v` describes `ndim` dims and `len` readable bytes, valid for the call.
unsafe fn to_tensor(v: &TensorView) -> Result<Tensor, String> {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    let shape = unsafe {
        if v.ndim == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(v.shape, v.ndim as usize)
        }
    };
    let kind = kind_of(v.dtype)?;
    // `empty` and one copy, not tch's `from_data_size` (`zeros`, then the copy): the fill was a third pass over
    // every input. The allocator zeroes new blocks (sandbox_limits.cpp), but not this one, which the copy below
    // writes whole: the hint names its size, and a tensor of another size is dropped unread.
    // SAFETY: sets a thread-local hint; no pointer is passed.
    unsafe { rai_shim_next_block_written(v.len as u64) };
    let t = Tensor::f_empty(shape, (kind, tch::Device::Cpu));
    // SAFETY: as above (the hint is dropped whether or not `empty` allocated).
    unsafe { rai_shim_next_block_written(0) };
    let t = t.map_err(tch_error)?;
    let len = t.numel() * kind.elt_size_in_bytes();
    if len != v.len {
        return Err(format!("an input of {} bytes for {len} bytes of tensor", v.len));
    }
    if len > 0 {
        // SAFETY: `t` is a new contiguous CPU tensor of `len` bytes; `v.data` holds `v.len` == `len` readable
        // bytes (the caller's contract); they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(v.data, t.data_ptr() as *mut u8, len) };
    }
    Ok(t)
}

fn to_out(t: &Tensor) -> Result<TensorOut, String> {
    let t = t.f_to_device(tch::Device::Cpu).and_then(|t| t.f_contiguous()).map_err(tch_error)?;
    let dtype = dtype_of(t.kind())?;
    let len = t.numel() * t.kind().elt_size_in_bytes();
    // Not a zeroed buffer (`vec![0; len]`): the allocator answers a big zeroed allocation with pages it hands
    // back to the kernel first, which faulted in and were cleared again on every run (a 256 KB output: 64 page
    // faults per run, docs/benchmarks.md). Every byte is written here.
    let mut data: Vec<u8> = Vec::with_capacity(len);
    if len > 0 {
        let src = t.data_ptr() as *const u8;
        // SAFETY: `t` is a contiguous CPU tensor (strided: other layouts failed `f_contiguous` above) of a plain
        // dtype (`dtype_of`) holding `len` bytes at `src`, alive for the call; `data` has room for `len` bytes,
        // all of which the copy initializes before `set_len`.
        unsafe {
            std::ptr::copy_nonoverlapping(src, data.as_mut_ptr(), len);
            data.set_len(len);
        }
    }
    Ok(TensorOut::new(dtype, t.size(), data))
}

/// A failure for the module: its kind (a return code of `abi`) and its text.
struct Failure {
    code: i32,
    text: String,
}

impl From<String> for Failure {
    fn from(text: String) -> Self {
        Failure { code: abi::FAILED, text }
    }
}

/// # Safety
/// `err` is writable.
unsafe fn fail(err: *mut *mut c_char, f: Failure) -> i32 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        *err = CString::new(f.text.replace('\0', " ")).unwrap_or_default().into_raw();
        f.code
    }
}

/// Takes a string the shim malloc'd (`None`: null).
/// # Safety
/// `p` is null or a NUL-terminated string from the shim, not used again.
unsafe fn take_string(p: *mut c_char) -> Option<String> {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        if p.is_null() {
            return None;
        }
        let s = CStr::from_ptr(p).to_string_lossy().into_owned();
        rai_shim_free_string(p);
        Some(s)
    }
}

/// Takes the kind the shim returned and the message it malloc'd.
/// # Safety
/// As `take_string`.
unsafe fn shim_failure(code: i32, p: *mut c_char) -> Failure {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    let text = unsafe { take_string(p) }.unwrap_or_else(|| "unknown libtorch error".into());
    Failure { code: if code == 0 { abi::FAILED } else { code }, text }
}

/// Runs `f`, turning a panic into an error: nothing may unwind into the module.
/// # Safety
/// `err` is writable.
unsafe fn guarded(err: *mut *mut c_char, f: impl FnOnce() -> Result<(), Failure>) -> i32 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => fail(err, e),
            Err(_) => fail(err, String::from("internal error in the TORCH backend").into()),
        }
    }
}

/// A model or script on `GPU:<gpu>` (gpu >= 0) needs CUDA and that device.
fn check_gpu(gpu: i32) -> Result<(), Failure> {
    if gpu < 0 {
        return Ok(());
    }
    let no_gpu = |text: String| Err(Failure { code: abi::NO_GPU, text });
    if !tch::Cuda::is_available() {
        return no_gpu("GPU requested but Torch couldn't find CUDA".into());
    }
    let count = tch::Cuda::device_count();
    if i64::from(gpu) >= count {
        return no_gpu(format!("GPU:{gpu} requested but this machine has {count} GPU(s)"));
    }
    Ok(())
}

/// Adopts the tensors of a shim array and hands them out as `TensorOut`s.
/// # Safety
/// `arr` holds `n` tensors from the shim, given up by the caller; the out-pointers are writable.
unsafe fn adopt(
    arr: *mut *mut c_void,
    n: usize,
    outputs: *mut *mut TensorOut,
    noutputs: *mut usize,
) -> Result<(), String> {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        let tensors: Vec<Tensor> = (0..n).map(|i| Tensor::from_ptr(*arr.add(i) as *mut _)).collect();
        rai_shim_free_array(arr);
        let outs = tensors.iter().map(to_out).collect::<Result<Vec<_>, _>>()?;
        abi::give_outs(outs, outputs, noutputs);
        Ok(())
    }
}

/// The module's `n` input views at `views` as tensors (copies: the module keeps its buffers).
/// # Safety
/// `views` points to `n` valid `TensorView`s (or `n` is 0).
unsafe fn input_tensors(views: *const TensorView, n: usize) -> Result<Vec<Tensor>, String> {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    let views = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(views, n) } };
    // SAFETY: each view describes a live buffer of the module, as the caller's contract says.
    views.iter().map(|v| unsafe { to_tensor(v) }).collect()
}

/// The tensors as the shim takes them: pointers to their `at::Tensor`s, valid while `tensors` lives.
fn shim_pointers(tensors: &[Tensor]) -> Vec<*const c_void> {
    tensors.iter().map(|t| t.as_ptr() as *const c_void).collect()
}

fn set_threads(intra: i32) {
    if intra > 0 {
        // Per OS thread in libtorch: set on the worker that runs.
        tch::set_num_threads(intra);
    }
}

#[no_mangle]
pub extern "C" fn rai_torch_abi() -> u32 {
    abi::ABI_VERSION
}

/// # Safety
/// `host` points to callbacks that stay valid for the life of the process.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_set_host(host: *const abi::HostApi) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        rai_shim_set_host(host);
    }
}

/// # Safety
/// See `abi::ConfigureFn`; `err` is writable.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_configure(inter_op_threads: i32, memory_bound: u64, err: *mut *mut c_char) -> i32 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        if inter_op_threads > 0 {
            let _ = catch_unwind(|| tch::set_num_interop_threads(inter_op_threads));
        }
        guarded(err, || {
            let mut e = std::ptr::null_mut();
            // `e` is writable; the shim catches every C++ exception and malloc's the message.
            let rc = rai_shim_configure(memory_bound, &mut e);
            if rc != 0 {
                return Err(shim_failure(rc, e));
            }
            Ok(())
        })
    }
}

#[no_mangle]
pub extern "C" fn rai_torch_memory() -> u64 {
    // SAFETY: reads an atomic counter.
    unsafe { rai_shim_live_bytes() }
}

#[no_mangle]
pub extern "C" fn rai_torch_version() -> *mut c_char {
    // SAFETY: the shim returns a static NUL-terminated string literal.
    let version = unsafe { CStr::from_ptr(rai_shim_torch_version()) };
    CString::from(version).into_raw()
}

/// # Safety
/// See `abi::ModelLoadFn`.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_model_load(
    blob: *const u8,
    len: usize,
    gpu: i32,
    model: *mut *mut c_void,
    info: *mut abi::ModelInfo,
    err: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        guarded(err, || {
            check_gpu(gpu)?;
            let (mut names, mut n, mut e, mut rc) = (std::ptr::null_mut(), 0usize, std::ptr::null_mut(), 0);
            let m = rai_shim_module_load(blob as *const c_char, len, gpu, &mut names, &mut n, &mut e, &mut rc);
            if m.is_null() {
                return Err(shim_failure(rc, e));
            }
            let joined = take_string(names).unwrap_or_default();
            *info = abi::ModelInfo { input_names: CString::new(joined).unwrap_or_default().into_raw(), noutputs: n };
            *model = m;
            Ok(())
        })
    }
}

/// # Safety
/// See `abi::ModelRunFn`.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_model_run(
    model: *mut c_void,
    inputs: *const TensorView,
    ninputs: usize,
    intra_threads: i32,
    timeout_ms: u64,
    outputs: *mut *mut TensorOut,
    noutputs: *mut usize,
    err: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        guarded(err, || {
            set_threads(intra_threads);
            let tensors = input_tensors(inputs, ninputs)?;
            let ptrs = shim_pointers(&tensors);
            let (mut arr, mut n, mut e) = (std::ptr::null_mut(), 0usize, std::ptr::null_mut());
            let rc = rai_shim_module_forward(model, ptrs.as_ptr(), ptrs.len(), timeout_ms, &mut arr, &mut n, &mut e);
            if rc != 0 {
                return Err(shim_failure(rc, e));
            }
            Ok(adopt(arr, n, outputs, noutputs)?)
        })
    }
}

/// # Safety
/// `model` came from `rai_torch_model_load` and is freed once.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_model_free(model: *mut c_void) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        let _ = catch_unwind(|| rai_shim_module_free(model));
    }
}

/// # Safety
/// See `abi::ScriptCompileFn`.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_script_compile(
    src: *const u8,
    len: usize,
    gpu: i32,
    script: *mut *mut c_void,
    err: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        guarded(err, || {
            check_gpu(gpu)?;
            let (mut e, mut rc) = (std::ptr::null_mut(), 0);
            let s = rai_shim_script_compile(src as *const c_char, len, gpu, &mut e, &mut rc);
            if s.is_null() {
                return Err(shim_failure(rc, e));
            }
            *script = s;
            Ok(())
        })
    }
}

/// # Safety
/// See `abi::ScriptCheckEntryFn`.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_script_check_entry(
    script: *mut c_void,
    name: StrView,
    err: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        guarded(err, || {
            let name = CString::new(std::slice::from_raw_parts(name.ptr, name.len))
                .map_err(|_| "bad function name".to_string())?;
            let mut e = std::ptr::null_mut();
            let rc = rai_shim_script_check_entry(script, name.as_ptr(), &mut e);
            if rc != 0 {
                return Err(shim_failure(rc, e));
            }
            Ok(())
        })
    }
}

/// The pointers and lengths of `n` string views.
/// # Safety
/// `p` points to `n` views (or `n` is 0).
unsafe fn strs(p: *const StrView, n: usize) -> (Vec<*const c_char>, Vec<usize>) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        let v: &[StrView] = if n == 0 { &[] } else { std::slice::from_raw_parts(p, n) };
        (v.iter().map(|s| s.ptr as *const c_char).collect(), v.iter().map(|s| s.len).collect())
    }
}

/// # Safety
/// See `abi::ScriptRunFn`.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_script_run(
    script: *mut c_void,
    function: StrView,
    call: i32,
    tensors: *const TensorView,
    ntensors: usize,
    list_from: isize,
    keys: *const StrView,
    nkeys: usize,
    args: *const StrView,
    nargs: usize,
    intra_threads: i32,
    timeout_ms: u64,
    outputs: *mut *mut TensorOut,
    noutputs: *mut usize,
    err: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        guarded(err, || {
            set_threads(intra_threads);
            let name = CString::new(std::slice::from_raw_parts(function.ptr, function.len))
                .map_err(|_| "bad function name".to_string())?;
            let ts = input_tensors(tensors, ntensors)?;
            let ptrs = shim_pointers(&ts);
            let (kp, kl) = strs(keys, nkeys);
            let (ap, al) = strs(args, nargs);
            let (mut arr, mut n, mut e) = (std::ptr::null_mut(), 0usize, std::ptr::null_mut());
            let rc = rai_shim_script_run(
                script,
                name.as_ptr(),
                call,
                ptrs.as_ptr(),
                ptrs.len(),
                list_from as libc::c_long,
                kp.as_ptr(),
                kl.as_ptr(),
                nkeys,
                ap.as_ptr(),
                al.as_ptr(),
                nargs,
                timeout_ms,
                &mut arr,
                &mut n,
                &mut e,
            );
            if rc != 0 {
                return Err(shim_failure(rc, e));
            }
            adopt(arr, n, outputs, noutputs).map_err(Failure::from)
        })
    }
}

/// # Safety
/// `script` came from `rai_torch_script_compile` and is freed once.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_script_free(script: *mut c_void) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        let _ = catch_unwind(|| rai_shim_script_free(script));
    }
}

/// # Safety
/// `tensors`/`n` came from a run of this library and are freed once.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_free_tensors(tensors: *mut TensorOut, n: usize) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe { abi::free_outs(tensors, n) }
}
/// # Safety
/// `s` came from this library and is freed once.
#[no_mangle]
pub unsafe extern "C" fn rai_torch_free_string(s: *mut c_char) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section).
    unsafe {
        if !s.is_null() {
            drop(CString::from_raw(s));
        }
    }
}

// The compiler checks every export against the ABI the module calls it through (src/backends/torch_abi.rs): a
// signature that drifts on either side no longer compiles.
const _: abi::AbiVersionFn = rai_torch_abi;
const _: abi::SetHostFn = rai_torch_set_host;
const _: abi::ConfigureFn = rai_torch_configure;
const _: abi::MemoryFn = rai_torch_memory;
const _: abi::VersionFn = rai_torch_version;
const _: abi::ModelLoadFn = rai_torch_model_load;
const _: abi::ModelRunFn = rai_torch_model_run;
const _: abi::FreeFn = rai_torch_model_free;
const _: abi::ScriptCompileFn = rai_torch_script_compile;
const _: abi::ScriptCheckEntryFn = rai_torch_script_check_entry;
const _: abi::ScriptRunFn = rai_torch_script_run;
const _: abi::FreeFn = rai_torch_script_free;
const _: abi::FreeTensorsFn = rai_torch_free_tensors;
const _: abi::FreeStringFn = rai_torch_free_string;
