//! The client end of a block's write pipeline in native code: packets (header, a checksum per chunk,
//! data) built and sent without the GIL, a window of unacknowledged packets kept for a resend, and a
//! thread that reads the acknowledgements. `pytest_hpcnet/reference/dfs/pipeline.py` keeps what
//! happens once per block (setup, recovery, commit) and hands whole packets of each write here.
//!
//! A failure (an error ack naming the pipeline index at fault, a broken connection, a timeout) is
//! recorded, never raised mid-write: every packet handed in is queued as unacknowledged (sent only
//! while there is no failure), so the Python recovery resends exactly what is not acknowledged.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::checksum::Kind;
use crate::dfs_wire;
use crate::link::Link;

/// How many acknowledged packets' buffers a writer keeps for reuse: two windows' worth (the pipeline's
/// is 8), more than a steady write needs.
const SPARE_FRAMES: usize = 16;

struct Pending {
    seq: i64,
    offset: u64,
    last: bool,
    frame: Arc<Vec<u8>>,
    sums_at: usize,
    data_at: usize,
}

#[derive(Default)]
struct State {
    unacked: VecDeque<Pending>,
    acked: u64,
    failure: Option<(u64, String)>,
    closing: bool,
    /// buffers of acknowledged packets, reused for the next ones (at most a window's worth)
    spare: Vec<Vec<u8>>,
}

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
}

impl Shared {
    fn fail(&self, bad: u64, reason: String) {
        let mut s = self.state.lock().unwrap();
        if s.failure.is_none() && !s.closing {
            s.failure = Some((bad, reason));
        }
        self.cond.notify_all();
    }
}

#[pyclass(frozen, name = "PacketWriter", module = "pytest_hpcnet_native._native")]
pub struct PyPacketWriter {
    shared: Arc<Shared>,
    sock: Mutex<Link>,
    reader: Mutex<Option<JoinHandle<()>>>,
    kind: Kind,
    bpc: usize,
    window: usize,
    ack_timeout: Duration,
    peer: String,
}

/// Reads acknowledgements until the last one or a failure; a failure also cuts the connection, so a
/// writer blocked on it (a head that stopped reading leaves a verbs sender without credits) stops.
fn ack_reader(shared: Arc<Shared>, sock: Link, peer: String) {
    let cut = sock.try_clone();
    let failed = |bad: u64, reason: String| {
        shared.fail(bad, reason);
        if let Ok(c) = &cut {
            c.shutdown();
        }
    };
    let mut buf = Vec::new();
    let mut sock = std::io::BufReader::with_capacity(16 * 1024, sock);   // acks come in batches
    loop {
        let msg = match dfs_wire::read_frame(&mut sock, &mut buf, dfs_wire::MAX_ACK) {
            Ok(n) => &buf[4..4 + n],
            Err(e) => return failed(0, format!("{peer}: {}", e.describe())),
        };
        match dfs_wire::read_ack(msg) {
            Err((bad, reason)) => return failed(bad, reason),
            Ok(seq) => {
                let mut s = shared.state.lock().unwrap();
                match s.unacked.front() {
                    Some(p) if p.seq == seq => {
                        let p = s.unacked.pop_front().unwrap();
                        s.acked = p.offset + (p.frame.len() - p.data_at) as u64;
                        // the frame's last owner unless the writer is still sending it (an early ack)
                        if let Ok(frame) = Arc::try_unwrap(p.frame) {
                            if s.spare.len() < SPARE_FRAMES {
                                s.spare.push(frame);
                            }
                        }
                        shared.cond.notify_all();
                        if p.last {
                            return;
                        }
                    }
                    _ => {
                        drop(s);
                        return failed(0, format!("{peer}: unexpected ack {seq}"));
                    }
                }
            }
        }
    }
}

impl PyPacketWriter {
    /// Queue one packet (waiting for room in the window) and send it unless the pipeline failed.
    fn emit(&self, seq: i64, offset: u64, data: &[u8], last: bool) {
        let spare = self.shared.state.lock().unwrap().spare.pop().unwrap_or_default();
        let (frame, sums_at, data_at) = dfs_wire::packet_frame(spare, self.kind, self.bpc, seq, offset, data, last);
        let send = {
            let mut s = self.shared.state.lock().unwrap();
            let deadline = Instant::now() + self.ack_timeout;
            while s.unacked.len() >= self.window && s.failure.is_none() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    s.failure = Some((0, format!("{}: no acknowledgement within the timeout", self.peer)));
                    break;
                }
                s = self.shared.cond.wait_timeout(s, left).unwrap().0;
            }
            let frame = Arc::new(frame);
            s.unacked.push_back(Pending { seq, offset, last, frame: frame.clone(), sums_at, data_at });
            s.failure.is_none().then_some(frame)
        };
        // written from the queue's own copy (shared, not copied): a peer that acknowledges early
        // cannot pull it away
        if let Some(frame) = send {
            let result = self.sock.lock().unwrap().write_all(&frame);
            if let Err(e) = result {
                // the ack reader usually knows better (an error ack naming the node at fault)
                let deadline = Instant::now() + Duration::from_secs(5);
                let mut s = self.shared.state.lock().unwrap();
                while s.failure.is_none() && Instant::now() < deadline {
                    s = self.shared.cond.wait_timeout(s, Duration::from_millis(50)).unwrap().0;
                }
                if s.failure.is_none() {
                    s.failure = Some((0, format!("{}: {e}", self.peer)));
                }
            }
        }
    }
}

/// An unacknowledged packet as Python sees it: (seq, end offset, header, checksums, data).
type UnackedPacket<'py> = (i64, u64, Bound<'py, PyDict>, Bound<'py, PyBytes>, Bound<'py, PyBytes>);

#[pymethods]
impl PyPacketWriter {
    /// `sock`: the head datanode's connection after the setup ack, a tcp socket's descriptor
    /// (duplicated; the caller keeps its own) or a native `VerbsConnection` (shared; the caller closes
    /// it); `acked`: the block's bytes every node already has.
    #[new]
    #[pyo3(signature = (sock, bpc, checksum, acked, peer, window=8, ack_timeout=60.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(sock: &Bound<'_, PyAny>, bpc: usize, checksum: &str, acked: u64, peer: String, window: usize,
           ack_timeout: f64) -> PyResult<Self> {
        let kind = Kind::parse(checksum).ok_or_else(|| PyValueError::new_err(format!(
            "unknown checksum type {checksum:?}; choose crc32c or crc32")))?;
        if bpc == 0 || window == 0 {
            return Err(PyValueError::new_err("bytes per checksum and window must be positive"));
        }
        let ack_timeout = Duration::try_from_secs_f64(ack_timeout)
            .map_err(|_| PyValueError::new_err(format!("bad ack timeout {ack_timeout}")))?;
        let stream = Link::from_python(sock, ack_timeout).map_err(|e| PyOSError::new_err(format!("{peer}: {e}")))?;
        let io = |e: std::io::Error| PyOSError::new_err(format!("{peer}: {e}"));
        let reader_sock = stream.try_clone().map_err(io)?;
        let shared = Arc::new(Shared { state: Mutex::new(State { acked, ..Default::default() }), cond: Condvar::new() });
        let (s2, p2) = (shared.clone(), peer.clone());
        let reader = std::thread::Builder::new().name("dfs-acks".into())
            .spawn(move || ack_reader(s2, reader_sock, p2))
            .map_err(|e| PyOSError::new_err(format!("{peer}: cannot start the ack reader: {e}")))?;
        Ok(PyPacketWriter { shared, sock: Mutex::new(stream), reader: Mutex::new(Some(reader)), kind, bpc,
                            window, ack_timeout, peer })
    }

    /// One packet: `data` at block `offset`, numbered `seq`.
    fn send_packet(&self, py: Python<'_>, seq: i64, offset: u64, data: PyBuffer<u8>, last: bool) -> PyResult<()> {
        let bytes = crate::pybuf::contiguous(&data, "data")?;
        py.allow_threads(|| self.emit(seq, offset, bytes, last));
        Ok(())
    }

    /// Whole packets of `packet_size` bytes of `data` (its length a multiple of it), numbered from
    /// `seq`, starting at block `offset`; returns how many.
    fn send_packets(&self, py: Python<'_>, seq: i64, offset: u64, data: PyBuffer<u8>, packet_size: usize)
                    -> PyResult<usize> {
        let bytes = crate::pybuf::contiguous(&data, "data")?;
        if packet_size == 0 || bytes.len() % packet_size != 0 {
            return Err(PyValueError::new_err(format!(
                "{} bytes are not whole packets of {packet_size}", bytes.len())));
        }
        Ok(py.allow_threads(|| {
            for (i, chunk) in bytes.chunks(packet_size).enumerate() {
                self.emit(seq + i as i64, offset + (i * packet_size) as u64, chunk, false);
            }
            bytes.len() / packet_size
        }))
    }

    /// (bad pipeline index, reason) once the pipeline failed, else None.
    fn failure(&self) -> Option<(u64, String)> {
        self.shared.state.lock().unwrap().failure.clone()
    }

    /// Wait until every packet is acknowledged or the pipeline failed; False on a timeout.
    fn drain(&self, py: Python<'_>, timeout: f64) -> bool {
        let deadline = Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
        py.allow_threads(|| {
            let mut s = self.shared.state.lock().unwrap();
            while !s.unacked.is_empty() && s.failure.is_none() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return false;
                }
                s = self.shared.cond.wait_timeout(s, left).unwrap().0;
            }
            true
        })
    }

    #[getter]
    fn acked(&self) -> u64 {
        self.shared.state.lock().unwrap().acked
    }

    /// The unacknowledged packets, oldest first: (seq, end offset, header, checksums, data), as the
    /// Python pipeline keeps them.
    fn unacked<'py>(&self, py: Python<'py>) -> PyResult<Vec<UnackedPacket<'py>>> {
        let s = self.shared.state.lock().unwrap();
        let mut out = Vec::with_capacity(s.unacked.len());
        for p in &s.unacked {
            let n = p.frame.len() - p.data_at;
            let h = PyDict::new(py);
            h.set_item("op", "packet")?;
            h.set_item("seq", p.seq)?;
            h.set_item("offset", p.offset)?;
            h.set_item("len", n)?;
            h.set_item("last", p.last)?;
            out.push((p.seq, p.offset + n as u64, h, PyBytes::new(py, &p.frame[p.sums_at..p.data_at]),
                      PyBytes::new(py, &p.frame[p.data_at..])));
        }
        Ok(out)
    }

    /// Stop: the connection is shut down (the ack reader wakes and ends) and the reader joined.
    fn close(&self, py: Python<'_>) {
        self.shared.state.lock().unwrap().closing = true;
        self.sock.lock().unwrap().shutdown();
        let handle = self.reader.lock().unwrap().take();
        if let Some(h) = handle {
            py.allow_threads(|| {
                let _ = h.join();
            });
        }
    }
}
