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

/// The bytes of a writable contiguous buffer (bytearray, a writable memoryview, numpy array), to fill
/// without a copy. Taking the buffer mutably makes the slice the only Rust access to its bytes for
/// as long as it lives; the buffer stays exported (alive, unresized) as long.
pub(crate) fn contiguous_mut<'a>(buf: &'a mut PyBuffer<u8>, what: &str) -> PyResult<&'a mut [u8]> {
    if buf.readonly() || !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("{what} must be a writable contiguous buffer")));
    }
    // SAFETY: a writable C-contiguous buffer of item size 1 of len_bytes(), borrowed mutably here
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.buf_ptr() as *mut u8, buf.len_bytes()) })
}
