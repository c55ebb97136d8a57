//! The block store's datanode packet pipeline in native code (issue 17), and the per-chunk checksum
//! functions, as Python sees them (`pytest_hpcnet/reference/dfs/native.py` wraps them).
//!
//! The Python datanode keeps what happens once per block: the credentials handshake, the write
//! request and its checks, connecting the next datanode, opening the replica files, and making the
//! replica final. It then hands the connections and files to a `BlockStream`, which runs the
//! per-packet work with the GIL released: `receive()` (this thread) reads, forwards, verifies and
//! writes packets (`dfs_wire::receive_packets`); at a middle node a responder thread relays the
//! downstream's acknowledgements upstream, and the tail acknowledges from this thread (`TailAcks`).
//! The connections are tcp sockets or native verbs ends (`link.rs`). The wire format is the Python
//! datanode's, so native and Python stages mix in one pipeline.

use std::fs::File;
use std::io::{BufReader, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::checksum::{self, Kind, Mismatch};
use crate::dfs_wire::{self, Ack, End, Stage};
use crate::link::{dup, Link};
use crate::pybuf::contiguous;

/// Read buffers: the upstream's packets, and the downstream's acknowledgements.
const RECV_BUFFER: usize = 256 * 1024;
const ACK_BUFFER: usize = 16 * 1024;

pub(crate) fn kind(name: &str) -> PyResult<Kind> {
    Kind::parse(name).ok_or_else(|| PyValueError::new_err(format!(
        "unknown checksum type {name:?}; choose crc32c or crc32")))
}

pub(crate) fn check_bpc(bpc: usize) -> PyResult<usize> {
    if bpc == 0 {
        return Err(PyValueError::new_err("bytes per checksum must be positive"));
    }
    Ok(bpc)
}

/// The checksums (4 bytes each, big-endian) of every `bpc`-byte chunk of `data`.
#[pyfunction]
#[pyo3(signature = (data, bpc=512, checksum="crc32c"))]
fn chunk_sums<'py>(py: Python<'py>, data: PyBuffer<u8>, bpc: usize, checksum: &str) -> PyResult<Bound<'py, PyBytes>> {
    let (k, bpc) = (kind(checksum)?, check_bpc(bpc)?);
    let data = contiguous(&data, "data")?;
    let mut out = Vec::new();
    py.allow_threads(|| checksum::sums_into(k, data, bpc, &mut out));
    Ok(PyBytes::new(py, &out))
}

/// The XOR of the CRC32Cs of every `bpc`-byte chunk of `data`, computed by the bare instruction
/// loop (`checksum::instruction_floor`): the floor the checksum gate measures `chunk_sums` against.
/// OSError where the CPU has no CRC32C instruction this loop can use.
#[pyfunction]
#[pyo3(signature = (data, bpc=512))]
fn crc32c_instruction_floor(py: Python<'_>, data: PyBuffer<u8>, bpc: usize) -> PyResult<u32> {
    let bpc = check_bpc(bpc)?;
    let data = contiguous(&data, "data")?;
    py.allow_threads(|| checksum::instruction_floor(data, bpc))
        .ok_or_else(|| PyOSError::new_err("this CPU has no SSE4.2 crc32 instruction (x86-64 only)"))
}

/// Whether `crc32c_instruction_floor` can run on this CPU.
#[pyfunction]
fn crc32c_instruction_floor_available() -> bool {
    checksum::instruction_floor(&[], 1).is_some()
}

/// Verifies `data` against `sums`: None when every chunk matches, else the index of the first
/// chunk that differs; ValueError when the number of checksums does not fit the data.
#[pyfunction]
#[pyo3(signature = (data, sums, bpc=512, checksum="crc32c"))]
fn first_bad_chunk(py: Python<'_>, data: PyBuffer<u8>, sums: PyBuffer<u8>, bpc: usize, checksum: &str)
                   -> PyResult<Option<usize>> {
    let (k, bpc) = (kind(checksum)?, check_bpc(bpc)?);
    let (data, sums) = (contiguous(&data, "data")?, contiguous(&sums, "checksums")?);
    match py.allow_threads(|| checksum::verify(k, data, sums, bpc)) {
        Ok(()) => Ok(None),
        Err(Mismatch::Chunk(i)) => Ok(Some(i)),
        Err(Mismatch::Count { have, want }) => Err(PyValueError::new_err(format!(
            "{have} checksum bytes for {} data bytes (expected {want})", data.len()))),
    }
}

/// The block-write floor (`dfs_floor`): `total` bytes through a bare verifying pipeline of `replicas`
/// receivers into `directory`, `packet` data bytes a packet; returns (wall seconds, sender CPU seconds,
/// the receivers' CPU seconds). Its files are removed before it returns.
#[pyfunction]
#[pyo3(signature = (directory, total, packet=65536, bpc=512, checksum="crc32c", timeout=60.0, replicas=1))]
#[allow(clippy::too_many_arguments)]
fn block_write_floor(py: Python<'_>, directory: std::path::PathBuf, total: usize, packet: usize, bpc: usize,
                     checksum: &str, timeout: f64, replicas: usize) -> PyResult<(f64, f64, f64)> {
    if !(1..=16).contains(&replicas) {
        return Err(PyValueError::new_err(format!("the block-write floor takes 1 to 16 replicas, not {replicas}")));
    }
    run_floor(py, |d, t, p, b, k, w| crate::dfs_floor::write(d, t, p, b, k, replicas, w), "block-write",
              &directory, total, packet, bpc, checksum, timeout)
}

/// One floor run with its arguments checked, the GIL released; OSError naming the floor on failure.
#[allow(clippy::too_many_arguments)]
fn run_floor<F>(py: Python<'_>, floor: F, name: &str, directory: &std::path::Path, total: usize, packet: usize,
             bpc: usize, checksum: &str, timeout: f64) -> PyResult<(f64, f64, f64)>
where F: Send + FnOnce(&std::path::Path, usize, usize, usize, Kind, Duration) -> std::io::Result<crate::dfs_floor::Figures> {
    let (k, bpc) = (kind(checksum)?, check_bpc(bpc)?);
    if total == 0 || packet == 0 || !packet.is_multiple_of(bpc) {
        return Err(PyValueError::new_err(format!(
            "the {name} floor needs bytes and a packet of whole chunks (total {total}, packet {packet})")));
    }
    let timeout = positive_seconds(timeout, "timeout")?;
    let f = py.allow_threads(|| floor(directory, total, packet, bpc, k, timeout))
        .map_err(|e| PyOSError::new_err(format!("the {name} floor: {e}")))?;
    Ok((f.seconds, f.sender_cpu, f.receiver_cpu))
}

/// The block-read floor (`dfs_floor::read`): reads `total` bytes of a replica it writes into
/// `directory` first, `packet` bytes per packet; (wall seconds, sender CPU seconds, receiver CPU
/// seconds). Its files are removed before it returns.
#[pyfunction]
#[pyo3(signature = (directory, total, packet=1 << 20, bpc=512, checksum="crc32c", timeout=60.0))]
fn block_read_floor(py: Python<'_>, directory: std::path::PathBuf, total: usize, packet: usize, bpc: usize,
                    checksum: &str, timeout: f64) -> PyResult<(f64, f64, f64)> {
    run_floor(py, crate::dfs_floor::read, "block-read", &directory, total, packet, bpc, checksum, timeout)
}

/// `secs` as a timeout a socket accepts (finite, positive); ValueError naming `what` otherwise.
pub(crate) fn positive_seconds(secs: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs).ok().filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("bad {what} {secs}")))
}

struct Streams {
    up: Link,
    down: Option<Link>,
    data: File,
    meta: File,
}

/// One block's packet stream at one datanode (see the module comment).
#[pyclass(frozen, name = "BlockStream", module = "pytest_hpcnet_native._native")]
struct PyBlockStream {
    streams: Mutex<Option<Streams>>,
    acks: Mutex<Option<Sender<Ack>>>,
    responder: Mutex<Option<JoinHandle<()>>>,
    /// The tail's acknowledgements, kept for the last packet's (`finish`): a tail has no responder
    /// thread (see `TailAcks`).
    tail_acks: Mutex<Option<TailAcks>>,
    down_shutdown: Mutex<Option<Link>>,
    kind: Kind,
    bpc: usize,
    index: u64,
    offset: u64,
    label: String,
    prefix: Vec<u8>,
    sync_behind: u64,
}

#[pymethods]
impl PyBlockStream {
    /// `up`/`down` are the connections to the previous and next node (down = None: the tail), each a
    /// tcp socket's descriptor or a native `VerbsConnection` taken over at a message boundary;
    /// `data`/`meta` the replica's files positioned where the packets go. Descriptors are duplicated;
    /// the caller keeps and closes its own, and its connections.
    /// `prefix`: bytes of the upstream that the caller's connection already read past its last
    /// message (a peer that did not wait for the setup ack); they come first.
    /// `sync_behind`: every so many bytes of data written, start their writeback (0: never; see
    /// `WriteThrough`).
    #[new]
    #[pyo3(signature = (up, down, data, meta, bpc, checksum, index, offset, label, packet_timeout=60.0,
                        prefix=b"".as_slice(), sync_behind=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(up: &Bound<'_, PyAny>, down: Option<&Bound<'_, PyAny>>, data: RawFd, meta: RawFd, bpc: usize,
           checksum: &str, index: u64, offset: u64, label: String, packet_timeout: f64, prefix: &[u8],
           sync_behind: u64) -> PyResult<Self> {
        let (k, bpc) = (kind(checksum)?, check_bpc(bpc)?);
        let timeout = positive_seconds(packet_timeout, "packet timeout")?;
        let link = |end: &Bound<'_, PyAny>, what: &str| Link::from_python(end, timeout)
            .map_err(|e| PyOSError::new_err(format!("{label}: {what}: {e}")));
        let up_stream = link(up, "upstream")?;
        let down_stream = down.map(|d| link(d, "downstream")).transpose()?;
        // SAFETY: each fd is a fresh duplicate owned by the File it is given to.
        let data = unsafe { File::from_raw_fd(dup(data, "replica data file")?) };
        let meta = unsafe { File::from_raw_fd(dup(meta, "replica meta file")?) };
        let io = |e: std::io::Error| PyOSError::new_err(format!("{label}: {e}"));
        let down_shutdown = match &down_stream {
            Some(d) => Some(d.try_clone().map_err(io)?),
            None => None,
        };
        Ok(PyBlockStream {
            streams: Mutex::new(Some(Streams { up: up_stream, down: down_stream, data, meta })),
            acks: Mutex::new(None),
            responder: Mutex::new(None),
            tail_acks: Mutex::new(None),
            down_shutdown: Mutex::new(down_shutdown),
            kind: k, bpc, index, offset, label, prefix: prefix.to_vec(), sync_behind,
        })
    }

    /// Receive packets until the last one or an error, the GIL released. Returns
    /// (end, replica length, last seq or -1, message): end is "last" (the last packet is written;
    /// make the replica final, then call `finish(True)`), "checksum" (drop the replica), "downstream",
    /// "upstream" or "disk". Call once.
    fn receive(&self, py: Python<'_>) -> PyResult<(&'static str, u64, i64, String)> {
        let Streams { mut up, down, mut data, mut meta } = self.streams.lock().unwrap().take()
            .ok_or_else(|| PyValueError::new_err("receive() was called already"))?;
        let up_writer = up.try_clone().map_err(|e| PyOSError::new_err(format!("{}: {e}", self.label)))?;
        let stage = Stage { kind: self.kind, bpc: self.bpc, index: self.index, offset: self.offset, label: &self.label };
        let (end, length) = match down {
            None => {
                let (result, acks) = py.allow_threads(|| self.receive_as_tail(&stage, up, up_writer, &mut data, &mut meta));
                *self.tail_acks.lock().unwrap() = Some(acks);   // for the last packet's ack (`finish`)
                result
            }
            Some(d) => {
                let (tx, rx) = channel();
                let r = d.try_clone().map_err(|e| PyOSError::new_err(format!("{}: {e}", self.label)))?;
                let (label, next) = (self.label.clone(), self.index + 1);
                let handle = std::thread::Builder::new()
                    .name("dfs-responder".into())
                    .spawn(move || respond(rx, up_writer, Some(r), next, &label))
                    .map_err(|e| PyOSError::new_err(format!("{}: cannot start the responder: {e}", self.label)))?;
                *self.responder.lock().unwrap() = Some(handle);
                *self.acks.lock().unwrap() = Some(tx.clone());
                let mut down_writer = d;
                py.allow_threads(|| self.pump(&stage, &mut up, Some(&mut down_writer), &mut data, &mut meta, &mut |a: Ack| {
                    let _ = tx.send(a);
                }))
            }
        };
        Ok(match end {
            End::Last { seq } => ("last", length, seq, String::new()),
            End::Checksum(m) => ("checksum", length, -1, m),
            End::Downstream(m) => ("downstream", length, -1, m),
            End::Upstream(m) => ("upstream", length, -1, m),
            End::Disk(m) => ("disk", length, -1, m),
        })
    }

    /// After `receive()`: with `last_seq`, queue the last packet's acknowledgement (the replica is
    /// final) and wait for the responder to send it; without, let the responder send what is queued
    /// (an error ack waits for the acks before it) and stop; `abort` also cuts the downstream, so a
    /// responder waiting for the next node's ack stops at once. Then every descriptor this object
    /// holds is closed.
    #[pyo3(signature = (last_seq=None, timeout=60.0, abort=false))]
    fn finish(&self, py: Python<'_>, last_seq: Option<i64>, timeout: f64, abort: bool) {
        let tail_acks = self.tail_acks.lock().unwrap().take();
        if let (Some(mut acks), Some(seq)) = (tail_acks, last_seq) {
            acks.queue(Ack::Ok { seq, last: true });
            py.allow_threads(|| acks.flush());
        }
        let tx = self.acks.lock().unwrap().take();
        if let Some(tx) = tx {
            let _ = tx.send(match last_seq {
                Some(seq) => Ack::Ok { seq, last: true },
                None => Ack::Stop,
            });
        }
        if abort {
            if let Some(d) = self.down_shutdown.lock().unwrap().as_ref() {
                d.shutdown();   // a responder waiting on the next node's ack wakes
            }
        }
        let handle = self.responder.lock().unwrap().take();
        if let Some(h) = handle {
            let deadline = std::time::Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
            py.allow_threads(|| {
                while !h.is_finished() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if h.is_finished() {
                    let _ = h.join();
                }
            });
        }
        self.down_shutdown.lock().unwrap().take();
        self.streams.lock().unwrap().take();
    }
}

impl PyBlockStream {
    /// The tail's receive (no next node): the receiving thread acknowledges each packet itself once it
    /// is written, with no responder thread to hand it to. The acknowledgements gather in `TailAcks`
    /// and go up in one write whenever the thread is about to read from the upstream again, so the
    /// acks of packets that arrived together leave together, as the responder's do, and the thread
    /// never waits with an acknowledgement unsent. Why: a handoff per packet cost the tail a thread
    /// wake-up and two context switches, as much as its own work on a two-core host.
    /// Returns the stream's end and the acknowledgements' way upstream, kept for the last packet's.
    fn receive_as_tail(&self, stage: &Stage, mut up: Link, up_writer: Link, data: &mut File, meta: &mut File)
                       -> ((End, u64), TailAcks) {
        let acks = std::cell::RefCell::new(TailAcks { up: up_writer, out: Vec::new(), broken: false });
        let upstream = FlushFirst { inner: &mut up, acks: &acks };
        let result = self.pump(stage, upstream, None, data, meta, &mut |a: Ack| acks.borrow_mut().queue(a));
        let mut acks = acks.into_inner();
        acks.flush();
        (result, acks)
    }

    /// The packet loop over `up` (after the bytes the caller's connection read past its last message),
    /// buffered so that one read() system call takes several packets' bytes at once.
    fn pump<R: std::io::Read>(&self, stage: &Stage, up: R, down: Option<&mut Link>, data: &mut File, meta: &mut File,
                              acks: &mut dyn FnMut(Ack)) -> (End, u64) {
        let mut data_w = WriteThrough::new(data, self.offset, self.sync_behind);
        let mut meta_w = WriteThrough::new(meta, 0, 0);
        let mut reader = BufReader::with_capacity(RECV_BUFFER, std::io::Read::chain(self.prefix.as_slice(), up));
        dfs_wire::receive_packets(stage, &mut reader, down, &mut data_w, &mut meta_w, acks, &mut Vec::new())
    }
}

/// A tail's acknowledgements not yet written upstream. After a write fails (the upstream is gone)
/// nothing more is written; the next read from the upstream then fails too and ends the stream.
struct TailAcks {
    up: Link,
    out: Vec<u8>,
    broken: bool,
}

impl TailAcks {
    fn queue(&mut self, ack: Ack) {
        match ack {
            Ack::Ok { seq, .. } => self.out.extend_from_slice(&dfs_wire::ok_ack(seq)),
            Ack::Error { bad, reason } => self.out.extend_from_slice(&dfs_wire::error_ack(bad, &reason)),
            Ack::Stop => {}
        }
    }

    fn flush(&mut self) {
        if !self.out.is_empty() && !self.broken {
            self.broken = self.up.write_all(&self.out).is_err();
        }
        self.out.clear();
    }
}

/// The tail's upstream: every read first writes the acknowledgements gathered so far.
struct FlushFirst<'a> {
    inner: &'a mut Link,
    acks: &'a std::cell::RefCell<TailAcks>,
}

impl std::io::Read for FlushFirst<'_> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        self.acks.borrow_mut().flush();
        self.inner.read(b)
    }
}

/// `write_all` straight to the file (no user-space buffer: a packet is in the OS when it is acked,
/// as the Python BlockWriter promises). With `every` > 0, each time that many bytes were written
/// since the last time, their writeback is started (`sync_file_range` WRITE: queued, not waited
/// for), as HDFS's dfs.datanode.sync.behind.writes does: a replica synced on close then finds most
/// of its pages on their way to the disk instead of all of them dirty.
struct WriteThrough<'a> {
    file: &'a mut File,
    synced_to: u64,
    written_to: u64,
    every: u64,
}

impl<'a> WriteThrough<'a> {
    fn new(file: &'a mut File, at: u64, every: u64) -> Self {
        WriteThrough { file, synced_to: at, written_to: at, every }
    }
}

impl Write for WriteThrough<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(b)?;
        self.written_to += n as u64;
        if self.every > 0 && self.written_to - self.synced_to >= self.every {
            use std::os::fd::AsRawFd;
            let (start, len) = (self.synced_to as libc::off64_t, (self.written_to - self.synced_to) as libc::off64_t);
            // SAFETY: a valid descriptor and a range; a failure only means no early writeback
            unsafe { libc::sync_file_range(self.file.as_raw_fd(), start, len, libc::SYNC_FILE_RANGE_WRITE) };
            self.synced_to = self.written_to;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The responder: for each packet written here, wait for the next node's acknowledgement of it
/// (if there is a next node), then acknowledge it upstream. Errors go up as error acks, once.
/// Acknowledgements that are ready together go up in one write; they are written before the
/// responder waits for anything (the next ack from downstream, or the receiver).
fn respond(rx: Receiver<Ack>, mut up: Link, down: Option<Link>, next: u64, label: &str) {
    let mut buf = Vec::new();
    let mut down = down.map(|d| BufReader::with_capacity(ACK_BUFFER, d));
    let mut out: Vec<u8> = Vec::new();
    let flush = |out: &mut Vec<u8>, up: &mut Link| -> bool {
        let ok = out.is_empty() || up.write_all(out).is_ok();
        out.clear();
        ok
    };
    loop {
        let ack = match rx.try_recv() {
            Ok(a) => a,
            Err(_) => {
                if !flush(&mut out, &mut up) {
                    break;
                }
                match rx.recv() {
                    Ok(a) => a,
                    Err(_) => break,
                }
            }
        };
        match ack {
            Ack::Stop => break,
            Ack::Error { bad, reason } => {
                out.extend_from_slice(&dfs_wire::error_ack(bad, &reason));
                break;
            }
            Ack::Ok { seq, last } => {
                let relayed = match down.as_mut() {
                    None => Ok(()),
                    Some(d) => {
                        if d.buffer().is_empty() && !flush(&mut out, &mut up) {
                            break;
                        }
                        match dfs_wire::read_frame(d, &mut buf, dfs_wire::MAX_ACK) {
                            Ok(n) => dfs_wire::check_ack(&buf[4..4 + n], seq, next, label),
                            Err(e) => Err(dfs_wire::error_ack(next, &format!(
                                "{label} got no ack from the next datanode: {}", e.describe()))),
                        }
                    }
                };
                match relayed {
                    Ok(()) => {
                        out.extend_from_slice(&dfs_wire::ok_ack(seq));
                        if last {
                            break;
                        }
                    }
                    Err(frame) => {
                        out.extend_from_slice(&frame);
                        break;
                    }
                }
            }
        }
    }
    flush(&mut out, &mut up);
    if let Some(d) = down.as_ref() {
        d.get_ref().shutdown();
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(chunk_sums, m)?)?;
    m.add_function(wrap_pyfunction!(crc32c_instruction_floor, m)?)?;
    m.add_function(wrap_pyfunction!(crc32c_instruction_floor_available, m)?)?;
    m.add_function(wrap_pyfunction!(first_bad_chunk, m)?)?;
    m.add_function(wrap_pyfunction!(block_write_floor, m)?)?;
    m.add_function(wrap_pyfunction!(block_read_floor, m)?)?;
    m.add_class::<PyBlockStream>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek};

    #[test]
    fn write_through_writes_every_byte_and_starts_writeback_in_steps() {
        let path = std::env::temp_dir().join(format!("hpcnet-write-through-{}", std::process::id()));
        let mut file = File::options().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        {
            let mut w = WriteThrough::new(&mut file, 0, 4096);
            for _ in 0..5 {
                w.write_all(&[7u8; 1500]).unwrap();
            }
            // writeback started once 4096 bytes were unsynced (at 4500); the last 3000 wait for the
            // close's sync
            assert_eq!((w.written_to, w.synced_to), (7500, 4500));
        }
        let mut back = Vec::new();
        file.rewind().unwrap();
        file.read_to_end(&mut back).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(back, vec![7u8; 7500]);
    }

    #[test]
    fn a_tail_writes_the_acks_it_gathered_before_it_reads_again() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut upstream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (tail, _) = listener.accept().unwrap();
        let mut up = Link::Tcp(tail.try_clone().unwrap());
        let acks = std::cell::RefCell::new(TailAcks { up: Link::Tcp(tail), out: Vec::new(), broken: false });
        for a in [Ack::Ok { seq: 1, last: false }, Ack::Stop, Ack::Ok { seq: 2, last: false },
                  Ack::Error { bad: 0, reason: "bad\nchunk".into() }] {
            acks.borrow_mut().queue(a);
        }
        upstream.write_all(b"x").unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(FlushFirst { inner: &mut up, acks: &acks }.read(&mut byte).unwrap(), 1);
        assert!(acks.borrow().out.is_empty());
        let want = [dfs_wire::ok_ack(1), dfs_wire::ok_ack(2), dfs_wire::error_ack(0, "bad chunk")].concat();
        let mut got = vec![0u8; want.len()];
        upstream.read_exact(&mut got).unwrap();
        assert_eq!(got, want);
    }
}
