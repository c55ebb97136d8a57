//! The byte stream of one verbs connection, as a state machine the end drives under its lock: eager
//! messages into receive slots, RDMA-READ rendezvous for large writes, credits, and the completions
//! that move it all on.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::trace::{self, Point};

use super::ffi::{self, Ep, Wc};
use super::region::Region;
use super::*;

/// What the byte stream holds next: an eager slot's payload, a rendezvous landing, or the peer's CLOSE.
enum Rx {
    Slot { slot: usize, pos: usize, end: usize },
    Landing { wr_id: u64, tag: u64, region: Region, pos: usize, ready: bool, posted: bool, src: (u64, u32) },
    Close,
}

/// A connection's stream: its memory, slots, credits and what was received, all behind the end's lock.
pub(super) struct State {
    pub(super) ep: *mut Ep,
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
    pub(super) closed: bool,
    answers_hello: bool, // the accepting side answers the client's HELLO with its own
    one_sided_done: HashSet<u64>, // completed one-sided READ/WRITEs (`post_one_sided`), until taken
    next_one_sided: u64,
}

unsafe impl Send for State {}

pub(super) fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn broken(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, msg.to_string())
}

impl State {
    pub(super) fn new(ep: *mut Ep, recv: Region, send: Region, credit: Region, answers_hello: bool) -> State {
        State {
            ep, recv, send, credit, free_send: (0..SEND_SLOTS).rev().collect(), sent: 0, peer_reposted: 0,
            reposted: 0, reported: 0, sq_used: 0, rx: VecDeque::new(), staging: HashMap::new(), next_tag: 1,
            next_rdma: RDMA_BASE, control: VecDeque::new(), peer_credit: None, error: None, closed: false,
            answers_hello, one_sided_done: HashSet::new(), next_one_sided: ONE_SIDED_BASE,
        }
    }

    /// The first message each way: where our credit word is.
    pub(super) fn say_hello(&mut self) {
        let h = self.hello_payload();
        self.control.push_back((HELLO, h));
        self.flush_control();
    }

    /// Failed or closed: nothing more will be read or sent.
    pub(super) fn ended(&self) -> bool {
        self.error.is_some() || self.closed
    }

    /// A one-sided RDMA READ (`read`) or WRITE: its id, or WouldBlock while the send queue is full.
    pub(super) fn post_one_sided(&mut self, read: bool, addr: u64, len: usize, lkey: u32, raddr: u64, rkey: u32)
                                 -> io::Result<u64> {
        self.check()?;
        if self.sq_used >= SEND_DEPTH {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let wid = self.next_one_sided;
        self.next_one_sided += 1;
        self.post(wid, if read { 2 } else { 1 }, addr, len, lkey, raddr, rkey)?;
        Ok(wid)
    }

    /// Whether the one-sided operation `wid` has completed (taking it), or the connection's error.
    pub(super) fn one_sided_done(&mut self, wid: u64) -> io::Result<bool> {
        if self.one_sided_done.remove(&wid) {
            return Ok(true);
        }
        self.check()?;
        Ok(false)
    }

    /// Tells the peer (CLOSE, best effort, its send given 200 ms to complete), then drops what was
    /// queued and deregisters the regions; returns the endpoint for the end to destroy, which it may
    /// only do now that no memory is registered on it.
    pub(super) fn shut(&mut self, peer: &str) -> *mut Ep {
        self.progress(peer);
        if self.error.is_none() && self.can_send() && self.post_eager(CLOSE, &[], 0, 0).is_ok() {
            let end = Instant::now() + Duration::from_millis(200);
            while self.sq_used > 0 && self.error.is_none() && Instant::now() < end {
                self.progress(peer);
            }
        }
        self.closed = true;
        self.rx.clear();
        self.staging.clear();
        self.control.clear();
        for region in [&mut self.recv, &mut self.send, &mut self.credit] {
            drop(std::mem::replace(region, Region::dangling()));
        }
        self.ep
    }

    fn hello_payload(&self) -> Vec<u8> {
        let mut h = self.credit.addr().to_le_bytes().to_vec();
        h.extend_from_slice(&self.credit.mr.rkey.to_le_bytes());
        h
    }

    pub(super) fn post_recv(&self, slot: usize) -> io::Result<()> {
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
    pub(super) fn progress(&mut self, peer: &str) {
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

    pub(super) fn fail(&mut self, why: String) {
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
    pub(super) fn front_ready(&self) -> bool {
        self.rx.front().is_some_and(|r| !matches!(r, Rx::Landing { ready: false, .. }))
    }

    pub(super) fn can_send(&mut self) -> bool {
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

    pub(super) fn check(&self) -> io::Result<()> {
        if let Some(e) = &self.error {
            return Err(broken(e));
        }
        if self.closed {
            return Err(broken("the connection is closed"));
        }
        Ok(())
    }

    pub(super) fn write(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
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

    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
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
