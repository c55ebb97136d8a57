//! The client end of a block read in native code: after the Python client has sent `read_block`,
//! the datanode's reply -- `data` packets (a checksum per chunk, then the bytes), then `end` -- is
//! received straight into the caller's buffer and every chunk verified, the GIL released: whole
//! (`read_block_into`, a positional read), or handed out piece by piece as a sequential reader asks
//! (`BlockReader`, one request per block; `pytest_hpcnet/reference/dfs/sequential.py`).
//!
//! Why native: the Python client took each packet through the interpreter, copied it out of the
//! transport's buffer, joined the packets and sliced the range out: four passes over every byte where
//! this makes one (the receive) beside the checksum. The messages are those of
//! `pytest_hpcnet/reference/dfs/wire.py`: a `data` header is `{"op":"data","start":S,"len":N,
//! "bpc":B,"checksum":K}`; packets start on chunk boundaries and follow each other without a gap.
//! A packet goes into the caller's buffer as far as it fits and the rest into `pending`, handed out
//! next; only the first packet, which may begin before the byte asked for, goes to `pending` whole.
//! It runs over any `Read`, so the tests drive it with bytes and the client with a `Link` (the client
//! uses it over tcp: over the native verbs end it works, but measured no faster).

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

/// One frame of a reply: a data packet's header fields, the end, or the datanode's error.
enum Frame {
    Data { start: u64, len: usize, bpc: usize, kind: Kind, sums: usize },
    End,
}

fn next_frame<R: Read>(r: &mut R) -> Result<Frame, ReadFailure> {
    let mut head = [0u8; 8];
    r.read_exact(&mut head).map_err(io_failure)?;
    let n = u32::from_be_bytes(head[..4].try_into().unwrap()) as usize;
    let h = u32::from_be_bytes(head[4..].try_into().unwrap()) as usize;
    if !(4..=MAX_MESSAGE).contains(&n) || h > MAX_HEADER || h > n - 4 {
        return Err(ReadFailure::Broken(format!("impossible reply frame ({n} bytes, header {h})")));
    }
    let mut message = vec![0u8; 4 + h];
    message[..4].copy_from_slice(&head[4..]);
    r.read_exact(&mut message[4..]).map_err(io_failure)?;
    let (header, _) = split_message(&message).map_err(ReadFailure::Broken)?;
    let payload = n - 4 - h;
    match header.get("op").and_then(Value::as_str) {
        Some("end") if payload == 0 => return Ok(Frame::End),
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
    if bpc == 0 || bpc > MAX_MESSAGE as u64 || len == 0 || len > payload as u64 {
        return Err(ReadFailure::Broken(format!("data packet of {len} bytes with {bpc} bytes per checksum")));
    }
    let (len, bpc) = (len as usize, bpc as usize);
    if payload != len + 4 * checksum::chunks(len, bpc) {
        return Err(ReadFailure::Broken(format!("data packet of {len} bytes carries {} checksum bytes", payload - len)));
    }
    Ok(Frame::Data { start, len, bpc, kind, sums: payload - len })
}

/// Verify the chunks of `a` followed by `b` (one packet's data, received into two places) against
/// `sums` without joining them: only the chunk that spans the two is copied. Err: the index of the
/// first chunk that differs.
fn verify_split(kind: Kind, a: &[u8], b: &[u8], sums: &[u8], bpc: usize) -> Result<(), usize> {
    let first_bad = |data: &[u8], from: usize| match checksum::verify(kind, data, &sums[4 * from..4 * (from + checksum::chunks(data.len(), bpc))], bpc) {
        Ok(()) => Ok(()),
        Err(Mismatch::Chunk(i)) => Err(from + i),
        Err(Mismatch::Count { .. }) => Err(from),
    };
    let whole = a.len() / bpc * bpc;
    first_bad(&a[..whole], 0)?;
    let mut index = whole / bpc;
    let mut b_from = 0;
    if whole < a.len() {
        b_from = (bpc - (a.len() - whole)).min(b.len());
        let joined = [&a[whole..], &b[..b_from]].concat();
        first_bad(&joined, index)?;
        index += 1;
    }
    first_bad(&b[b_from..], index)
}

/// A reply being received: where the reader is, where the next packet must start, and the part of
/// the last packet not handed out yet (a packet that did not fit, or began before the first byte
/// asked for, went through `pending`).
pub struct Stream {
    pos: u64,
    next: Option<u64>,
    pending: Vec<u8>,
    taken: usize,
    ended: bool,
    label: String,
    sums: Vec<u8>,
}

impl Stream {
    /// A stream whose first byte is the block's byte `offset`.
    pub fn new(offset: u64, label: &str) -> Stream {
        Stream { pos: offset, next: None, pending: Vec::new(), taken: 0, ended: false, label: label.into(), sums: Vec::new() }
    }

    /// The block offset of the next byte `fill` hands out.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Fill `out` from the stream, each packet verified before any of it is handed out; fewer bytes
    /// than `out` holds only when the datanode ended the reply.
    pub fn fill<R: Read>(&mut self, r: &mut R, out: &mut [u8]) -> Result<usize, ReadFailure> {
        let mut filled = self.take_pending(out);
        while filled < out.len() && !self.ended {
            let (start, len, bpc, kind, sums) = match next_frame(r)? {
                Frame::End => {
                    self.ended = true;
                    break;
                }
                Frame::Data { start, len, bpc, kind, sums } => (start, len, bpc, kind, sums),
            };
            let expected = self.next.unwrap_or(self.pos - self.pos % bpc as u64);
            if start != expected {
                return Err(ReadFailure::Broken(format!("{}: a {len}-byte packet at {start} where {expected} was due", self.label)));
            }
            self.sums.resize(sums, 0);
            r.read_exact(&mut self.sums).map_err(io_failure)?;
            let skip = (self.pos - start) as usize;           // > 0 only in the first packet
            // what fits goes straight into `out`, the rest of the packet into `pending`; a first
            // packet that begins before the position goes into `pending` whole
            let fit = if skip == 0 { len.min(out.len() - filled) } else { 0 };
            r.read_exact(&mut out[filled..filled + fit]).map_err(io_failure)?;
            self.pending.resize(len - fit, 0);
            r.read_exact(&mut self.pending).map_err(io_failure)?;
            if let Err(i) = verify_split(kind, &out[filled..filled + fit], &self.pending, &self.sums, bpc) {
                return Err(ReadFailure::Checksum(format!("{}: checksum mismatch in the chunk at byte {} ({} per {bpc} bytes)",
                                                         self.label, start + (i * bpc) as u64, kind.label())));
            }
            self.next = Some(start + len as u64);
            filled += fit;
            self.pos += fit as u64;
            self.taken = skip.min(self.pending.len());
            filled += self.take_pending(&mut out[filled..]);
        }
        Ok(filled)
    }

    fn take_pending(&mut self, out: &mut [u8]) -> usize {
        let n = (self.pending.len() - self.taken).min(out.len());
        out[..n].copy_from_slice(&self.pending[self.taken..self.taken + n]);
        self.taken += n;
        self.pos += n as u64;
        n
    }

    /// After the last byte wanted: the reply must end here (what is left of the last packet is the
    /// rest of its final chunk, dropped).
    pub fn finish<R: Read>(&mut self, r: &mut R) -> Result<(), ReadFailure> {
        if !self.ended {
            match next_frame(r)? {
                Frame::End => self.ended = true,
                Frame::Data { start, .. } => {
                    return Err(ReadFailure::Broken(format!("{}: a packet at {start} past the range asked for", self.label)));
                }
            }
        }
        Ok(())
    }
}

/// Receive the reply to `read_block(offset, out.len())` from `r` into `out`, every chunk verified;
/// `label` names the replica in messages ("block 7 on datanode node1").
pub fn read_range<R: Read>(r: &mut R, out: &mut [u8], offset: u64, label: &str) -> Result<(), ReadFailure> {
    let mut stream = Stream::new(offset, label);
    let filled = stream.fill(r, out)?;
    if filled < out.len() {
        return Err(ReadFailure::Refused(format!("{label} returned {filled} of {} bytes", out.len())));
    }
    stream.finish(r)
}

fn failure_tuple(f: ReadFailure) -> (&'static str, String) {
    match f {
        ReadFailure::Refused(m) => ("refused", m),
        ReadFailure::Checksum(m) => ("checksum", m),
        ReadFailure::Broken(m) => ("broken", m),
    }
}

fn seconds(timeout: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(timeout).map_err(|_| PyValueError::new_err(format!("bad timeout {timeout}")))
}

/// Receive the reply to a `read_block` request just sent on `endpoint` (a tcp socket's descriptor or
/// a native `VerbsConnection`) into the writable buffer `into`, which covers the block's bytes from
/// `offset`. None when every byte came and verified; else `(kind, one-line reason)` with kind
/// `refused` (the datanode's error; the connection is in step), `checksum` or `broken` (it is not).
#[pyfunction]
#[pyo3(signature = (endpoint, into, offset, label, timeout=60.0))]
fn read_block_into(py: Python<'_>, endpoint: &Bound<'_, PyAny>, mut into: PyBuffer<u8>, offset: u64,
                   label: String, timeout: f64) -> PyResult<Option<(&'static str, String)>> {
    let mut link = Link::from_python(endpoint, seconds(timeout)?)?;
    let target = crate::pybuf::contiguous_mut(&mut into, "into")?;
    let result = py.allow_threads(move || read_range(&mut link, target, offset, &label));
    Ok(result.err().map(failure_tuple))
}

/// A sequential reader of one `read_block` reply, the request (from `offset` to wherever it ends)
/// just sent on `endpoint`: `readinto` hands out its bytes in order, every packet verified first, as
/// HDFS's block reader serves a sequential read from one request. After a failure it hands out
/// nothing more: the connection is out of step (close it).
#[pyclass(frozen, name = "BlockReader", module = "pytest_hpcnet_native._native")]
pub struct PyBlockReader {
    state: std::sync::Mutex<ReaderState>,
}

/// The connection, its framing state, and why it is out of step (what, detail) once it is.
type ReaderState = (Link, Stream, Option<(&'static str, String)>);

#[pymethods]
impl PyBlockReader {
    #[new]
    #[pyo3(signature = (endpoint, offset, label, timeout=60.0))]
    fn new(endpoint: &Bound<'_, PyAny>, offset: u64, label: String, timeout: f64) -> PyResult<Self> {
        let link = Link::from_python(endpoint, seconds(timeout)?)?;
        Ok(PyBlockReader { state: std::sync::Mutex::new((link, Stream::new(offset, &label), None)) })
    }

    /// Fill `into` with the next bytes: `(count, None)`, a short count only at the reply's end; or
    /// `(count, (kind, reason))` when the reply failed after `count` good bytes (kinds as
    /// `read_block_into`'s).
    fn readinto(&self, py: Python<'_>, mut into: PyBuffer<u8>) -> PyResult<(usize, Option<(&'static str, String)>)> {
        let target = crate::pybuf::contiguous_mut(&mut into, "into")?;
        py.allow_threads(|| {
            let mut guard = self.state.lock().unwrap();
            let (link, stream, failed) = &mut *guard;
            if let Some(f) = failed {
                return Ok((0, Some(f.clone())));
            }
            // a failure mid-fill still hands out the verified bytes before it (`pos` moves only past them)
            let before = stream.position();
            match stream.fill(link, target) {
                Ok(n) => Ok((n, None)),
                Err(e) => {
                    let f = failure_tuple(e);
                    *failed = Some(f.clone());
                    Ok(((stream.position() - before) as usize, Some(f)))
                }
            }
        })
    }

    /// After the last byte of the range: read the reply's end, so the connection is left in step
    /// (None) or, if something else came, `(kind, reason)` (close it).
    fn finish(&self, py: Python<'_>) -> Option<(&'static str, String)> {
        py.allow_threads(|| {
            let mut guard = self.state.lock().unwrap();
            let (link, stream, failed) = &mut *guard;
            if failed.is_some() {
                return failed.clone();
            }
            stream.finish(link).err().map(failure_tuple)
        })
    }

    /// The block offset of the next byte `readinto` hands out.
    #[getter]
    fn position(&self) -> u64 {
        self.state.lock().unwrap().1.position()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_block_into, m)?)?;
    m.add_class::<PyBlockReader>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dfs_wire::{encode_frame, start_frame};

    fn data_frame(start: u64, data: &[u8], bpc: usize, kind: Kind) -> Vec<u8> {
        frame_claiming(start, data, bpc, bpc, kind)
    }

    /// A data frame whose header claims `claimed` bytes per checksum, its sums taken per `bpc`.
    fn frame_claiming(start: u64, data: &[u8], bpc: usize, claimed: usize, kind: Kind) -> Vec<u8> {
        let mut f = Vec::new();
        start_frame(&mut f, &serde_json::json!(
            {"op": "data", "start": start, "len": data.len(), "bpc": claimed, "checksum": kind.name()}),
            4 * checksum::chunks(data.len(), bpc) + data.len());
        checksum::sums_into(kind, data, bpc, &mut f);
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
    fn a_stream_hands_out_a_reply_in_pieces_of_any_size() {
        let block: Vec<u8> = (0..20_000u32).map(|i| (i * 13 % 253) as u8).collect();
        for (offset, piece) in [(0usize, 1000usize), (777, 4096), (5, 1), (1024, 20_000), (19_999, 7)] {
            let bytes = reply(&block, offset, block.len() - offset, 3072, 512);
            let (mut r, mut stream, mut got) = (bytes.as_slice(), Stream::new(offset as u64, "b"), Vec::new());
            let mut buf = vec![0u8; piece];
            loop {
                let n = stream.fill(&mut r, &mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
                assert_eq!(stream.position(), (offset + got.len()) as u64);
                if n < piece {
                    break;
                }
            }
            assert_eq!(got, &block[offset..], "{offset} in pieces of {piece}");
            assert!(r.is_empty());
        }
    }

    #[test]
    fn a_corrupt_chunk_split_between_the_buffer_and_the_rest_is_caught() {
        let block = vec![9u8; 4096];
        for (at, piece, chunk) in [(1000usize, 700usize, 512u64), (100, 700, 0), (1500, 700, 1024)] {
            let mut bytes = reply(&block, 0, 4096, 2048, 512);
            let first_data = bytes.windows(4).position(|w| w == [9, 9, 9, 9]).unwrap();
            bytes[first_data + at] ^= 1;
            let mut stream = Stream::new(0, "b");
            let mut out = vec![0u8; piece];
            match stream.fill(&mut bytes.as_slice(), &mut out) {
                Err(ReadFailure::Checksum(m)) => assert!(m.contains(&format!("chunk at byte {chunk} ")), "{m}"),
                other => panic!("{other:?}"),
            }
            assert_eq!(stream.position(), 0);
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
