//! The native Hadoop IPC v9 client: one blocking tcp connection, many concurrent calls matched by
//! call id. No receiver thread: a caller whose response has not come becomes the reader for everyone
//! (the Python client's leader/follower scheme), so a lone caller reads its own response with no
//! thread hand-off.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::wire::{self, Cursor, RequestHeader, ResponseHeader};

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
    pending: HashMap<i32, Option<Outcome>>,
    broken: Option<CallError>,
    reading: bool,
}

struct FrameReader {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl FrameReader {
    /// One whole packet (without its length), or None when the read slice passed without one.
    fn frame(&mut self, max: usize) -> Result<Option<(usize, usize)>, CallError> {
        loop {
            let avail = self.end - self.start;
            if avail >= 4 {
                let b = &self.buf[self.start..self.start + 4];
                let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
                if len > max {
                    return Err(CallError::Lost(format!(
                        "response of {len} bytes exceeds ipc.maximum.data.length {max}")));
                }
                if avail >= 4 + len {
                    let s = self.start + 4;
                    self.start += 4 + len;
                    return Ok(Some((s, s + len)));
                }
                if self.buf.len() < self.start + 4 + len {
                    if self.start > 0 {
                        self.buf.copy_within(self.start..self.end, 0);
                        self.end -= self.start;
                        self.start = 0;
                    }
                    if self.buf.len() < 4 + len {
                        let grown = (self.buf.len() * 2).min(4 + len).max(self.end + 1);
                        self.buf.resize(grown, 0);
                    }
                }
            } else if self.start == self.end {
                self.start = 0;
                self.end = 0;
            } else if self.buf.len() - self.start < 4 {
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
    writer: Mutex<TcpStream>,
    reader: Mutex<FrameReader>,
    state: Mutex<State>,
    cv: Condvar,
    next_id: AtomicU32,
    client_id: Vec<u8>,
    protocol: String,
    peer: String,
    max_data_length: usize,
    method_headers: Mutex<HashMap<String, Vec<u8>>>,
}

impl Client {
    pub fn connect(addr: SocketAddr, client_id: Vec<u8>, user: &str, protocol: &str,
                   connect_timeout: Duration, max_data_length: usize) -> Result<Client, CallError> {
        let peer = format!("{}:{}", addr.ip(), addr.port());
        let lost = |e: io::Error| {
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                CallError::Timeout(format!("connecting to {peer}: {e}"))
            } else {
                CallError::Lost(format!("connecting to {peer}: {e}"))
            }
        };
        let stream = TcpStream::connect_timeout(&addr, connect_timeout).map_err(lost)?;
        stream.set_nodelay(true).map_err(lost)?;
        stream.set_write_timeout(Some(connect_timeout)).map_err(lost)?;
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
        (&stream).write_all(&hello).map_err(lost)?;
        let rstream = stream.try_clone().map_err(lost)?;
        rstream.set_read_timeout(Some(READ_SLICE)).map_err(lost)?;
        Ok(Client {
            writer: Mutex::new(stream),
            reader: Mutex::new(FrameReader { stream: rstream, buf: vec![0; 65536], start: 0, end: 0 }),
            state: Mutex::new(State { pending: HashMap::new(), broken: None, reading: false }),
            cv: Condvar::new(),
            next_id: AtomicU32::new(0),
            client_id,
            protocol: protocol.to_string(),
            peer,
            max_data_length,
            method_headers: Mutex::new(HashMap::new()),
        })
    }

    fn method_header(&self, method: &str) -> Vec<u8> {
        let mut m = self.method_headers.lock().unwrap();
        m.entry(method.to_string())
            .or_insert_with(|| wire::encode_method_header(method, &self.protocol, PROTOCOL_VERSION))
            .clone()
    }

    /// Calls `method` with a serialized request; returns the serialized response.
    pub fn call(&self, method: &str, request: &[u8], timeout: Duration) -> Outcome {
        let deadline = Instant::now() + timeout;
        let call_id = (self.next_id.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff) as i32;
        {
            let mut st = self.state.lock().unwrap();
            if let Some(b) = &st.broken {
                return Err(b.clone());
            }
            st.pending.insert(call_id, None);
        }
        let rh = self.method_header(method);
        let mut header = Vec::with_capacity(32);
        RequestHeader::encode(&mut header, call_id, &self.client_id, -1);
        let mut packet = Vec::with_capacity(16 + header.len() + rh.len() + request.len());
        packet.extend_from_slice(&[0; 4]);
        for part in [&header[..], &rh[..], request] {
            wire::put_varint(&mut packet, part.len() as u64);
            packet.extend_from_slice(part);
        }
        let n = (packet.len() - 4) as u32;
        packet[..4].copy_from_slice(&n.to_be_bytes());
        let written = self.writer.lock().unwrap().write_all(&packet);
        if let Err(e) = written {
            let err = CallError::Lost(format!("connection to {} lost: {e}", self.peer));
            self.break_with(err.clone());
            self.state.lock().unwrap().pending.remove(&call_id);
            return Err(err);
        }
        let out = self.wait(call_id, deadline, method, timeout);
        out
    }

    fn wait(&self, call_id: i32, deadline: Instant, method: &str, timeout: Duration) -> Outcome {
        let mut st = self.state.lock().unwrap();
        loop {
            if let Some(slot) = st.pending.get_mut(&call_id) {
                if let Some(outcome) = slot.take() {
                    st.pending.remove(&call_id);
                    return outcome;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                st.pending.remove(&call_id);
                return Err(CallError::Timeout(format!(
                    "{method} got no response within {} s", timeout.as_secs_f64())));
            }
            if st.reading {
                st = self.cv.wait_timeout(st, deadline - now).unwrap().0;
                continue;
            }
            // become the reader until our own response is in
            st.reading = true;
            drop(st);
            let result = self.read_until(call_id, deadline);
            st = self.state.lock().unwrap();
            st.reading = false;
            if let Err(e) = result {
                self.fail_all(&mut st, e);
            }
            self.cv.notify_all(); // another waiter takes over reading
        }
    }

    /// Reads packets and hands them out until `call_id` has its outcome or the deadline passes.
    fn read_until(&self, call_id: i32, deadline: Instant) -> Result<(), CallError> {
        let mut reader = self.reader.lock().unwrap();
        loop {
            let Some((s, e)) = reader.frame(self.max_data_length)? else {
                if Instant::now() >= deadline {
                    return Ok(());
                }
                continue;
            };
            let (id, outcome) = self.decode(&reader.buf[s..e])?;
            let mut st = self.state.lock().unwrap();
            if let Some(slot) = st.pending.get_mut(&id) {
                *slot = Some(outcome);
                if id == call_id {
                    return Ok(());
                }
                self.cv.notify_all();
            } // else: its caller timed out and left
        }
    }

    fn decode(&self, packet: &[u8]) -> Result<(i32, Outcome), CallError> {
        let malformed = |e: String| CallError::Lost(format!("malformed response from {}: {e}", self.peer));
        let mut cur = Cursor::new(packet);
        let h = ResponseHeader::parse(cur.delimited().map_err(malformed)?).map_err(malformed)?;
        let id = h.call_id as i32;
        match h.status {
            wire::SUCCESS => Ok((id, Ok(cur.delimited().map_err(malformed)?.to_vec()))),
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
            let _ = w.shutdown(std::net::Shutdown::Both);
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
        self.writer.lock().unwrap().write_all(&packet)
            .map_err(|e| CallError::Lost(format!("connection to {} lost: {e}", self.peer)))
    }

    pub fn close(&self) {
        self.break_with(CallError::Lost("client closed".into()));
        let _ = self.writer.lock().unwrap().shutdown(std::net::Shutdown::Both);
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

    /// Times `iterations` echo calls of `size` bytes (after `warmup` untimed ones); microseconds.
    pub fn echo_samples(&self, size: usize, iterations: usize, warmup: usize, timeout: Duration)
                        -> Result<Vec<f64>, CallError> {
        let payload = vec![0u8; size];
        let mut req = Vec::with_capacity(size + 6);
        wire::put_bytes_field(&mut req, 1, &payload);
        let mut out = Vec::with_capacity(iterations);
        for i in 0..warmup + iterations {
            let t0 = Instant::now();
            let body = self.call("echo", &req, timeout)?;
            let dt = t0.elapsed();
            let got = wire::parse_payload(&body).map(|p| p.len()).unwrap_or(usize::MAX);
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
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
    }
}
