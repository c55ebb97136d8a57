"""The fabric's own ceiling beside every RDMA claim (issue 17, item 3).

When a claim compares RDMA with IPoIB or Ethernet (``fabric = "latency"`` or ``"bandwidth"`` in its
claims file), the run also measures the same comparison with the fabric's native tools on the same
nodes: perftest (``ib_send_lat``, ``ib_write_bw``) on the RDMA side, qperf (``tcp_lat``, ``tcp_bw``)
or sockperf on the IP address of the claim's baseline network. Those figures are recorded as
``fabric.*`` measurements; ``ceiling`` turns them into what the fabric alone allows for the claim's
quantity and says whose a FAIL is: the fabric's (even the native tools do not reach the claim) or
the stack's (the fabric allows it, the stack did not get there).

- ``tools``: one strategy per native tool (command lines, output parsing) behind ``FabricTool``.
- ``probe``: runs a tool pair between two nodes through the cluster's launchers.
- ``ceiling``: the claim's quantity from the fabric's figures, and the verdict's cause.
"""

from .ceiling import attach_ceilings, ceiling_rows, fabric_quantity  # noqa: F401
from .tools import TOOLS, FabricTool, ToolError  # noqa: F401
