//! The two buffer designs of the reference (pytest_hpcnet/reference/buffers.py), natively, with the
//! same counters:
//!
//! - `pooled`: a connection reads into one registered buffer that grows (by doubling, at most to the
//!   packet being read) only when a message needs more than it has -- message-size locality: once it
//!   holds the size recent messages needed, every message is a pool hit and is parsed in place; a
//!   response is encoded straight into the connection's write buffer (zero-copy framing). Payloads
//!   are not copied at all: a call's header goes out with the request from the caller's memory in one
//!   writev, the server's echo sends the payload from its read buffer behind the header the same way,
//!   and a caller reading its own response sees it in the receive buffer.
//! - `naive`: as default Hadoop RPC, every received message is copied out into a freshly allocated
//!   buffer, and every outgoing message is built in fresh buffers and joined into one more before it
//!   is written.
//!
//! Counted as in Python: `allocations` (message buffers created: a naive message buffer, a pooled
//! buffer's growth), `copies`/`bytes_copied` (message bytes our code copies into intermediate memory;
//! the encoding of a response and the kernel's copy are not counted, in either design), `pool_hits`
//! and `pool_misses` (pooled: a message that fit the buffer / needed it to grow), `messages`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Design {
    Pooled,
    Naive,
}

impl Design {
    pub fn parse(name: &str) -> Option<Design> {
        match name {
            "pooled" => Some(Design::Pooled),
            "naive" => Some(Design::Naive),
            _ => None,
        }
    }
}

#[derive(Default)]
pub struct BufferStats {
    pub allocations: AtomicU64,
    pub copies: AtomicU64,
    pub bytes_copied: AtomicU64,
    pub pool_hits: AtomicU64,
    pub pool_misses: AtomicU64,
    pub messages: AtomicU64,
}

impl BufferStats {
    pub fn alloc(&self) {
        self.allocations.fetch_add(1, Relaxed);
    }

    pub fn copy(&self, n: usize) {
        self.copies.fetch_add(1, Relaxed);
        self.bytes_copied.fetch_add(n as u64, Relaxed);
    }

    /// A received message; pooled: `grew` says whether the buffer had to grow for it.
    pub fn message(&self, design: Design, grew: bool) {
        self.messages.fetch_add(1, Relaxed);
        if design == Design::Pooled {
            if grew {
                self.pool_misses.fetch_add(1, Relaxed);
            } else {
                self.pool_hits.fetch_add(1, Relaxed);
            }
        }
    }

    pub fn snapshot(&self) -> [(&'static str, u64); 6] {
        [
            ("allocations", self.allocations.load(Relaxed)),
            ("copies", self.copies.load(Relaxed)),
            ("bytes_copied", self.bytes_copied.load(Relaxed)),
            ("pool_hits", self.pool_hits.load(Relaxed)),
            ("pool_misses", self.pool_misses.load(Relaxed)),
            ("messages", self.messages.load(Relaxed)),
        ]
    }
}
