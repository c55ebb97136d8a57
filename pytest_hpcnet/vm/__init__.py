"""The Soft-RoCE test harness: a small Debian guest under QEMU (TCG) where the verbs transport runs on
a real RDMA stack (``rdma_rxe`` bound to a dummy netdev).

``hpcnet vm build`` builds and caches the guest (``build``); ``hpcnet vm test`` boots it, runs pytest
inside on the verbs suites and brings junit XML, the run record and the output back (``boot``).
``guest`` holds the pure parts: package and module lists, the boot script, the serial results channel.
"""

from .guest import GUEST_ADDRESS, VmError  # noqa: F401
