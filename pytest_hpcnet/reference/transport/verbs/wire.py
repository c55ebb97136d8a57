"""The verbs transport's message format and sizing: eager slots, headers, credits, time-outs."""

from __future__ import annotations

import os
import struct

from ....timeouts import scaled


RECV_DEPTH = 32                 # receives posted per connection = the peer's send credits
SLOT = 8192                     # bytes per eager slot (header included)
HDR = struct.Struct("<BxxxIQ")  # kind, payload length, receives the sender has re-posted (cumulative)
EAGER = SLOT - HDR.size
RNDV = struct.Struct("<QQIQ")   # RTS payload: address, length, rkey, tag
TAG = struct.Struct("<Q")       # FIN payload
DATA, RTS, FIN, CLOSE, NOP, HELLO = 1, 2, 3, 4, 5, 6
SEND_SLOTS = RECV_DEPTH
SEND_DEPTH = SEND_SLOTS + 32    # send queue: SENDs plus RDMA READ/WRITEs and credit writes
CQ_DEPTH = RECV_DEPTH + SEND_DEPTH + 8
SPIN_SECONDS = float(os.environ.get("HPCNET_VERBS_SPIN_US", "50")) * 1e-6   # busy-poll before blocking
WAIT_SLICE = 0.02
PROBE_IDLE = 1.0                # first idle probe; each further one waits twice as long ...
PROBE_MAX = 8.0                 # ... up to this, until the connection carries messages again
QP_TIMEOUT = 16                 # 4.096 us * 2^16 = 268 ms per try; with RETRY tries a dead peer shows in ~2 s
RETRY = 6
CONNECT_TIMEOUT_MS = int(scaled(5000))   # rdma_cm's address and route resolution
ACCEPT_SLICE = 0.2              # an accept() waiting for a connection looks for close() this often
CREDIT_BATCH = RECV_DEPTH // 4
SEND_BASE, RDMA_BASE, CREDIT_WR = 1 << 16, 1 << 32, (1 << 48)


MAX_RENDEZVOUS = 128 * 1024 * 1024   # largest message any service accepts (ipc.maximum.data.length)
