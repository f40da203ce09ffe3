//! `RAI_Error` and its functions: a code from RedisAI's `RedisAI_ErrorCode` and the text a client would have
//! been sent (`Error::reply_text`), whole and on one line.

use std::ffi::{c_char, c_int, CString};

use super::ffi;
use crate::error::Error;

// RedisAI's RedisAI_ErrorCode values (include/redisai.h).
pub const OK: c_int = 0;
pub const EMODELCONFIGURE: c_int = 2;
pub const EMODELCREATE: c_int = 3;
pub const EMODELRUN: c_int = 4;
pub const EMODELSERIALIZE: c_int = 5;
pub const ESCRIPTCREATE: c_int = 9;
pub const ESCRIPTRUN: c_int = 10;
pub const EUNSUPPORTEDBACKEND: c_int = 11;
pub const EBACKENDNOTLOADED: c_int = 12;
pub const EDAGBUILDER: c_int = 16;
pub const EDAGRUN: c_int = 17;
pub const EFINISHCTX: c_int = 18;

#[derive(Clone, Default)]
pub struct RaiError {
    code: c_int,
    detail: CString,
    oneline: CString,
}

impl RaiError {
    pub fn new(code: c_int, e: &Error) -> RaiError {
        let mut err = RaiError::default();
        err.set(code, e);
        err
    }

    fn set(&mut self, code: c_int, e: &Error) {
        let text = e.reply_text().replace('\0', " ");
        let oneline = text.split(['\r', '\n']).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ");
        self.code = code;
        self.detail = CString::new(text).unwrap_or_default();
        self.oneline = CString::new(oneline).unwrap_or_default();
    }

    pub fn is_error(&self) -> bool {
        self.code != OK
    }
}

/// Records `e` in the caller's error, if it passed one.
///
/// # Safety
/// `err` is NULL or a live error from `RedisAI_InitError`, not used by another thread during the call.
pub unsafe fn set(err: *mut RaiError, code: c_int, e: &Error) {
    // SAFETY: see the contract.
    if let Some(err) = unsafe { err.as_mut() } {
        err.set(code, e);
    }
}

/// Copies a run's error (or none) into the caller's error.
///
/// # Safety
/// As for `set`.
pub unsafe fn copy(err: *mut RaiError, from: Option<&RaiError>) {
    // SAFETY: see the contract.
    if let (Some(err), Some(from)) = (unsafe { err.as_mut() }, from) {
        *err = from.clone();
    }
}

pub extern "C" fn init_error(err: *mut *mut RaiError) -> c_int {
    ffi("RedisAI_InitError", super::ERR, || {
        if err.is_null() {
            return super::ERR;
        }
        // SAFETY: the caller passes where to store the new error's address.
        unsafe { *err = Box::into_raw(Box::default()) };
        super::OK
    })
}

pub extern "C" fn clear_error(err: *mut RaiError) {
    ffi("RedisAI_ClearError", (), || {
        // SAFETY: NULL or an error from RedisAI_InitError, used by this thread only.
        if let Some(err) = unsafe { err.as_mut() } {
            *err = RaiError::default();
        }
    })
}

pub extern "C" fn free_error(err: *mut RaiError) {
    ffi("RedisAI_FreeError", (), || {
        if !err.is_null() {
            // SAFETY: an error from RedisAI_InitError, freed once.
            drop(unsafe { Box::from_raw(err) });
        }
    })
}

pub extern "C" fn get_error(err: *mut RaiError) -> *const c_char {
    // SAFETY: NULL or a live error; the text lives until the error is cleared, set again or freed.
    ffi("RedisAI_GetError", c"".as_ptr(), || unsafe { err.as_ref() }.map_or(c"".as_ptr(), |e| e.detail.as_ptr()))
}

pub extern "C" fn get_error_one_line(err: *mut RaiError) -> *const c_char {
    ffi("RedisAI_GetErrorOneLine", c"".as_ptr(), || {
        // SAFETY: as for get_error.
        unsafe { err.as_ref() }.map_or(c"".as_ptr(), |e| e.oneline.as_ptr())
    })
}

pub extern "C" fn get_error_code(err: *mut RaiError) -> c_int {
    // SAFETY: NULL or a live error.
    ffi("RedisAI_GetErrorCode", OK, || unsafe { err.as_ref() }.map_or(OK, |e| e.code))
}

pub extern "C" fn clone_error(dest: *mut RaiError, src: *const RaiError) {
    ffi("RedisAI_CloneError", (), || {
        // SAFETY: NULL or live errors; `dest` is the caller's to write.
        if let (Some(d), Some(s)) = unsafe { (dest.as_mut(), src.as_ref()) } {
            if !std::ptr::eq(d, s) {
                *d = s.clone();
            }
        }
    })
}
