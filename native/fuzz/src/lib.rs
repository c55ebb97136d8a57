//! The native core's pure parsers, compiled from the crate's own source files so the fuzz targets
//! link without PyO3 (the core is a cdylib built for Python's extension-module ABI). Only modules
//! that depend on nothing but std belong here.

#[path = "../../src/wire.rs"]
pub mod wire;

#[path = "../../src/checksum.rs"]
pub mod checksum;

#[path = "../../src/dfs_wire.rs"]
pub mod dfs_wire;

use wire::{Cursor, Frame, RequestHeader, ResponseHeader, WireResult};

/// The server's reading of a connection context packet (server/protocol.rs `context`): a delimited
/// RpcRequestHeaderProto with callId -3, then a delimited IpcConnectionContextProto.
pub fn context_packet(packet: &[u8]) -> WireResult<(String, String)> {
    let mut cur = Cursor::new(packet);
    let header = RequestHeader::parse(cur.delimited()?)?;
    if header.call_id != wire::CONNECTION_CONTEXT_CALL_ID {
        return Err("not a connection context".into());
    }
    wire::parse_context(cur.delimited()?)
}

/// A parsed call: method, protocol, request length.
pub type Call = (String, String, usize);

/// The server's reading of a call packet (server/protocol.rs `call`): a delimited RpcRequestHeaderProto, then
/// for a call a delimited RequestHeaderProto and the request, parsed as the native methods do.
/// Returns the call id and, for a call, (method, protocol, body length).
pub fn call_packet(packet: &[u8]) -> WireResult<(i32, Option<Call>)> {
    let mut cur = Cursor::new(packet);
    let header = RequestHeader::parse(cur.delimited()?)?;
    if header.call_id < 0 || header.rpc_op == wire::RPC_CLOSE_CONNECTION {
        return Ok((header.call_id, None));
    }
    let (method, protocol) = wire::parse_method_header(cur.delimited()?)?;
    let body = cur.delimited()?;
    match method {
        "echo" => {
            wire::parse_payload(body)?;
        }
        "ping" => wire::check_message(body)?,
        _ => {}
    }
    Ok((header.call_id, Some((method.to_owned(), protocol.to_owned(), body.len()))))
}

/// The client's reading of a response packet (client.rs `decode`): a delimited
/// RpcResponseHeaderProto, then on SUCCESS the delimited response, parsed as an echo response.
pub fn response_packet(packet: &[u8]) -> WireResult<(ResponseHeader, Option<&[u8]>)> {
    let mut cur = Cursor::new(packet);
    let h = ResponseHeader::parse(cur.delimited()?)?;
    if h.status == wire::SUCCESS {
        let body = cur.delimited()?;
        wire::parse_payload(body)?;
        return Ok((h, Some(body)));
    }
    Ok((h, None))
}

/// The server's reading of one connection's byte stream (server/protocol.rs `process_buffer`): the
/// preamble, the connection context packet (bounded by MAX_CONTEXT_LENGTH), then call packets
/// (bounded by `max_data`) until the bytes run out or something is refused. Checks what the framing
/// promises on the way: a packet is never longer than the bound, and "need n bytes" always asks for
/// more than there is and at most one bounded frame.
pub fn serve_stream(stream: &[u8], max_data: usize) -> usize {
    match wire::check_preamble(stream) {
        Ok(true) => {}
        Ok(false) => {
            assert!(stream.len() < wire::PREAMBLE.len());
            return 0;
        }
        Err(_) => return 0,
    }
    let mut rest = &stream[wire::PREAMBLE.len()..];
    let mut packets = 0;
    loop {
        let limit = if packets == 0 { max_data.min(wire::MAX_CONTEXT_LENGTH) } else { max_data };
        let packet = match split_checked(rest, limit) {
            Some(p) => p,
            None => return packets,
        };
        rest = &rest[4 + packet.len()..];
        let ok = if packets == 0 { context_packet(packet).is_ok() } else { call_packet(packet).is_ok() };
        if !ok {
            return packets;
        }
        packets += 1;
    }
}

/// `wire::split_frame` with its promises checked.
pub fn split_checked(avail: &[u8], limit: usize) -> Option<&[u8]> {
    match wire::split_frame(avail, limit) {
        Ok(Frame::Packet(p)) => {
            assert!(p.len() <= limit && 4 + p.len() <= avail.len());
            assert_eq!(&avail[..4], &(p.len() as u32).to_be_bytes());
            Some(p)
        }
        Ok(Frame::Need(n)) => {
            assert!(n > avail.len() && n <= 4 + limit, "need {n} of {} (limit {limit})", avail.len());
            None
        }
        Err(len) => {
            assert!(len > limit && avail.len() >= 4);
            None
        }
    }
}
