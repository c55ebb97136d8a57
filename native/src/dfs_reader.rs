//! The client end of a block read in native code: after the Python client has sent `read_block`,
//! the datanode's reply -- `data` packets (a checksum per chunk, then the bytes), then `end` -- is
//! received straight into the caller's buffer and every chunk verified, the GIL released.
//!
//! Why native: the Python client took each packet through the interpreter, copied it out of the
//! transport's buffer, joined the packets and sliced the range out: four passes over every byte where
//! this makes one (the receive) beside the checksum. The messages are those of
//! `pytest_hpcnet/reference/dfs/wire.py`: a `data` header is `{"op":"data","start":S,"len":N,
//! "bpc":B,"checksum":K}`; packets start on chunk boundaries and follow each other without a gap, so
//! only the first and last packet of a range may carry bytes outside it (those go through a scratch
//! buffer). It runs over any `Read`, so the tests drive it with bytes and the client with a `Link`
//! (the client uses it over tcp: over the native verbs end it works, but measured no faster).

use std::io::{self, Read};
use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;

use crate::checksum::{self, Kind, Mismatch};
use crate::dfs_wire::{split_message, MAX_HEADER, MAX_MESSAGE};
use crate::link::Link;

/// Why a read did not fill the range.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadFailure {
    /// The datanode answered with an error, or ended short: the reply was read whole, so the
    /// connection is still in step.
    Refused(String),
    /// A chunk did not match its checksum; the rest of the reply is unread.
    Checksum(String),
    /// The connection failed or the reply broke the protocol; it is out of step.
    Broken(String),
}

fn io_failure(e: io::Error) -> ReadFailure {
    ReadFailure::Broken(if e.kind() == io::ErrorKind::UnexpectedEof {
        "the datanode closed the connection".into()
    } else {
        e.to_string()
    })
}

fn field(h: &serde_json::Map<String, Value>, key: &str) -> Result<u64, ReadFailure> {
    h.get(key).and_then(Value::as_u64)
        .ok_or_else(|| ReadFailure::Broken(format!("data packet without a non-negative integer {key:?}")))
}

/// Receive the reply to `read_block(offset, out.len())` from `r` into `out`, every chunk verified;
/// `label` names the replica in messages ("block 7 on datanode node1").
pub fn read_range<R: Read>(r: &mut R, out: &mut [u8], offset: u64, label: &str) -> Result<(), ReadFailure> {
    let end = offset + out.len() as u64;
    let mut next: Option<u64> = None;      // where the next packet must start
    let (mut head, mut sums, mut scratch) = ([0u8; 8], Vec::new(), Vec::new());
    loop {
        r.read_exact(&mut head).map_err(io_failure)?;
        let n = u32::from_be_bytes(head[..4].try_into().unwrap()) as usize;
        let h = u32::from_be_bytes(head[4..].try_into().unwrap()) as usize;
        if n > MAX_MESSAGE || n < 4 || h > MAX_HEADER || h > n - 4 {
            return Err(ReadFailure::Broken(format!("impossible reply frame ({n} bytes, header {h})")));
        }
        let mut message = vec![0u8; 4 + h];
        message[..4].copy_from_slice(&head[4..]);
        r.read_exact(&mut message[4..]).map_err(io_failure)?;
        let (header, _) = split_message(&message).map_err(ReadFailure::Broken)?;
        let payload = n - 4 - h;
        match header.get("op").and_then(Value::as_str) {
            Some("end") if payload == 0 => {
                let covered = next.unwrap_or(offset);
                if covered < end && !out.is_empty() {
                    return Err(ReadFailure::Refused(format!(
                        "{label} returned {} of {} bytes", covered.saturating_sub(offset), out.len())));
                }
                return Ok(());
            }
            Some("error") if payload == 0 => {
                let reason = header.get("reason").and_then(Value::as_str).unwrap_or("read failed");
                return Err(ReadFailure::Refused(reason.to_string()));
            }
            Some("data") => {}
            _ => return Err(ReadFailure::Broken(format!("unexpected reply {}",
                                                        String::from_utf8_lossy(&message[4..4 + h.min(80)])))),
        }
        let (start, len, bpc) = (field(&header, "start")?, field(&header, "len")?, field(&header, "bpc")?);
        let kind_name = header.get("checksum").and_then(Value::as_str).unwrap_or("crc32c");
        let kind = Kind::parse(kind_name)
            .ok_or_else(|| ReadFailure::Broken(format!("unknown checksum type {:?}", &kind_name[..kind_name.len().min(40)])))?;
        if bpc == 0 || bpc > MAX_MESSAGE as u64 || len > payload as u64 {
            return Err(ReadFailure::Broken(format!("data packet of {len} bytes with {bpc} bytes per checksum")));
        }
        let (len, bpc) = (len as usize, bpc as usize);
        if payload != len + 4 * checksum::chunks(len, bpc) {
            return Err(ReadFailure::Broken(format!("data packet of {len} bytes carries {} checksum bytes",
                                                   payload - len)));
        }
        let expected = next.unwrap_or(offset - offset % bpc as u64);
        if start != expected || len == 0 {
            return Err(ReadFailure::Broken(format!("{label}: a {len}-byte packet at {start} where {expected} was due")));
        }
        sums.resize(payload - len, 0);
        r.read_exact(&mut sums).map_err(io_failure)?;
        let stop = start + len as u64;
        let inside = start >= offset && stop <= end;
        let data: &mut [u8] = if inside {
            &mut out[(start - offset) as usize..(stop - offset) as usize]
        } else {
            scratch.resize(len, 0);
            &mut scratch[..]
        };
        r.read_exact(data).map_err(io_failure)?;
        if let Err(m) = checksum::verify(kind, data, &sums, bpc) {
            let at = match m {
                Mismatch::Chunk(i) => start + (i * bpc) as u64,
                Mismatch::Count { .. } => start,
            };
            return Err(ReadFailure::Checksum(format!("{label}: checksum mismatch in the chunk at byte {at} ({} per {bpc} bytes)",
                                                     kind.label())));
        }
        if !inside {
            let (lo, hi) = (start.max(offset), stop.min(end));
            if lo < hi {
                out[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&scratch[(lo - start) as usize..(hi - start) as usize]);
            }
        }
        next = Some(stop);
    }
}

/// Receive the reply to a `read_block` request just sent on `endpoint` (a tcp socket's descriptor or
/// a native `VerbsConnection`) into the writable buffer `into`, which covers the block's bytes from
/// `offset`. None when every byte came and verified; else `(kind, one-line reason)` with kind
/// `refused` (the datanode's error; the connection is in step), `checksum` or `broken` (it is not).
#[pyfunction]
#[pyo3(signature = (endpoint, into, offset, label, timeout=60.0))]
fn read_block_into(py: Python<'_>, endpoint: &Bound<'_, PyAny>, into: PyBuffer<u8>, offset: u64, label: String,
                   timeout: f64) -> PyResult<Option<(&'static str, String)>> {
    let limit = Duration::try_from_secs_f64(timeout)
        .map_err(|_| PyValueError::new_err(format!("bad timeout {timeout}")))?;
    if into.readonly() || !into.is_c_contiguous() {
        return Err(PyValueError::new_err("into must be a writable contiguous buffer"));
    }
    let mut link = Link::from_python(endpoint, limit)?;
    // SAFETY: a writable C-contiguous byte buffer, exported (alive, unresized) while `into` lives.
    let target = unsafe { std::slice::from_raw_parts_mut(into.buf_ptr() as *mut u8, into.len_bytes()) };
    let result = py.allow_threads(move || read_range(&mut link, target, offset, &label));
    Ok(match result {
        Ok(()) => None,
        Err(ReadFailure::Refused(m)) => Some(("refused", m)),
        Err(ReadFailure::Checksum(m)) => Some(("checksum", m)),
        Err(ReadFailure::Broken(m)) => Some(("broken", m)),
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_block_into, m)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dfs_wire::encode_frame;

    fn data_frame(start: u64, data: &[u8], bpc: usize, kind: Kind) -> Vec<u8> {
        frame_claiming(start, data, bpc, bpc, kind)
    }

    /// A data frame whose header claims `claimed` bytes per checksum, its sums taken per `bpc`.
    fn frame_claiming(start: u64, data: &[u8], bpc: usize, claimed: usize, kind: Kind) -> Vec<u8> {
        let header = serde_json::to_vec(&serde_json::json!(
            {"op": "data", "start": start, "len": data.len(), "bpc": claimed, "checksum": kind.label().to_lowercase()})).unwrap();
        let mut sums = Vec::new();
        checksum::sums_into(kind, data, bpc, &mut sums);
        let n = 4 + header.len() + sums.len() + data.len();
        let mut f = Vec::new();
        f.extend_from_slice(&(n as u32).to_be_bytes());
        f.extend_from_slice(&(header.len() as u32).to_be_bytes());
        f.extend_from_slice(&header);
        f.extend_from_slice(&sums);
        f.extend_from_slice(data);
        f
    }

    /// The reply a datanode sends for [offset, offset+length) of `block`, in packets of `packet`.
    fn reply(block: &[u8], offset: usize, length: usize, packet: usize, bpc: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut pos = offset - offset % bpc;
        while pos < offset + length {
            let n = packet.min(block.len() - pos);
            out.extend(data_frame(pos as u64, &block[pos..pos + n], bpc, Kind::Crc32c));
            pos += n;
        }
        out.extend(encode_frame(&serde_json::json!({"op": "end"})));
        out
    }

    #[test]
    fn unaligned_ranges_come_back_whole() {
        let block: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for (offset, length) in [(0, 10_000), (1, 9_000), (513, 1), (700, 3_000), (9_999, 1), (4096, 0)] {
            let bytes = reply(&block, offset, length, 1024, 512);
            let mut out = vec![0u8; length];
            read_range(&mut bytes.as_slice(), &mut out, offset as u64, "b").unwrap();
            assert_eq!(out, &block[offset..offset + length], "{offset}+{length}");
        }
    }

    #[test]
    fn a_corrupt_chunk_is_named_and_an_error_reply_passed_on() {
        let block = vec![5u8; 4096];
        let mut bytes = reply(&block, 0, 4096, 2048, 512);
        let last = bytes.len() - 20 - 10;  // before the 20-byte end frame: the data's chunk at 3584
        bytes[last] ^= 1;
        let mut out = vec![0u8; 4096];
        let e = read_range(&mut bytes.as_slice(), &mut out, 0, "block 3").unwrap_err();
        assert_eq!(e, ReadFailure::Checksum("block 3: checksum mismatch in the chunk at byte 3584 (CRC32C per 512 bytes)".into()));
        let refused = encode_frame(&serde_json::json!({"op": "error", "reason": "no such block"}));
        assert_eq!(read_range(&mut refused.as_slice(), &mut out, 0, "b").unwrap_err(),
                   ReadFailure::Refused("no such block".into()));
    }

    #[test]
    fn hostile_replies_break_the_read() {
        let block = vec![1u8; 2048];
        let mut out = vec![0u8; 2048];
        let gap = [data_frame(0, &block[..512], 512, Kind::Crc32c), data_frame(1024, &block[1024..], 512, Kind::Crc32c)].concat();
        let short = reply(&block, 0, 1024, 1024, 512);
        let cases: [(&[u8], &str); 4] = [
            (&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0], "impossible"),
            (&gap, "where 512 was due"),
            (&short[..short.len() - 3], "closed"),
            (&frame_claiming(0, &block, 512, 0, Kind::Crc32c), "bytes per checksum"),
        ];
        for (bytes, want) in cases {
            match read_range(&mut &bytes[..], &mut out, 0, "b") {
                Err(ReadFailure::Broken(m)) => assert!(m.contains(want), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        let ended_early = reply(&block, 0, 1024, 1024, 512);
        assert_eq!(read_range(&mut ended_early.as_slice(), &mut out, 0, "b").unwrap_err(),
                   ReadFailure::Refused("b returned 1024 of 2048 bytes".into()));
    }
}
