//! Blocking socket I/O against a deadline, on descriptors the caller owns and set up with
//! SO_SNDTIMEO/SO_RCVTIMEO slices: a slice that elapses is tried again until the deadline, so a
//! stalled peer is a timeout, a gone one an error with the kernel's words. Used by the shuffle's
//! native serve (`sendfile.rs`) and fetch (`fetch.rs`).

use std::os::fd::RawFd;
use std::time::Instant;

/// Why a transfer stopped short.
pub(crate) enum Failure {
    Timeout,
    Closed(String),
}

impl Failure {
    /// The failure of a call that returned -1: a timeout where the slice ran out at the deadline.
    pub(crate) fn last_os_error() -> Self {
        let e = std::io::Error::last_os_error();
        if again(&e) { Failure::Timeout } else { Failure::Closed(e.to_string()) }
    }

    pub(crate) fn text(&self) -> String {
        match self {
            Failure::Timeout => "timed out".into(),
            Failure::Closed(why) => why.clone(),
        }
    }
}

/// A slice elapsed or a signal came: the call may be tried again.
pub(crate) fn again(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted)
}

/// Whether a call that returned -1 should be tried again (the deadline not reached yet).
pub(crate) fn retry(deadline: Instant) -> bool {
    again(&std::io::Error::last_os_error()) && Instant::now() < deadline
}

pub(crate) fn send_all(sock: RawFd, mut data: &[u8], deadline: Instant) -> Result<(), Failure> {
    while !data.is_empty() {
        // SAFETY: a valid slice; the caller owns the descriptor for the duration of the call.
        let n = unsafe { libc::send(sock, data.as_ptr().cast(), data.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            if retry(deadline) {
                continue;
            }
            return Err(Failure::last_os_error());
        }
        data = &data[n as usize..];
    }
    Ok(())
}
