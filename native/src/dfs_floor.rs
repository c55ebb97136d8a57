//! The block-write and block-read floors: what a verifying packet pipeline of this design costs on
//! this host with no protocol around it. One thread does what the client does per packet (copy the caller's bytes into
//! the packet, a CRC per chunk beside them, one send over loopback tcp); another does what the tail
//! datanode does (receive the packet whole, verify every chunk, write data and checksums to two files).
//! No headers to parse, no acknowledgements, no window, no processes: the copies and checksum passes
//! the design cannot do without. `bench_blockstore.py` puts the block store between it and `dd`, so
//! a short store says whether the stack or the design fell short.
//!
//! The read floor does what a native datanode and client do per packet of a read: one thread reads the
//! packet's checksums from the meta file, sends them and then the data from the page cache with
//! `sendfile`; the other receives both, the data into one buffer it reuses (the caller's), and
//! verifies every chunk. No requests, headers or processes.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::checksum::{self, Kind};
use crate::dfs_wire;

/// Wall seconds of the whole write, and the CPU seconds of its sending and receiving threads.
pub struct Figures {
    pub seconds: f64,
    pub sender_cpu: f64,
    pub receiver_cpu: f64,
}

fn thread_cpu() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec for the calling thread's clock
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// The two replica files, removed when dropped (the floor keeps nothing).
struct Replica {
    paths: [PathBuf; 2],
}

impl Replica {
    fn create(dir: &Path) -> io::Result<(Replica, File, File)> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let stem = format!("hpcnet-write-floor-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let paths = [dir.join(format!("{stem}.data")), dir.join(format!("{stem}.meta"))];
        let open = |p: &Path| OpenOptions::new().write(true).create_new(true).open(p)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())));
        let data = open(&paths[0])?;
        let replica = Replica { paths: paths.clone() };   // from here on, dropping removes what exists
        let meta = open(&paths[1])?;
        Ok((replica, data, meta))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A connected pair of loopback tcp sockets (sender, receiver), every wait ending after `timeout`.
fn loopback_pair(timeout: Duration) -> io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let sender = TcpStream::connect_timeout(&addr, timeout)?;
    let (receiver, _) = listener.accept()?;
    for s in [&sender, &receiver] {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
    }
    Ok((sender, receiver))
}

/// The floor's data: the same bytes for every packet-sized piece.
fn pattern(packet: usize) -> Vec<u8> {
    (0..packet as u64).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()
}

/// Writes `total` bytes through the floor pipeline into `dir`, `packet` data bytes per packet and a
/// checksum per `bpc` bytes. The files are removed before it returns.
pub fn write(dir: &Path, total: usize, packet: usize, bpc: usize, kind: Kind, timeout: Duration) -> io::Result<Figures> {
    let (replica, mut data_file, mut meta_file) = Replica::create(dir)?;
    let (sender, receiver) = loopback_pair(timeout)?;
    let start = Instant::now();
    let tail = std::thread::Builder::new().name("hpcnet-write-floor".into()).spawn(move || -> io::Result<f64> {
        let cpu0 = thread_cpu();
        let mut conn = receiver;
        let mut buf = Vec::new();
        let mut left = total;
        while left > 0 {
            // received as the datanode receives a packet (`dfs_wire::read_frame`)
            let data_len = packet.min(left);
            let sums_len = 4 * data_len.div_ceil(bpc);
            let n = dfs_wire::read_frame(&mut conn, &mut buf, sums_len + data_len)
                .map_err(|e| io::Error::other(e.describe()))?;
            if n != sums_len + data_len {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a {n}-byte packet, expected {}", sums_len + data_len)));
            }
            let (sums, data) = buf[4..].split_at(sums_len);
            checksum::verify(kind, data, sums, bpc)
                .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, format!("checksum mismatch: {m:?}")))?;
            data_file.write_all(data)?;
            meta_file.write_all(sums)?;
            left -= data_len;
        }
        Ok(thread_cpu() - cpu0)
    })?;
    let cpu0 = thread_cpu();
    let sent = (|| -> io::Result<()> {
        let source = pattern(packet);
        let mut frame = Vec::with_capacity(4 + 4 * packet.div_ceil(bpc) + packet);
        let mut left = total;
        let mut conn = &sender;
        while left > 0 {
            let data = &source[..packet.min(left)];
            frame.clear();
            frame.extend_from_slice(&[0; 4]);
            checksum::sums_into(kind, data, bpc, &mut frame);
            frame.extend_from_slice(data);     // the client's copy of the caller's bytes into its packet
            let n = (frame.len() - 4) as u32;
            frame[..4].copy_from_slice(&n.to_be_bytes());
            conn.write_all(&frame)?;
            left -= data.len();
        }
        Ok(())
    })();
    conclude(sent, thread_cpu() - cpu0, &sender, tail, start, replica)
}

/// The end of a floor run: the receiving thread joined (woken by a shutdown when the sender failed),
/// the replica removed, and the figures, or the first error.
fn conclude(sent: io::Result<()>, sender_cpu: f64, sender: &TcpStream, receiver: std::thread::JoinHandle<io::Result<f64>>,
            start: Instant, replica: Replica) -> io::Result<Figures> {
    if sent.is_err() {
        let _ = sender.shutdown(Shutdown::Both);
    }
    let received = receiver.join().map_err(|_| io::Error::other("the receiving thread panicked"))?;
    let seconds = start.elapsed().as_secs_f64();
    drop(replica);
    sent?;
    Ok(Figures { seconds, sender_cpu, receiver_cpu: received? })
}

/// Reads `total` bytes of a replica in `dir` through the read floor, `packet` data bytes per packet
/// and a checksum per `bpc` bytes. The replica is written first (not timed, left in the page cache)
/// and removed before it returns.
pub fn read(dir: &Path, total: usize, packet: usize, bpc: usize, kind: Kind, timeout: Duration) -> io::Result<Figures> {
    let (replica, mut data_file, mut meta_file) = Replica::create(dir)?;
    let source = pattern(packet);
    let mut sums = Vec::new();
    for at in (0..total).step_by(packet) {
        let data = &source[..packet.min(total - at)];
        sums.clear();
        checksum::sums_into(kind, data, bpc, &mut sums);
        data_file.write_all(data)?;
        meta_file.write_all(&sums)?;
    }
    let (data_file, meta_file) = (File::open(&replica.paths[0])?, File::open(&replica.paths[1])?);
    let (sender, receiver) = loopback_pair(timeout)?;
    let start = Instant::now();
    let client = std::thread::Builder::new().name("hpcnet-read-floor".into()).spawn(move || -> io::Result<f64> {
        let cpu0 = thread_cpu();
        let mut conn = receiver;
        let (mut buf, mut sums) = (vec![0u8; packet], Vec::new());
        let mut left = total;
        while left > 0 {
            let n = packet.min(left);
            sums.resize(4 * n.div_ceil(bpc), 0);
            conn.read_exact(&mut sums)?;
            conn.read_exact(&mut buf[..n])?;
            checksum::verify(kind, &buf[..n], &sums, bpc)
                .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, format!("checksum mismatch: {m:?}")))?;
            left -= n;
        }
        Ok(thread_cpu() - cpu0)
    })?;
    let cpu0 = thread_cpu();
    let sent = (|| -> io::Result<()> {
        let mut conn = &sender;
        let mut sums = Vec::new();
        for at in (0..total).step_by(packet) {
            let n = packet.min(total - at);
            sums.resize(4 * n.div_ceil(bpc), 0);
            meta_file.read_exact_at(&mut sums, (4 * (at / bpc)) as u64)?;
            conn.write_all(&sums)?;
            let mut off = at as libc::off_t;
            let end = (at + n) as libc::off_t;
            while off < end {
                // SAFETY: two open descriptors of ours; `off` is ours
                let k = unsafe { libc::sendfile(sender.as_raw_fd(), data_file.as_raw_fd(), &mut off, (end - off) as usize) };
                if k <= 0 {
                    return Err(if k == 0 { io::Error::other("the replica ended early") } else { io::Error::last_os_error() });
                }
            }
        }
        Ok(())
    })();
    conclude(sent, thread_cpu() - cpu0, &sender, client, start, replica)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_runs_to_the_end_and_keeps_nothing() {
        let dir = std::env::temp_dir().join(format!("hpcnet-floor-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = write(&dir, 3 * 65536 + 1000, 65536, 512, Kind::Crc32c, Duration::from_secs(10)).unwrap();
        assert!(f.seconds > 0.0 && f.sender_cpu >= 0.0 && f.receiver_cpu >= 0.0);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn the_read_floor_verifies_every_byte_and_keeps_nothing() {
        let dir = std::env::temp_dir().join(format!("hpcnet-read-floor-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = read(&dir, 3 * 65536 + 1000, 65536, 512, Kind::Crc32c, Duration::from_secs(10)).unwrap();
        assert!(f.seconds > 0.0 && f.sender_cpu >= 0.0 && f.receiver_cpu >= 0.0);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_is_one_error_naming_it() {
        let e = write(Path::new("/nonexistent/hpcnet"), 1000, 512, 512, Kind::Crc32c, Duration::from_secs(1))
            .err().unwrap();
        assert!(e.to_string().starts_with("/nonexistent/hpcnet/hpcnet-write-floor-"), "{e}");
    }
}
