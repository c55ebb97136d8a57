//! One native verbs connection: its queue pair and cm id, the waiting, and every call into its byte
//! stream (`stream.rs`) under one lock.

use std::ffi::c_void;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::trace::{self, Point};

use super::ffi::{self, Mr};
use super::region::Region;
use super::stream::{os_err, State};
use super::*;

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
            st: Mutex::new(State::new(ep, recv, send, credit, answers_hello)),
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
        self.st.lock().unwrap().say_hello();
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
        self.st.lock().unwrap().fail(why);
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
        st.ended() || st.front_ready()
    }

    pub fn writable(&self) -> bool {
        let mut st = self.st.lock().unwrap();
        st.progress(&self.peer);
        st.ended() || st.can_send()
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
        st.post_one_sided(read, addr, len, lkey, raddr, rkey)
    }

    /// Whether the one-sided operation `wid` has completed (an error if the connection failed).
    pub fn one_sided_done(&self, wid: u64) -> io::Result<bool> {
        let mut st = self.st.lock().unwrap();
        st.progress(&self.peer);
        st.one_sided_done(wid)
    }

    /// Tells the peer (CLOSE, best effort), then frees the QP, memory and cm id. Idempotent.
    pub fn close(&self) {
        let mut st = self.st.lock().unwrap();
        if st.closed {
            return;
        }
        let ep = st.shut(&self.peer);
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
