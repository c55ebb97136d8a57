"""The ``verbs`` transport: RDMA through pyverbs, RC queue pairs connected with rdma_cm.

Shape (the RPCoIB / RDMA-Hadoop design):

- **Connection setup** with the asynchronous rdma_cm API (one event channel per listener and per
  client connection) and an *external* RC QP that we create and move INIT -> RTR -> RTS with the
  attributes ``rdma_init_qp_attr`` gives. Our own QP, CQ and completion channel, because pyverbs'
  CMID-owned ones only send whole MRs and wait with the GIL held.
- **Never blocking inside pyverbs.** pyverbs calls librdmacm/libibverbs without releasing the GIL, so
  a blocking ``rdma_get_cm_event`` or ``ibv_get_cq_event`` would freeze every thread of the process
  (a server and client in one process would deadlock). Both channel descriptors are set non-blocking
  and waited on with ``poll()`` from Python (which releases the GIL); pyverbs hides the descriptors,
  so they are found as the one new ``/proc/self/fd`` entry of their kind after creating the channel.
- **Registered memory once:** per device one context and protection domain for the process; receive
  slots, send slots and rendezvous staging/landing regions come from a process-wide pool of
  registered regions and go back to it when a connection closes.
- **Eager** messages (up to ``EAGER`` bytes) are copied into a registered send slot and SENT into one
  of the peer's ``RECV_DEPTH`` posted receive slots. **Rendezvous** for larger ones: the sender copies
  into a registered staging region and sends its (address, rkey, length); the receiver RDMA-READs it
  into a registered landing region and answers FIN, which frees the staging region.
- **Credits:** a sender may only have as many SENDs outstanding as the peer has posted receives. Each
  header carries the count of receives its sender has re-posted so far; when enough are unreported
  and nothing goes the other way, the receiver RDMA-WRITEs that count into the peer's credit word, so
  returning credits never consumes a receive (no credit deadlock). Where each side's credit word is
  travels in a HELLO message each way (rdma-core 44's pyverbs drops rdma_cm private data).
- **Completions:** poll the CQ, spin ``SPIN_SECONDS``, then arm the CQ and ``poll()`` the completion
  channel. Waits for credits are capped at ``WAIT_SLICE`` so credit-word updates (which raise no
  completion) are seen, and so are waits that share the connection with another waiting thread; a
  lone waiter sleeps until a completion, the next probe or its deadline (idle connections cost
  nothing between probes).
- **Failures are exceptions, never hangs:** no RDMA device / unroutable address -> ``TransportError``;
  peer gone (its CLOSE, a DISCONNECTED event, a failed work request after the RC retries; an idle
  connection probes its peer with a NOP after ``PROBE_IDLE`` s, backing off to ``PROBE_MAX``) ->
  ``TransportClosed``; a QP error -> ``TransportClosed`` naming the work-completion status; every
  wait has a deadline.

Addresses: rdma_cm cannot use 127.0.0.1 (loopback has no RDMA device), so a loopback or wildcard host
is replaced by this machine's RDMA address: ``$HPCNET_VERBS_HOST`` or the first IPv4 address in the
GID table of an ACTIVE RDMA port. ``Listener.address`` reports the address actually used.

The framing above the eager/rendezvous messages is the byte stream of ``StreamConnection`` (4-byte
length + body), so ``send_raw``/``recv_raw`` (Hadoop's ``hrpc`` preamble) work as on tcp.
"""

from __future__ import annotations

# The package's modules, bottom up: ``wire`` (message format and sizing), ``loader`` (pyverbs and this
# machine's RDMA address: can verbs run here?), ``events`` (waiting on the descriptors pyverbs hides;
# rdma_cm events), ``memory`` (the process's devices and pool of registered regions), ``connection``
# (one connection: eager/rendezvous, credits, put/get), ``transport`` (listen/accept/connect). Beside
# them ``native``: the same interface over the native core's verbs end, imported where it is used.
from .connection import VerbsConnection, VerbsRegion
from .loader import (VerbsUnavailable, gid_ipv4_addresses, load_pyverbs, looks_usable,
                     rdma_host, unavailable_reason)
from .transport import VerbsListener, VerbsTransport
from .wire import (ACCEPT_SLICE, CLOSE, CONNECT_TIMEOUT_MS, CQ_DEPTH, CREDIT_BATCH, DATA, EAGER,
                   FIN, HDR, HELLO, MAX_RENDEZVOUS, NOP, PROBE_IDLE, PROBE_MAX, QP_TIMEOUT, RECV_DEPTH,
                   RETRY, RNDV, RTS, SEND_DEPTH, SEND_SLOTS, SLOT, SPIN_SECONDS, TAG, WAIT_SLICE)

__all__ = [  # the public import path ``pytest_hpcnet.reference.transport.verbs`` as it was before the split
    "VerbsConnection", "VerbsRegion", "VerbsListener", "VerbsTransport",
    "VerbsUnavailable", "gid_ipv4_addresses", "load_pyverbs", "looks_usable", "rdma_host", "unavailable_reason",
    "ACCEPT_SLICE", "CLOSE", "CONNECT_TIMEOUT_MS", "CQ_DEPTH", "CREDIT_BATCH", "DATA", "EAGER", "FIN", "HDR",
    "HELLO", "MAX_RENDEZVOUS", "NOP", "PROBE_IDLE", "PROBE_MAX", "QP_TIMEOUT", "RECV_DEPTH", "RETRY", "RNDV",
    "RTS", "SEND_DEPTH", "SEND_SLOTS", "SLOT", "SPIN_SECONDS", "TAG", "WAIT_SLICE",
]
