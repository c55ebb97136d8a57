//! Python buffers as Rust slices, for the functions that take bytes from Python without a copy.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The bytes of a contiguous buffer (bytes, bytearray, memoryview) without a copy. The buffer stays
/// exported (so alive and unresized) while `buf` lives.
pub(crate) fn contiguous<'a>(buf: &'a PyBuffer<u8>, what: &str) -> PyResult<&'a [u8]> {
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("{what} must be a contiguous buffer")));
    }
    // SAFETY: a C-contiguous buffer of item size 1 (PyBuffer<u8> checked the format) of len_bytes().
    Ok(unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) })
}
