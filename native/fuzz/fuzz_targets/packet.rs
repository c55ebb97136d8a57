//! The datanode's packet path (`dfs_wire::receive_packets`, what `BlockStream.receive` runs): an
//! upstream byte stream of frames is received, parsed, forwarded, verified and written, with the
//! input's first byte picking the checksum type, bytes per checksum, the starting offset and whether
//! there is a downstream. Checks what the loop promises: what is written is exactly the verified
//! packets' data (checksums 4 bytes per chunk beside it), each forwarded frame went out whole, the
//! acks are in order, and every error ends the stream with one ack or stop, never a panic.
//! The downstream acknowledgement check (`check_ack`) is fed the same bytes.
#![no_main]

use hpcnet_native_fuzz::checksum::{self, Kind};
use hpcnet_native_fuzz::dfs_wire::{self, Ack, End, Stage};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, stream)) = data.split_first() else { return };
    let kind = if mode & 1 == 0 { Kind::Crc32c } else { Kind::Crc32 };
    let bpc = [512, 1, 7, 64][(mode as usize >> 1) & 3];
    let offset = [0u64, 512, 1 << 40][((mode as usize >> 3) & 3) % 3];
    let stage = Stage { kind, bpc, index: 2, offset, label: "fuzz" };
    let (mut down, mut file, mut meta, mut acks) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut up = stream;
    let forward = mode & 0x20 != 0;
    let (end, length) = dfs_wire::receive_packets(&stage, &mut up, if forward { Some(&mut down) } else { None },
                                                  &mut file, &mut meta, &mut |a| acks.push(a), &mut Vec::new());
    assert_eq!(length - offset, file.len() as u64);
    assert_eq!(meta.len() % 4, 0);
    checksum::verify(kind, &[], &[], bpc).unwrap();
    if !forward {
        assert!(down.is_empty());
    } else {
        assert!(down.len() <= stream.len());
        assert_eq!(&stream[..down.len()], &down[..]);   // frames forwarded exactly as they came
    }
    match &end {
        End::Last { .. } => assert!(acks.iter().all(|a| matches!(a, Ack::Ok { last: false, .. }))),
        End::Upstream(_) => assert_eq!(acks.last(), Some(&Ack::Stop)),
        End::Checksum(m) | End::Downstream(m) | End::Disk(m) => {
            assert!(!m.contains('\n'));
            assert!(matches!(acks.last(), Some(Ack::Error { .. })));
        }
    }
    let _ = dfs_wire::check_ack(stream, 0, 3, "fuzz");
});
