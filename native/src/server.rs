//! The native Hadoop IPC v9 server: one event-driven reader (mio) for every connection, built-in
//! `echo` and `ping` answered on that thread, every other method queued (bounded) for the Python
//! handler threads, whose replies come back through an outbox and a waker.
//!
//! Resource bounds (as the Python server's, design.md "Run credentials"): at most `max_pending`
//! connections still sending preamble + context (the oldest is dropped to make room) and
//! `max_connections` past it (one more is closed); a handshake within `handshake_timeout`, a call
//! within `idle_timeout`; no packet above `ipc.maximum.data.length`, and the read buffer grows only
//! as a packet's bytes arrive (a peer that announces 128 MB and sends 10 bytes costs 4 KiB). A
//! connection whose unsent responses pass `WRITE_HIGH` is not read until they drain; one that takes
//! none of them for `write_timeout` is closed.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};

use mio::net::{TcpListener, TcpStream, UnixListener};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use rustc_hash::FxHashMap;

use crate::buffers::{BufferStats, Design};
use crate::shm::{self, ShmEnd};
use crate::trace::{self, Point};
use crate::verbs::cm::{Event as CmEvent, VerbsListener};
use crate::verbs::VerbsEnd;
use crate::wire::{self, Cursor, RequestHeader};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
// a connection `id` (>= 2) has tokens id << 2 | sub: its socket (tcp) or data doorbell (shm) 0, its
// space doorbell 1, its liveness socket 2 (shm)
const SUB_SPACE: usize = 1;
const INITIAL_BUFFER: usize = 4096;
const KEEP_BUFFER: usize = 256 * 1024; // a buffer grown past this is released once empty
const WRITE_HIGH: usize = 4 * 1024 * 1024;
const TICK: Duration = Duration::from_millis(100);
// how often a verbs connection waiting for send credits looks at its credit word (an RDMA WRITE
// into it raises no completion)
const CREDIT_LOOK: Duration = Duration::from_millis(1);
// how long the loop busy-polls verbs connections after a message before it sleeps again (long enough
// for an emulated client's next call to arrive), and at most after a wake-up
const SPIN_CAP: Duration = Duration::from_millis(5);

pub struct Config {
    pub protocol: String,
    pub max_data_length: usize,
    pub max_connections: usize,
    pub max_pending: usize,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
    /// Idle connections are closed only while more than this many are served (Hadoop's
    /// ipc.client.idlethreshold rule, as the Python server).
    pub idle_threshold: usize,
    pub write_timeout: Duration,
    pub queue_size: usize,
    pub design: Design,
}

/// A call for a Python handler.
pub struct PyCall {
    pub conn: u64,
    pub call_id: i32,
    pub retry_count: i32,
    pub method: String,
    pub body: Vec<u8>,
}

pub enum Reply {
    Success { call_id: i32, retry_count: i32, body: Vec<u8> },
    Error { call_id: i32, retry_count: i32, class_name: String, message: String, code: u64 },
    Fatal { call_id: i32, message: String, code: u64 },
}

#[derive(Default)]
pub struct Counters {
    pub connections: AtomicU64,
    pub calls: AtomicU64,
    pub errors: AtomicU64,
    pub fatals: AtomicU64,
    pub pings: AtomicU64,
    pub native_calls: AtomicU64,
    pub python_calls: AtomicU64,
}

pub struct Shared {
    pub cfg: Config,
    pub calls: Mutex<VecDeque<PyCall>>,
    pub calls_cv: Condvar,
    outbox: Mutex<Vec<(u64, Reply)>>,
    waker: Waker,
    pub stopping: AtomicBool,
    pub counters: Counters,
    pub buffers: BufferStats,
    pub open: AtomicUsize,
    pub closed_reasons: Mutex<HashMap<String, u64>>,
}

impl Shared {
    pub fn reply(&self, conn: u64, reply: Reply) {
        self.outbox.lock().unwrap().push((conn, reply));
        let _ = self.waker.wake();
    }

    pub fn next_call(&self, timeout: Duration) -> Option<PyCall> {
        let deadline = Instant::now() + timeout;
        let mut q = self.calls.lock().unwrap();
        loop {
            if let Some(c) = q.pop_front() {
                return Some(c);
            }
            let now = Instant::now();
            if now >= deadline || self.stopping.load(Ordering::Relaxed) {
                return None;
            }
            q = self.calls_cv.wait_timeout(q, deadline - now).unwrap().0;
        }
    }

    fn closed(&self, reason: &str) {
        let key = reason.split(':').next().unwrap_or(reason).to_string();
        *self.closed_reasons.lock().unwrap().entry(key).or_insert(0) += 1;
    }
}

pub struct Server {
    pub shared: Arc<Shared>,
    pub address: (String, u16),
    thread: Option<JoinHandle<()>>,
}

/// Where a server listens: a tcp address, an shm (host, port) on this host, or an RDMA address.
pub enum Listen {
    Tcp(SocketAddr),
    Shm(String, u16),
    Verbs(String, u16),
}

enum Listener {
    Tcp(TcpListener),
    Shm(UnixListener),
    Verbs(VerbsListener),
}

impl Server {
    pub fn start(listen: Listen, cfg: Config) -> io::Result<Server> {
        let poll = Poll::new()?;
        let (mut listener, address) = match listen {
            Listen::Tcp(addr) => {
                let l = TcpListener::bind(addr)?;
                let a = l.local_addr()?;
                (Listener::Tcp(l), (a.ip().to_string(), a.port()))
            }
            Listen::Shm(host, port) => {
                let (l, p) = shm::listen(&host, port)?;
                l.set_nonblocking(true)?;
                (Listener::Shm(UnixListener::from_std(l)), (host, p))
            }
            Listen::Verbs(host, port) => {
                let l = VerbsListener::bind(&host, port)?;
                let p = l.port;
                (Listener::Verbs(l), (host, p))
            }
        };
        match &mut listener {
            Listener::Tcp(l) => poll.registry().register(l, LISTENER, Interest::READABLE)?,
            Listener::Shm(l) => poll.registry().register(l, LISTENER, Interest::READABLE)?,
            Listener::Verbs(l) => poll.registry().register(&mut SourceFd(&l.fd), LISTENER, Interest::READABLE)?,
        }
        let waker = Waker::new(poll.registry(), WAKER)?;
        let shared = Arc::new(Shared {
            cfg,
            calls: Mutex::new(VecDeque::new()),
            calls_cv: Condvar::new(),
            outbox: Mutex::new(Vec::new()),
            waker,
            stopping: AtomicBool::new(false),
            counters: Counters::default(),
            buffers: BufferStats::default(),
            open: AtomicUsize::new(0),
            closed_reasons: Mutex::new(HashMap::new()),
        });
        let mut ev = EventLoop { poll, listener, shared: shared.clone(), conns: FxHashMap::default(), next: 2,
                                 resume: Vec::new() };
        let thread = std::thread::Builder::new().name("hpcnet-rpc-loop".into()).spawn(move || ev.run())?;
        Ok(Server { shared, address, thread: Some(thread) })
    }

    pub fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.shared.waker.wake();
        self.shared.calls_cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(PartialEq, Clone, Copy)]
enum Phase {
    Preamble,
    Context,
    Ready,
}

/// A connection's bytes: a tcp socket, the server's end of shm rings, or a verbs connection.
enum Io {
    Tcp(TcpStream),
    Shm(ShmEnd),
    Verbs(Box<VerbsEnd>), // boxed: an end is large, a socket a word
}

impl Io {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Io::Tcp(s) => s.read(buf),
            Io::Shm(e) => e.read(buf),
            Io::Verbs(e) => e.read(buf),
        }
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Io::Tcp(s) => s.write(buf),
            Io::Shm(e) => match e.write(buf) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    e.set_writer_waiting(true); // then look again: the reader may have just made room
                    e.write(buf)
                }
                other => other,
            },
            Io::Verbs(e) => e.write(buf),
        }
    }

    /// `head` then `body`, as far as they go now (tcp: one writev). Two slices on the stack, no Vec:
    /// under emulation an allocation per message is a measurable share of a verbs round trip.
    fn write_pair(&mut self, head: &[u8], body: &[u8]) -> io::Result<usize> {
        match self {
            Io::Tcp(s) => s.write_vectored(&[io::IoSlice::new(head), io::IoSlice::new(body)]),
            Io::Shm(e) => match e.write_vectored(&[head, body]) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    e.set_writer_waiting(true); // then look again: the reader may have just made room
                    e.write_vectored(&[head, body])
                }
                other => other,
            },
            Io::Verbs(e) => e.write_vectored(&[head, body]),
        }
    }

    fn register(&mut self, r: &Registry, id: usize) -> io::Result<()> {
        match self {
            Io::Tcp(s) => r.register(s, Token(id << 2), Interest::READABLE),
            Io::Shm(e) => {
                e.always_ring_on_data();
                r.register(&mut SourceFd(&e.my_data.as_raw_fd()), Token(id << 2), Interest::READABLE)?;
                r.register(&mut SourceFd(&e.my_space.as_raw_fd()), Token(id << 2 | SUB_SPACE), Interest::READABLE)?;
                r.register(&mut SourceFd(&e.live.as_raw_fd()), Token(id << 2 | 2), Interest::READABLE)
            }
            Io::Verbs(e) => r.register(&mut SourceFd(&e.comp_fd), Token(id << 2), Interest::READABLE),
        }
    }

    fn want_writable(&mut self, r: &Registry, id: usize, on: bool) {
        match self {
            Io::Tcp(s) => {
                let interest = if on { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
                let _ = r.reregister(s, Token(id << 2), interest);
            }
            Io::Shm(e) => {
                if !on {
                    e.set_writer_waiting(false);
                }
            }
            Io::Verbs(_) => {} // the loop looks at its credits every CREDIT_LOOK while it wants to write
        }
    }

    fn close(&mut self, r: &Registry) {
        match self {
            Io::Tcp(s) => {
                let _ = r.deregister(s);
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            Io::Shm(e) => {
                for fd in [e.my_data.as_raw_fd(), e.my_space.as_raw_fd(), e.live.as_raw_fd()] {
                    let _ = r.deregister(&mut SourceFd(&fd));
                }
                e.close();
            }
            Io::Verbs(e) => {
                let _ = r.deregister(&mut SourceFd(&e.comp_fd));
                e.close();
            }
        }
    }

    /// A short read means the socket is drained only on tcp (a ring read also stops at its end).
    fn short_read_drains(&self) -> bool {
        matches!(self, Io::Tcp(_))
    }
}

struct Conn {
    stream: Io,
    phase: Phase,
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    wbuf: Vec<u8>,
    wpos: usize,
    client_id: Vec<u8>,
    opened: Instant,
    last_active: Instant,
    last_write: Instant,
    in_python: usize,
    closing: bool, // a FATAL is queued: read nothing more, close once it is written
    paused: bool,  // not read while its responses back up
    writable_interest: bool,
    grew: bool, // the read buffer grew since the last message (pooled: a pool miss)
}

impl Conn {
    fn unsent(&self) -> usize {
        self.wbuf.len() - self.wpos
    }
}

/// Why a connection is closed; `Fatal` answers first.
enum Close {
    Quiet(String),
    Fatal { code: u64, call_id: i32, message: String },
}

fn fatal(code: u64, call_id: i32, message: String) -> Close {
    Close::Fatal { code, call_id, message }
}

/// The next delimited RpcRequestHeaderProto of a packet; FATAL (no call id yet) when it is not one.
fn request_header<'a>(cur: &mut Cursor<'a>) -> Result<RequestHeader<'a>, Close> {
    let hbytes = cur.delimited()
        .map_err(|e| fatal(wire::FATAL_DESERIALIZING_REQUEST, wire::INVALID_CALL_ID, e))?;
    RequestHeader::parse(hbytes).map_err(|e| fatal(
        wire::FATAL_INVALID_RPC_HEADER, wire::INVALID_CALL_ID,
        format!("cannot parse RpcRequestHeaderProto: {e}")))
}

fn code_name(code: u64) -> &'static str {
    match code {
        wire::FATAL_UNSUPPORTED_SERIALIZATION => "FATAL_UNSUPPORTED_SERIALIZATION",
        wire::FATAL_INVALID_RPC_HEADER => "FATAL_INVALID_RPC_HEADER",
        wire::FATAL_DESERIALIZING_REQUEST => "FATAL_DESERIALIZING_REQUEST",
        wire::FATAL_VERSION_MISMATCH => "FATAL_VERSION_MISMATCH",
        wire::FATAL_UNAUTHORIZED => "FATAL_UNAUTHORIZED",
        _ => "FATAL_UNKNOWN",
    }
}

struct EventLoop {
    poll: Poll,
    listener: Listener,
    shared: Arc<Shared>,
    conns: FxHashMap<usize, Conn>,
    next: usize,
    resume: Vec<usize>, // connections whose backed-up responses drained: read them again
}

impl EventLoop {
    fn run(&mut self) {
        let mut events = Events::with_capacity(1024);
        let mut last_tick = Instant::now();
        // verbs connections that just carried a message, busy-polled until `spin_until` before the loop
        // sleeps: waking from the completion channel costs an interrupt and a context switch, which on
        // Soft-RoCE is a round trip's worth (perftest's ib_send_lat never sleeps)
        let mut hot: Vec<usize> = Vec::new();
        let mut spin_until = Instant::now();
        let mut spin_cap = Instant::now(); // a spin never outlasts SPIN_CAP after the last wake-up
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
                        spin_until = (Instant::now() + crate::verbs::server_spin()).min(spin_cap);
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
                // completion that came before the arming raises no event. A message found then came
                // as a wake-up would and starts a new spin, unless this spin ran into its cap (a
                // connection that stays readable, e.g. paused behind a peer that returns no credits,
                // must not keep the loop spinning: it waits for its events like any other)
                let capped = spin_until >= spin_cap;
                if self.serve_hot(&hot, true) && !capped {
                    spin_until = Instant::now() + crate::verbs::server_spin();
                    spin_cap = Instant::now() + SPIN_CAP;
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
                            spin_cap = Instant::now() + SPIN_CAP;
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
    /// `arm`); whether any had.
    fn serve_hot(&mut self, hot: &[usize], arm: bool) -> bool {
        let mut served = false;
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
                served = true;
            }
        }
        served
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

    /// Handles every complete packet in the buffer; returns the buffer length the next one needs.
    fn process(&mut self, id: usize) -> Result<usize, Close> {
        let mut buf = {
            let Some(c) = self.conns.get_mut(&id) else { return Ok(0) };
            std::mem::take(&mut c.rbuf)
        };
        let r = self.process_buffer(id, &buf);
        let Some(c) = self.conns.get_mut(&id) else { return Ok(0) };
        if c.rstart == c.rend {
            c.rstart = 0;
            c.rend = 0;
            if buf.len() > KEEP_BUFFER {
                buf = Vec::new();
            }
        }
        c.rbuf = buf;
        r
    }

    fn process_buffer(&mut self, id: usize, buf: &[u8]) -> Result<usize, Close> {
        let max_data = self.shared.cfg.max_data_length;
        loop {
            let c = self.conns.get_mut(&id).expect("connection");
            if c.closing {
                return Ok(0);
            }
            if c.unsent() > WRITE_HIGH {
                c.paused = true;
                return Ok(0);
            }
            let avail = &buf[c.rstart..c.rend];
            match c.phase {
                Phase::Preamble => {
                    match wire::check_preamble(avail) {
                        Ok(true) => {}
                        Ok(false) => return Ok(c.rstart + wire::PREAMBLE.len()),
                        Err(wire::PreambleError::Magic(seen)) => return Err(Close::Quiet(format!(
                            "bad preamble: {:?} is not 'hrpc'", String::from_utf8_lossy(&seen)))),
                        Err(wire::PreambleError::Version(v)) => {
                            return Err(fatal(wire::FATAL_VERSION_MISMATCH, wire::INVALID_CALL_ID, format!(
                                "IPC version {v} not supported, server speaks {}", wire::IPC_VERSION)))
                        }
                        Err(wire::PreambleError::Auth(a)) => {
                            return Err(fatal(wire::FATAL_UNAUTHORIZED, wire::INVALID_CALL_ID, format!(
                                "auth protocol {a} not supported (only none)")))
                        }
                    }
                    c.rstart += wire::PREAMBLE.len();
                    c.phase = Phase::Context;
                }
                Phase::Context | Phase::Ready => {
                    let context = c.phase == Phase::Context;
                    let limit = if context { max_data.min(wire::MAX_CONTEXT_LENGTH) } else { max_data };
                    let packet = match wire::split_frame(avail, limit) {
                        Ok(wire::Frame::Packet(packet)) => packet,
                        Ok(wire::Frame::Need(n)) => return Ok(c.rstart + n),
                        Err(len) if context => {
                            return Err(fatal(wire::FATAL_INVALID_RPC_HEADER, wire::INVALID_CALL_ID,
                                             format!("connection context of {len} bytes exceeds {limit}")))
                        }
                        Err(len) => {
                            return Err(fatal(wire::FATAL_INVALID_RPC_HEADER, wire::INVALID_CALL_ID, format!(
                                "RPC data length {len} exceeds ipc.maximum.data.length {max_data}")))
                        }
                    };
                    c.rstart += 4 + packet.len();
                    if c.phase == Phase::Context {
                        self.context(id, packet)?;
                        continue;
                    }
                    let design = self.shared.cfg.design;
                    self.shared.buffers.message(design, std::mem::take(&mut c.grew));
                    if design == Design::Pooled {
                        self.call(id, packet)?;
                        continue;
                    }
                    // naive: the message copied out to a buffer of its own, the response built in
                    // fresh memory and joined into the write buffer
                    let owned = packet.to_vec();
                    self.shared.buffers.alloc();
                    self.shared.buffers.copy(owned.len());
                    let saved = std::mem::take(&mut c.wbuf);
                    let r = self.call(id, &owned);
                    let c = self.conns.get_mut(&id).expect("connection");
                    join_naive(&self.shared.buffers, c, saved);
                    r?;
                }
            }
        }
    }

    fn context(&mut self, id: usize, packet: &[u8]) -> Result<(), Close> {
        let mut cur = Cursor::new(packet);
        let header = request_header(&mut cur)?;
        if header.call_id != wire::CONNECTION_CONTEXT_CALL_ID {
            return Err(fatal(wire::FATAL_INVALID_RPC_HEADER, wire::INVALID_CALL_ID, format!(
                "first packet has callId {}, expected connection context -3", header.call_id)));
        }
        let ctx = cur.delimited()
            .map_err(|e| fatal(wire::FATAL_DESERIALIZING_REQUEST, wire::INVALID_CALL_ID, e))?;
        wire::parse_context(ctx).map_err(|e| fatal(
            wire::FATAL_DESERIALIZING_REQUEST, wire::INVALID_CALL_ID,
            format!("cannot parse IpcConnectionContextProto: {e}")))?;
        let max = self.shared.cfg.max_connections;
        if self.shared.open.load(Ordering::Relaxed) >= max {
            return Err(Close::Quiet(format!("already serving {max} connections")));
        }
        let c = self.conns.get_mut(&id).expect("connection");
        c.client_id = header.client_id.to_vec();
        c.phase = Phase::Ready;
        c.last_active = Instant::now();
        self.shared.open.fetch_add(1, Ordering::Relaxed);
        self.shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn call(&mut self, id: usize, packet: &[u8]) -> Result<(), Close> {
        trace::mark(Point::Dispatch);
        let shared = &self.shared;
        let c = self.conns.get_mut(&id).expect("connection");
        let mut cur = Cursor::new(packet);
        let header = request_header(&mut cur)?;
        let call_id = header.call_id;
        if call_id == wire::PING_CALL_ID {
            shared.counters.pings.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if header.rpc_op == wire::RPC_CLOSE_CONNECTION {
            return Err(Close::Quiet("client asked to close".into()));
        }
        if call_id < 0 {
            return Err(fatal(wire::FATAL_INVALID_RPC_HEADER, wire::INVALID_CALL_ID,
                             format!("callId {call_id} is not a call")));
        }
        if header.rpc_kind != wire::RPC_PROTOCOL_BUFFER {
            return Err(fatal(wire::FATAL_UNSUPPORTED_SERIALIZATION, call_id,
                             format!("rpcKind {} not supported", header.rpc_kind)));
        }
        let retry = header.retry_count;
        let des = |e: String| fatal(wire::FATAL_DESERIALIZING_REQUEST, call_id, e);
        let rh = cur.delimited().map_err(des)?;
        let (method, protocol) = wire::parse_method_header(rh)
            .map_err(|e| des(format!("cannot parse RequestHeaderProto: {e}")))?;
        let body = cur.delimited().map_err(des)?;
        shared.counters.calls.fetch_add(1, Ordering::Relaxed);
        if protocol != shared.cfg.protocol {
            shared.counters.errors.fetch_add(1, Ordering::Relaxed);
            wire::error_packet(&mut c.wbuf, call_id, wire::ERROR, &c.client_id, retry,
                               "org.apache.hadoop.ipc.RpcNoSuchProtocolException",
                               &format!("unknown protocol {protocol}"), wire::ERROR_NO_SUCH_PROTOCOL);
            return Ok(());
        }
        match method {
            "echo" => {
                let payload = wire::parse_payload(body)
                    .map_err(|e| des(format!("cannot parse EchoRequestProto: {e}")))?;
                if shared.cfg.design == Design::Pooled && c.unsent() == 0 {
                    echo_in_place(c, call_id, retry, payload);
                } else {
                    echo_packet(&mut c.wbuf, call_id, &c.client_id, retry, payload);
                }
            }
            "ping" => {
                wire::check_message(body).map_err(|e| des(format!("cannot parse EmptyRequestProto: {e}")))?;
                wire::success_packet(&mut c.wbuf, call_id, &c.client_id, retry, &[]);
            }
            _ => {
                // every other method is Python's (an unknown one too: the handlers know the names)
                let mut q = shared.calls.lock().unwrap();
                if q.len() >= shared.cfg.queue_size {
                    drop(q);
                    shared.counters.errors.fetch_add(1, Ordering::Relaxed);
                    wire::error_packet(&mut c.wbuf, call_id, wire::ERROR, &c.client_id, retry,
                                       "org.apache.hadoop.ipc.RetriableException",
                                       "server too busy: call queue full", wire::ERROR_RPC_SERVER);
                    return Ok(());
                }
                q.push_back(PyCall { conn: id as u64, call_id, retry_count: retry, method: method.to_owned(),
                                     body: body.to_vec() });
                drop(q);
                c.in_python += 1;
                shared.counters.python_calls.fetch_add(1, Ordering::Relaxed);
                shared.calls_cv.notify_one();
                return Ok(());
            }
        }
        shared.counters.native_calls.fetch_add(1, Ordering::Relaxed);
        Ok(())
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

/// Naive framing: what was just encoded into the (fresh) write buffer is one newly allocated message;
/// it is copied behind the bytes that were waiting (`saved`).
fn join_naive(stats: &BufferStats, c: &mut Conn, mut saved: Vec<u8>) {
    let fresh = std::mem::take(&mut c.wbuf);
    if !fresh.is_empty() {
        stats.alloc();
        stats.copy(fresh.len());
        saved.extend_from_slice(&fresh);
    }
    c.wbuf = saved;
}

/// A SUCCESS packet whose body is EchoResponseProto{payload}, but for the payload's bytes, which must
/// follow: its length counts them.
fn echo_head(out: &mut Vec<u8>, call_id: i32, client_id: &[u8], retry: i32, payload_len: usize) {
    let body_len = 1 + wire::varint_len(payload_len as u64) + payload_len;
    let start = out.len();
    // success_packet with the body's bytes appended in place
    wire::success_packet(out, call_id, client_id, retry, &[]);
    out.pop(); // the empty body's length byte
    wire::put_varint(out, body_len as u64);
    out.push(0x0a);
    wire::put_varint(out, payload_len as u64);
    let n = (out.len() - start - 4 + payload_len) as u32;
    out[start..start + 4].copy_from_slice(&n.to_be_bytes());
}

/// A SUCCESS packet whose body is EchoResponseProto{payload}, written without an intermediate copy.
fn echo_packet(out: &mut Vec<u8>, call_id: i32, client_id: &[u8], retry: i32, payload: &[u8]) {
    out.reserve(64 + payload.len());
    echo_head(out, call_id, client_id, retry, payload.len());
    out.extend_from_slice(payload);
}

/// Pooled, with nothing waiting to be sent: the echo's header is encoded into the (empty) write
/// buffer and sent with the payload straight from the read buffer, where the request landed (one
/// writev, no copy). What the socket does not take now is queued in the write buffer as usual; a
/// write error is left for `flush` to find.
fn echo_in_place(c: &mut Conn, call_id: i32, retry: i32, payload: &[u8]) {
    echo_head(&mut c.wbuf, call_id, &c.client_id, retry, payload.len());
    let head = c.wbuf.len();
    let mut sent = 0;
    while sent < head + payload.len() {
        let written = if sent < head {
            c.stream.write_pair(&c.wbuf[sent..], payload)
        } else {
            c.stream.write_pair(&payload[sent - head..], &[])
        };
        match written {
            Ok(0) => break,
            Ok(n) => {
                sent += n;
                c.last_write = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break, // WouldBlock: queued below; an error: flush meets it again
        }
    }
    if sent < head {
        c.wpos = sent;
        c.wbuf.extend_from_slice(payload);
    } else {
        let rest = &payload[sent - head..];
        c.wbuf.clear();
        c.wpos = 0;
        c.wbuf.extend_from_slice(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_packet_equals_success_packet_with_the_encoded_body() {
        let mut a = Vec::new();
        echo_packet(&mut a, 300, &[1; 16], -1, &[9; 200]);
        let mut body = vec![0x0a];
        wire::put_varint(&mut body, 200);
        body.extend_from_slice(&[9; 200]);
        let mut b = Vec::new();
        wire::success_packet(&mut b, 300, &[1; 16], -1, &body);
        assert_eq!(a, b);
    }
}
