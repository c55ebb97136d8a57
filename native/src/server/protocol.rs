//! What a connection's bytes mean: the preamble, the connection context, and each call, answered
//! here for the built-in `echo` and `ping` or queued for Python's handlers.

use std::io;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::buffers::{BufferStats, Design};
use crate::trace::{self, Point};
use crate::wire::{self, Cursor, RequestHeader};

use super::{fatal, Close, Conn, EventLoop, Phase, PyCall, KEEP_BUFFER, WRITE_HIGH};

/// The next delimited RpcRequestHeaderProto of a packet; FATAL (no call id yet) when it is not one.
fn request_header<'a>(cur: &mut Cursor<'a>) -> Result<RequestHeader<'a>, Close> {
    let hbytes = cur.delimited()
        .map_err(|e| fatal(wire::FATAL_DESERIALIZING_REQUEST, wire::INVALID_CALL_ID, e))?;
    RequestHeader::parse(hbytes).map_err(|e| fatal(
        wire::FATAL_INVALID_RPC_HEADER, wire::INVALID_CALL_ID,
        format!("cannot parse RpcRequestHeaderProto: {e}")))
}

impl EventLoop {
    /// Handles every complete packet in the buffer; returns the buffer length the next one needs.
    pub(super) fn process(&mut self, id: usize) -> Result<usize, Close> {
        let mut buf = {
            let Some(c) = self.conns.get_mut(&id) else { return Ok(0) };
            std::mem::take(&mut c.rbuf)
        };
        let r = self.process_buffer(id, &buf);
        let Some(c) = self.conns.get_mut(&id) else { return Ok(0) };
        if c.rstart == c.rend {
            c.rstart = 0;
            c.rend = 0;
            if buf.len() > KEEP_BUFFER {
                buf = Vec::new();
            }
        }
        c.rbuf = buf;
        r
    }

    fn process_buffer(&mut self, id: usize, buf: &[u8]) -> Result<usize, Close> {
        let max_data = self.shared.cfg.max_data_length;
        loop {
            let c = self.conns.get_mut(&id).expect("connection");
            if c.closing {
                return Ok(0);
            }
            if c.unsent() > WRITE_HIGH {
                c.paused = true;
                return Ok(0);
            }
            let avail = &buf[c.rstart..c.rend];
            match c.phase {
                Phase::Preamble => {
                    match wire::check_preamble(avail) {
                        Ok(true) => {}
                        Ok(false) => return Ok(c.rstart + wire::PREAMBLE.len()),
                        Err(wire::PreambleError::Magic(seen)) => return Err(Close::Quiet(format!(
                            "bad preamble: {:?} is not 'hrpc'", String::from_utf8_lossy(&seen)))),
                        Err(wire::PreambleError::Version(v)) => {
                            return Err(fatal(wire::FATAL_VERSION_MISMATCH, wire::INVALID_CALL_ID, format!(
                                "IPC version {v} not supported, server speaks {}", wire::IPC_VERSION)))
                        }
                        Err(wire::PreambleError::Auth(a)) => {
                            return Err(fatal(wire::FATAL_UNAUTHORIZED, wire::INVALID_CALL_ID, format!(
                                "auth protocol {a} not supported (only none)")))
                        }
                    }
                    c.rstart += wire::PREAMBLE.len();
                    c.phase = Phase::Context;
                }
                Phase::Context | Phase::Ready => {
                    let context = c.phase == Phase::Context;
                    let limit = if context { max_data.min(wire::MAX_CONTEXT_LENGTH) } else { max_data };
                    let packet = match wire::split_frame(avail, limit) {
                        Ok(wire::Frame::Packet(packet)) => packet,
                        Ok(wire::Frame::Need(n)) => return Ok(c.rstart + n),
                        Err(len) if context => {
                            return Err(fatal(wire::FATAL_INVALID_RPC_HEADER, wire::INVALID_CALL_ID,
                                             format!("connection context of {len} bytes exceeds {limit}")))
                        }
                        Err(len) => {
                            return Err(fatal(wire::FATAL_INVALID_RPC_HEADER, wire::INVALID_CALL_ID, format!(
                                "RPC data length {len} exceeds ipc.maximum.data.length {max_data}")))
                        }
                    };
                    c.rstart += 4 + packet.len();
                    if c.phase == Phase::Context {
                        self.context(id, packet)?;
                        continue;
                    }
                    let design = self.shared.cfg.design;
                    self.shared.buffers.message(design, std::mem::take(&mut c.grew));
                    if design == Design::Pooled {
                        self.call(id, packet)?;
                        continue;
                    }
                    // naive: the message copied out to a buffer of its own, the response built in
                    // fresh memory and joined into the write buffer
                    let owned = packet.to_vec();
                    self.shared.buffers.alloc();
                    self.shared.buffers.copy(owned.len());
                    let saved = std::mem::take(&mut c.wbuf);
                    let r = self.call(id, &owned);
                    let c = self.conns.get_mut(&id).expect("connection");
                    join_naive(&self.shared.buffers, c, saved);
                    r?;
                }
            }
        }
    }

    fn context(&mut self, id: usize, packet: &[u8]) -> Result<(), Close> {
        let mut cur = Cursor::new(packet);
        let header = request_header(&mut cur)?;
        if header.call_id != wire::CONNECTION_CONTEXT_CALL_ID {
            return Err(fatal(wire::FATAL_INVALID_RPC_HEADER, wire::INVALID_CALL_ID, format!(
                "first packet has callId {}, expected connection context -3", header.call_id)));
        }
        let ctx = cur.delimited()
            .map_err(|e| fatal(wire::FATAL_DESERIALIZING_REQUEST, wire::INVALID_CALL_ID, e))?;
        wire::parse_context(ctx).map_err(|e| fatal(
            wire::FATAL_DESERIALIZING_REQUEST, wire::INVALID_CALL_ID,
            format!("cannot parse IpcConnectionContextProto: {e}")))?;
        let max = self.shared.cfg.max_connections;
        if self.shared.open.load(Ordering::Relaxed) >= max {
            return Err(Close::Quiet(format!("already serving {max} connections")));
        }
        let c = self.conns.get_mut(&id).expect("connection");
        c.client_id = header.client_id.to_vec();
        c.phase = Phase::Ready;
        c.last_active = Instant::now();
        self.shared.open.fetch_add(1, Ordering::Relaxed);
        self.shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn call(&mut self, id: usize, packet: &[u8]) -> Result<(), Close> {
        trace::mark(Point::Dispatch);
        let shared = &self.shared;
        let c = self.conns.get_mut(&id).expect("connection");
        let mut cur = Cursor::new(packet);
        let header = request_header(&mut cur)?;
        let call_id = header.call_id;
        if call_id == wire::PING_CALL_ID {
            shared.counters.pings.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if header.rpc_op == wire::RPC_CLOSE_CONNECTION {
            return Err(Close::Quiet("client asked to close".into()));
        }
        if call_id < 0 {
            return Err(fatal(wire::FATAL_INVALID_RPC_HEADER, wire::INVALID_CALL_ID,
                             format!("callId {call_id} is not a call")));
        }
        if header.rpc_kind != wire::RPC_PROTOCOL_BUFFER {
            return Err(fatal(wire::FATAL_UNSUPPORTED_SERIALIZATION, call_id,
                             format!("rpcKind {} not supported", header.rpc_kind)));
        }
        let retry = header.retry_count;
        let des = |e: String| fatal(wire::FATAL_DESERIALIZING_REQUEST, call_id, e);
        let rh = cur.delimited().map_err(des)?;
        let (method, protocol) = wire::parse_method_header(rh)
            .map_err(|e| des(format!("cannot parse RequestHeaderProto: {e}")))?;
        let body = cur.delimited().map_err(des)?;
        shared.counters.calls.fetch_add(1, Ordering::Relaxed);
        if protocol != shared.cfg.protocol {
            shared.counters.errors.fetch_add(1, Ordering::Relaxed);
            wire::error_packet(&mut c.wbuf, call_id, wire::ERROR, &c.client_id, retry,
                               "org.apache.hadoop.ipc.RpcNoSuchProtocolException",
                               &format!("unknown protocol {protocol}"), wire::ERROR_NO_SUCH_PROTOCOL);
            return Ok(());
        }
        match method {
            "echo" => {
                let payload = wire::parse_payload(body)
                    .map_err(|e| des(format!("cannot parse EchoRequestProto: {e}")))?;
                if shared.cfg.design == Design::Pooled && c.unsent() == 0 {
                    echo_in_place(c, call_id, retry, payload);
                } else {
                    echo_packet(&mut c.wbuf, call_id, &c.client_id, retry, payload);
                }
            }
            "ping" => {
                wire::check_message(body).map_err(|e| des(format!("cannot parse EmptyRequestProto: {e}")))?;
                wire::success_packet(&mut c.wbuf, call_id, &c.client_id, retry, &[]);
            }
            _ => {
                // every other method is Python's (an unknown one too: the handlers know the names)
                let mut q = shared.calls.lock().unwrap();
                if q.len() >= shared.cfg.queue_size {
                    drop(q);
                    shared.counters.errors.fetch_add(1, Ordering::Relaxed);
                    wire::error_packet(&mut c.wbuf, call_id, wire::ERROR, &c.client_id, retry,
                                       "org.apache.hadoop.ipc.RetriableException",
                                       "server too busy: call queue full", wire::ERROR_RPC_SERVER);
                    return Ok(());
                }
                q.push_back(PyCall { conn: id as u64, call_id, retry_count: retry, method: method.to_owned(),
                                     body: body.to_vec() });
                drop(q);
                c.in_python += 1;
                shared.counters.python_calls.fetch_add(1, Ordering::Relaxed);
                shared.calls_cv.notify_one();
                return Ok(());
            }
        }
        shared.counters.native_calls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

}


/// Naive framing: what was just encoded into the (fresh) write buffer is one newly allocated message;
/// it is copied behind the bytes that were waiting (`saved`).
pub(super) fn join_naive(stats: &BufferStats, c: &mut Conn, mut saved: Vec<u8>) {
    let fresh = std::mem::take(&mut c.wbuf);
    if !fresh.is_empty() {
        stats.alloc();
        stats.copy(fresh.len());
        saved.extend_from_slice(&fresh);
    }
    c.wbuf = saved;
}

/// A SUCCESS packet whose body is EchoResponseProto{payload}, but for the payload's bytes, which must
/// follow: its length counts them.
fn echo_head(out: &mut Vec<u8>, call_id: i32, client_id: &[u8], retry: i32, payload_len: usize) {
    let body_len = 1 + wire::varint_len(payload_len as u64) + payload_len;
    let start = out.len();
    // success_packet with the body's bytes appended in place
    wire::success_packet(out, call_id, client_id, retry, &[]);
    out.pop(); // the empty body's length byte
    wire::put_varint(out, body_len as u64);
    out.push(0x0a);
    wire::put_varint(out, payload_len as u64);
    let n = (out.len() - start - 4 + payload_len) as u32;
    out[start..start + 4].copy_from_slice(&n.to_be_bytes());
}

/// A SUCCESS packet whose body is EchoResponseProto{payload}, written without an intermediate copy.
fn echo_packet(out: &mut Vec<u8>, call_id: i32, client_id: &[u8], retry: i32, payload: &[u8]) {
    out.reserve(64 + payload.len());
    echo_head(out, call_id, client_id, retry, payload.len());
    out.extend_from_slice(payload);
}

/// Pooled, with nothing waiting to be sent: the echo's header is encoded into the (empty) write
/// buffer and sent with the payload straight from the read buffer, where the request landed (one
/// writev, no copy). What the socket does not take now is queued in the write buffer as usual; a
/// write error is left for `flush` to find.
fn echo_in_place(c: &mut Conn, call_id: i32, retry: i32, payload: &[u8]) {
    echo_head(&mut c.wbuf, call_id, &c.client_id, retry, payload.len());
    let head = c.wbuf.len();
    let mut sent = 0;
    while sent < head + payload.len() {
        let written = if sent < head {
            c.stream.write_pair(&c.wbuf[sent..], payload)
        } else {
            c.stream.write_pair(&payload[sent - head..], &[])
        };
        match written {
            Ok(0) => break,
            Ok(n) => {
                sent += n;
                c.last_write = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break, // WouldBlock: queued below; an error: flush meets it again
        }
    }
    if sent < head {
        c.wpos = sent;
        c.wbuf.extend_from_slice(payload);
    } else {
        let rest = &payload[sent - head..];
        c.wbuf.clear();
        c.wpos = 0;
        c.wbuf.extend_from_slice(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_packet_equals_success_packet_with_the_encoded_body() {
        let mut a = Vec::new();
        echo_packet(&mut a, 300, &[1; 16], -1, &[9; 200]);
        let mut body = vec![0x0a];
        wire::put_varint(&mut body, 200);
        body.extend_from_slice(&[9; 200]);
        let mut b = Vec::new();
        wire::success_packet(&mut b, 300, &[1; 16], -1, &body);
        assert_eq!(a, b);
    }
}
