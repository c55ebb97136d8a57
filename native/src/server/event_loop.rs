//! The server's one thread: polls the listener, the waker and every connection, busy-polls verbs
//! connections that just carried a message, and reads, writes and closes connections.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::{Events, Token};

use crate::buffers::Design;
use crate::shm;
use crate::trace::{self, Point};
use crate::verbs::cm::Event as CmEvent;
use crate::wire;

use super::protocol::join_naive;
use super::{code_name, fatal, Close, Conn, EventLoop, Io, Listener, Phase, Reply};
use super::{CREDIT_LOOK, INITIAL_BUFFER, KEEP_BUFFER, LISTENER, SUB_SPACE, TICK, WAKER, WRITE_HIGH};

impl EventLoop {
    pub(super) fn run(&mut self) {
        let mut events = Events::with_capacity(1024);
        let mut last_tick = Instant::now();
        // verbs connections that just carried a message, busy-polled until `spin_until` before the loop
        // sleeps: waking from the completion channel costs an interrupt and a context switch, which on
        // Soft-RoCE is a round trip's worth (perftest's ib_send_lat never sleeps)
        let mut hot: Vec<usize> = Vec::new();
        let mut spin_until = Instant::now();
        // while spinning, the other sockets are looked at (one poll system call) once per
        // `yield_every`, not after every message served: under emulation each system call costs a
        // good part of a round trip, and a tcp or shm event then waits at most that long
        let mut next_look = Instant::now();
        while !self.shared.stopping.load(Ordering::Relaxed) {
            let stalled: Vec<usize> = self.conns.iter()
                .filter(|(_, c)| c.writable_interest && matches!(c.stream, Io::Verbs(_)))
                .map(|(id, _)| *id).collect();
            let spinning = !hot.is_empty() && Instant::now() < spin_until;
            let wait = if spinning { Duration::ZERO } else if stalled.is_empty() { TICK } else { CREDIT_LOOK };
            for id in stalled {
                self.on_writable(id);
            }
            if spinning {
                std::thread::yield_now(); // let rxe's kernel workers run (see VerbsEnd::wait)
                // then only the hot connections' CQs are polled, up to `yield_every` or a message
                // served, before the next yield (a system call, as the look at the other sockets)
                let burst_end = (Instant::now() + crate::verbs::yield_every()).min(spin_until);
                loop {
                    let served = self.serve_hot(&hot, false);
                    if served {
                        spin_until = Instant::now() + crate::verbs::server_spin();
                    }
                    if served || Instant::now() >= burst_end {
                        break;
                    }
                    std::hint::spin_loop();
                }
                if Instant::now() < next_look {
                    continue;
                }
                next_look = Instant::now() + crate::verbs::yield_every();
            } else if !hot.is_empty() {
                // the spin is over: arm the hot connections' CQs, then look once more, since a
                // completion that came before the arming raises no event. Bytes read then came as
                // a wake-up would and start a new spin
                if self.serve_hot(&hot, true) {
                    spin_until = Instant::now() + crate::verbs::server_spin();
                    continue;
                }
                trace::mark(Point::Sleep);
                hot.clear();
            }
            if let Err(e) = self.poll.poll(&mut events, Some(wait)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!("hpcnet native rpc server: poll failed: {e}");
                break;
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => self.drain_outbox(),
                    Token(t) => {
                        let (id, sub) = (t >> 2, t & 3);
                        if let Some(Io::Shm(e)) = self.conns.get(&id).map(|c| &c.stream) {
                            // a doorbell or the liveness socket: drain the bell, then look at the rings
                            match sub {
                                0 => shm::drain_bell(e.my_data.as_raw_fd()),
                                SUB_SPACE => shm::drain_bell(e.my_space.as_raw_fd()),
                                _ => {}
                            }
                            self.on_writable(id);
                            self.on_readable(id, false);
                            continue;
                        }
                        if let Some(Io::Verbs(e)) = self.conns.get(&id).map(|c| &c.stream) {
                            // take the channel's events and leave the CQ unarmed while the loop
                            // busy-polls it (armed again when the spin ends)
                            e.take_events();
                            self.on_writable(id);
                            self.on_readable(id, false);
                            if !hot.contains(&id) {
                                hot.push(id);
                            }
                            spin_until = Instant::now() + crate::verbs::server_spin();
                            continue;
                        }
                        if event.is_writable() {
                            self.on_writable(id);
                        }
                        let closed = event.is_read_closed() || event.is_error();
                        if event.is_readable() || closed {
                            // the short-read shortcut only where no FIN or error is pending
                            self.on_readable(id, !closed);
                        }
                    }
                }
            }
            while let Some(id) = self.resume.pop() {
                self.on_readable(id, false); // edge-triggered: bytes that came while paused raise no event
            }
            let now = Instant::now();
            if now.duration_since(last_tick) >= TICK {
                last_tick = now;
                self.check_timers(now);
            }
        }
        let ids: Vec<usize> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(id, Close::Quiet("server stopping".into()));
        }
    }

    fn accept(&mut self) {
        loop {
            let accepted = match &self.listener {
                Listener::Tcp(l) => l.accept().map(|(s, _)| {
                    let _ = s.set_nodelay(true);
                    Some(Io::Tcp(s))
                }),
                Listener::Shm(l) => l.accept().map(|(s, _)| {
                    // the handshake: a few syscalls, one short blocking send of the descriptors
                    // SAFETY: the descriptor moves from the mio stream to the std one
                    let s = unsafe { std::os::unix::net::UnixStream::from_raw_fd(s.into_raw_fd()) };
                    let _ = s.set_nonblocking(false);
                    match shm::accept(s, shm::RING_CAPACITY) {
                        Ok(end) => Some(Io::Shm(end)),
                        Err(e) => {
                            self.shared.closed(&format!("shm handshake failed: {e}"));
                            None
                        }
                    }
                }),
                Listener::Verbs(l) => match l.next() {
                    None => Err(io::ErrorKind::WouldBlock.into()),
                    Some(CmEvent::Connected(end)) => Ok(Some(Io::Verbs(end))),
                    Some(CmEvent::Failed(why)) => {
                        self.shared.closed(&why);
                        Ok(None)
                    }
                    Some(CmEvent::Ended(cm_id, why)) => {
                        // a child's DISCONNECTED (or worse): its connection reads the error and closes
                        let found = self.conns.iter().find_map(|(id, c)| match &c.stream {
                            Io::Verbs(e) if e.cm_id == cm_id => {
                                e.fail(why.clone());
                                Some(*id)
                            }
                            _ => None,
                        });
                        if let Some(id) = found {
                            self.resume.push(id);
                        }
                        Ok(None)
                    }
                },
            };
            match accepted {
                Ok(None) => continue,
                Ok(Some(mut stream)) => {
                    let pending = self.conns.values().filter(|c| c.phase != Phase::Ready).count();
                    if pending >= self.shared.cfg.max_pending {
                        let oldest = self.conns.iter().filter(|(_, c)| c.phase != Phase::Ready)
                            .min_by_key(|(_, c)| c.opened).map(|(id, _)| *id);
                        if let Some(id) = oldest {
                            self.close(id, Close::Quiet("too many connections handshaking".into()));
                        }
                    }
                    let id = self.next;
                    self.next += 1;
                    if stream.register(self.poll.registry(), id).is_err() {
                        stream.close(self.poll.registry());
                        continue;
                    }
                    let now = Instant::now();
                    self.conns.insert(id, Conn {
                        stream,
                        phase: Phase::Preamble,
                        rbuf: Vec::new(),
                        rstart: 0,
                        rend: 0,
                        wbuf: Vec::new(),
                        wpos: 0,
                        client_id: Vec::new(),
                        opened: now,
                        last_active: now,
                        last_write: now,
                        in_python: 0,
                        closing: false,
                        paused: false,
                        writable_interest: false,
                        grew: false,
                    });
                    self.resume.push(id); // shm: bytes may be in the ring already
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return, // EMFILE and the like: try again on the next event
            }
        }
    }

    /// Serves every verbs connection in `hot` that has something to read (arming its CQ first when
    /// `arm`); whether bytes were read. Bytes, not readiness, keep a spin going: a connection that
    /// stays readable without being read (paused behind a peer that takes no responses) must not
    /// keep the loop spinning; it waits for its events like any other.
    fn serve_hot(&mut self, hot: &[usize], arm: bool) -> bool {
        let before = self.bytes_read;
        for &id in hot {
            let busy = match self.conns.get(&id).map(|c| &c.stream) {
                Some(Io::Verbs(e)) => {
                    if arm {
                        e.arm();
                    }
                    e.readable()
                }
                _ => false,
            };
            if busy {
                self.on_readable(id, false);
            }
        }
        self.bytes_read != before
    }

    fn drain_outbox(&mut self) {
        let replies = std::mem::take(&mut *self.shared.outbox.lock().unwrap());
        let mut touched = Vec::new();
        for (id, reply) in replies {
            let Some(c) = self.conns.get_mut(&(id as usize)) else { continue };
            c.in_python = c.in_python.saturating_sub(1);
            if c.closing {
                continue;
            }
            let naive = self.shared.cfg.design == Design::Naive;
            let saved = if naive { Some(std::mem::take(&mut c.wbuf)) } else { None };
            match reply {
                Reply::Success { call_id, retry_count, body } => {
                    wire::success_packet(&mut c.wbuf, call_id, &c.client_id, retry_count, &body);
                }
                Reply::Error { call_id, retry_count, class_name, message, code } => {
                    self.shared.counters.errors.fetch_add(1, Ordering::Relaxed);
                    wire::error_packet(&mut c.wbuf, call_id, wire::ERROR, &c.client_id, retry_count,
                                       &class_name, &message, code);
                }
                Reply::Fatal { call_id, message, code } => {
                    if let Some(saved) = saved {
                        c.wbuf = saved;
                    }
                    let id = id as usize;
                    self.close(id, fatal(code, call_id, message));
                    continue;
                }
            }
            if let Some(saved) = saved {
                join_naive(&self.shared.buffers, c, saved);
            }
            touched.push(id as usize);
        }
        for id in touched {
            self.flush(id);
        }
    }

    fn on_readable(&mut self, id: usize, short_read_drains: bool) {
        let result = self.read_and_process(id, short_read_drains);
        match result {
            Ok(()) => self.flush(id),
            Err(close) => self.close(id, close),
        }
    }

    fn read_and_process(&mut self, id: usize, short_read_drains: bool) -> Result<(), Close> {
        loop {
            let Some(c) = self.conns.get_mut(&id) else { return Ok(()) };
            if c.closing || c.paused {
                return Ok(());
            }
            let need = self.process(id)?;
            let Some(c) = self.conns.get_mut(&id) else { return Ok(()) };
            if c.closing || c.paused {
                return Ok(());
            }
            // room for the bytes the next packet still needs, growing only as they arrive
            if c.rend == c.rbuf.len() {
                if c.rstart > 0 {
                    if c.rend > c.rstart {
                        self.shared.buffers.copy(c.rend - c.rstart); // a pipelined surplus carried over
                    }
                    c.rbuf.copy_within(c.rstart..c.rend, 0);
                    c.rend -= c.rstart;
                    c.rstart = 0;
                }
                if c.rend == c.rbuf.len() {
                    let target = need.max(c.rend + 1);
                    let grown = (c.rbuf.len() * 2).max(INITIAL_BUFFER).min(target.max(INITIAL_BUFFER));
                    c.rbuf.resize(grown, 0);
                    self.shared.buffers.alloc();
                    c.grew = true;
                }
            }
            match c.stream.read(&mut c.rbuf[c.rend..]) {
                Ok(0) => {
                    return Err(Close::Quiet(if c.phase == Phase::Ready {
                        "peer closed".into()
                    } else {
                        "peer closed before its context".into()
                    }))
                }
                Ok(n) => {
                    let room = c.rbuf.len() - c.rend;
                    c.rend += n;
                    self.bytes_read += n as u64;
                    if c.phase == Phase::Ready {
                        c.last_active = Instant::now();
                    }
                    if n < room && short_read_drains && c.stream.short_read_drains() {
                        // a short read drained the socket: a tcp socket raises a new edge when more
                        // arrives, so the read that would only say WouldBlock is saved
                        self.process(id)?;
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.process(id)?;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Close::Quiet(format!("peer closed: {e}"))),
            }
        }
    }

    /// Writes what it can; asks for WRITABLE while something is left.
    fn flush(&mut self, id: usize) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        while c.wpos < c.wbuf.len() {
            match c.stream.write(&c.wbuf[c.wpos..]) {
                Ok(0) => break,
                Ok(n) => {
                    c.wpos += n;
                    c.last_write = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let reason = format!("writing a response failed: {e}");
                    self.close(id, Close::Quiet(reason));
                    return;
                }
            }
        }
        if c.wpos == c.wbuf.len() {
            c.wpos = 0;
            c.wbuf.clear();
            if c.wbuf.capacity() > KEEP_BUFFER {
                c.wbuf = Vec::new();
            }
            if c.closing {
                self.close(id, Close::Quiet(String::new()));
                return;
            }
        }
        let want_write = c.unsent() > 0;
        if want_write != c.writable_interest {
            c.writable_interest = want_write;
            c.stream.want_writable(self.poll.registry(), id, want_write);
        }
        if c.paused && c.unsent() <= WRITE_HIGH / 2 {
            c.paused = false;
            self.resume.push(id);
        }
    }

    fn on_writable(&mut self, id: usize) {
        self.flush(id);
    }

    fn check_timers(&mut self, now: Instant) {
        let cfg = &self.shared.cfg;
        let mut expired = Vec::new();
        let served = self.conns.values().filter(|c| c.phase == Phase::Ready).count();
        for (id, c) in &self.conns {
            if c.phase != Phase::Ready {
                if now.duration_since(c.opened) > cfg.handshake_timeout {
                    expired.push((*id, "handshake timeout: no preamble/context in time".to_string()));
                }
            } else if c.unsent() > 0 {
                if now.duration_since(c.last_write) > cfg.write_timeout {
                    expired.push((*id, format!("write timeout: the peer took no bytes for {:?}", cfg.write_timeout)));
                }
            } else if c.in_python == 0
                && served > cfg.idle_threshold
                && now.duration_since(c.last_active) > cfg.idle_timeout
            {
                expired.push((*id, format!("idle: no call for {}s with more than {} connections open",
                                           cfg.idle_timeout.as_secs_f64(), cfg.idle_threshold)));
            }
        }
        for (id, reason) in expired {
            self.close(id, Close::Quiet(reason));
        }
    }

    fn close(&mut self, id: usize, why: Close) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        match why {
            Close::Fatal { code, call_id, message } => {
                if c.closing {
                    return;
                }
                self.shared.counters.fatals.fetch_add(1, Ordering::Relaxed);
                self.shared.closed(&format!("FATAL {}: {}", code_name(code), message));
                wire::error_packet(&mut c.wbuf, call_id, wire::FATAL, &c.client_id, wire::INVALID_CALL_ID,
                                   "org.apache.hadoop.ipc.RpcServerException", &message, code);
                c.closing = true;
                c.last_write = Instant::now();
                self.flush(id);
            }
            Close::Quiet(reason) => {
                let mut c = self.conns.remove(&id).expect("connection");
                if !reason.is_empty() {
                    self.shared.closed(&reason);
                }
                if c.phase == Phase::Ready {
                    self.shared.open.fetch_sub(1, Ordering::Relaxed);
                }
                c.stream.close(self.poll.registry());
            }
        }
    }
}
