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
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, UnixListener};
use mio::unix::SourceFd;
use mio::{Interest, Poll, Token, Waker};
use rustc_hash::FxHashMap;

use crate::buffers::{BufferStats, Design};
use crate::shm;
use crate::verbs::cm::VerbsListener;
use crate::wire;

mod event_loop; // when to read and write: the poll loop, the verbs spin, accepting, flushing, timers
mod protocol;   // what the bytes mean: preamble, context, calls, the built-in methods
mod stream;     // a connection's bytes over tcp, shm or verbs

use stream::Io;

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
                                 resume: Vec::new(), bytes_read: 0 };
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
    bytes_read: u64,    // from every connection so far: whether a verbs spin is still serving someone
}
