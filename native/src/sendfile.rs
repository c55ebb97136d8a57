//! Zero-copy serving of a file range over a tcp socket (`sendfile(2)`): the shuffle server's map
//! output segments go from the page cache to the socket without passing through user space
//! (`pytest_hpcnet/reference/mapreduce/engine/shuffle.py`, tcp without one-sided reads).

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyOSError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;

use crate::blocking::{send_all, Failure};

/// Send `header`, then `length` bytes of `file` from `offset`, on the connected socket `sock`, the
/// GIL released. Returns the bytes of the file sent (all of them, or an error: OSError when the file
/// is shorter than promised or the peer went away, TimeoutError past `timeout` seconds).
#[pyfunction]
#[pyo3(signature = (sock, file, offset, length, header=b"".as_slice(), timeout=60.0))]
fn send_file(py: Python<'_>, sock: RawFd, file: RawFd, offset: u64, length: u64, header: &[u8], timeout: f64)
             -> PyResult<u64> {
    let limit = Duration::try_from_secs_f64(timeout)
        .map_err(|_| PyValueError::new_err(format!("bad timeout {timeout}")))?;
    let offset = libc::off_t::try_from(offset).map_err(|_| PyValueError::new_err("offset out of range"))?;
    let header = header.to_vec();
    let result = py.allow_threads(move || send_range(sock, &header, file, offset, length, Instant::now() + limit));
    result.map(|()| length).map_err(|f| match f {
        Failure::Timeout => PyTimeoutError::new_err(format!("sendfile: {}", f.text())),
        Failure::Closed(_) => PyOSError::new_err(format!("sendfile: {}", f.text())),
    })
}

/// `header`, then `length` bytes of `file` from `offset`, on `sock` (both the caller's for the call),
/// by `deadline`. A file shorter than the range is a failure: the frame it belonged to is cut.
pub(crate) fn send_range(sock: RawFd, header: &[u8], file: RawFd, offset: libc::off_t, length: u64,
                         deadline: Instant) -> Result<(), Failure> {
    send_all(sock, header, deadline)?;
    let mut off = offset;
    let mut left = length;
    while left > 0 {
        let chunk = left.min(1 << 30) as usize;
        // SAFETY: descriptors owned by the caller for the call; `off` is ours.
        let n = unsafe { libc::sendfile(sock, file, &mut off, chunk) };
        if n < 0 {
            if crate::blocking::retry(deadline) {
                continue;
            }
            return Err(Failure::last_os_error());
        }
        if n == 0 {
            return Err(Failure::Closed(format!("the file ended {left} bytes short of the range")));
        }
        left -= n as u64;
    }
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(send_file, m)?)
}
