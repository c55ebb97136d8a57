//! Length-prefixed RPC frames: a stream of 4-byte big-endian lengths and packets, cut by
//! `wire::split_frame` against an ipc.maximum.data.length bound. The input's first two bytes pick a
//! small bound (so that packets fit in an input), the rest is the stream; the default 128 MiB bound
//! and the context bound are checked on the same bytes.
#![no_main]

use hpcnet_native_fuzz::{split_checked, wire};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((bound, stream)) = data.split_first_chunk::<2>() else { return };
    let limit = u16::from_be_bytes(*bound) as usize;
    let mut rest = stream;
    while let Some(packet) = split_checked(rest, limit) {
        rest = &rest[4 + packet.len()..];
    }
    split_checked(stream, wire::MAX_DATA_LENGTH);
    split_checked(stream, wire::MAX_CONTEXT_LENGTH);
});
