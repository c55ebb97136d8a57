//! One native verbs connection: the byte stream over eager slots and rendezvous, with credits.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::c_void;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ffi::{self, Ep, Mr, Wc};
use crate::trace::{self, Point};
use super::*;

/// Registered memory we own (page-aligned), deregistered and freed on drop.
pub struct Region {
    ptr: *mut u8,
    len: usize,
    mr: Mr,
}

unsafe impl Send for Region {}

impl Region {
    pub fn new(ep: *mut Ep, len: usize, access: i32) -> io::Result<Region> {
        let layout = std::alloc::Layout::from_size_align(len.max(64), 4096).map_err(io::Error::other)?;
        // SAFETY: a non-zero-sized layout; freed in Drop with the same layout
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "cannot allocate a registered region"));
        }
        let mut mr = Mr { mr: std::ptr::null_mut(), lkey: 0, rkey: 0 };
        // SAFETY: `ptr` is valid for `len.max(64)` bytes for as long as the MR lives (dropped first)
        if unsafe { ffi::hv_reg(ep, ptr as *mut c_void, len.max(64), access, &mut mr) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: allocated above with this layout
            unsafe { std::alloc::dealloc(ptr, layout) };
            return Err(io::Error::new(e.kind(), format!("registering {len} bytes failed: {e}")));
        }
        Ok(Region { ptr, len, mr })
    }

    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: our allocation of at least `len` bytes; RDMA writes into it are ordered by the
        // completions we poll before reading
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is the only Rust access
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: 8-aligned inside a page-aligned allocation; the peer RDMA-WRITEs it
        unsafe { AtomicU64::from_ptr(self.ptr.add(off) as *mut u64) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: the MR registered in `new`, then the allocation it covered
        unsafe {
            ffi::hv_dereg(self.mr.mr);
            std::alloc::dealloc(self.ptr, std::alloc::Layout::from_size_align_unchecked(self.len.max(64), 4096));
        }
    }
}

/// What the byte stream holds next: an eager slot's payload, a rendezvous landing, or the peer's CLOSE.
enum Rx {
    Slot { slot: usize, pos: usize, end: usize },
    Landing { wr_id: u64, tag: u64, region: Region, pos: usize, ready: bool, posted: bool, src: (u64, u32) },
    Close,
}

struct State {
    ep: *mut Ep,
    recv: Region,
    send: Region,
    credit: Region, // word 0: the peer writes its re-posted count here; word 8: the source of ours
    free_send: Vec<usize>,
    sent: u64,
    peer_reposted: u64,
    reposted: u64,
    reported: u64,
    sq_used: usize,
    rx: VecDeque<Rx>,
    staging: HashMap<u64, Region>, // tag -> our rendezvous source, until the peer's FIN
    next_tag: u64,
    next_rdma: u64,
    control: VecDeque<(u8, Vec<u8>)>, // FIN/HELLO waiting for a credit
    peer_credit: Option<(u64, u32)>,
    error: Option<String>,
    closed: bool,
    answers_hello: bool, // the accepting side answers the client's HELLO with its own
    one_sided_done: HashSet<u64>, // completed one-sided READ/WRITEs (`post_one_sided`), until taken
    next_one_sided: u64,
}

unsafe impl Send for State {}

/// One end of a verbs connection. The cm id (and a client's own event channel) belong to it.
pub struct VerbsEnd {
    st: Mutex<State>,
    pub comp_fd: RawFd,
    pub cm_id: *mut c_void,
    channel: *mut c_void, // a client's rdma_cm channel; null on the server (the listener's)
    pub cm_fd: Option<RawFd>,
    pub peer: String,
    waiters: AtomicUsize,
}

unsafe impl Send for VerbsEnd {}
unsafe impl Sync for VerbsEnd {}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn broken(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, msg.to_string())
}

impl VerbsEnd {
    /// Our QP, CQ and memory on a cm id whose route is resolved (client) or that a CONNECT_REQUEST
    /// created (server). The caller then brings it up, connects or accepts, and says hello.
    pub fn create(cm_id: *mut c_void, channel: *mut c_void, peer: String, answers_hello: bool)
                  -> io::Result<VerbsEnd> {
        // SAFETY: a live cm id with a device (route resolved or connect request)
        let ep = unsafe { ffi::hv_ep_create(cm_id, SEND_DEPTH as i32, RECV_DEPTH as i32, CQ_DEPTH as i32, super::max_inline()) };
        if ep.is_null() {
            return Err(os_err("creating the RDMA queue pair failed"));
        }
        let regions = (|| -> io::Result<(Region, Region, Region)> {
            Ok((Region::new(ep, RECV_DEPTH * SLOT, LOCAL_WRITE)?, Region::new(ep, SEND_SLOTS * SLOT, LOCAL_WRITE)?,
                Region::new(ep, 64, LOCAL_WRITE | REMOTE_WRITE)?))
        })();
        let (recv, send, credit) = match regions {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: created above, nothing registered on it any more
                unsafe { ffi::hv_ep_destroy(ep) };
                return Err(e);
            }
        };
        // SAFETY: a live endpoint
        let comp_fd = unsafe { ffi::hv_ep_fd(ep) };
        let cm_fd = if channel.is_null() { None } else { Some(unsafe { ffi::hv_channel_fd(channel) }) };
        Ok(VerbsEnd {
            st: Mutex::new(State {
                ep, recv, send, credit, free_send: (0..SEND_SLOTS).rev().collect(), sent: 0, peer_reposted: 0,
                reposted: 0, reported: 0, sq_used: 0, rx: VecDeque::new(), staging: HashMap::new(), next_tag: 1,
                next_rdma: RDMA_BASE, control: VecDeque::new(), peer_credit: None, error: None, closed: false,
                answers_hello, one_sided_done: HashSet::new(),
                next_one_sided: ONE_SIDED_BASE,
            }),
            comp_fd, cm_id, channel, cm_fd, peer, waiters: AtomicUsize::new(0),
        })
    }

    pub fn qpn(&self) -> u32 {
        // SAFETY: the endpoint lives until close
        unsafe { ffi::hv_ep_qpn(self.st.lock().unwrap().ep) }
    }

    /// INIT (post every receive there) -> RTR -> RTS, then arm the CQ.
    pub fn bring_up(&self) -> io::Result<()> {
        let st = self.st.lock().unwrap();
        for state in 1..=3 {
            // SAFETY: live endpoint and cm id
            if unsafe { ffi::hv_ep_modify(st.ep, self.cm_id, state, QP_TIMEOUT, RETRY) } != 0 {
                return Err(os_err("moving the queue pair to RTS failed"));
            }
            if state == 1 {
                for slot in 0..RECV_DEPTH {
                    st.post_recv(slot)?;
                }
            }
        }
        // SAFETY: live endpoint
        unsafe { ffi::hv_arm(st.ep) };
        Ok(())
    }

    /// The first message each way: where our credit word is (the client sends first).
    pub fn hello(&self) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        let h = st.hello_payload();
        st.control.push_back((HELLO, h));
        st.flush_control();
        Ok(())
    }

    /// Takes the completion channel's events, leaving the CQ unarmed (the server's loop, on its
    /// readiness: it busy-polls the connection next, and an armed CQ would raise an event, and wake
    /// the loop's poll, for every completion it reaps by polling anyway).
    pub fn take_events(&self) {
        let st = self.st.lock().unwrap();
        // SAFETY: live endpoint (closed ones are deregistered before their endpoint goes)
        if !st.closed {
            unsafe { ffi::hv_take_events(st.ep) };
        }
    }

    /// Arms the CQ: its next completion raises an event on the channel (before the loop sleeps; the
    /// caller then looks at the connection once more, for what came before the arming).
    pub fn arm(&self) {
        let st = self.st.lock().unwrap();
        // SAFETY: as above
        if !st.closed {
            unsafe { ffi::hv_arm(st.ep) };
        }
    }

    /// The connection failed (an rdma_cm event about it, seen by whoever reads its channel).
    pub fn fail(&self, why: String) {
        let mut st = self.st.lock().unwrap();
        if st.error.is_none() {
            st.error = Some(why);
        }
    }

    /// What is there to read. The CQ is polled only when nothing is: a caller that just saw the
    /// connection readable has had its poll, and under emulation each poll costs a good part of a
    /// microsecond on the round trip's path (more comes on the next read).
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut st = self.st.lock().unwrap();
        if !st.front_ready() {
            st.progress(&self.peer);
        }
        let got = st.read(buf);
        if got.as_ref().is_ok_and(|n| *n > 0) {
            trace::mark(Point::Read);
        }
        got
    }

    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[buf])
    }

    /// As much of `bufs`, in order, as credits allow now: eager chunks, or one rendezvous message
    /// for a large write. The CQ is polled first only when nothing can be sent (send completions
    /// and the credits in received headers are what free room); it has room for every work
    /// request the queues allow, so a completion left in it waits without loss.
    pub fn write_vectored(&self, bufs: &[&[u8]]) -> io::Result<usize> {
        let mut st = self.st.lock().unwrap();
        if !st.can_send() {
            st.progress(&self.peer);
        }
        st.write(bufs)
    }

    /// Whether data (or the end of the stream, or an error) is there to read.
    pub fn readable(&self) -> bool {
        let mut st = self.st.lock().unwrap();
        st.progress(&self.peer);
        st.error.is_some() || st.closed || st.front_ready()
    }

    pub fn writable(&self) -> bool {
        let mut st = self.st.lock().unwrap();
        st.progress(&self.peer);
        st.error.is_some() || st.closed || st.can_send()
    }

    /// The blocking client's wait: spin, then sleep on the completion channel (and the client's
    /// rdma_cm channel, whose every event after setup means the connection is over). Sleeps are
    /// capped when waiting for credits (a credit-word write raises no completion) and when another
    /// thread waits too (it may take the event this one waits for).
    pub fn wait(&self, writable: bool, timeout: Duration) -> bool {
        self.wait_spinning(writable, timeout, spin())
    }

    /// `wait` with a busy-poll of `spin` before the sleep (the floor's server spins as the RPC
    /// server's loop does).
    pub fn wait_spinning(&self, writable: bool, timeout: Duration, spin: Duration) -> bool {
        let ready = || if writable { self.writable() } else { self.readable() };
        let start = Instant::now();
        let deadline = start + timeout;
        let spin_until = start + spin;
        let mut next_yield = start;
        loop {
            if ready() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if now < spin_until {
                // a yield now and then, not a bare spin: rxe's kernel workers may need this CPU for our
                // completion to come, and a process spinning through its time slice delays them by
                // milliseconds; but not at every poll (see `yield_every`)
                if now >= next_yield {
                    std::thread::yield_now();
                    next_yield = now + crate::verbs::yield_every();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            break;
        }
        trace::mark(Point::Sleep);
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let result = loop {
            {
                let st = self.st.lock().unwrap();
                if st.closed {
                    break true;
                }
                // SAFETY: live endpoint
                unsafe { ffi::hv_arm(st.ep) };
            }
            if ready() {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            let mut cap = deadline - now;
            if writable || self.waiters.load(Ordering::SeqCst) > 1 {
                cap = cap.min(Duration::from_millis(2));
            } else if self.cm_fd.is_none() {
                // accepted: the listener's thread learns of a peer's end (`fail`), which wakes no poll
                cap = cap.min(Duration::from_millis(100));
            }
            let mut fds = vec![libc::pollfd { fd: self.comp_fd, events: libc::POLLIN, revents: 0 }];
            if let Some(fd) = self.cm_fd {
                fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
            }
            let ms = cap.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
            // SAFETY: a valid array of pollfds
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if fds[0].revents != 0 {
                let st = self.st.lock().unwrap();
                if !st.closed {
                    // SAFETY: live endpoint
                    unsafe { ffi::hv_take_events(st.ep) };
                }
            }
            if fds.len() > 1 && fds[1].revents != 0 {
                self.check_cm();
            }
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn check_cm(&self) {
        let mut ev = ffi::CmEvent::empty();
        // SAFETY: the client's own channel, live until close
        if self.channel.is_null() || unsafe { ffi::hv_get_event(self.channel, &mut ev) } != 0 {
            return;
        }
        // SAFETY: a static name from librdmacm
        let name = ffi::name(unsafe { ffi::hv_event_name(ev.kind) });
        self.fail(format!("RDMA connection to {} ended: {}", self.peer,
                          name.trim_start_matches("RDMA_CM_EVENT_")));
    }

    /// Registers `len` bytes of memory at `addr` with this connection's protection domain (the caller's
    /// memory: it must stay valid until `dereg`, which the caller does before `close`).
    pub fn reg(&self, addr: *mut u8, len: usize, access: i32) -> io::Result<Mr> {
        let st = self.st.lock().unwrap();
        st.check()?;
        let mut mr = Mr { mr: std::ptr::null_mut(), lkey: 0, rkey: 0 };
        // SAFETY: the caller keeps [addr, addr + len) valid while registered; live endpoint
        if unsafe { ffi::hv_reg(st.ep, addr as *mut c_void, len.max(1), access, &mut mr) } != 0 {
            return Err(os_err(&format!("registering {len} bytes failed")));
        }
        Ok(mr)
    }

    /// Deregisters what `reg` registered (before `close`: the protection domain goes with the QP).
    pub fn dereg(&self, mr: &Mr) {
        let _st = self.st.lock().unwrap();
        // SAFETY: an MR of this (still open) endpoint, deregistered once
        unsafe { ffi::hv_dereg(mr.mr) };
    }

    /// Posts a one-sided RDMA READ (`read`) or WRITE between registered local memory and the peer's
    /// (address, rkey): its id for `one_sided_done`, or WouldBlock while the send queue is full.
    pub fn post_one_sided(&self, read: bool, addr: u64, len: usize, lkey: u32, raddr: u64, rkey: u32)
                          -> io::Result<u64> {
        let mut st = self.st.lock().unwrap();
        st.progress(&self.peer);
        st.check()?;
        if st.sq_used >= SEND_DEPTH {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let wid = st.next_one_sided;
        st.next_one_sided += 1;
        st.post(wid, if read { 2 } else { 1 }, addr, len, lkey, raddr, rkey)?;
        Ok(wid)
    }

    /// Whether the one-sided operation `wid` has completed (an error if the connection failed).
    pub fn one_sided_done(&self, wid: u64) -> io::Result<bool> {
        let mut st = self.st.lock().unwrap();
        st.progress(&self.peer);
        if st.one_sided_done.remove(&wid) {
            return Ok(true);
        }
        st.check()?;
        Ok(false)
    }

    /// Tells the peer (CLOSE, best effort), then frees the QP, memory and cm id. Idempotent.
    pub fn close(&self) {
        let mut st = self.st.lock().unwrap();
        if st.closed {
            return;
        }
        st.progress(&self.peer);
        if st.error.is_none() && st.can_send() && st.post_eager(CLOSE, &[], 0, 0).is_ok() {
            let end = Instant::now() + Duration::from_millis(200);
            while st.sq_used > 0 && st.error.is_none() && Instant::now() < end {
                st.progress(&self.peer);
            }
        }
        st.closed = true;
        st.rx.clear();
        st.staging.clear();
        st.control.clear();
        let ep = st.ep;
        // the regions are deregistered before the protection domain goes with the endpoint
        let (r, s, c) = (std::mem::replace(&mut st.recv, Region::dangling()), std::mem::replace(&mut st.send, Region::dangling()),
                         std::mem::replace(&mut st.credit, Region::dangling()));
        drop((r, s, c));
        // SAFETY: every MR of this endpoint is deregistered; the cm id (and a client's channel) are ours
        unsafe {
            ffi::hv_ep_destroy(ep);
            ffi::hv_id_destroy(self.cm_id);
            if !self.channel.is_null() {
                ffi::hv_channel_destroy(self.channel);
            }
        }
    }
}

impl Drop for VerbsEnd {
    fn drop(&mut self) {
        self.close();
    }
}

impl Region {
    /// A placeholder that owns nothing (what a closed connection holds).
    fn dangling() -> Region {
        Region { ptr: std::ptr::null_mut(), len: 0, mr: Mr { mr: std::ptr::null_mut(), lkey: 0, rkey: 0 } }
    }
}

impl State {
    fn hello_payload(&self) -> Vec<u8> {
        let mut h = self.credit.addr().to_le_bytes().to_vec();
        h.extend_from_slice(&self.credit.mr.rkey.to_le_bytes());
        h
    }

    fn post_recv(&self, slot: usize) -> io::Result<()> {
        // SAFETY: a slot inside our registered receive region
        let rc = unsafe { ffi::hv_post_recv(self.ep, slot as u64, self.recv.addr() + (slot * SLOT) as u64,
                                            SLOT as u32, self.recv.mr.lkey) };
        if rc != 0 { Err(os_err("posting a receive failed")) } else { Ok(()) }
    }

    #[allow(clippy::too_many_arguments)] // the shim's hv_post_send, one work request's fields
    fn post(&mut self, wr_id: u64, opcode: i32, addr: u64, len: usize, lkey: u32, raddr: u64, rkey: u32)
            -> io::Result<()> {
        // SAFETY: local memory is inside one of our registered regions
        if opcode == 0 {
            trace::mark(Point::Post);
        }
        let rc = unsafe { ffi::hv_post_send(self.ep, wr_id, opcode, addr, len as u32, lkey, raddr, rkey) };
        if opcode == 0 {
            trace::mark(Point::Posted);
        }
        if rc != 0 {
            let e = os_err("posting a work request failed");
            self.error.get_or_insert_with(|| e.to_string());
            return Err(e);
        }
        self.sq_used += 1;
        Ok(())
    }

    /// Every completion in the CQ. Polls again only after a full batch: one that came back short
    /// emptied the CQ, and a completion after it is the next call's (a poll that finds nothing
    /// costs as much as one that finds something, on the path of every message).
    fn progress(&mut self, peer: &str) {
        if self.closed {
            return;
        }
        const BATCH: usize = 16;
        let mut wcs = [Wc::default(); BATCH];
        loop {
            // SAFETY: live endpoint, room for BATCH
            let n = unsafe { ffi::hv_poll(self.ep, wcs.as_mut_ptr(), BATCH as i32) };
            if n <= 0 {
                break;
            }
            for wc in &wcs[..n as usize] {
                let wid = wc.wr_id;
                if wc.status != 0 {
                    if self.error.is_none() {
                        // SAFETY: a static name from libibverbs
                        let name = ffi::name(unsafe { ffi::hv_wc_status_name(wc.status as i32) });
                        self.error = Some(format!("RDMA connection to {peer} failed: work completion status {} ({name}); the peer is gone or the QP is in error", wc.status));
                    }
                    if wid >= SEND_BASE {
                        self.sq_used -= 1;
                    }
                    continue;
                }
                if wid < RECV_DEPTH as u64 {
                    trace::mark(Point::Received);
                    self.on_receive(wid as usize, wc.byte_len as usize, peer);
                } else if wid < RDMA_BASE {
                    self.sq_used -= 1;
                    self.free_send.push((wid - SEND_BASE) as usize);
                } else {
                    self.sq_used -= 1;
                    if wid != CREDIT_WR {
                        self.landed(wid);
                    }
                }
            }
            if (n as usize) < BATCH {
                break;
            }
        }
        self.post_reads();
        self.flush_control();
    }

    fn fail(&mut self, why: String) {
        if self.error.is_none() {
            self.error = Some(why);
        }
    }

    fn on_receive(&mut self, slot: usize, nbytes: usize, peer: &str) {
        let base = slot * SLOT;
        let b = &self.recv.bytes()[base..base + SLOT];
        let kind = b[0];
        let length = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
        let reposted = u64::from_le_bytes(b[8..16].try_into().unwrap());
        if nbytes < HDR || length > EAGER || HDR + length > nbytes {
            self.fail(format!("peer {peer} sent a malformed message ({nbytes} bytes, header length {length})"));
            return;
        }
        self.peer_reposted = self.peer_reposted.max(reposted);
        let payload = b[HDR..HDR + length].to_vec_if(kind != DATA);
        match kind {
            DATA if length > 0 => self.rx.push_back(Rx::Slot { slot, pos: base + HDR, end: base + HDR + length }),
            DATA | NOP => self.repost(slot),
            RTS if length >= RNDV => {
                let p = payload.unwrap();
                let addr = u64::from_le_bytes(p[0..8].try_into().unwrap());
                let len = u64::from_le_bytes(p[8..16].try_into().unwrap());
                let rkey = u32::from_le_bytes(p[16..20].try_into().unwrap());
                let tag = u64::from_le_bytes(p[20..28].try_into().unwrap());
                self.repost(slot);
                if len > MAX_RENDEZVOUS {
                    self.fail(format!("peer {peer} offered a {len}-byte rendezvous (limit {MAX_RENDEZVOUS})"));
                    return;
                }
                match Region::new(self.ep, len as usize, LOCAL_WRITE) {
                    Ok(region) => {
                        let wr_id = self.next_rdma;
                        self.next_rdma += 1;
                        self.rx.push_back(Rx::Landing { wr_id, tag, region, pos: 0, ready: len == 0,
                                                        posted: len == 0, src: (addr, rkey) });
                        if len == 0 {
                            self.control.push_back((FIN, tag.to_le_bytes().to_vec()));
                        }
                    }
                    Err(e) => self.fail(format!("cannot land a {len}-byte rendezvous from {peer}: {e}")),
                }
            }
            FIN if length >= 8 => {
                let tag = u64::from_le_bytes(payload.unwrap()[0..8].try_into().unwrap());
                self.staging.remove(&tag);
                self.repost(slot);
            }
            CLOSE => self.rx.push_back(Rx::Close),
            HELLO => {
                let first = self.peer_credit.is_none();
                let p = payload.unwrap();
                if p.len() >= 12 {   // anything shorter is not our peer's: credits then only travel piggybacked
                    self.peer_credit = Some((u64::from_le_bytes(p[0..8].try_into().unwrap()),
                                             u32::from_le_bytes(p[8..12].try_into().unwrap())));
                }
                if first && self.answers_hello {
                    let h = self.hello_payload();
                    self.control.push_back((HELLO, h));
                }
                self.repost(slot);
            }
            other => self.fail(format!("peer {peer} sent a message of unknown kind {other} ({length} bytes)")),
        }
    }

    /// A rendezvous READ completed: its bytes can be read, and the peer gets FIN for its staging.
    fn landed(&mut self, wid: u64) {
        if wid >= ONE_SIDED_BASE {
            self.one_sided_done.insert(wid);
            return;
        }
        for r in self.rx.iter_mut() {
            if let Rx::Landing { wr_id, tag, ready, .. } = r {
                if *wr_id == wid {
                    *ready = true;
                    let t = *tag;
                    self.control.push_back((FIN, t.to_le_bytes().to_vec()));
                    return;
                }
            }
        }
    }

    /// READs for announced rendezvous not yet posted (the send queue may have been full).
    fn post_reads(&mut self) {
        let mut todo = Vec::new();
        for r in self.rx.iter_mut() {
            if let Rx::Landing { wr_id, region, posted, src, .. } = r {
                if !*posted && self.sq_used + todo.len() < SEND_DEPTH {
                    *posted = true;
                    todo.push((*wr_id, region.addr(), region.len, region.mr.lkey, *src));
                }
            }
        }
        for (wid, addr, len, lkey, (raddr, rkey)) in todo {
            let _ = self.post(wid, 2, addr, len, lkey, raddr, rkey);
        }
    }

    fn repost(&mut self, slot: usize) {
        if self.error.is_some() || self.closed {
            return;
        }
        if let Err(e) = self.post_recv(slot) {
            self.fail(e.to_string());
            return;
        }
        self.reposted += 1;
        if self.reposted - self.reported >= CREDIT_BATCH && self.sq_used < SEND_DEPTH {
            if let Some((addr, rkey)) = self.peer_credit {
                self.credit.word(8).store(self.reposted, Ordering::Release);
                let (src, lkey) = (self.credit.addr() + 8, self.credit.mr.lkey);
                if self.post(CREDIT_WR, 1, src, 8, lkey, addr, rkey).is_ok() {
                    self.reported = self.reposted;
                }
            }
        }
    }

    fn credits(&mut self) -> i64 {
        let written = self.credit.word(0).load(Ordering::Acquire);
        self.peer_reposted = self.peer_reposted.max(written);
        RECV_DEPTH as i64 + self.peer_reposted as i64 - self.sent as i64
    }

    /// Whether the stream's next bytes (or its end) can be read now.
    fn front_ready(&self) -> bool {
        self.rx.front().is_some_and(|r| !matches!(r, Rx::Landing { ready: false, .. }))
    }

    fn can_send(&mut self) -> bool {
        self.error.is_none() && self.credits() > 0 && !self.free_send.is_empty() && self.sq_used < SEND_DEPTH
    }

    /// One message of `kind` whose payload is the bytes [skip, skip + length) of the concatenation
    /// of `bufs`, copied into a free send slot behind the header.
    fn post_eager(&mut self, kind: u8, bufs: &[&[u8]], skip: usize, length: usize) -> io::Result<()> {
        let slot = self.free_send.pop().expect("a free send slot");
        let base = slot * SLOT;
        let reposted = self.reposted;
        let dst = &mut self.send.bytes_mut()[base..base + SLOT];
        copy_range(bufs, skip, &mut dst[HDR..HDR + length]);
        let pos = HDR + length;
        dst[0] = kind;
        dst[1..4].fill(0);
        dst[4..8].copy_from_slice(&(length as u32).to_le_bytes());
        dst[8..16].copy_from_slice(&reposted.to_le_bytes());
        self.reported = reposted;
        let (addr, lkey) = (self.send.addr() + base as u64, self.send.mr.lkey);
        if let Err(e) = self.post(SEND_BASE + slot as u64, 0, addr, pos, lkey, 0, 0) {
            self.free_send.push(slot);
            return Err(e);
        }
        self.sent += 1;
        Ok(())
    }

    fn flush_control(&mut self) {
        while !self.control.is_empty() && self.can_send() {
            let (kind, payload) = self.control.pop_front().unwrap();
            if self.post_eager(kind, &[&payload], 0, payload.len()).is_err() {
                return;
            }
        }
    }

    fn check(&self) -> io::Result<()> {
        if let Some(e) = &self.error {
            return Err(broken(e));
        }
        if self.closed {
            return Err(broken("the connection is closed"));
        }
        Ok(())
    }

    fn write(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
        self.check()?;
        self.flush_control();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Ok(0);
        }
        if !self.can_send() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if total > RNDV_THRESHOLD {
            let len = total.min(MAX_RENDEZVOUS as usize);
            let mut region = Region::new(self.ep, len, LOCAL_WRITE | REMOTE_READ)?;
            copy_range(bufs, 0, &mut region.bytes_mut()[..len]);
            let tag = self.next_tag;
            self.next_tag += 1;
            let mut rts = Vec::with_capacity(RNDV);
            rts.extend_from_slice(&region.addr().to_le_bytes());
            rts.extend_from_slice(&(len as u64).to_le_bytes());
            rts.extend_from_slice(&region.mr.rkey.to_le_bytes());
            rts.extend_from_slice(&tag.to_le_bytes());
            self.staging.insert(tag, region);   // the peer reads it; its FIN frees it
            self.post_eager(RTS, &[&rts], 0, rts.len())?;
            return Ok(len);
        }
        let mut done = 0;
        while done < total && self.can_send() {
            let n = (total - done).min(EAGER);
            self.post_eager(DATA, bufs, done, n)?;
            done += n;
        }
        Ok(done)
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            let Some(front) = self.rx.front_mut() else { break };
            match front {
                Rx::Slot { slot, pos, end } => {
                    let k = (*end - *pos).min(buf.len() - n);
                    buf[n..n + k].copy_from_slice(&self.recv.bytes()[*pos..*pos + k]);
                    *pos += k;
                    n += k;
                    if *pos == *end {
                        let s = *slot;
                        self.rx.pop_front();
                        self.repost(s);
                    }
                }
                Rx::Landing { ready: true, region, pos, .. } => {
                    let k = (region.len - *pos).min(buf.len() - n);
                    buf[n..n + k].copy_from_slice(&region.bytes()[*pos..*pos + k]);
                    *pos += k;
                    n += k;
                    if *pos == region.len {
                        self.rx.pop_front();
                    }
                }
                Rx::Landing { .. } => break,
                Rx::Close => {
                    if n == 0 {
                        return Ok(0); // the peer's CLOSE: end of stream
                    }
                    break;
                }
            }
        }
        if n > 0 {
            return Ok(n);
        }
        self.check()?;
        Err(io::ErrorKind::WouldBlock.into())
    }
}

trait ToVecIf {
    fn to_vec_if(&self, cond: bool) -> Option<Vec<u8>>;
}

impl ToVecIf for [u8] {
    fn to_vec_if(&self, cond: bool) -> Option<Vec<u8>> {
        if cond { Some(self.to_vec()) } else { None }
    }
}

/// The bytes [skip, skip + dst.len()) of the concatenation of `bufs` into `dst`.
fn copy_range(bufs: &[&[u8]], mut skip: usize, dst: &mut [u8]) {
    let mut pos = 0;
    for b in bufs {
        if pos == dst.len() {
            return;
        }
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        let k = (b.len() - skip).min(dst.len() - pos);
        dst[pos..pos + k].copy_from_slice(&b[skip..skip + k]);
        skip = 0;
        pos += k;
    }
}

#[cfg(test)]
mod tests {
    use super::copy_range;

    #[test]
    fn copy_range_takes_any_window_across_the_slices() {
        let bufs: [&[u8]; 3] = [b"head", b"", b"body!"];
        let all = b"headbody!";
        for skip in 0..=all.len() {
            for len in 0..=all.len() - skip {
                let mut dst = vec![0u8; len];
                copy_range(&bufs, skip, &mut dst);
                assert_eq!(&dst[..], &all[skip..skip + len], "skip {skip} len {len}");
            }
        }
    }
}
