//! One response packet as the client parses it: varint-delimited RpcResponseHeaderProto, then the
//! response on SUCCESS. A SUCCESS or ERROR packet the crate itself encodes from the parsed header
//! must parse back to the same call id and status.
#![no_main]

use hpcnet_native_fuzz::{response_packet, wire};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = response_packet(data);
    if let Ok(h) = wire::ResponseHeader::parse(data) {
        let mut out = Vec::new();
        let id = h.call_id as i32;
        if h.status == wire::SUCCESS {
            wire::success_packet(&mut out, id, b"0123456789abcdef", -1, b"");
        } else {
            wire::error_packet(&mut out, id, h.status, b"0123456789abcdef", -1, &h.exception_class,
                               &h.error_msg, h.error_detail.unwrap_or(0));
        }
        let (back, _) = response_packet(&out[4..]).expect("a re-encoded response parses");
        assert_eq!((back.call_id, back.status), (h.call_id, h.status));
        assert_eq!((back.exception_class, back.error_msg), if h.status == wire::SUCCESS {
            (String::new(), String::new())
        } else {
            (h.exception_class, h.error_msg)
        });
    }
});
