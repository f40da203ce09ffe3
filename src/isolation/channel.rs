//! The worker's channel: a Unix SOCK_SEQPACKET pair (the worker's stdin). It carries the worker's hello and,
//! from Redis, one lane descriptor per message; requests themselves go through the lanes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::lane::os_error;
use crate::error::Result;

/// A connected pair: (Redis's end, the worker's end). Redis's end is close-on-exec, so that no other program
/// Redis starts holds it.
pub fn pair() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(os_error("socketpair"));
    }
    // SAFETY: two fresh descriptors, owned from here on.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one message, with `fd` attached when given.
pub fn send(sock: &OwnedFd, bytes: &[u8], fd: Option<&OwnedFd>) -> Result<()> {
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // Room for one descriptor's control message, aligned as cmsghdr needs.
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; every pointer in it points to a live local for the call; CMSG_* compute
    // offsets within `control`, which is large enough for one descriptor.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, fd.as_raw_fd());
        }
        if libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(os_error("sendmsg"));
        }
    }
    Ok(())
}

/// Receives one message into `buf`: its length and the descriptor it carried; `None` at the end of the channel.
fn receive_into(sock: &OwnedFd, buf: &mut [u8]) -> Result<Option<(usize, Option<OwnedFd>)>> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut control = [0u64; 4];
    // SAFETY: as in `send`; a descriptor the kernel passed is owned by us from here on (close-on-exec).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = loop {
            let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break n;
            }
        };
        if n < 0 {
            return Err(os_error("recvmsg"));
        }
        let mut fd = None;
        let c = libc::CMSG_FIRSTHDR(&msg);
        if !c.is_null() && (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
            fd = Some(OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const i32)));
        }
        if n == 0 && fd.is_none() {
            return Ok(None);
        }
        Ok(Some((n as usize, fd)))
    }
}

/// The next descriptor and the tag its message carried (what it is); `None` once Redis has closed the channel.
pub fn receive_fd(sock: &OwnedFd) -> Result<Option<(u8, OwnedFd)>> {
    let mut byte = [0u8; 1];
    loop {
        match receive_into(sock, &mut byte)? {
            None => return Ok(None),
            Some((_, Some(fd))) => return Ok(Some((byte[0], fd))),
            Some((_, None)) => continue,
        }
    }
}

/// One whole message (the worker's hello), waiting at most `timeout`.
pub fn receive(sock: &OwnedFd, timeout: std::time::Duration) -> Result<Option<Vec<u8>>> {
    let tv = libc::timeval { tv_sec: timeout.as_secs() as libc::time_t, tv_usec: timeout.subsec_micros() as _ };
    // SAFETY: setsockopt with a valid timeval for the call.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }
    let mut buf = vec![0u8; 64 * 1024];
    Ok(receive_into(sock, &mut buf)?.map(|(n, _)| {
        buf.truncate(n);
        buf
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_and_a_descriptor_cross() {
        let (a, b) = pair().unwrap();
        send(&a, b"hello", None).unwrap();
        assert_eq!(receive(&b, std::time::Duration::from_secs(1)).unwrap().unwrap(), b"hello");
        let lane = super::super::lane::Lane::create().unwrap();
        send(&a, b"L", Some(lane.fd())).unwrap();
        let (tag, fd) = receive_fd(&b).unwrap().unwrap();
        assert_eq!(tag, b'L');
        assert!(super::super::lane::Lane::open(fd).is_ok());
        drop(a);
        assert!(receive_fd(&b).unwrap().is_none(), "the end of the channel");
    }
}
