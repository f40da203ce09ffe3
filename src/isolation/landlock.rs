//! Landlock (Linux 5.13+): the files a GPU worker may open. CUDA opens device nodes and libraries lazily, long
//! after the seccomp filter is in, so a GPU worker's filter lets opens through to the kernel, and this ruleset
//! decides which: the listed trees and files, nothing else (no Redis `dir`, no home, no `/etc` but the loader's
//! cache, no other process's `/proc`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{Error, Result};

const SYS_CREATE_RULESET: libc::c_long = 444;
const SYS_ADD_RULE: libc::c_long = 445;
const SYS_RESTRICT_SELF: libc::c_long = 446;
const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: u32 = 1;

/// Access rights (linux/landlock.h), by the ABI that brought them.
pub const EXECUTE: u64 = 1 << 0;
pub const WRITE_FILE: u64 = 1 << 1;
pub const READ_FILE: u64 = 1 << 2;
pub const READ_DIR: u64 = 1 << 3;
/// ABI 1 handles bits 0..=12 (the rest: removing and making files of each kind), 2 adds REFER, 3 TRUNCATE,
/// 5 IOCTL_DEV.
const ABI1_ALL: u64 = (1 << 13) - 1;
const REFER: u64 = 1 << 13;
const TRUNCATE: u64 = 1 << 14;
pub const IOCTL_DEV: u64 = 1 << 15;
/// The rights a rule on a file (not a directory) may hold.
const FILE_RIGHTS: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The kernel's Landlock ABI version, or `None` without Landlock (an older kernel, or not enabled).
pub fn abi() -> Option<u32> {
    // SAFETY: the version query takes no attribute (null, size 0) and only returns a number.
    let v =
        unsafe { libc::syscall(SYS_CREATE_RULESET, std::ptr::null::<RulesetAttr>(), 0usize, CREATE_RULESET_VERSION) };
    (v > 0).then_some(v as u32)
}

/// The rights this kernel handles: every right it knows, so that none is left unrestricted.
pub fn handled(abi: u32) -> u64 {
    let mut h = ABI1_ALL;
    if abi >= 2 {
        h |= REFER;
    }
    if abi >= 3 {
        h |= TRUNCATE;
    }
    if abi >= 5 {
        h |= IOCTL_DEV;
    }
    h
}

/// Restricts this process (every thread that calls it: call it before the backends start threads, or with
/// the seccomp filter's TSYNC in mind: Landlock applies to the calling thread and the threads it starts
/// afterwards) to `rules`: `(path, rights)`, each path's tree for a directory, the file itself otherwise.
/// Paths that do not exist are skipped. Requires `PR_SET_NO_NEW_PRIVS`.
pub fn restrict(rules: &[(String, u64)]) -> Result<()> {
    let abi = abi().ok_or_else(|| {
        Error::Internal("backend worker sandbox: a GPU worker needs Landlock (Linux 5.13 or later)".into())
    })?;
    let handled = handled(abi);
    let attr = RulesetAttr { handled_access_fs: handled };
    // SAFETY: a valid attribute of the size given; the result is a new descriptor or -1.
    let fd = unsafe { libc::syscall(SYS_CREATE_RULESET, &attr, std::mem::size_of::<RulesetAttr>(), 0u32) };
    if fd < 0 {
        return Err(os_error("landlock_create_ruleset"));
    }
    // SAFETY: a fresh descriptor, owned from here on.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    for (path, rights) in rules {
        let Ok(c) = std::ffi::CString::new(path.as_str()) else { continue };
        // SAFETY: open with O_PATH of a NUL-terminated path; the result is checked.
        let p = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if p < 0 {
            continue;
        }
        // SAFETY: the descriptor was just opened and is owned here.
        let p = unsafe { OwnedFd::from_raw_fd(p) };
        let is_dir = std::fs::metadata(path).is_ok_and(|m| m.is_dir());
        let allowed = rights & handled & if is_dir { u64::MAX } else { FILE_RIGHTS };
        if allowed == 0 {
            continue;
        }
        let rule = PathBeneathAttr { allowed_access: allowed, parent_fd: p.as_raw_fd() };
        // SAFETY: the ruleset and the path's descriptor are open; the attribute is valid for the call.
        let r = unsafe { libc::syscall(SYS_ADD_RULE, ruleset.as_raw_fd(), RULE_PATH_BENEATH, &rule, 0u32) };
        if r < 0 {
            return Err(os_error(&format!("landlock_add_rule {path}")));
        }
    }
    // SAFETY: the ruleset is open; NO_NEW_PRIVS is set (sandbox::detach).
    if unsafe { libc::syscall(SYS_RESTRICT_SELF, ruleset.as_raw_fd(), 0u32) } < 0 {
        return Err(os_error("landlock_restrict_self"));
    }
    Ok(())
}

fn os_error(what: &str) -> Error {
    Error::Internal(format!("backend worker sandbox: {what}: {}", std::io::Error::last_os_error()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_right_is_handled_for_the_abi() {
        assert_eq!(handled(1), 0x1fff);
        assert_eq!(handled(2), 0x3fff);
        assert_eq!(handled(4), 0x7fff);
        assert_eq!(handled(7), 0xffff);
    }
}
