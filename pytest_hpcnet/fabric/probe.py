"""Run a fabric tool between two nodes of the cluster: its server on one, its client on the other,
through the cluster's launchers (so it runs on the same hosts, in the same namespaces, as the stack
under test). Returns ``fabric.*`` measurements; a tool that cannot run says why in one line."""

from __future__ import annotations

import time

from ..errors import HpcnetError
from ..measure import Measurement, measurement
from ..sockets import free_port
from .tools import DEFAULT, TOOLS, FabricTool, ToolError

SERVER_START = 1.0               # seconds a tool's server gets to listen before its client connects


def metric_of(quantity: str) -> str:
    return f"fabric.{quantity}"


def config_of(tool: FabricTool, net: str) -> str:
    """The measurement's configuration: which side of the comparison, over which network."""
    return f"transport={'verbs' if tool.side == 'rdma' else 'tcp'},net={net}"


def run_tool(launchers, server_node, client_node, tool: FabricTool, address: str, seconds: float = 2.0,
             port: int | None = None) -> float:
    """One run of ``tool``: server on ``server_node``, client on ``client_node`` to ``address``."""
    port = port or free_port()
    try:
        server = launchers.start(server_node, tool.server(address, port))
    except (OSError, HpcnetError) as e:
        raise ToolError(f"{tool.name} cannot start on {server_node.name} (Debian package {tool.package}): "
                        f"{e}") from None
    try:
        time.sleep(SERVER_START)
        if server.poll() is not None:
            out, err = server.output()
            raise ToolError(f"{tool.name} server on {server_node.name} exited: {' '.join((err or out).split())[-160:]}")
        try:
            code, out, err = launchers.run(client_node, tool.client(address, port, seconds), timeout=seconds + 60)
        except (OSError, HpcnetError) as e:
            raise ToolError(f"{tool.name} client on {client_node.name}: {e}") from None
        text = f"{out}\n{err}"
        if code != 0:
            raise ToolError(f"{tool.name} client on {client_node.name} failed (exit {code}): "
                            f"{' '.join(text.split())[-160:]}")
        return tool.parse(text)
    finally:
        server.kill()


def measure_fabric(launchers, nodes, quantity: str, net: str, repeat: int = 3,
                   tools: dict | None = None) -> tuple[list[Measurement], list[str]]:
    """The fabric alone for one quantity: the RDMA tool between the first two nodes, and the IP tool
    over ``net``'s addresses. Returns (measurements, reasons a side could not be measured)."""
    if len(nodes) < 2:
        return [], [f"the fabric ceiling needs two nodes, the cluster has {len(nodes)}"]
    a, b = nodes[0], nodes[1]
    out, why = [], []
    for side in ("rdma", "ip"):
        tool = TOOLS[(tools or {}).get(side) or DEFAULT[(side, quantity)]]
        # perftest reaches its peer over the IPoIB address (any address works for its out-of-band
        # exchange; a RoCE or Soft-RoCE device sits on the Ethernet one)
        address = (a.addresses.get("ib") or a.addresses.get("eth")) if side == "rdma" else a.addresses.get(net)
        if not address:
            why.append(f"{side}: node {a.name} has no address on network {net}")
            continue
        samples = []
        try:
            for _ in range(repeat):
                samples.append(run_tool(launchers, a, b, tool, address))
        except ToolError as e:
            why.append(f"{side}: {e}")
            continue
        unit, direction = ("us", "lower") if quantity == "latency" else ("MB/s", "higher")
        out.append(measurement(metric_of(quantity), samples, unit=unit, direction=direction,
                               config=config_of(tool, "ib" if side == "rdma" else net),
                               nodes=[a.name, b.name], params={"tool": tool.name}))
    return out, why
