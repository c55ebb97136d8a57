//! Where a round trip's time goes: timestamps (CLOCK_MONOTONIC, nanoseconds) at fixed points of a
//! call, kept in memory while `HPCNET_TRACE` is set in the environment and taken from Python with
//! `_native.trace_take()`. A client's and a server's points on one host share the clock, so
//! `benchmarks/bench_verbs_latency.py --breakdown` lines them up call by call: how long each side
//! works before it posts, how long a message takes from one side's post to the other side's poll
//! seeing it. Off (the default), a point costs one load of a flag.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// The points, in the order a round trip meets them.
#[derive(Clone, Copy)]
#[repr(u8)]
pub enum Point {
    /// A timed call or ping-pong starts (the timing drivers).
    Start = 1,
    /// A SEND is about to be posted (the verbs end).
    Post = 2,
    /// `ibv_post_send` returned: under Soft-RoCE the kernel has done the send's work in this call,
    /// the peer's side included.
    Posted = 3,
    /// A poll found a received message's completion.
    Received = 4,
    /// A read handed received bytes up.
    Read = 5,
    /// The RPC server starts on a call's packet.
    Dispatch = 6,
    /// The timed call or ping-pong has its answer.
    End = 7,
}

pub const NAMES: [(u8, &str); 7] = [(1, "start"), (2, "post"), (3, "posted"), (4, "received"), (5, "read"),
                                    (6, "dispatch"), (7, "end")];

/// Kept points are capped: a traced run that goes on for long keeps its first ones.
const CAP: usize = 1 << 22;

static POINTS: Mutex<Vec<(u8, u64)>> = Mutex::new(Vec::new());

fn enabled() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0); // 0 not looked yet, 1 off, 2 on
    match STATE.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var_os("HPCNET_TRACE").is_some_and(|v| !v.is_empty() && v != "0");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        s => s == 2,
    }
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
        points.push((point as u8, t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64));
    }
}

/// The points kept so far, in the order taken (emptied).
pub fn take() -> Vec<(u8, u64)> {
    std::mem::take(&mut *POINTS.lock().unwrap())
}
