//! The map side of TeraSort in native code (issue 17): read a split's 100-byte records, sort them by
//! their 10-byte key, and spill them onto a file descriptor partition after partition, returning each
//! partition's size (the map output index is the Python side's).
//!
//! Why native: the numpy map copies the key columns out, argsorts them, gathers the records into a
//! new array and writes that, and each of those arrays is fresh memory (faulted in and zeroed) for
//! every map task. Here the split is read into a buffer this process keeps for its next map, the sort
//! is of 16-byte (key, position) entries in a second kept buffer, and the records go out through one
//! small chunk.
//!
//! The order is numpy's `key_order` (by key, equal keys in input order); partition r holds the keys in
//! [point[r-1], point[r]) (`partition.partition`).

use std::os::fd::RawFd;
use std::sync::Mutex;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

const RECORD: usize = 100;
const KEY: usize = 10;
const CHUNK: usize = 1 << 20;
const POS_BITS: u32 = 48;

/// The buffers a map keeps for the next map of this process (records, sort entries).
static SCRATCH: Mutex<(Vec<u8>, Vec<u128>)> = Mutex::new((Vec::new(), Vec::new()));

/// The key, as big-endian high 8 and low 2 bytes, above `low` (the position, or 0 for a split point).
#[inline]
fn entry(key: &[u8], low: u64) -> u128 {
    let hi = u64::from_be_bytes(key[0..8].try_into().unwrap());
    let lo = u16::from_be_bytes([key[8], key[9]]);
    ((hi as u128) << 64) | ((lo as u128) << POS_BITS) | low as u128
}

/// Sorts `records` (whole records) by key, stable; the sorted entries (key above position).
pub fn sort_entries(records: &[u8], entries: &mut Vec<u128>) {
    entries.clear();
    entries.extend(records.chunks_exact(RECORD).enumerate().map(|(i, r)| entry(r, i as u64)));
    entries.sort_unstable();           // the position below the key makes equal keys keep input order
}

/// The partition sizes in records: partition r ends before the first entry whose key is >= point r.
pub fn partition_counts(entries: &[u128], points: &[u128]) -> Vec<usize> {
    let mut counts = Vec::with_capacity(points.len() + 1);
    let mut start = 0;
    for &p in points {
        let end = start + entries[start..].partition_point(|&e| e < p);
        counts.push(end - start);
        start = end;
    }
    counts.push(entries.len() - start);
    counts
}

fn write_all(fd: RawFd, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        // SAFETY: a valid slice; the caller owns the descriptor for the duration of the call.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        data = &data[n as usize..];
    }
    Ok(())
}

fn read_exact_at(fd: RawFd, buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: the unfilled tail of a valid buffer; the caller owns the descriptor.
        let n = unsafe { libc::pread(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got, offset as libc::off_t) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof,
                                           format!("the input ended {} bytes short", buf.len() - got)));
        }
        got += n as usize;
        offset += n as u64;
    }
    Ok(())
}

/// Reads `count` records at record `first` of `input`, sorts them, writes them to `out` partition by
/// partition; the partition sizes in bytes.
pub fn sort_and_spill(input: RawFd, first: u64, count: usize, points: &[u128], out: RawFd)
                      -> std::io::Result<Vec<u64>> {
    let mut scratch = SCRATCH.lock().unwrap_or_else(|p| p.into_inner());
    let (records, entries) = &mut *scratch;
    records.resize(count * RECORD, 0);     // a kept buffer: resized, its pages already faulted in
    read_exact_at(input, records, first * RECORD as u64)?;
    sort_entries(records, entries);
    let mut chunk: Vec<u8> = Vec::with_capacity(CHUNK);
    for e in entries.iter() {
        let at = (*e as u64 & ((1u64 << POS_BITS) - 1)) as usize * RECORD;
        chunk.extend_from_slice(&records[at..at + RECORD]);
        if chunk.len() + RECORD > CHUNK {
            write_all(out, &chunk)?;
            chunk.clear();
        }
    }
    write_all(out, &chunk)?;
    Ok(partition_counts(entries, points).into_iter().map(|n| (n * RECORD) as u64).collect())
}

// -- the Python face ---------------------------------------------------------------------------------

/// A TeraSort map's sort and spill: records `first .. first+count` of the open file `input`, sorted
/// by key (stable), written to the open file `out`; the byte size of each of the `len(split_points)+1`
/// partitions, in order. The GIL is released; the read and sort buffers are kept for the next call.
#[pyfunction]
fn terasort_sort_and_spill(py: Python<'_>, input: RawFd, first: u64, count: usize, split_points: Vec<Vec<u8>>,
                           out: RawFd) -> PyResult<Vec<u64>> {
    let mut points = Vec::with_capacity(split_points.len());
    for (i, p) in split_points.iter().enumerate() {
        if p.len() != KEY {
            return Err(PyValueError::new_err(format!("split point {i} is {} bytes, not {KEY}", p.len())));
        }
        points.push(entry(p, 0));
    }
    if points.windows(2).any(|w| w[0] > w[1]) {
        return Err(PyValueError::new_err("split points must be in non-decreasing order"));
    }
    if count as u64 >= 1u64 << POS_BITS {
        return Err(PyValueError::new_err(format!("{count} records is more than a map sorts")));
    }
    py.allow_threads(|| sort_and_spill(input, first, count, &points, out))
        .map_err(|e| PyOSError::new_err(format!("terasort map: {e}")))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(terasort_sort_and_spill, m)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: &[u8]) -> Vec<u8> {
        let mut r = key.to_vec();
        r.resize(RECORD, 7);
        r
    }

    #[test]
    fn stable_key_order_and_partitions() {
        let data = [rec(b"cccccccccc"), rec(b"aaaaaaaaaa"), rec(b"cccccccccc"), rec(b"bbbbbbbbbb")].concat();
        let mut entries = Vec::new();
        sort_entries(&data, &mut entries);
        let order: Vec<u64> = entries.iter().map(|e| *e as u64 & 0xffff).collect();
        assert_eq!(order, vec![1, 3, 0, 2]);
        // a key equal to a split point goes to the partition above it
        let points = [entry(b"bbbbbbbbbb", 0), entry(b"zzzzzzzzzz", 0)];
        assert_eq!(partition_counts(&entries, &points), vec![1, 3, 0]);
        assert_eq!(partition_counts(&entries, &[]), vec![4]);
    }
}
