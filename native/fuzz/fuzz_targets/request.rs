//! One request packet as the server parses it: varint-delimited RpcRequestHeaderProto,
//! RequestHeaderProto and request (or IpcConnectionContextProto), down to the echo payload. What
//! parses is re-encoded with the crate's encoders and must parse back to the same values.
#![no_main]

use hpcnet_native_fuzz::{call_packet, context_packet, wire};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = context_packet(data);
    let _ = call_packet(data);
    if let Ok(h) = wire::RequestHeader::parse(data) {
        let mut out = Vec::new();
        wire::RequestHeader::encode(&mut out, h.call_id, h.client_id, h.retry_count);
        let back = wire::RequestHeader::parse(&out).expect("a re-encoded request header parses");
        assert_eq!((back.call_id, back.client_id, back.retry_count), (h.call_id, h.client_id, h.retry_count));
    }
    if let Ok((method, protocol)) = wire::parse_method_header(data) {
        let out = wire::encode_method_header(method, protocol, 1);
        assert_eq!(wire::parse_method_header(&out).expect("re-encoded"), (method, protocol));
    }
    if let Ok((user, protocol)) = wire::parse_context(data) {
        let out = wire::encode_context(&user, &protocol);
        assert_eq!(wire::parse_context(&out).expect("re-encoded"), (user, protocol));
    }
});
