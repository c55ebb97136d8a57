//! Where a round trip's time goes: timestamps (CLOCK_MONOTONIC, nanoseconds) at fixed points of a
//! call, kept in memory while `HPCNET_TRACE` is set in the environment and taken from Python with
//! `_native.trace_take()`. A client's and a server's points on one host share the clock, so
//! `benchmarks/bench_verbs_latency.py --breakdown` lines them up call by call: how long each side
//! works before it posts, how long a message takes from one side's post to the other side's poll
//! seeing it. Off (the default), a point costs one load of a flag.

use std::sync::{Mutex, OnceLock};

/// The points, in the order a round trip meets them.
#[derive(Clone, Copy)]
pub enum Point {
    /// A timed call or ping-pong starts (the timing drivers).
    Start,
    /// A SEND is about to be posted (the verbs end).
    Post,
    /// `ibv_post_send` returned: under Soft-RoCE the kernel has done the send's work in this call,
    /// the peer's side included.
    Posted,
    /// A poll found a received message's completion.
    Received,
    /// A read handed received bytes up.
    Read,
    /// The RPC server starts on a call's packet.
    Dispatch,
    /// A waiting end stops spinning and sleeps on the completion channel: its wake-up costs an
    /// interrupt and a context switch, under emulation several round trips.
    Sleep,
    /// The timed call or ping-pong has its answer.
    End,
}

impl Point {
    pub fn name(self) -> &'static str {
        match self {
            Point::Start => "start",
            Point::Post => "post",
            Point::Posted => "posted",
            Point::Received => "received",
            Point::Read => "read",
            Point::Dispatch => "dispatch",
            Point::Sleep => "sleep",
            Point::End => "end",
        }
    }
}

/// Kept points are capped: a traced run that goes on for long keeps its first ones.
const CAP: usize = 1 << 22;

static POINTS: Mutex<Vec<(Point, u64)>> = Mutex::new(Vec::new());

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("HPCNET_TRACE").is_some_and(|v| !v.is_empty() && v != "0"))
}

pub fn mark(point: Point) {
    if !enabled() {
        return;
    }
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    let mut points = POINTS.lock().unwrap();
    if points.len() < CAP {
        points.push((point, t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64));
    }
}

/// The points kept so far, in the order taken (emptied).
pub fn take() -> Vec<(Point, u64)> {
    std::mem::take(&mut *POINTS.lock().unwrap())
}
