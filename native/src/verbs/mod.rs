//! The `verbs` transport natively, wire-compatible with pytest_hpcnet/reference/transport/verbs (read
//! its package docstring for the design): RC queue pairs connected with rdma_cm, eager SENDs into
//! 8 KiB slots behind a 16-byte header, credits (each header carries the receives its sender has
//! re-posted; a receiver that owes `CREDIT_BATCH` RDMA-WRITEs the count into the peer's credit word,
//! whose address the HELLO message gives), RDMA-READ rendezvous (RTS, FIN) for large messages, NOP,
//! CLOSE. libibverbs and librdmacm are opened at run time through the C shim (`ffi`).
//!
//! `VerbsEnd::read`/`write` never block (WouldBlock), like `ShmEnd`: the event-driven server waits on
//! the completion channel's descriptor, the blocking client in `wait`.

pub mod cm;
pub mod conn;
pub mod end;
pub mod ffi;
pub mod floor;
mod region;
mod stream;

pub use end::VerbsEnd;

// The format and sizing of pytest_hpcnet/reference/transport/verbs/wire.py.
pub const RECV_DEPTH: usize = 32;
pub const SLOT: usize = 8192;
pub const HDR: usize = 16; // kind u8, 3 pad bytes, payload length u32, receives re-posted u64 (little-endian)
pub const EAGER: usize = SLOT - HDR;
pub const RNDV: usize = 28; // RTS payload: address u64, length u64, rkey u32, tag u64
pub const DATA: u8 = 1;
pub const RTS: u8 = 2;
pub const FIN: u8 = 3;
pub const CLOSE: u8 = 4;
pub const NOP: u8 = 5;
pub const HELLO: u8 = 6;
pub const SEND_SLOTS: usize = RECV_DEPTH;
pub const SEND_DEPTH: usize = SEND_SLOTS + 32;
pub const CQ_DEPTH: usize = RECV_DEPTH + SEND_DEPTH + 8;
pub const CREDIT_BATCH: u64 = (RECV_DEPTH / 4) as u64;
pub const SEND_BASE: u64 = 1 << 16;
pub const RDMA_BASE: u64 = 1 << 32;
pub const CREDIT_WR: u64 = 1 << 48;
pub const ONE_SIDED_BASE: u64 = 1 << 40; // put/get work requests (below CREDIT_WR, far above rendezvous READs)
pub const QP_TIMEOUT: i32 = 16;
pub const RETRY: i32 = 6;
pub const MAX_RENDEZVOUS: u64 = 128 * 1024 * 1024;

// Access bits (IBV_ACCESS_*).
pub const LOCAL_WRITE: i32 = 1;
pub const REMOTE_WRITE: i32 = 2;
pub const REMOTE_READ: i32 = 4;

/// Writes above this go by rendezvous; below it as eager chunks (a registration and a READ cost
/// more than a few SENDs on Soft-RoCE).
pub const RNDV_THRESHOLD: usize = 4 * EAGER;

/// `var` as a number of microseconds (0 up to a second), or `default`: the verbs ends' waiting knobs.
fn env_micros(var: &str, default: f64) -> std::time::Duration {
    let us = std::env::var(var).ok().and_then(|v| v.parse::<f64>().ok())
        .filter(|v| (0.0..1e6).contains(v)).unwrap_or(default);
    std::time::Duration::from_secs_f64(us * 1e-6)
}

/// Busy-polling before a blocking wait: `HPCNET_VERBS_SPIN_US` (the Python transport's knob).
pub fn spin() -> std::time::Duration {
    static SPIN: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| env_micros("HPCNET_VERBS_SPIN_US", 50.0))
}

/// How long the server's loop busy-polls its verbs connections after a message before it sleeps:
/// `HPCNET_VERBS_SERVER_SPIN_US`, default 300 (long enough for an emulated client's next call).
pub fn server_spin() -> std::time::Duration {
    static SPIN: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| env_micros("HPCNET_VERBS_SERVER_SPIN_US", 300.0))
}

/// How often a busy-poll yields the CPU: `HPCNET_VERBS_YIELD_US`, default 20. Between yields it only
/// polls the CQ, as perftest does; a yield per poll costs a system call each, which under emulation
/// is most of what a poll costs, and delays seeing the completion by as much.
pub fn yield_every() -> std::time::Duration {
    static EVERY: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *EVERY.get_or_init(|| env_micros("HPCNET_VERBS_YIELD_US", 20.0))
}

/// The longest send that goes inline, its bytes in the work request (`shim.c`):
/// `HPCNET_VERBS_INLINE`, default 128 bytes, 0 for none; a device that takes fewer gets none.
pub fn max_inline() -> i32 {
    static INLINE: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *INLINE.get_or_init(|| std::env::var("HPCNET_VERBS_INLINE").ok().and_then(|v| v.parse::<i32>().ok())
        .filter(|v| (0..=1024).contains(v)).unwrap_or(128))
}

/// Why native verbs cannot run here, or None.
pub fn unavailable() -> Option<String> {
    ffi::load().err()
}
