//! A reducer's fetch of one shuffle segment over tcp in native code (issue 17): send the request
//! frame, read the reply's length and status, and receive the segment straight into the caller's
//! buffer (a slice of the one buffer the reduce allocated for all its segments), the GIL released.
//!
//! Why native: the Python transport receives a multi-megabyte reply in many `recv_into` calls, each
//! a trip through the interpreter while other reduces compete for the same two cores, then copies
//! it out of its pool buffer. The frames are the Python transport's (`transport/base.py`: a
//! big-endian u32 length, then the message; a reply's first byte is its status), so the server side
//! is unchanged: its `sendfile` replies land here.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::blocking::{send_all, Failure};

/// The longest error text a server may send (its requests are at most 64 KiB too).
const MAX_TEXT: usize = 64 * 1024;

fn recv_exact(sock: RawFd, buf: &mut [u8], deadline: Instant) -> Result<(), Failure> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: the unfilled tail of a valid buffer; the caller owns the descriptor.
        let n = unsafe { libc::recv(sock, buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n < 0 {
            if crate::blocking::retry(deadline) {
                continue;          // SO_RCVTIMEO slice elapsed: keep waiting until the deadline
            }
            return Err(Failure::last_os_error());
        }
        if n == 0 {
            return Err(Failure::Closed(format!("the server closed the connection {} bytes into a {}-byte read",
                                               got, buf.len())));
        }
        got += n as usize;
    }
    Ok(())
}

/// What came back: the status byte, the reply's body length, and (status != 0) its text.
type Reply = (u8, u64, Option<Vec<u8>>);

fn exchange(sock: RawFd, request: &[u8], into: &mut [u8], deadline: Instant) -> Result<Reply, Failure> {
    let mut frame = Vec::with_capacity(4 + request.len());
    frame.extend_from_slice(&(request.len() as u32).to_be_bytes());
    frame.extend_from_slice(request);
    send_all(sock, &frame, deadline)?;
    let mut head = [0u8; 5];
    recv_exact(sock, &mut head, deadline)?;
    let length = u32::from_be_bytes(head[..4].try_into().unwrap()) as u64;
    if length == 0 {
        return Err(Failure::Closed("the server sent an empty reply".into()));
    }
    let body = length - 1;
    let status = head[4];
    if status == 0 {
        if body == into.len() as u64 {
            recv_exact(sock, into, deadline)?;
        }
        return Ok((status, body, None));     // another length: the caller refuses it and hangs up
    }
    if body as usize > MAX_TEXT {
        return Ok((status, body, None));
    }
    let mut text = vec![0u8; body as usize];
    recv_exact(sock, &mut text, deadline)?;
    Ok((status, body, Some(text)))
}

/// Send one shuffle request (JSON bytes) on the connected, authenticated tcp socket `sock` and take
/// the reply: `(status, body_length, text)`. Status 0 with `body_length == len(into)`: the segment is
/// in `into`. Status 0 with another length: nothing more was read (the connection is out of step;
/// close it). Another status: `text` is the server's message (None if it was over 64 KiB; close
/// then too). TimeoutError past `timeout` seconds, OSError when the connection fails.
#[pyfunction]
#[pyo3(signature = (sock, request, into, timeout=60.0))]
fn fetch_segment_into<'py>(py: Python<'py>, sock: RawFd, request: &[u8], into: PyBuffer<u8>, timeout: f64)
                           -> PyResult<(u8, u64, Option<Bound<'py, PyBytes>>)> {
    let limit = Duration::try_from_secs_f64(timeout)
        .map_err(|_| PyValueError::new_err(format!("bad timeout {timeout}")))?;
    if into.readonly() || !into.is_c_contiguous() {
        return Err(PyValueError::new_err("into must be a writable contiguous buffer"));
    }
    // SAFETY: a writable C-contiguous byte buffer, exported (alive, unresized) while `into` lives.
    let target = unsafe { std::slice::from_raw_parts_mut(into.buf_ptr() as *mut u8, into.len_bytes()) };
    let request = request.to_vec();
    let result = py.allow_threads(move || exchange(sock, &request, target, Instant::now() + limit));
    match result {
        Ok((status, body, text)) => Ok((status, body, text.map(|t| PyBytes::new(py, &t)))),
        Err(Failure::Timeout) => Err(PyTimeoutError::new_err("shuffle fetch: timed out")),
        Err(Failure::Closed(m)) => Err(PyOSError::new_err(format!("shuffle fetch: {m}"))),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fetch_segment_into, m)?)
}
