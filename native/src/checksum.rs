//! Per-chunk checksums of the block store: one big-endian 32-bit CRC per `bpc` bytes (the last
//! chunk may be short), as HDFS keeps them. CRC32C (Castagnoli, HDFS's default `dfs.checksum.type`)
//! comes from the `crc32c` crate, which uses the SSE4.2 `crc32` instruction where the CPU has it
//! (and ARMv8's CRC extension), with a table fallback; CRC32 (IEEE, zlib's) from `crc32fast`
//! (PCLMULQDQ folding where present).

use std::ops::ControlFlow;

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

    /// The name on the wire and in the meta files' magic table (what `parse` reads).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Crc32 => "crc32",
            Kind::Crc32c => "crc32c",
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
    let _ = each_sum::<()>(kind, data, bpc, |_, sum| {
        out.extend_from_slice(&sum.to_be_bytes());
        ControlFlow::Continue(())
    });
}

/// Calls `f` with the index and checksum of every chunk of `data`, in order, until it breaks.
///
/// Why three chunks at a time: a chunk's CRC32C is one dependent chain of `crc32` instructions, so
/// one chunk at a time runs at the instruction's latency (3 cycles on current x86-64) while the CPU
/// could issue one a cycle. Three chunks' chains side by side fill that pipeline; HDFS's native
/// checksum code pipelines its chunks the same way. The `crc32c` crate interleaves only within a
/// buffer of 768 bytes or more, which a 512-byte chunk never is.
fn each_sum<B>(kind: Kind, data: &[u8], bpc: usize, mut f: impl FnMut(usize, u32) -> ControlFlow<B>)
               -> ControlFlow<B> {
    let (mut i, mut rest) = (0, data);
    #[cfg(target_arch = "x86_64")]
    if kind == Kind::Crc32c && std::arch::is_x86_feature_detected!("sse4.2") {
        while rest.len() >= 3 * bpc {
            let (a, r) = rest.split_at(bpc);
            let (b, r) = r.split_at(bpc);
            let (c, r) = r.split_at(bpc);
            // SAFETY: the CPU has SSE4.2, checked above; the three chunks are `bpc` bytes each.
            let sums = unsafe { sse42_three_chains(a, b, c) };
            for (k, sum) in sums.into_iter().enumerate() {
                f(i + k, sum)?;
            }
            i += 3;
            rest = r;
        }
    }
    for chunk in rest.chunks(bpc) {
        f(i, kind.crc(chunk))?;
        i += 1;
    }
    ControlFlow::Continue(())
}

/// The CRC32Cs of three chunks of equal length, their chains advanced 8 bytes each per step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn sse42_three_chains(a: &[u8], b: &[u8], c: &[u8]) -> [u32; 3] {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    debug_assert!(a.len() == b.len() && b.len() == c.len());
    // SAFETY (of the reads below): `at + 8 <= words <= len` for all three.
    let word = |s: &[u8], at: usize| u64::from_le(std::ptr::read_unaligned(s.as_ptr().add(at).cast::<u64>()));
    let words = a.len() / 8 * 8;
    let (mut x, mut y, mut z) = (u64::from(u32::MAX), u64::from(u32::MAX), u64::from(u32::MAX));
    let mut at = 0;
    while at < words {
        x = _mm_crc32_u64(x, word(a, at));
        y = _mm_crc32_u64(y, word(b, at));
        z = _mm_crc32_u64(z, word(c, at));
        at += 8;
    }
    let (mut x, mut y, mut z) = (x as u32, y as u32, z as u32);
    for at in words..a.len() {
        x = _mm_crc32_u8(x, a[at]);
        y = _mm_crc32_u8(y, b[at]);
        z = _mm_crc32_u8(z, c[at]);
    }
    [!x, !y, !z]
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
    let found = each_sum(kind, data, bpc, |i, sum| {
        if sum.to_be_bytes() == sums[4 * i..4 * i + 4] {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(i)
        }
    });
    match found {
        ControlFlow::Break(i) => Err(Mismatch::Chunk(i)),
        ControlFlow::Continue(()) => Ok(()),
    }
}

/// The loop a per-chunk CRC32C path is measured against: the CPU's `crc32` instruction over each
/// `bpc`-byte chunk, 8 bytes at a time, one chunk after the other, with nothing else around it (no
/// output, no dispatch); the XOR of the chunks' CRC32Cs, so it cannot be optimised away and can be
/// checked. `None` where the CPU has no SSE4.2 (or is not x86-64).
///
/// It is the floor of one dependent chain per chunk, bound by the instruction's latency on every
/// x86-64 CPU, and written apart from the path on purpose: the path (`each_sum`) runs three chunks'
/// chains side by side and should cost well under this loop, so a path that lost its interleaving
/// (or gained overhead around it) shows as a ratio to this loop, which the host moves with it.
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
    fn three_chains_give_each_chunk_its_own_sum() {
        // lengths around the three-chunk step and chunk sizes that are not a multiple of 8
        for bpc in [1, 7, 8, 9, 511, 512, 513] {
            for n in [0, 1, bpc, 3 * bpc - 1, 3 * bpc, 3 * bpc + 1, 7 * bpc + 5] {
                let data: Vec<u8> = (0..n as u32).map(|i| (i * 31 + 7) as u8).collect();
                let mut sums = Vec::new();
                sums_into(Kind::Crc32c, &data, bpc, &mut sums);
                let want: Vec<u8> = data.chunks(bpc).flat_map(|c| crc32c::crc32c(c).to_be_bytes()).collect();
                assert_eq!(sums, want, "bpc {bpc}, {n} bytes");
                assert_eq!(verify(Kind::Crc32c, &data, &sums, bpc), Ok(()));
                if n > 0 {
                    let mut bad = data.clone();
                    bad[n - 1] ^= 0x80;
                    assert_eq!(verify(Kind::Crc32c, &bad, &sums, bpc), Err(Mismatch::Chunk((n - 1) / bpc)));
                }
            }
        }
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
