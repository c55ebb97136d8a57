//! A blocking native verbs connection for Python's transport interface: framed messages (4-byte
//! big-endian length + body, as `StreamConnection`), raw bytes (the run-credential handshake), memory
//! registered on the connection, and one-sided READ/WRITE of a peer's region. A listener accepts
//! them. The protocol itself is `VerbsEnd`'s; this only adds deadlines and framing state.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::cm::{self, Event, VerbsListener};
use super::end::VerbsEnd;
use super::ffi::Mr;
use super::{LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE};

/// How often a reader or a writer waiting on the connection looks at its cut flag (`*_or_cut`).
const CUT_SLICE: Duration = Duration::from_millis(50);

fn cut_off() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the connection was cut off")
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} on the RDMA connection did not complete within the timeout"))
}

fn closed(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, what.to_string())
}

struct Registration(Mr);

// SAFETY: an opaque ibv_mr pointer, only passed back to the shim under the end's lock
unsafe impl Send for Registration {}

/// Where a framed receive that timed out stopped, so the next one resumes the same message.
#[derive(Default)]
struct RxFrame {
    hdr: [u8; 4],
    hdr_n: usize,
    body: Option<Vec<u8>>,
    body_n: usize,
}

/// One Python-facing connection. The listener (when accepted) is kept alive by its children: its
/// event channel must outlive every child cm id.
pub struct Conn {
    end: Arc<VerbsEnd>,
    regions: Mutex<HashMap<u64, Registration>>,
    next_region: AtomicU64,
    rx: Mutex<RxFrame>,
    tx: Mutex<()>,
    one_sided: Mutex<()>,
    _listener: Option<Arc<ListenerCore>>,
}

/// A one-sided operation's registered local memory, deregistered when the operation is over.
struct Scratch<'a> {
    end: &'a VerbsEnd,
    mr: Mr,
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        self.end.dereg(&self.mr);
    }
}

impl Conn {
    pub fn connect(host: &str, port: u16, timeout: Duration) -> io::Result<Conn> {
        Ok(Conn::new(cm::connect(host, port, timeout)?, None))
    }

    fn new(end: VerbsEnd, listener: Option<Arc<ListenerCore>>) -> Conn {
        let end = Arc::new(end);
        if let Some(l) = &listener {
            l.children.lock().unwrap().insert(end.cm_id as usize, Arc::downgrade(&end));
        }
        Conn { end, regions: Mutex::new(HashMap::new()), next_region: AtomicU64::new(1), rx: Mutex::default(),
               tx: Mutex::new(()), one_sided: Mutex::new(()), _listener: listener }
    }

    pub fn peer(&self) -> &str {
        &self.end.peer
    }

    /// Every byte of `bufs`, in order, before the deadline (waiting for credits as needed).
    pub fn write_all(&self, bufs: &[&[u8]], timeout: Duration) -> io::Result<()> {
        self.write_all_or_cut(bufs, timeout, &AtomicBool::new(false))
    }

    /// `write_all`, given up (ConnectionAborted) when `cut` is set while it waits for credits: a
    /// writer whose peer stopped reading (a pipeline stage that failed) is not held to the timeout.
    pub fn write_all_or_cut(&self, bufs: &[&[u8]], timeout: Duration, cut: &AtomicBool) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let _one_writer = self.tx.lock().unwrap();   // messages of two threads never interleave
        let (mut i, mut off) = (0, 0);
        while i < bufs.len() {
            if off == bufs[i].len() {
                i += 1;
                off = 0;
                continue;
            }
            let mut rest: Vec<&[u8]> = Vec::with_capacity(bufs.len() - i);
            rest.push(&bufs[i][off..]);
            rest.extend_from_slice(&bufs[i + 1..]);
            match self.end.write_vectored(&rest) {
                Ok(mut n) => {
                    while n > 0 {
                        let k = (bufs[i].len() - off).min(n);
                        off += k;
                        n -= k;
                        if off == bufs[i].len() && n > 0 {
                            i += 1;
                            off = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if cut.load(Ordering::SeqCst) {
                        return Err(cut_off());
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(timed_out("sending (the peer returned no send credits)"));
                    }
                    self.end.wait(true, (deadline - now).min(CUT_SLICE));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// `read_some`, given up (ConnectionAborted) when `cut` is set while it waits. Raw bytes, past the
    /// framing state of `recv`: for a reader that took the stream over at a message boundary.
    pub fn read_some_or_cut(&self, buf: &mut [u8], timeout: Duration, cut: &AtomicBool) -> io::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            if cut.load(Ordering::SeqCst) {
                return Err(cut_off());
            }
            let now = Instant::now();
            match self.read_some(buf, (now + CUT_SLICE).min(deadline)) {
                Err(e) if e.kind() == io::ErrorKind::TimedOut && now + CUT_SLICE < deadline => continue,
                other => return other,
            }
        }
    }

    /// At least one byte into `buf` before the deadline; the peer's CLOSE is an error.
    fn read_some(&self, buf: &mut [u8], deadline: Instant) -> io::Result<usize> {
        loop {
            match self.end.read(buf) {
                Ok(0) if !buf.is_empty() => return Err(closed(&format!("peer {} closed the connection", self.end.peer))),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let now = Instant::now();
                    if now >= deadline || !self.end.wait(false, deadline - now) {
                        return Err(timed_out("receiving"));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Exactly `buf.len()` raw bytes (no framing: the handshake before the first message). A
    /// timeout loses what was read; the handshake's caller closes the connection then anyway.
    pub fn read_exact(&self, buf: &mut [u8], timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let _rx = self.rx.lock().unwrap();
        let mut got = 0;
        while got < buf.len() {
            got += self.read_some(&mut buf[got..], deadline)?;
        }
        Ok(())
    }

    /// One framed message, of at most `max_length` bytes (`Err(Oversized)` beyond: the stream cannot be
    /// resynced). A timeout keeps what was read for the next call.
    pub fn recv(&self, timeout: Duration, max_length: usize) -> Result<Vec<u8>, RecvError> {
        let deadline = Instant::now() + timeout;
        let mut rx = self.rx.lock().unwrap();
        while rx.hdr_n < 4 {
            let n = rx.hdr_n;
            let mut hdr = rx.hdr;
            let got = self.read_some(&mut hdr[n..], deadline)?;
            rx.hdr = hdr;
            rx.hdr_n += got;
        }
        let length = u32::from_be_bytes(rx.hdr) as usize;
        if length > max_length {
            return Err(RecvError::Oversized(length));
        }
        if rx.body.is_none() {
            rx.body = Some(vec![0u8; length]);
            rx.body_n = 0;
        }
        while rx.body_n < length {
            let n = rx.body_n;
            let mut body = rx.body.take().unwrap();
            let got = self.read_some(&mut body[n..], deadline);
            rx.body = Some(body);
            rx.body_n += got?;
        }
        rx.hdr_n = 0;
        Ok(rx.body.take().unwrap())
    }

    /// Registers `len` bytes at `addr` for the peer to READ and WRITE: (id, rkey). The caller keeps
    /// the memory valid until `deregister(id)` or `close`.
    pub fn register(&self, addr: *mut u8, len: usize) -> io::Result<(u64, u32)> {
        let mut regions = self.regions.lock().unwrap();
        let mr = self.end.reg(addr, len, LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE)?;
        let id = self.next_region.fetch_add(1, Ordering::Relaxed);
        let rkey = mr.rkey;
        regions.insert(id, Registration(mr));
        Ok((id, rkey))
    }

    pub fn deregister(&self, id: u64) {
        if let Some(r) = self.regions.lock().unwrap().remove(&id) {
            self.end.dereg(&r.0);
        }
    }

    /// RDMA READ (`read`) of `len` bytes at the peer's (raddr, rkey) into local memory at `local`, or
    /// WRITE of them from there, waiting for the completion. The local memory is registered for
    /// the operation only. A timeout fails the connection: the operation may still land.
    pub fn one_sided(&self, read: bool, local: *mut u8, len: usize, raddr: u64, rkey: u32, timeout: Duration)
                     -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if len > u32::MAX as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a one-sided {len}-byte operation is over 4 GiB")));
        }
        let deadline = Instant::now() + timeout;
        let _one = self.one_sided.lock().unwrap();
        let mr = self.end.reg(local, len, if read { LOCAL_WRITE } else { 0 })?;
        let scratch = Scratch { end: &self.end, mr };
        let what = if read { "an RDMA READ" } else { "an RDMA WRITE" };
        let wid = loop {
            match self.end.post_one_sided(read, local as u64, len, scratch.mr.lkey, raddr, rkey) {
                Ok(w) => break w,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(timed_out(what));
                    }
                    self.end.wait(true, Duration::from_millis(2));
                }
                Err(e) => return Err(e),
            }
        };
        let spin_until = Instant::now() + super::spin();
        loop {
            if self.end.one_sided_done(wid)? {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                // it may still land in memory we are about to deregister: nothing may use this QP again
                self.end.fail(format!("{what} to {} timed out", self.end.peer));
                return Err(timed_out(what));
            }
            if now < spin_until {
                std::thread::yield_now();
                continue;
            }
            // arm, look once more (a completion before the arming raises no event), then sleep briefly:
            // another thread waiting on this connection may take the event
            self.end.arm();
            if self.end.one_sided_done(wid)? {
                return Ok(());
            }
            let ms = (deadline - now).as_millis().clamp(1, 5) as i32;
            let mut p = libc::pollfd { fd: self.end.comp_fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd
            unsafe { libc::poll(&mut p, 1, ms) };
            if p.revents != 0 {
                self.end.take_events();
            }
        }
    }

    /// Deregisters every region, then closes the end (the protection domain goes with it). Idempotent.
    pub fn close(&self) {
        if let Some(l) = &self._listener {   // before the cm id goes: a new child may get its address
            l.children.lock().unwrap().remove(&(self.end.cm_id as usize));
        }
        let _one = self.one_sided.lock().unwrap();
        for (_, r) in self.regions.lock().unwrap().drain() {
            self.end.dereg(&r.0);
        }
        self.end.close();
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close();   // before `_listener` goes: the child's cm id before the listener's channel
    }
}

pub enum RecvError {
    Io(io::Error),
    Oversized(usize),
}

impl From<io::Error> for RecvError {
    fn from(e: io::Error) -> Self {
        RecvError::Io(e)
    }
}

/// The listening cm id and its channel; shared with the accepted connections.
pub struct ListenerCore {
    inner: Mutex<VerbsListener>,
    /// accepted ends by cm id, for the channel's events about them (`accept`)
    children: Mutex<HashMap<usize, Weak<VerbsEnd>>>,
    fd: i32,
    closed: AtomicBool,
}

pub struct Listener {
    core: Arc<ListenerCore>,
    pub port: u16,
}

impl Listener {
    pub fn bind(host: &str, port: u16) -> io::Result<Listener> {
        let l = VerbsListener::bind(host, port)?;
        let (fd, port) = (l.fd, l.port);
        Ok(Listener { core: Arc::new(ListenerCore { inner: Mutex::new(l), children: Mutex::default(), fd, closed: AtomicBool::new(false) }), port })
    }

    /// The next connection within the timeout. Other events on the channel (an accepted peer's
    /// DISCONNECTED: a killed peer's kernel sends it, and no CLOSE) fail that child's end, so a
    /// reader that only waits for data from a dead peer learns it is gone.
    pub fn accept(&self, timeout: Duration) -> io::Result<Conn> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.core.closed.load(Ordering::SeqCst) {
                return Err(closed("listener closed"));
            }
            let event = self.core.inner.lock().unwrap().next();
            match event {
                Some(Event::Connected(end)) => return Ok(Conn::new(*end, Some(self.core.clone()))),
                Some(Event::Failed(why)) => return Err(io::Error::new(io::ErrorKind::ConnectionAborted, why)),
                Some(Event::Ended(id, why)) => {
                    let child = self.core.children.lock().unwrap().get(&(id as usize)).and_then(Weak::upgrade);
                    if let Some(end) = child {
                        end.fail(format!("{why} (peer {})", end.peer));
                    }
                    continue;
                }
                None => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no RDMA connection within the timeout"));
            }
            // short slices: close() from another thread is seen within 200 ms
            let ms = (deadline - now).as_millis().clamp(1, 200) as i32;
            let mut p = libc::pollfd { fd: self.core.fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd
            unsafe { libc::poll(&mut p, 1, ms) };
        }
    }

    /// Stops listening; the channel lives on with the last accepted connection.
    pub fn close(&self) {
        self.core.closed.store(true, Ordering::SeqCst);
        self.core.inner.lock().unwrap().stop_listening();
    }
}
