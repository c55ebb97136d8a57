//! The reduce side of TeraSort in native code (issue 17): a k-way merge of key-sorted runs of
//! 100-byte records (10-byte keys, compared as unsigned bytes, as Hadoop's `Text.compareTo`), written
//! to a file descriptor in chunks or into a caller's buffer.
//!
//! Why native: the Python reduce concatenates the fetched segments, copies out the key columns,
//! argsorts them and gathers the records, so it touches three fresh arrays the size of its input.
//! On this project's VMs most of that time goes to faulting in and zeroing new pages, not to
//! comparing keys. Here the runs are read where they lie and the output goes out through one small
//! reusable chunk, so the only large memory is the fetched segments themselves.
//!
//! The order is the Python reduce's (`merge_runs` in `engine/worker.py`): by key, and among equal
//! keys by run (map order), then by position in the run -- the stable sort of the concatenation.
//! A run that is not key-sorted is an error (a corrupt segment), not something to sort quietly.

use std::io;
use std::os::fd::RawFd;
use std::collections::BinaryHeap;
use std::cmp::Reverse;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::pybuf::contiguous;

pub const RECORD: usize = 100;
/// Output goes to the descriptor in writes of this size (a few, not one per record).
const CHUNK: usize = 1 << 20;
/// The run index lives in the low bits of the heap entry, under the key.
const RUN_BITS: u32 = 48;

#[derive(Debug, PartialEq, Eq)]
pub enum MergeError {
    /// Run `run` is `bytes` long: not a whole number of records.
    Length { run: usize, bytes: usize },
    /// Record `record` of run `run` has a smaller key than the one before it.
    Unsorted { run: usize, record: usize },
    TooManyRuns(usize),
    Io(String),
}

impl std::fmt::Display for MergeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MergeError::Length { run, bytes } => {
                write!(f, "run {run} is {bytes} bytes, not a whole number of {RECORD}-byte records")
            }
            MergeError::Unsorted { run, record } => {
                write!(f, "run {run} is not key-sorted: record {record} has a smaller key than the one before")
            }
            MergeError::TooManyRuns(n) => write!(f, "{n} runs is more than a merge takes"),
            MergeError::Io(e) => write!(f, "writing the merged records failed: {e}"),
        }
    }
}

/// The 10-byte key (as big-endian high 8 and low 2 bytes) above the run index: comparing two entries
/// compares keys as unsigned bytes, then runs.
#[inline]
fn entry(record: &[u8], run: usize) -> u128 {
    let hi = u64::from_be_bytes(record[0..8].try_into().unwrap());
    let lo = u16::from_be_bytes([record[8], record[9]]);
    ((hi as u128) << 64) | ((lo as u128) << RUN_BITS) | run as u128
}

#[inline]
fn key_of(e: u128) -> u128 {
    e >> RUN_BITS
}

/// Merges the runs, handing every record to `emit` in order; the number of records.
pub fn merge(runs: &[&[u8]], mut emit: impl FnMut(&[u8]) -> Result<(), MergeError>) -> Result<u64, MergeError> {
    if runs.len() as u64 >= 1u64 << RUN_BITS {
        return Err(MergeError::TooManyRuns(runs.len()));
    }
    for (run, data) in runs.iter().enumerate() {
        if data.len() % RECORD != 0 {
            return Err(MergeError::Length { run, bytes: data.len() });
        }
    }
    let mut next = vec![0usize; runs.len()];          // byte offset of each run's next record
    let mut heap: BinaryHeap<Reverse<u128>> = runs.iter().enumerate()
        .filter(|(_, d)| !d.is_empty())
        .map(|(run, d)| Reverse(entry(&d[..RECORD], run)))
        .collect();
    let mut count = 0u64;
    while let Some(mut top) = heap.peek_mut() {
        let Reverse(e) = *top;
        let run = (e & ((1u128 << RUN_BITS) - 1)) as usize;
        let data = runs[run];
        let at = next[run];
        emit(&data[at..at + RECORD])?;
        count += 1;
        let after = at + RECORD;
        next[run] = after;
        if after < data.len() {
            let following = entry(&data[after..after + RECORD], run);
            if key_of(following) < key_of(e) {
                return Err(MergeError::Unsorted { run, record: after / RECORD });
            }
            *top = Reverse(following);         // sifts down when `top` goes out of scope
        } else {
            std::collections::binary_heap::PeekMut::pop(top);
        }
    }
    Ok(count)
}

/// Merges into `out` (exactly the runs' total length).
pub fn merge_into(runs: &[&[u8]], out: &mut [u8]) -> Result<u64, MergeError> {
    let total: usize = runs.iter().map(|r| r.len()).sum();
    if out.len() != total {
        return Err(MergeError::Io(format!("the output buffer is {} bytes, the runs {total}", out.len())));
    }
    let mut at = 0;
    merge(runs, |rec| {
        out[at..at + RECORD].copy_from_slice(rec);
        at += RECORD;
        Ok(())
    })
}

fn write_all(fd: RawFd, mut data: &[u8]) -> Result<(), MergeError> {
    while !data.is_empty() {
        // SAFETY: a valid slice; the caller owns the descriptor for the duration of the call.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(MergeError::Io(e.to_string()));
        }
        data = &data[n as usize..];
    }
    Ok(())
}

/// Merges onto the descriptor `fd` (a file opened for writing), in chunks of `CHUNK` bytes.
pub fn merge_to_fd(runs: &[&[u8]], fd: RawFd) -> Result<u64, MergeError> {
    let mut chunk: Vec<u8> = Vec::with_capacity(CHUNK);
    let count = merge(runs, |rec| {
        chunk.extend_from_slice(rec);
        if chunk.len() + RECORD > CHUNK {
            write_all(fd, &chunk)?;
            chunk.clear();
        }
        Ok(())
    })?;
    write_all(fd, &chunk)?;
    Ok(count)
}

// -- the Python face ---------------------------------------------------------------------------------

fn py_err(e: MergeError) -> PyErr {
    match e {
        MergeError::Io(m) => PyOSError::new_err(m),
        other => PyValueError::new_err(other.to_string()),
    }
}

fn views(bufs: &[PyBuffer<u8>]) -> PyResult<Vec<&[u8]>> {
    bufs.iter().enumerate().map(|(i, b)| contiguous(b, &format!("run {i}"))).collect()
}

/// Merge key-sorted runs of 100-byte TeraSort records (bytes-like, in map order) onto the open file
/// descriptor `fd`, the GIL released; the number of records. ValueError names a run that is not a
/// whole number of records or not sorted; OSError a failed write.
#[pyfunction]
fn merge_records_to_fd(py: Python<'_>, runs: Vec<PyBuffer<u8>>, fd: RawFd) -> PyResult<u64> {
    let slices = views(&runs)?;
    py.allow_threads(|| merge_to_fd(&slices, fd)).map_err(py_err)
}

/// Merge key-sorted runs into the writable buffer `out` (exactly their total length); the number of
/// records. Same order and errors as `merge_records_to_fd`.
#[pyfunction]
fn merge_records_into(py: Python<'_>, runs: Vec<PyBuffer<u8>>, out: PyBuffer<u8>) -> PyResult<u64> {
    let slices = views(&runs)?;
    if out.readonly() || !out.is_c_contiguous() {
        return Err(PyValueError::new_err("out must be a writable contiguous buffer"));
    }
    // SAFETY: a writable C-contiguous byte buffer, exported (so alive and unresized) while `out` lives.
    let target = unsafe { std::slice::from_raw_parts_mut(out.buf_ptr() as *mut u8, out.len_bytes()) };
    let outside = |r: &&[u8]| {
        let (a, b) = (r.as_ptr() as usize, target.as_ptr() as usize);
        a < b + target.len() && b < a + r.len()
    };
    if slices.iter().any(outside) {
        return Err(PyValueError::new_err("out must not overlap the runs"));
    }
    py.allow_threads(|| merge_into(&slices, target)).map_err(py_err)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(merge_records_to_fd, m)?)?;
    m.add_function(wrap_pyfunction!(merge_records_into, m)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: &[u8], tag: u8) -> Vec<u8> {
        assert_eq!(key.len(), 10);
        let mut r = key.to_vec();
        r.resize(RECORD, tag);
        r
    }

    fn merged(runs: &[Vec<u8>]) -> Result<Vec<u8>, MergeError> {
        let slices: Vec<&[u8]> = runs.iter().map(|r| r.as_slice()).collect();
        let mut out = vec![0u8; slices.iter().map(|s| s.len()).sum()];
        merge_into(&slices, &mut out).map(|_| out)
    }

    #[test]
    fn orders_by_unsigned_key_then_run() {
        let a = [rec(b"\x00aaaaaaaaa", 1), rec(b"\xffaaaaaaaaa", 1)].concat();
        let b = [rec(b"\x00aaaaaaaaa", 2), rec(b"\x00aaaaaaaab", 2), rec(b"\x80\x00\x00\x00\x00\x00\x00\x00\x00\x00", 2)].concat();
        let out = merged(&[a, Vec::new(), b]).unwrap();
        let tags: Vec<u8> = out.chunks(RECORD).map(|r| r[RECORD - 1]).collect();
        assert_eq!(tags, vec![1, 2, 2, 2, 1]);      // equal keys: run 0 before run 2
        assert_eq!(&out[200..210], b"\x00aaaaaaaab");
    }

    #[test]
    fn low_key_bytes_decide_ties_of_the_high_eight() {
        let a = rec(b"kkkkkkkk\x01\x00", 1);
        let b = rec(b"kkkkkkkk\x00\xff", 2);
        let out = merged(&[a, b]).unwrap();
        assert_eq!(out[RECORD - 1], 2);
    }

    #[test]
    fn refuses_partial_records_and_unsorted_runs() {
        assert_eq!(merged(&[vec![0u8; 150]]), Err(MergeError::Length { run: 0, bytes: 150 }));
        let bad = [rec(b"bbbbbbbbbb", 0), rec(b"aaaaaaaaaa", 0)].concat();
        assert_eq!(merged(&[Vec::new(), bad]), Err(MergeError::Unsorted { run: 1, record: 1 }));
    }
}
