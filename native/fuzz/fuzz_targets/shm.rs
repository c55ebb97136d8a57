//! The shm transport's control data, which the peer can write: the handshake text
//! (`{"capacity": N}`) and a ring's head/tail counters. Input: 8 bytes head, 8 bytes tail, one byte
//! for the ring capacity's log2, two bytes for the copy size, then the handshake text. A copy must
//! stay inside the ring, move the counter by what it copies, and never copy more than is there
//! (reading) or free (writing).
#![no_main]

use hpcnet_native_fuzz::wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(cap) = wire::parse_shm_handshake(data) {
        assert!(cap.is_power_of_two() && cap <= wire::MAX_RING_CAPACITY);
    }
    let Some((head, rest)) = data.split_first_chunk::<8>() else { return };
    let Some((tail, rest)) = rest.split_first_chunk::<8>() else { return };
    let Some((shape, _)) = rest.split_first_chunk::<3>() else { return };
    let (head, tail) = (u64::from_le_bytes(*head), u64::from_le_bytes(*tail));
    // below 64: a power of two; from 64 on the byte itself, mostly not one (refused)
    let cap = if shape[0] < 64 { 1usize << shape[0] } else { shape[0] as usize };
    let want = u16::from_le_bytes([shape[1], shape[2]]) as usize;
    if let Ok(s) = wire::ring_read_span(head, tail, cap, want) {
        assert!(s.pos + s.n <= cap && s.n <= want);
        assert!(s.n as u64 <= head.wrapping_sub(tail));
        assert_eq!(s.moved, tail.wrapping_add(s.n as u64));
    }
    if let Ok(s) = wire::ring_write_span(head, tail, cap, want) {
        assert!(s.pos + s.n <= cap && s.n <= want);
        assert!(s.n as u64 <= cap as u64 - head.wrapping_sub(tail));
        assert_eq!(s.moved, head.wrapping_add(s.n as u64));
    }
});
