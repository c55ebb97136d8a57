//! The native Hadoop IPC v9 client: one blocking tcp connection, many concurrent calls matched by
//! call id. No receiver thread: a caller whose response has not come becomes the reader for everyone
//! (the Python client's leader/follower scheme), so a lone caller reads its own response with no
//! thread hand-off.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::buffers::{BufferStats, Design};
use crate::shm::ShmEnd;
use crate::trace::{self, Point};
use crate::verbs::VerbsEnd;
use crate::wire::{self, Cursor, Frame, RequestHeader, ResponseHeader};

const READ_SLICE: Duration = Duration::from_millis(50);
const PROTOCOL_VERSION: u64 = 1;

#[derive(Clone, Debug)]
pub enum CallError {
    Timeout(String),
    Lost(String),
    Remote { class_name: String, message: String, detail: Option<u64> },
    Fatal { class_name: String, message: String, detail: Option<u64> },
}

type Outcome = Result<Vec<u8>, CallError>;

struct State {
    pending: FxHashMap<i32, Option<Outcome>>,
    broken: Option<CallError>,
    reading: bool,
    waiting: usize, // callers asleep on the condvar (a notify is a syscall: only when someone waits)
}

/// The byte stream under a connection: a tcp socket, one end of shm rings, or a verbs connection.
enum Link {
    Tcp(TcpStream),
    Shm(Arc<ShmEnd>),
    Verbs(Arc<VerbsEnd>),
}

/// Where a client connects.
pub enum Dial<'a> {
    Tcp(SocketAddr),
    Shm(&'a str, u16),
    Verbs(&'a str, u16),
}

impl Link {
    /// Reads what is there, waiting at most the read slice (then TimedOut).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Tcp(s) => s.read(buf),
            Link::Shm(e) => match e.read(buf) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    if e.wait_readable(READ_SLICE) {
                        e.read(buf)
                    } else {
                        Err(io::ErrorKind::TimedOut.into())
                    }
                }
                other => other,
            },
            Link::Verbs(e) => match e.read(buf) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    if e.wait(false, READ_SLICE) {
                        e.read(buf)
                    } else {
                        Err(io::ErrorKind::TimedOut.into())
                    }
                }
                other => other,
            },
        }
    }

    fn write_all(&mut self, buf: &[u8], timeout: Duration) -> io::Result<()> {
        self.write_all2(buf, &[], timeout)
    }

    /// `head` then `body`, in one writev per attempt on tcp (the pooled design's zero-copy framing:
    /// the body is sent from the caller's memory, not copied behind the header first).
    fn write_all2(&mut self, head: &[u8], body: &[u8], timeout: Duration) -> io::Result<()> {
        match self {
            Link::Tcp(s) => {
                let mut bufs = [io::IoSlice::new(head), io::IoSlice::new(body)];
                let mut slices = &mut bufs[..];
                while !slices.is_empty() {
                    match s.write_vectored(slices) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => io::IoSlice::advance_slices(&mut slices, n),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            // both into the ring (one doorbell for the server) / into eager slots, as credits allow
            Link::Shm(e) => write_pair(head, body, timeout, |bufs| e.write_vectored(bufs),
                                       |left| e.wait_writable(left), "the peer did not drain the ring"),
            Link::Verbs(e) => write_pair(head, body, timeout, |bufs| e.write_vectored(bufs),
                                         |left| e.wait(true, left), "the peer returned no send credits"),
        }
    }

    fn shutdown(&self) {
        match self {
            Link::Tcp(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            Link::Shm(e) => e.close(),
            Link::Verbs(e) => e.close(),
        }
    }
}

struct FrameReader {
    stream: Link,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    grew: bool,
}

impl FrameReader {
    /// One whole packet (without its length), or None when the read slice passed without one.
    fn frame(&mut self, max: usize, stats: &BufferStats) -> Result<Option<(usize, usize)>, CallError> {
        loop {
            let avail = self.end - self.start;
            if avail >= 4 {
                let len = match wire::split_frame(&self.buf[self.start..self.end], max) {
                    Ok(Frame::Packet(packet)) => {
                        let s = self.start + 4;
                        self.start += 4 + packet.len();
                        return Ok(Some((s, self.start)));
                    }
                    Ok(Frame::Need(n)) => n - 4,
                    Err(len) => return Err(CallError::Lost(format!(
                        "response of {len} bytes exceeds ipc.maximum.data.length {max}"))),
                };
                if self.buf.len() < self.start + 4 + len {
                    if self.start > 0 {
                        stats.copy(self.end - self.start);
                        self.buf.copy_within(self.start..self.end, 0);
                        self.end -= self.start;
                        self.start = 0;
                    }
                    if self.buf.len() < 4 + len {
                        let grown = (self.buf.len() * 2).min(4 + len).max(self.end + 1);
                        self.buf.resize(grown, 0);
                        stats.alloc();
                        self.grew = true;
                    }
                }
            } else if self.start == self.end {
                self.start = 0;
                self.end = 0;
            } else if self.buf.len() - self.start < 4 {
                stats.copy(self.end - self.start);
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            match self.stream.read(&mut self.buf[self.end..]) {
                Ok(0) => return Err(CallError::Lost("peer closed".into())),
                Ok(n) => self.end += n,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return Ok(None)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CallError::Lost(e.to_string())),
            }
        }
    }
}

pub struct Client {
    writer: Mutex<(Link, Vec<u8>)>,
    write_timeout: Duration,
    reader: Mutex<FrameReader>,
    state: Mutex<State>,
    cv: Condvar,
    next_id: AtomicU32,
    client_id: Vec<u8>,
    protocol: String,
    peer: String,
    max_data_length: usize,
    method_headers: Mutex<FxHashMap<String, Vec<u8>>>,
    design: Design,
    pub stats: BufferStats,
}

impl Client {
    #[allow(clippy::too_many_arguments)]
    pub fn connect(dial: Dial<'_>, client_id: Vec<u8>, user: &str, protocol: &str,
                   connect_timeout: Duration, max_data_length: usize, design: Design)
                   -> Result<Client, CallError> {
        let peer = match &dial {
            Dial::Shm(h, p) => format!("shm {h}:{p}"),
            Dial::Verbs(h, p) => format!("verbs {h}:{p}"),
            Dial::Tcp(addr) => format!("{}:{}", addr.ip(), addr.port()),
        };
        let lost = |e: io::Error| {
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                CallError::Timeout(format!("connecting to {peer}: {e}"))
            } else {
                CallError::Lost(format!("connecting to {peer}: {e}"))
            }
        };
        let (mut wlink, rlink) = match dial {
            Dial::Shm(h, p) => {
                let end = Arc::new(crate::shm::connect(h, p, connect_timeout).map_err(lost)?);
                (Link::Shm(end.clone()), Link::Shm(end))
            }
            Dial::Verbs(h, p) => {
                let end = Arc::new(crate::verbs::cm::connect(h, p, connect_timeout).map_err(lost)?);
                (Link::Verbs(end.clone()), Link::Verbs(end))
            }
            Dial::Tcp(addr) => {
                let stream = TcpStream::connect_timeout(&addr, connect_timeout).map_err(lost)?;
                stream.set_nodelay(true).map_err(lost)?;
                stream.set_write_timeout(Some(connect_timeout)).map_err(lost)?;
                let rstream = stream.try_clone().map_err(lost)?;
                rstream.set_read_timeout(Some(READ_SLICE)).map_err(lost)?;
                (Link::Tcp(stream), Link::Tcp(rstream))
            }
        };
        let mut hello = wire::PREAMBLE.to_vec();
        let mut header = Vec::new();
        RequestHeader::encode(&mut header, wire::CONNECTION_CONTEXT_CALL_ID, &client_id, -1);
        let ctx = wire::encode_context(user, protocol);
        let mut body = Vec::new();
        wire::put_varint(&mut body, header.len() as u64);
        body.extend_from_slice(&header);
        wire::put_varint(&mut body, ctx.len() as u64);
        body.extend_from_slice(&ctx);
        hello.extend_from_slice(&(body.len() as u32).to_be_bytes());
        hello.extend_from_slice(&body);
        wlink.write_all(&hello, connect_timeout).map_err(lost)?;
        let stats = BufferStats::default();
        stats.alloc(); // the connection's receive buffer
        Ok(Client {
            writer: Mutex::new((wlink, Vec::new())),
            write_timeout: connect_timeout.max(Duration::from_secs(30)),
            reader: Mutex::new(FrameReader { stream: rlink, buf: vec![0; 65536], start: 0, end: 0,
                                             grew: true }),
            state: Mutex::new(State { pending: FxHashMap::default(), broken: None, reading: false, waiting: 0 }),
            cv: Condvar::new(),
            next_id: AtomicU32::new(0),
            client_id,
            protocol: protocol.to_string(),
            peer,
            max_data_length,
            method_headers: Mutex::new(FxHashMap::default()),
            design,
            stats,
        })
    }

    /// Frames one call into `out` but for the request's bytes, which must follow: length (counting
    /// them), then the delimited request header, method header and the request's length.
    fn frame_head(&self, out: &mut Vec<u8>, call_id: i32, method: &str, request_len: usize) {
        let mut m = self.method_headers.lock().unwrap();
        if !m.contains_key(method) {
            m.insert(method.to_string(), wire::encode_method_header(method, &self.protocol, PROTOCOL_VERSION));
        }
        let rh = &m[method];
        let start = out.len();
        out.extend_from_slice(&[0; 5]); // the packet length, and the request header's length (1 byte)
        RequestHeader::encode(out, call_id, &self.client_id, -1);
        let hlen = out.len() - start - 5;
        if hlen < 128 {
            out[start + 4] = hlen as u8;
        } else {
            // a long client id: the header's length takes more than one byte
            let hdr = out.split_off(start + 5);
            out.truncate(start + 4);
            wire::put_varint(out, hlen as u64);
            out.extend_from_slice(&hdr);
        }
        wire::put_varint(out, rh.len() as u64);
        out.extend_from_slice(rh);
        wire::put_varint(out, request_len as u64);
        let n = (out.len() - start - 4 + request_len) as u32;
        out[start..start + 4].copy_from_slice(&n.to_be_bytes());
    }

    /// Frames one whole call into `out`.
    fn frame_call(&self, out: &mut Vec<u8>, call_id: i32, method: &str, request: &[u8]) {
        self.frame_head(out, call_id, method, request.len());
        out.extend_from_slice(request);
    }

    /// Calls `method` with a serialized request; returns the serialized response.
    pub fn call(&self, method: &str, request: &[u8], timeout: Duration) -> Outcome {
        let mut body = Vec::new();
        self.call_with(method, request, timeout, &mut |b: &[u8]| body = b.to_vec())?;
        Ok(body)
    }

    /// Calls `method`; `sink` gets the serialized response. Pooled: the request is sent from
    /// `request` itself behind its header (no copy), and when this thread reads its own response
    /// `sink` sees it in the receive buffer, where it landed (no copy); a response another thread
    /// read for us was copied out for the hand-over.
    pub fn call_with(&self, method: &str, request: &[u8], timeout: Duration, sink: &mut dyn FnMut(&[u8]))
                     -> Result<(), CallError> {
        let deadline = Instant::now() + timeout;
        let call_id = (self.next_id.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff) as i32;
        {
            let mut st = self.state.lock().unwrap();
            if let Some(b) = &st.broken {
                return Err(b.clone());
            }
            st.pending.insert(call_id, None);
        }
        let written = {
            let mut w = self.writer.lock().unwrap();
            let (stream, buf) = &mut *w;
            if self.design == Design::Pooled {
                // zero-copy framing: the header encoded into the connection's reused send buffer,
                // the request sent from where it is
                buf.clear();
                self.frame_head(buf, call_id, method, request.len());
                stream.write_all2(buf, request, self.write_timeout)
            } else {
                // naive: the message built in fresh memory, then joined into one more buffer
                let mut parts = Vec::new();
                self.frame_call(&mut parts, call_id, method, request);
                let joined = parts.to_vec();
                self.stats.alloc();
                self.stats.copy(joined.len());
                stream.write_all(&joined, self.write_timeout)
            }
        };
        if let Err(e) = written {
            let err = CallError::Lost(format!("connection to {} lost: {e}", self.peer));
            self.break_with(err.clone());
            self.state.lock().unwrap().pending.remove(&call_id);
            return Err(err);
        }
        self.wait(call_id, deadline, method, timeout, sink)
    }

    fn wait(&self, call_id: i32, deadline: Instant, method: &str, timeout: Duration,
            sink: &mut dyn FnMut(&[u8])) -> Result<(), CallError> {
        let mut st = self.state.lock().unwrap();
        loop {
            if let Some(slot) = st.pending.get_mut(&call_id) {
                if let Some(outcome) = slot.take() {
                    st.pending.remove(&call_id);
                    return outcome.map(|body| sink(&body));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                st.pending.remove(&call_id);
                return Err(CallError::Timeout(format!(
                    "{method} got no response within {} s", timeout.as_secs_f64())));
            }
            if st.reading {
                st.waiting += 1;
                st = self.cv.wait_timeout(st, deadline - now).unwrap().0;
                st.waiting -= 1;
                continue;
            }
            // become the reader until our own response is in
            st.reading = true;
            drop(st);
            let result = self.read_until(call_id, deadline, sink);
            st = self.state.lock().unwrap();
            st.reading = false;
            let mut done = false;
            match result {
                Ok(in_place) => done = in_place,
                Err(e) => self.fail_all(&mut st, e),
            }
            if done {
                st.pending.remove(&call_id);
            }
            if st.waiting > 0 {
                self.cv.notify_all(); // another waiter takes over reading
            }
            if done {
                return Ok(());
            }
        }
    }

    /// Reads packets and hands them out until `call_id` has its outcome or the deadline passes.
    /// Ok(true): `call_id` succeeded and `sink` already saw its response in place (pooled).
    fn read_until(&self, call_id: i32, deadline: Instant, sink: &mut dyn FnMut(&[u8]))
                  -> Result<bool, CallError> {
        let mut reader = self.reader.lock().unwrap();
        loop {
            let Some((s, e)) = reader.frame(self.max_data_length, &self.stats)? else {
                if Instant::now() >= deadline {
                    return Ok(false);
                }
                continue;
            };
            self.stats.message(self.design, std::mem::take(&mut reader.grew));
            let owned;
            let packet = if self.design == Design::Pooled {
                &reader.buf[s..e] // in place
            } else {
                owned = reader.buf[s..e].to_vec(); // naive: copied out to a buffer of its own
                self.stats.alloc();
                self.stats.copy(owned.len());
                &owned[..]
            };
            let (id, result) = self.decode(packet)?;
            if id == call_id && self.design == Design::Pooled {
                if let Ok(body) = result {
                    sink(body); // our own response, read where it landed
                    return Ok(true);
                }
            }
            let outcome = result.map(|body| body.to_vec()); // handed to the thread that waits for it
            let mut st = self.state.lock().unwrap();
            if let Some(slot) = st.pending.get_mut(&id) {
                *slot = Some(outcome);
                if id == call_id {
                    return Ok(false);
                }
                if st.waiting > 0 {
                    self.cv.notify_all();
                }
            } // else: its caller timed out and left
        }
    }

    fn decode<'a>(&self, packet: &'a [u8]) -> Result<(i32, Result<&'a [u8], CallError>), CallError> {
        let malformed = |e: String| CallError::Lost(format!("malformed response from {}: {e}", self.peer));
        let mut cur = Cursor::new(packet);
        let h = ResponseHeader::parse(cur.delimited().map_err(malformed)?).map_err(malformed)?;
        let id = h.call_id as i32;
        match h.status {
            wire::SUCCESS => Ok((id, Ok(cur.delimited().map_err(malformed)?))),
            wire::ERROR => Ok((id, Err(CallError::Remote {
                class_name: h.exception_class, message: h.error_msg, detail: h.error_detail }))),
            _ => Err(CallError::Fatal { class_name: h.exception_class, message: h.error_msg,
                                        detail: h.error_detail }),
        }
    }

    fn fail_all(&self, st: &mut State, e: CallError) {
        let e = match e {
            CallError::Lost(m) if !m.starts_with("connection to") && !m.starts_with("malformed") => {
                CallError::Lost(format!("connection to {} lost: {m}", self.peer))
            }
            other => other,
        };
        if st.broken.is_none() {
            st.broken = Some(e.clone());
        }
        let broken = st.broken.clone().unwrap();
        for slot in st.pending.values_mut() {
            if slot.is_none() {
                *slot = Some(Err(broken.clone()));
            }
        }
        if let Ok(w) = self.writer.try_lock() {
            w.0.shutdown();
        }
    }

    fn break_with(&self, e: CallError) {
        let mut st = self.state.lock().unwrap();
        self.fail_all(&mut st, e);
        self.cv.notify_all();
    }

    /// Hadoop's keep-alive: a header with callId -4, no response.
    pub fn send_ping(&self) -> Result<(), CallError> {
        let mut header = Vec::new();
        RequestHeader::encode(&mut header, wire::PING_CALL_ID, &self.client_id, -1);
        let mut packet = ((header.len() + 1) as u32).to_be_bytes().to_vec();
        wire::put_varint(&mut packet, header.len() as u64);
        packet.extend_from_slice(&header);
        self.writer.lock().unwrap().0.write_all(&packet, self.write_timeout)
            .map_err(|e| CallError::Lost(format!("connection to {} lost: {e}", self.peer)))
    }

    pub fn close(&self) {
        self.break_with(CallError::Lost("client closed".into()));
        self.writer.lock().unwrap().0.shutdown();
    }

    pub fn echo(&self, payload: &[u8], timeout: Duration) -> Outcome {
        let mut req = Vec::with_capacity(payload.len() + 6);
        wire::put_bytes_field(&mut req, 1, payload);
        let body = self.call("echo", &req, timeout)?;
        wire::parse_payload(&body)
            .map(|p| p.to_vec())
            .map_err(|e| CallError::Remote { class_name: "DecodeError".into(),
                                             message: format!("cannot parse the echo response: {e}"),
                                             detail: None })
    }

    /// Calls echo with `size` bytes back to back for `seconds`; the calls completed inside that time
    /// (the one that crosses the end is not counted). The calls/s driver of the throughput workload.
    pub fn echo_for(&self, size: usize, seconds: f64, timeout: Duration) -> Result<u64, CallError> {
        let mut req = Vec::with_capacity(size + 6);
        wire::put_bytes_field(&mut req, 1, &vec![0u8; size]);
        let end = Instant::now() + Duration::from_secs_f64(seconds.max(0.0));
        let mut calls = 0;
        loop {
            self.call_with("echo", &req, timeout, &mut |_| {})?;
            if Instant::now() > end {
                return Ok(calls);
            }
            calls += 1;
        }
    }

    /// Times `iterations` echo calls of `size` bytes (after `warmup` untimed ones); microseconds.
    pub fn echo_samples(&self, size: usize, iterations: usize, warmup: usize, timeout: Duration)
                        -> Result<Vec<f64>, CallError> {
        let payload = vec![0u8; size];
        let mut req = Vec::with_capacity(size + 6);
        wire::put_bytes_field(&mut req, 1, &payload);
        let mut out = Vec::with_capacity(iterations);
        for i in 0..warmup + iterations {
            let mut got = usize::MAX;
            trace::mark(Point::Start);
            let t0 = Instant::now();
            self.call_with("echo", &req, timeout, &mut |body| {
                got = wire::parse_payload(body).map(|p| p.len()).unwrap_or(usize::MAX)
            })?;
            let dt = t0.elapsed();
            trace::mark(Point::End);
            if got != size {
                return Err(CallError::Lost(format!("echo of {size} B returned {got} B")));
            }
            if i >= warmup {
                out.push(dt.as_secs_f64() * 1e6);
            }
        }
        Ok(out)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Ok(w) = self.writer.lock() {
            w.0.shutdown();
        }
    }
}

/// `head` then `body` through an end whose writes take what fits (`write`, WouldBlock when nothing
/// does), waiting for room (`wait`, false when none came in time) until `timeout`; `stalled` says
/// what the peer failed to do when it runs out.
pub(crate) fn write_pair(head: &[u8], body: &[u8], timeout: Duration,
              mut write: impl FnMut(&[&[u8]]) -> io::Result<usize>,
              mut wait: impl FnMut(Duration) -> bool, stalled: &str) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    let (mut head, mut body) = (head, body);
    while !(head.is_empty() && body.is_empty()) {
        match write(&[head, body]) {
            Ok(n) => {
                let h = n.min(head.len());
                head = &head[h..];
                body = &body[n - h..];
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                let now = Instant::now();
                if now >= deadline || !wait(deadline - now) {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, stalled.to_string()));
                }
            }
            Err(err) => return Err(err),
        }
    }
    Ok(())
}
