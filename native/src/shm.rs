//! The `shm` transport natively, wire-compatible with pytest_hpcnet/reference/transport/shm.py (read
//! its docstring for the design): an abstract unix socket named after (host, port) hands the client
//! one memfd with two single-producer/single-consumer byte rings and four eventfd doorbells
//! (SCM_RIGHTS); the socket then only tells each side when the other dies. A ring's control block
//! holds head, tail, reader-waiting, writer-waiting and closed, one 64-byte line each; a doorbell is
//! rung only when the other side's waiting flag is set, and every sleep is capped at 5 ms and
//! re-checks (the flag store and the counter load may be reordered).
//!
//! `ShmEnd::read`/`write` never block (WouldBlock when the ring is empty/full), so the event-driven
//! server uses an end like a non-blocking socket; `wait_readable`/`wait_writable` are the blocking
//! client's waits.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::wire::{self, RingSpan};

pub const CTRL: usize = 320;
pub const RING_CAPACITY: usize = 1 << 20;
const HEAD: usize = 0;
const TAIL: usize = 64;
const READER_WAITING: usize = 128;
const WRITER_WAITING: usize = 192;
const CLOSED: usize = 256;
const MAX_SLEEP: Duration = Duration::from_millis(5);

/// The client's spin before it sleeps on a doorbell: `HPCNET_SHM_SPIN` seconds (the Python
/// transport's knob), default `DEFAULT_SPIN`.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

pub fn spin() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        std::env::var("HPCNET_SHM_SPIN").ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| (0.0..1.0).contains(v))
            .map(Duration::from_secs_f64)
            .unwrap_or(DEFAULT_SPIN)
    })
}

pub fn socket_addr(host: &str, port: u16) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("pytest-hpcnet-shm/{host}:{port}").as_bytes())
}

fn last_error<T>() -> io::Result<T> {
    Err(io::Error::last_os_error())
}

struct Mapping {
    ptr: *mut u8,
    len: usize,
}

unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(fd: RawFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of a file we hold; unmapped once, in Drop
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if ptr == libc::MAP_FAILED {
            return last_error();
        }
        Ok(Mapping { ptr: ptr as *mut u8, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length; no reference outlives the ShmEnd that owns it
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// One direction inside the mapping: control block, then `cap` data bytes.
struct Ring {
    ctrl: *mut u8,
    data: *mut u8,
    cap: usize,
}

impl Ring {
    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` < CTRL and 8-aligned within a page-aligned mapping that lives as long as self
        unsafe { AtomicU64::from_ptr(self.ctrl.add(off) as *mut u64) }
    }
}

fn ring_bell(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: an 8-byte write to an eventfd we own
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

pub fn drain_bell(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: an 8-byte read from a non-blocking eventfd
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
}

/// One end of an shm connection.
pub struct ShmEnd {
    map: Mapping,
    rx: Ring,
    tx: Ring,
    pub my_data: OwnedFd,
    pub my_space: OwnedFd,
    peer_data: OwnedFd,
    peer_space: OwnedFd,
    pub live: UnixStream,
    closed: AtomicBool,
}

unsafe impl Send for ShmEnd {}
unsafe impl Sync for ShmEnd {}

impl ShmEnd {
    fn new(map: Mapping, cap: usize, server: bool, fds: [OwnedFd; 4], live: UnixStream) -> ShmEnd {
        let base = map.ptr;
        // SAFETY: the mapping is 2 * (CTRL + cap) bytes
        let c2s = Ring { ctrl: base, data: unsafe { base.add(CTRL) }, cap };
        let s2c = Ring { ctrl: unsafe { base.add(CTRL + cap) }, data: unsafe { base.add(2 * CTRL + cap) }, cap };
        let [srv_data, srv_space, cli_data, cli_space] = fds;
        let (rx, tx, my_data, my_space, peer_data, peer_space) = if server {
            (c2s, s2c, srv_data, srv_space, cli_data, cli_space)
        } else {
            (s2c, c2s, cli_data, cli_space, srv_data, srv_space)
        };
        ShmEnd { map, rx, tx, my_data, my_space, peer_data, peer_space, live, closed: AtomicBool::new(false) }
    }

    /// Bytes from the ring; WouldBlock when it is empty, Ok(0) once the peer has closed.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(io::Error::new(io::ErrorKind::NotConnected, "connection is closed"));
        }
        let r = &self.rx;
        let head = r.word(HEAD).load(Ordering::Acquire);
        let tail = r.word(TAIL).load(Ordering::Relaxed);
        if head == tail {
            if r.word(CLOSED).load(Ordering::Acquire) != 0 || self.peer_gone() {
                return Ok(0);
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let RingSpan { pos, n, moved } = wire::ring_read_span(head, tail, r.cap, buf.len())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        // SAFETY: [pos, pos + n) lies inside the ring's data, which only the producer writes, and
        // only outside [tail, head)
        unsafe { std::ptr::copy_nonoverlapping(r.data.add(pos), buf.as_mut_ptr(), n) };
        r.word(TAIL).store(moved, Ordering::Release);
        if r.word(WRITER_WAITING).load(Ordering::SeqCst) != 0 {
            ring_bell(&self.peer_space);
        }
        Ok(n)
    }

    /// Bytes into the ring; WouldBlock when it is full.
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[buf])
    }

    /// The slices' bytes into the ring, in order, as far as there is room; published to the reader
    /// (and its doorbell rung) once for all of them. WouldBlock when the ring is full.
    pub fn write_vectored(&self, bufs: &[&[u8]]) -> io::Result<usize> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(io::Error::new(io::ErrorKind::NotConnected, "connection is closed"));
        }
        let t = &self.tx;
        if self.peer_gone() || self.rx.word(CLOSED).load(Ordering::Relaxed) != 0 {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "peer closed the shared-memory connection"));
        }
        let mut head = t.word(HEAD).load(Ordering::Relaxed);
        let tail = t.word(TAIL).load(Ordering::Acquire);
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        let mut total = 0;
        'bufs: for buf in bufs {
            let mut done = 0;
            while done < buf.len() {
                let RingSpan { pos, n, moved } = wire::ring_write_span(head, tail, t.cap, buf.len() - done)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                if n == 0 {
                    break 'bufs;
                }
                // SAFETY: [pos, pos + n) is free space the consumer does not read until head moves
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr().add(done), t.data.add(pos), n) };
                head = moved;
                done += n;
                total += n;
            }
        }
        if total == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        t.word(HEAD).store(head, Ordering::SeqCst);
        if t.word(READER_WAITING).load(Ordering::SeqCst) != 0 {
            ring_bell(&self.peer_data);
        }
        Ok(total)
    }

    fn peer_gone(&self) -> bool {
        let mut b = [0u8; 1];
        // SAFETY: a non-blocking peek of one byte
        let n = unsafe {
            libc::recv(self.live.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 1,
                       libc::MSG_PEEK | libc::MSG_DONTWAIT)
        };
        if n == 0 {
            return true;
        }
        n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
    }

    /// The event-driven server keeps this set: every message the peer sends rings our data bell.
    pub fn always_ring_on_data(&self) {
        self.rx.word(READER_WAITING).store(1, Ordering::SeqCst);
    }

    pub fn set_writer_waiting(&self, on: bool) {
        self.tx.word(WRITER_WAITING).store(on as u64, Ordering::SeqCst);
    }

    fn readable_now(&self) -> bool {
        let r = &self.rx;
        r.word(HEAD).load(Ordering::Acquire) != r.word(TAIL).load(Ordering::Relaxed)
            || r.word(CLOSED).load(Ordering::Acquire) != 0
    }

    fn writable_now(&self) -> bool {
        let t = &self.tx;
        (t.word(HEAD).load(Ordering::Relaxed).wrapping_sub(t.word(TAIL).load(Ordering::Acquire)) as usize) < t.cap
    }

    /// Blocks until the ring has data (or the peer closed) or `timeout` passes; false on timeout.
    /// First spins for up to `spin()` (a reply already on its way arrives without a sleep, and the
    /// peer, seeing no waiting flag, rings no doorbell), then sleeps on the doorbell.
    pub fn wait_readable(&self, timeout: Duration) -> bool {
        let spin = spin().min(timeout);
        if !spin.is_zero() {
            let until = Instant::now() + spin;
            loop {
                for _ in 0..64 {
                    if self.readable_now() {
                        return true;
                    }
                    std::hint::spin_loop();
                }
                if Instant::now() >= until {
                    break;
                }
            }
        }
        self.wait(timeout, true)
    }

    pub fn wait_writable(&self, timeout: Duration) -> bool {
        self.wait(timeout, false)
    }

    fn wait(&self, timeout: Duration, read: bool) -> bool {
        let deadline = Instant::now() + timeout;
        let ready = || if read { self.readable_now() } else { self.writable_now() };
        let (flag_ring, flag, bell) = if read {
            (&self.rx, READER_WAITING, &self.my_data)
        } else {
            (&self.tx, WRITER_WAITING, &self.my_space)
        };
        loop {
            if ready() || self.closed.load(Ordering::Relaxed) {
                return true;
            }
            if self.peer_gone() {
                return true; // the read or write says so
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            flag_ring.word(flag).store(1, Ordering::SeqCst);
            if ready() {
                flag_ring.word(flag).store(0, Ordering::SeqCst);
                return true;
            }
            let ms = (deadline - now).min(MAX_SLEEP).as_millis().max(1) as i32;
            let mut fds = [
                libc::pollfd { fd: bell.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.live.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: two valid pollfds
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            flag_ring.word(flag).store(0, Ordering::SeqCst);
            if n > 0 && fds[0].revents != 0 {
                drain_bell(bell.as_raw_fd());
            }
        }
    }

    /// Marks our outgoing ring closed, wakes the peer and our own waiters, drops the liveness socket.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.tx.word(CLOSED).store(1, Ordering::SeqCst);
        for bell in [&self.peer_data, &self.peer_space, &self.my_data, &self.my_space] {
            ring_bell(bell);
        }
        let _ = self.live.shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for ShmEnd {
    fn drop(&mut self) {
        self.close();
        let _ = &self.map;
    }
}

fn peer_uid(sock: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the given size
    let rc = unsafe {
        libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED,
                         &mut cred as *mut libc::ucred as *mut libc::c_void, &mut len)
    };
    if rc != 0 {
        return last_error();
    }
    Ok(cred.uid)
}

fn euid() -> u32 {
    // SAFETY: no arguments, cannot fail
    unsafe { libc::geteuid() }
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: returns a new descriptor or -1
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return last_error();
    }
    // SAFETY: a fresh descriptor we own
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Listens on `(host, port)`; port 0 picks a free one in 20000..60000 as the Python transport does.
pub fn listen(host: &str, port: u16) -> io::Result<(UnixListener, u16)> {
    let mut err = None;
    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 ^ std::process::id() as u64).unwrap_or(7);
    for attempt in 0..50 {
        let p = if port != 0 {
            port
        } else {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            20000 + ((seed >> 33) % 40000) as u16
        };
        match UnixListener::bind_addr(&socket_addr(host, p)?) {
            Ok(l) => return Ok((l, p)),
            Err(e) => err = Some(e),
        }
        if port != 0 || attempt == 49 {
            break;
        }
    }
    Err(err.unwrap_or_else(|| io::Error::other("no free shm port")))
}

/// The server's half of the handshake on an accepted socket: check the peer's uid, create the rings
/// and doorbells, send the descriptors.
pub fn accept(sock: UnixStream, cap: usize) -> io::Result<ShmEnd> {
    let uid = peer_uid(&sock)?;
    if uid != euid() {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied,
                                  format!("shm peer runs as uid {uid}, not this run's uid {}", euid())));
    }
    // SAFETY: a fresh anonymous file
    let memfd = unsafe { libc::memfd_create(c"pytest-hpcnet-shm".as_ptr(), libc::MFD_CLOEXEC) };
    if memfd < 0 {
        return last_error();
    }
    // SAFETY: we own it
    let memfd = unsafe { OwnedFd::from_raw_fd(memfd) };
    let size = 2 * (CTRL + cap);
    // SAFETY: resizing our own file
    if unsafe { libc::ftruncate(memfd.as_raw_fd(), size as libc::off_t) } != 0 {
        return last_error();
    }
    let map = Mapping::map(memfd.as_raw_fd(), size)?;
    let bells = [eventfd()?, eventfd()?, eventfd()?, eventfd()?];
    let msg = format!("{{\"capacity\": {cap}}}");
    let raw = [memfd.as_raw_fd(), bells[0].as_raw_fd(), bells[1].as_raw_fd(), bells[2].as_raw_fd(),
               bells[3].as_raw_fd()];
    sock.set_write_timeout(Some(Duration::from_secs(5)))?;
    let end = ShmEnd::new(map, cap, true, bells, sock);
    // before the client has the rings: its first bytes (the preamble) must ring our data doorbell
    end.always_ring_on_data();
    send_fds(&end.live, msg.as_bytes(), &raw)?;
    drop(memfd);
    end.live.set_nonblocking(true)?;
    Ok(end)
}

/// The client's half: connect, check the server's uid, receive and map the rings.
pub fn connect(host: &str, port: u16, timeout: Duration) -> io::Result<ShmEnd> {
    let sock = UnixStream::connect_addr(&socket_addr(host, port)?)?;
    let uid = peer_uid(&sock)?;
    if uid != euid() {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!(
            "shm server {host}:{port} runs as uid {uid}, not ours ({})", euid())));
    }
    sock.set_read_timeout(Some(timeout))?;
    let (msg, mut fds) = recv_fds(&sock)?;
    if fds.len() != 5 {
        return Err(io::Error::new(io::ErrorKind::InvalidData,
                                  format!("shm server {host}:{port} sent a bad handshake")));
    }
    let cap = wire::parse_shm_handshake(&msg).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let memfd = fds.remove(0);
    let map = Mapping::map(memfd.as_raw_fd(), 2 * (CTRL + cap))?;
    drop(memfd);
    let [a, b, c, d]: [OwnedFd; 4] = fds.try_into().map_err(|_| io::Error::other("fds"))?;
    sock.set_nonblocking(true)?;
    Ok(ShmEnd::new(map, cap, false, [a, b, c, d], sock))
}

fn send_fds(sock: &UnixStream, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: msghdr and cmsg built per cmsg(3) over buffers that outlive the call
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg) as *mut RawFd, fds.len());
        if libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) < 0 {
            return last_error();
        }
    }
    Ok(())
}

fn recv_fds(sock: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut data = vec![0u8; 4096];
    let space = unsafe { libc::CMSG_SPACE((8 * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr() as *mut libc::c_void, iov_len: data.len() };
    let mut fds = Vec::new();
    // SAFETY: as in send_fds; every descriptor received is wrapped in an OwnedFd at once
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return last_error();
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                let p = libc::CMSG_DATA(cmsg) as *const RawFd;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(*p.add(i)));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        n as usize
    };
    data.truncate(n);
    Ok((data, fds))
}
