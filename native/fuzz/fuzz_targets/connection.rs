//! A whole connection as the server reads it: preamble ("hrpc", version 9, service class, auth),
//! the connection context packet, then call packets, each parsed down to the request body. The
//! input's first byte picks the ipc.maximum.data.length bound (small ones and the default).
#![no_main]

use hpcnet_native_fuzz::{serve_stream, wire};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, stream)) = data.split_first() else { return };
    let max_data = match pick {
        0 => wire::MAX_DATA_LENGTH,
        n => n as usize * 16,
    };
    serve_stream(stream, max_data);
});
