//! One blocking byte stream of a block's write pipeline, over tcp or the native verbs end: what the
//! datanode's packet stream (`dfs.rs`) and the client's packet writer (`dfs_writer.rs`) read and
//! write. Both speak the same framed bytes on either; only waiting and cutting differ.
//!
//! On verbs, `shutdown` sets a flag (a verbs connection has no half-close) that the connection's
//! waits look at (`Conn::*_or_cut`), so it wakes a reader, or a writer waiting for credits, as
//! `shutdown(2)` wakes a socket's. The connection itself stays open: its Python owner closes it.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;

use crate::verbs::conn::Conn;
use crate::verbs_py::PyVerbsConnection;

/// A close-on-exec duplicate of a descriptor the caller owns; the copy is the caller's to close.
pub fn dup(fd: RawFd, what: &str) -> PyResult<RawFd> {
    // SAFETY: fcntl on a descriptor number; a bad one is an error, not undefined behaviour.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if copy < 0 {
        return Err(pyo3::exceptions::PyOSError::new_err(format!("{what}: {}", io::Error::last_os_error())));
    }
    Ok(copy)
}

pub enum Link {
    Tcp(TcpStream),
    Verbs { conn: Arc<Conn>, timeout: Duration, cut: Arc<AtomicBool> },
}

impl Link {
    /// A link over `endpoint`: a tcp socket's descriptor (duplicated; the caller keeps its own) or a
    /// native `VerbsConnection` (shared; its owner closes it). Every wait ends after `timeout`.
    pub fn from_python(endpoint: &Bound<'_, PyAny>, timeout: Duration) -> PyResult<Link> {
        if let Ok(conn) = endpoint.downcast::<PyVerbsConnection>() {
            return Ok(Link::Verbs { conn: conn.get().conn.clone(), timeout, cut: Arc::default() });
        }
        let fd: RawFd = endpoint.extract().map_err(|_| pyo3::exceptions::PyTypeError::new_err(
            "a pipeline link is a tcp socket's descriptor or a native VerbsConnection"))?;
        // SAFETY: a fresh duplicate, owned by the TcpStream.
        let s = unsafe { TcpStream::from_raw_fd(dup(fd, "socket")?) };
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        s.set_nodelay(true)?;
        Ok(Link::Tcp(s))
    }

    /// Another handle on the same stream (one thread reads while another writes).
    pub fn try_clone(&self) -> io::Result<Link> {
        Ok(match self {
            Link::Tcp(s) => Link::Tcp(s.try_clone()?),
            Link::Verbs { conn, timeout, cut } => Link::Verbs { conn: conn.clone(), timeout: *timeout, cut: cut.clone() },
        })
    }

    /// Wake and fail every reader of this stream, and every writer waiting for room, in every handle
    /// (a responder waiting for an ack, a writer whose peer stopped reading).
    pub fn shutdown(&self) {
        match self {
            Link::Tcp(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            Link::Verbs { cut, .. } => cut.store(true, Ordering::SeqCst),
        }
    }
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Tcp(s) => s.read(buf),
            Link::Verbs { conn, timeout, cut } => conn.read_some_or_cut(buf, *timeout, cut),
        }
    }
}

impl Write for Link {
    /// On verbs the whole buffer goes in one call (one eager chunk or one rendezvous per frame).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Link::Tcp(s) => s.write(buf),
            Link::Verbs { conn, timeout, cut } => conn.write_all_or_cut(&[buf], *timeout, cut).map(|()| buf.len()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
