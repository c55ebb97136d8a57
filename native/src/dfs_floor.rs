//! The block-write and block-read floors: what a verifying packet pipeline of this design costs on
//! this host with no protocol around it. One thread does what the client does per packet (copy the caller's bytes into
//! the packet, a CRC per chunk beside them, one send over loopback tcp); another does what the tail
//! datanode does (receive the packet whole, verify every chunk, write data and checksums to two files).
//! With more replicas the receivers form a chain, each but the last forwarding every packet before it
//! verifies and writes it, as the datanodes of a write pipeline do. No headers to parse, no acknowledgements, no window, no processes: the copies and checksum passes
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
/// checksum per `bpc` bytes, to `replicas` receivers in a chain (1: the sender and the tail). Every
/// receiver but the tail forwards each packet whole before it verifies and writes it, as a datanode
/// in a write pipeline does (`dfs_wire::receive_packets`); each receiver is a thread of its own, as each
/// datanode is a process. The files are removed before it returns.
pub fn write(dir: &Path, total: usize, packet: usize, bpc: usize, kind: Kind, replicas: usize, timeout: Duration)
             -> io::Result<Figures> {
    if replicas == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the write floor needs at least one replica"));
    }
    let mut files = Vec::with_capacity(replicas);
    for _ in 0..replicas {
        files.push(Replica::create(dir)?);
    }
    let mut hops = Vec::with_capacity(replicas);
    for _ in 0..replicas {
        hops.push(loopback_pair(timeout)?);
    }
    // hop i carries packets from stage i-1 (0: the sender) to receiver i
    let (sender, first) = hops.remove(0);
    let mut inbound = vec![first];
    let mut outbound = Vec::with_capacity(replicas - 1);
    for (out, into) in hops {
        outbound.push(out);
        inbound.push(into);
    }
    let (mut kept, mut receivers) = (Vec::with_capacity(replicas), Vec::with_capacity(replicas));
    let mut downstream = outbound.into_iter();
    let start = Instant::now();
    for (i, (conn, (replica, data_file, meta_file))) in inbound.into_iter().zip(files).enumerate() {
        kept.push(replica);
        let down = downstream.next();
        receivers.push(std::thread::Builder::new().name(format!("hpcnet-write-floor-{i}")).spawn(move || {
            receive(conn, down, data_file, meta_file, total, packet, bpc, kind)
        })?);
    }
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
    conclude(sent, thread_cpu() - cpu0, &sender, receivers, start, kept)
}

/// One receiver of the write floor: what a datanode does per packet (receive it whole, forward it
/// when a downstream follows, verify every chunk, write data and checksums); its CPU seconds.
#[allow(clippy::too_many_arguments)]
fn receive(mut conn: TcpStream, mut down: Option<TcpStream>, mut data_file: File, mut meta_file: File, total: usize,
           packet: usize, bpc: usize, kind: Kind) -> io::Result<f64> {
    let cpu0 = thread_cpu();
    let mut buf = Vec::new();
    let mut left = total;
    while left > 0 {
        let data_len = packet.min(left);
        let sums_len = 4 * data_len.div_ceil(bpc);
        let n = dfs_wire::read_frame(&mut conn, &mut buf, sums_len + data_len)
            .map_err(|e| io::Error::other(e.describe()))?;
        if n != sums_len + data_len {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a {n}-byte packet, expected {}", sums_len + data_len)));
        }
        if let Some(d) = down.as_mut() {
            d.write_all(&buf[..4 + n])?;
        }
        let (sums, data) = buf[4..4 + n].split_at(sums_len);
        checksum::verify(kind, data, sums, bpc)
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, format!("checksum mismatch: {m:?}")))?;
        data_file.write_all(data)?;
        meta_file.write_all(sums)?;
        left -= data_len;
    }
    Ok(thread_cpu() - cpu0)
}

/// The end of a floor run: the receiving threads joined (woken by a shutdown when the sender failed;
/// a receiver that fails drops its sockets, which ends its neighbours' waits), the replicas removed,
/// and the figures (the receivers' CPU summed), or the first error.
fn conclude(sent: io::Result<()>, sender_cpu: f64, sender: &TcpStream, receivers: Vec<std::thread::JoinHandle<io::Result<f64>>>,
            start: Instant, replicas: Vec<Replica>) -> io::Result<Figures> {
    if sent.is_err() {
        let _ = sender.shutdown(Shutdown::Both);
    }
    let received: Vec<io::Result<f64>> = receivers.into_iter()
        .map(|r| r.join().unwrap_or_else(|_| Err(io::Error::other("a receiving thread panicked"))))
        .collect();
    let seconds = start.elapsed().as_secs_f64();
    drop(replicas);
    sent?;
    let mut receiver_cpu = 0.0;
    for r in received {
        receiver_cpu += r?;
    }
    Ok(Figures { seconds, sender_cpu, receiver_cpu })
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
    conclude(sent, thread_cpu() - cpu0, &sender, vec![client], start, vec![replica])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_runs_to_the_end_and_keeps_nothing() {
        let dir = std::env::temp_dir().join(format!("hpcnet-floor-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = write(&dir, 3 * 65536 + 1000, 65536, 512, Kind::Crc32c, 1, Duration::from_secs(10)).unwrap();
        assert!(f.seconds > 0.0 && f.sender_cpu >= 0.0 && f.receiver_cpu >= 0.0);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_chain_of_three_writes_three_replicas_and_keeps_nothing() {
        let dir = std::env::temp_dir().join(format!("hpcnet-floor-chain-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = write(&dir, 5 * 65536 + 512, 65536, 512, Kind::Crc32c, 3, Duration::from_secs(10)).unwrap();
        assert!(f.seconds > 0.0 && f.receiver_cpu >= 0.0);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        assert!(write(&dir, 512, 512, 512, Kind::Crc32c, 0, Duration::from_secs(1)).is_err());
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_receiver_forwards_a_packet_before_it_finds_it_corrupt_and_then_stops() {
        let dir = std::env::temp_dir().join(format!("hpcnet-floor-corrupt-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (replica, data_file, meta_file) = Replica::create(&dir).unwrap();
        let (mut up, conn) = loopback_pair(Duration::from_secs(10)).unwrap();
        let (out, mut down) = loopback_pair(Duration::from_secs(10)).unwrap();
        let data = pattern(1024);
        let mut frame = vec![0; 4];
        checksum::sums_into(Kind::Crc32c, &data, 512, &mut frame);
        frame.extend_from_slice(&data);
        let n = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&n.to_be_bytes());
        *frame.last_mut().unwrap() ^= 1;
        up.write_all(&frame).unwrap();
        let e = receive(conn, Some(out), data_file, meta_file, 1024, 1024, 512, Kind::Crc32c).unwrap_err();
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
        let mut forwarded = Vec::new();
        down.read_to_end(&mut forwarded).unwrap();
        assert_eq!(forwarded, frame);
        assert_eq!(std::fs::metadata(&replica.paths[0]).unwrap().len(), 0);
        drop(replica);
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
        let e = write(Path::new("/nonexistent/hpcnet"), 1000, 512, 512, Kind::Crc32c, 1, Duration::from_secs(1))
            .err().unwrap();
        assert!(e.to_string().starts_with("/nonexistent/hpcnet/hpcnet-write-floor-"), "{e}");
    }
}
