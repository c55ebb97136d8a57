//! Per-chunk checksums of the block store: one big-endian 32-bit CRC per `bpc` bytes (the last
//! chunk may be short), as HDFS keeps them. CRC32C (Castagnoli, HDFS's default `dfs.checksum.type`)
//! comes from the `crc32c` crate, which uses the SSE4.2 `crc32` instruction where the CPU has it
//! (and ARMv8's CRC extension), with a table fallback; CRC32 (IEEE, zlib's) from `crc32fast`
//! (PCLMULQDQ folding where present).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Crc32,
    Crc32c,
}

impl Kind {
    pub fn parse(name: &str) -> Option<Kind> {
        match name {
            "crc32" => Some(Kind::Crc32),
            "crc32c" => Some(Kind::Crc32c),
            _ => None,
        }
    }

    /// The label error messages use (as HDFS names the types).
    pub fn label(self) -> &'static str {
        match self {
            Kind::Crc32 => "CRC32",
            Kind::Crc32c => "CRC32C",
        }
    }

    pub fn crc(self, chunk: &[u8]) -> u32 {
        match self {
            Kind::Crc32 => crc32fast::hash(chunk),
            Kind::Crc32c => crc32c::crc32c(chunk),
        }
    }
}

/// Chunks of `bpc` bytes in `n` bytes (`bpc` > 0).
pub fn chunks(n: usize, bpc: usize) -> usize {
    n.div_ceil(bpc)
}

/// Appends the checksum of every chunk of `data` to `out`.
pub fn sums_into(kind: Kind, data: &[u8], bpc: usize, out: &mut Vec<u8>) {
    out.reserve(4 * chunks(data.len(), bpc));
    for chunk in data.chunks(bpc) {
        out.extend_from_slice(&kind.crc(chunk).to_be_bytes());
    }
}

/// Why a packet's checksums do not match its data.
#[derive(Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// The number of checksum bytes is not 4 per chunk.
    Count { have: usize, want: usize },
    /// The chunk with this index differs.
    Chunk(usize),
}

/// Checks every chunk of `data` against `sums`; the first chunk that differs, or a wrong count.
pub fn verify(kind: Kind, data: &[u8], sums: &[u8], bpc: usize) -> Result<(), Mismatch> {
    let want = 4 * chunks(data.len(), bpc);
    if sums.len() != want {
        return Err(Mismatch::Count { have: sums.len(), want });
    }
    for (i, (chunk, sum)) in data.chunks(bpc).zip(sums.chunks_exact(4)).enumerate() {
        if kind.crc(chunk).to_be_bytes() != sum {
            return Err(Mismatch::Chunk(i));
        }
    }
    Ok(())
}

/// The floor a per-chunk CRC32C path is measured against: the CPU's `crc32` instruction over each
/// `bpc`-byte chunk, 8 bytes at a time, with nothing else around it (no output, no dispatch); the
/// XOR of the chunks' CRC32Cs, so it cannot be optimised away and can be checked. `None` where the
/// CPU has no SSE4.2 (or is not x86-64).
///
/// Why this loop and not a faster one: it is the algorithm a 512-byte chunk gets (one dependent chain
/// per chunk; the `crc32c` crate interleaves three chains only from 768 bytes up), bound by the
/// instruction's latency on every x86-64 CPU, so the ratio of a path to it is the path's own overhead
/// and does not move with the host the way a ratio to interpreted Python does. Interleaving three
/// chunks would be the headroom left: about 3x on CPUs that issue one `crc32` per cycle.
pub fn instruction_floor(data: &[u8], bpc: usize) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2, checked just above.
        return Some(unsafe { sse42_chunks(data, bpc) });
    }
    let _ = (data, bpc);
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn sse42_chunks(data: &[u8], bpc: usize) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut fold = 0u32;
    for chunk in data.chunks(bpc) {
        let words = chunk.chunks_exact(8);
        let tail = words.remainder();
        let mut crc = u64::from(u32::MAX);
        for w in words {
            crc = _mm_crc32_u64(crc, u64::from_le_bytes(w.try_into().unwrap()));
        }
        let mut crc = crc as u32;
        for &b in tail {
            crc = _mm_crc32_u8(crc, b);
        }
        fold ^= !crc;
    }
    fold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_values() {
        // the catalogue's check value of each CRC over "123456789"
        assert_eq!(Kind::Crc32c.crc(b"123456789"), 0xE306_9283);
        assert_eq!(Kind::Crc32.crc(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn short_last_chunk_and_mismatch() {
        let data: Vec<u8> = (0..1300u32).map(|i| i as u8).collect();
        let mut sums = Vec::new();
        sums_into(Kind::Crc32c, &data, 512, &mut sums);
        assert_eq!(sums.len(), 12);
        assert_eq!(verify(Kind::Crc32c, &data, &sums, 512), Ok(()));
        let mut bad = data.clone();
        bad[1100] ^= 1;
        assert_eq!(verify(Kind::Crc32c, &bad, &sums, 512), Err(Mismatch::Chunk(2)));
        assert_eq!(verify(Kind::Crc32c, &data, &sums[..8], 512), Err(Mismatch::Count { have: 8, want: 12 }));
    }

    #[test]
    fn instruction_floor_is_the_xor_of_the_chunk_sums() {
        let data: Vec<u8> = (0..1300u32).map(|i| (i * 7) as u8).collect();
        let want = data.chunks(512).fold(0u32, |acc, c| acc ^ Kind::Crc32c.crc(c));
        if let Some(got) = instruction_floor(&data, 512) {
            assert_eq!(got, want);
        }
    }
}
