"""DFSIO performance per configuration, measured in paired rounds (baseline and candidate
interleaved, see ``measure.run_paired``), and the claims on their ratios.

Shapes are small for a 2-core CI box: one file per node (at most 4), 2 MB each, 512 KB blocks,
replication 2; 12 paired rounds (the local claims' bounds leave a wide margin, so more rounds would
only cost time). Throughput is TestDFSIO's "Throughput mb/sec" (MB over the sum of task I/O times).
"""

from __future__ import annotations

import os

import pytest

from pytest_hpcnet.measure import Paired, measurement
from pytest_hpcnet.options import env_int
from pytest_hpcnet.reference.dfs import timed_read
from pytest_hpcnet.reference.dfs.store import BlockStore
from pytest_hpcnet.reference.dfs.wire import PACKET_SIZE
from pytest_hpcnet.reference import native
from pytest_hpcnet.reference.transport import TRANSPORTS, verbs
from pytest_hpcnet.workloads.dfsio import FsTarget, parse_dfsio_args, run_dfsio
from pytest_hpcnet.workloads.dfsio.pipeline_cost import (floor_cpu_ms_per_mb, interleaved_checksum_cost,
                                                       pipeline_cpu_ms_per_mb, pipeline_on_one_core,
                                                       read_cpu_ms_per_mb, read_floor_cpu_ms_per_mb)

ROUNDS = 12
SIZE = "2MB"
BLOCK = 512 * 1024
METRIC = "dfsio.write.throughput"


def _write_opts(cluster):
    return parse_dfsio_args(["-write", "-nrFiles", str(min(4, len(cluster.nodes))), "-size", SIZE])


def _throughput(opts, target, launchers, cluster):
    return run_dfsio(opts, target, launchers, cluster, write_res_file=False).throughput


def _record(measure, paired, params, nodes):
    for name, samples in ((paired.baseline_name, paired.baseline), (paired.candidate_name, paired.candidate)):
        measure.record(measurement(METRIC, samples, unit="MB/s", direction="higher", config=name,
                                   nodes=nodes, params=params))


@pytest.fixture
def stores(launchers, cluster, workdirs, needs_one_host):
    needs_one_host("shm")
    started = {}
    try:
        for transport in ("tcp", "shm"):
            started[transport] = BlockStore(
                launchers, cluster, transport=transport,
                dirs={name: path / f"dfs-{transport}" for name, path in workdirs.items()}).start()
        yield started
    finally:
        for store in started.values():
            store.stop()


def test_blockstore_pipeline_shm_vs_tcp(stores, launchers, cluster, measure, claim):
    if len(cluster.nodes) < 2:
        pytest.skip(f"a replication pipeline needs two nodes, cluster {cluster.source} has {len(cluster.nodes)}")
    opts = _write_opts(cluster)
    targets = {t: FsTarget("blockstore", store=s.spec(replication=2, block_size=BLOCK)) for t, s in stores.items()}
    paired = measure.paired(
        ("blockstore,transport=tcp,replication=2", lambda: _throughput(opts, targets["tcp"], launchers, cluster)),
        ("blockstore,transport=shm,replication=2", lambda: _throughput(opts, targets["shm"], launchers, cluster)),
        rounds=ROUNDS, metric=METRIC)
    _record(measure, paired, {"nr_files": opts.nr_files, "size": SIZE, "block_size": BLOCK}, cluster.names)
    claim("dfsio.local.blockstore.shm_vs_tcp.write", paired)


def test_posix_fsync_close_vs_none(launchers, cluster, workdirs, measure, claim):
    """What fsync-on-close costs on this disk: the figure a POSIX-target result must be read with."""
    opts = _write_opts(cluster)
    none = FsTarget("posix", root="local", fsync="none", node_dirs=workdirs)
    close = FsTarget("posix", root="local", fsync="close", node_dirs=workdirs)
    paired = measure.paired(("posix,fsync=close", lambda: _throughput(opts, close, launchers, cluster)),
                            ("posix,fsync=none", lambda: _throughput(opts, none, launchers, cluster)),
                            rounds=ROUNDS, metric=METRIC)
    _record(measure, paired, {"nr_files": opts.nr_files, "size": SIZE}, cluster.names)
    claim("dfsio.local.posix.no_fsync_vs_fsync_close.write", paired)


# -- the native packet pipeline's design effects, in CPU time (see workloads/dfsio/pipeline_cost.py) ----
CPU_ROUNDS = 12
# the checksum gate's rounds, one per fresh process (see interleaved_checksum_cost): 12 over 6 processes
# caught 89% of 20% regressions in gate_quality's model of 8 runs on this box, short of 95%
CHECKSUM_ROUNDS = CHECKSUM_PROCESSES = 24
PIPELINE_MB, PIPELINE_PACKET, PIPELINE_BLOCK = 8, 8 * 1024, 4 << 20
# the stack-over-floor gate: 64 MiB a write (one block), 30 rounds (about 20 s); a round's ratio
# moves +-15% (page-cache state, the datanode's per-block threads), the median of 30 about +-4%
FLOOR_MB, FLOOR_ROUNDS, FLOOR_BLOCK = 64, 30, 128 << 20
# the read gate: one 64 MiB file (one block), each round a native and a Python reading process
READ_MB, READ_ROUNDS, READ_BEST_OF = 64, 16, 3
FAULTS_METRIC = "dfsio.read.client_faults_per_mb"


@pytest.fixture
def native_and_python_stores(launchers, cluster, workdirs):
    if not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    started = {}
    try:
        for impl in ("native", "python"):
            started[impl] = BlockStore(launchers, cluster, transport="tcp", impl=impl,
                                       dirs={name: path / f"dfs-{impl}" for name, path in workdirs.items()}).start()
        yield started
    finally:
        for store in started.values():
            store.stop()


def _checksum_gate(claim_id: str, baseline: tuple[str, str], measure, claim) -> None:
    """Native per-chunk CRC32C against ``baseline`` (kind, impl), the two taking turns pass by pass
    in this thread's CPU time (see ``interleaved_checksum_cost``); the claim judged, both recorded."""
    if not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    paired = interleaved_checksum_cost(baseline, ("crc32c", "native"), rounds=CHECKSUM_ROUNDS,
                                        processes=CHECKSUM_PROCESSES)
    try:
        claim(claim_id, paired)
    finally:
        measure.record(*(measurement(paired.metric, samples, unit="ns/KiB", direction="lower", config=name,
                                     nodes=("test-process",),
                                     params={"bpc": 512, "bytes": 256 << 10, "per_round": "min of 40 passes"})
                         for name, samples in ((paired.baseline_name, paired.baseline),
                                               (paired.candidate_name, paired.candidate))))


def test_checksum_cpu_native_crc32c_vs_instruction_floor(measure, claim):
    """What the native per-chunk CRC32C path (the datanode's: three chunks' chains side by side)
    spends per KiB against the CPU's bare ``crc32`` loop over the same chunks one after the other
    (``crc32c_instruction_floor``): its interleaving and its own overhead, which move little with
    the host because both are bound by the same instruction."""
    if not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    if not native.core.crc32c_instruction_floor_available():
        pytest.skip("the CRC32C instruction floor needs an x86-64 CPU with SSE4.2")
    _checksum_gate("dfsio.local.checksum.crc32c_native_vs_instruction_floor.cpu", ("crc32c", "floor"),
                   measure, claim)


def test_checksum_cpu_native_crc32c_vs_python_crc32(measure, claim):
    """What a datanode spends per KiB on its per-chunk checksums: CRC32C in the native core (SSE4.2)
    against the Python pipeline's CRC32 loop (zlib.crc32 per 512-byte chunk)."""
    _checksum_gate("dfsio.local.checksum.crc32c_native_vs_python_crc32.cpu", ("crc32", "python"), measure, claim)


def test_blockstore_pipeline_cpu_native_vs_python(native_and_python_stores, cluster, measure, claim):
    """CPU per MiB of a replication-2 write, client and datanodes together, with the per-packet work
    in the native core against the Python pipeline (8 KiB packets, so the per-packet work dominates)."""
    if len(cluster.nodes) < 2:
        pytest.skip(f"a replication pipeline needs two nodes, cluster {cluster.source} has {len(cluster.nodes)}")
    clients = {impl: store.client(block_size=PIPELINE_BLOCK, packet_size=PIPELINE_PACKET, impl=impl,
                                  node=cluster.names[0])
               for impl, store in native_and_python_stores.items()}
    metric = "dfsio.write.cpu_ms_per_mb"
    try:
        paired = measure.paired(
            ("blockstore,transport=tcp,replication=2,impl=python",
             lambda: pipeline_cpu_ms_per_mb(clients["python"], "/cpu/f", PIPELINE_MB, 2)),
            ("blockstore,transport=tcp,replication=2,impl=native",
             lambda: pipeline_cpu_ms_per_mb(clients["native"], "/cpu/f", PIPELINE_MB, 2)),
            rounds=CPU_ROUNDS, metric=metric)
    finally:
        for c in clients.values():
            c.close()
    measure.record(*(measurement(metric, samples, unit="ms/MiB", direction="lower", config=name,
                                 nodes=cluster.names, params={"size_mb": PIPELINE_MB, "packet": PIPELINE_PACKET})
                     for name, samples in ((paired.baseline_name, paired.baseline),
                                           (paired.candidate_name, paired.candidate))))
    claim("dfsio.local.blockstore.native_vs_python.cpu", paired)


def test_blockstore_cpu_native_r1_vs_floor(native_and_python_stores, cluster, workdirs, measure, claim):
    """CPU per MiB of a replication-1 write through the native pipeline (client and datanode, 64 KiB
    packets) against the native block-write floor (the same copies and checksum passes with no
    protocol) into the same node's directory: what the stack costs over its design. Both run on one
    CPU (``pipeline_on_one_core``), so what is measured is their work, not the wake-ups between CPUs."""
    node = cluster.names[0]
    client = native_and_python_stores["native"].client(block_size=FLOOR_BLOCK, impl="native", node=node)
    floor_dir = workdirs[node] / "dfs-floor"
    floor_dir.mkdir(parents=True, exist_ok=True)
    metric = "dfsio.write.cpu_ms_per_mb"
    try:
        with pipeline_on_one_core(client) as pinned:
            if not pinned:
                pytest.skip(f"the datanodes of cluster {cluster.source} are not all processes on this host "
                            "(or it cannot pin threads to a CPU): this gate needs both ends on one CPU")
            paired = measure.paired(
                ("blockstore,transport=tcp,replication=1,impl=floor",
                 lambda: floor_cpu_ms_per_mb(floor_dir, FLOOR_MB, PACKET_SIZE)),
                ("blockstore,transport=tcp,replication=1,impl=native",
                 lambda: pipeline_cpu_ms_per_mb(client, "/cpu/r1", FLOOR_MB, 1)),
                rounds=FLOOR_ROUNDS, metric=metric)
    finally:
        client.close()
    measure.record(*(measurement(metric, samples, unit="ms/MiB", direction="lower", config=name,
                                 nodes=[node], params={"size_mb": FLOOR_MB, "packet": PACKET_SIZE, "cpus": 1})
                     for name, samples in ((paired.baseline_name, paired.baseline),
                                           (paired.candidate_name, paired.candidate))))
    claim("dfsio.local.blockstore.native_r1_vs_floor.cpu", paired)


@pytest.fixture
def read_back(native_and_python_stores, cluster):
    """A client on the first node of the native store, and one file of READ_MB MiB (one block, its one
    replica on that node) for it to read back; the file goes after the test."""
    node, store = cluster.names[0], native_and_python_stores["native"]
    client = store.client(block_size=FLOOR_BLOCK, impl="native", node=node)
    try:
        with client.create("/cpu/read", replication=1) as out:
            out.write(os.urandom(READ_MB << 20))
        yield client, "/cpu/read"
    finally:
        client.close()
    with store.client() as fresh:      # the test may leave the client's metadata connection idle past
        fresh.delete("/cpu/read")      # the service's idle timeout


def _record_read(measure, paired, metric: str, node: str, unit: str = "ms/MiB", **params) -> None:
    measure.record(*(measurement(metric, samples, unit=unit, direction="lower", config=name, nodes=[node],
                                 params={"size_mb": READ_MB, "buffer": timed_read.BUFFER, "cpus": 1, **params})
                     for name, samples in ((paired.baseline_name, paired.baseline),
                                           (paired.candidate_name, paired.candidate))))


def _pinned_or_skip(pinned: bool, cluster) -> None:
    if not pinned:
        pytest.skip(f"the datanodes of cluster {cluster.source} are not all processes on this host "
                    "(or it cannot pin threads to a CPU): this gate needs both ends on one CPU")


def test_blockstore_read_cpu_native_vs_floor(read_back, cluster, workdirs, measure, claim):
    """CPU per MiB of reading one block back whole through the native path -- a sequential read that
    streams the block from one request, each reply received straight into the caller's buffer and
    verified in the core, from a native datanode that sends from the page cache with ``sendfile`` --
    against the native block-read floor (the same checksum reads, ``sendfile``, receive and verify,
    with no protocol) in the same node's directory: what the stack costs over its design. This
    process, the datanodes and the floor all run on one CPU; each side's sample is the cheaper of
    ``READ_BEST_OF`` reads, since a neighbour's time slice only ever adds to one."""
    client, path = read_back
    node = cluster.names[0]
    floor_dir = workdirs[node] / "dfs-read-floor"
    floor_dir.mkdir(parents=True, exist_ok=True)
    metric = "dfsio.read.cpu_ms_per_mb"
    buf = memoryview(bytearray(timed_read.BUFFER))

    def native_read() -> float:
        return read_cpu_ms_per_mb(client, path, buf, READ_MB)

    def floor() -> float:
        return read_floor_cpu_ms_per_mb(floor_dir, READ_MB, 1 << 20)

    with pipeline_on_one_core(client) as pinned:
        _pinned_or_skip(pinned, cluster)
        paired = measure.paired(
            ("blockstore,transport=tcp,read,impl=floor", lambda: min(floor() for _ in range(READ_BEST_OF))),
            ("blockstore,transport=tcp,read,impl=native", lambda: min(native_read() for _ in range(READ_BEST_OF))),
            rounds=READ_ROUNDS, metric=metric)
    _record_read(measure, paired, metric, node, packet=1 << 20)
    claim("dfsio.local.blockstore.read_native_vs_floor.cpu", paired)


def test_blockstore_read_client_cpu_native_vs_python(read_back, cluster, measure, claim):
    """Client CPU and minor page faults per MiB of the same read by the native client against the
    Python one, which takes each 1 MiB packet through a buffer of its own: the design effect of
    receiving in place. A fresh process pays for a fresh buffer in page faults, the pages it touches
    for the first time; the faults are counted in the same processes, and being counts, they hold on
    any host. Both read from a native datanode, in fresh processes, on one CPU with the datanodes."""
    client, path = read_back
    metric = "dfsio.read.client_cpu_ms_per_mb"
    faults: dict[str, list[float]] = {"python": [], "native": []}

    def client_cpu(impl: str) -> float:
        got, _, cpu, faulted = timed_read.in_child(client.meta_address, "tcp", path, impl, node=client.node)
        assert got == READ_MB << 20
        faults[impl].append(faulted / READ_MB)
        return cpu * 1000 / READ_MB

    with pipeline_on_one_core(client) as pinned:
        _pinned_or_skip(pinned, cluster)
        paired = measure.paired(("blockstore,transport=tcp,read,impl=python", lambda: client_cpu("python")),
                                ("blockstore,transport=tcp,read,impl=native", lambda: client_cpu("native")),
                                rounds=READ_ROUNDS, metric=metric)
    counted = Paired(paired.baseline_name, paired.candidate_name, list(faults["python"]), list(faults["native"]),
                     metric=FAULTS_METRIC)
    _record_read(measure, paired, metric, cluster.names[0])
    _record_read(measure, counted, FAULTS_METRIC, cluster.names[0], unit="faults/MiB")
    claim("dfsio.local.blockstore.read_native_vs_python.client_faults", counted)
    claim("dfsio.local.blockstore.read_native_vs_python.client_cpu", paired)


@pytest.mark.edr
@pytest.mark.power8
def test_seed001_testdfsio_rdma_vs_ipoib(launchers, cluster, workdirs, measure, claim, fabric_ceiling):
    """Seed 001: TestDFSIO throughput 2.18x-2.26x with RDMA-IB vs IPoIB (100 Gbps), 5 datanodes,
    60 maps, 256 MB blocks. Runs the block store over tcp on the IPoIB network against verbs, by default
    at the paper's shape; the environment can scale it (``HPCNET_DFSIO_PAPER_FILES`` = 60,
    ``HPCNET_DFSIO_PAPER_SIZE_MB`` = 1024 per file, ``HPCNET_DFSIO_PAPER_BLOCK_MB`` = 256)."""
    if "verbs" not in TRANSPORTS:
        pytest.skip(f"the verbs transport cannot run here ({verbs.unavailable_reason()}); this claim needs it "
                    "as the candidate")
    files, size_mb = env_int("HPCNET_DFSIO_PAPER_FILES", 60), env_int("HPCNET_DFSIO_PAPER_SIZE_MB", 1024)
    block = env_int("HPCNET_DFSIO_PAPER_BLOCK_MB", 256) << 20
    opts = parse_dfsio_args(["-write", "-nrFiles", str(files), "-size", f"{size_mb}MB"])
    stores = {}
    try:
        for transport in ("tcp", "verbs"):
            stores[transport] = BlockStore(launchers, cluster, transport=transport, network="ib",
                                           dirs={n: p / f"dfs-{transport}" for n, p in workdirs.items()}).start()
        targets = {t: FsTarget("blockstore", store=s.spec(replication=3, block_size=block))
                   for t, s in stores.items()}
        paired = measure.paired(
            ("transport=tcp,net=ib", lambda: _throughput(opts, targets["tcp"], launchers, cluster)),
            ("transport=verbs", lambda: _throughput(opts, targets["verbs"], launchers, cluster)), rounds=3,
            metric=METRIC)
    finally:
        for store in stores.values():
            store.stop()
    _record(measure, paired, {"nr_files": files, "size": f"{size_mb}MB", "block_size": block}, cluster.names)
    fabric_ceiling("dfsio.seed001.throughput.rdma_vs_ipoib")   # ib_write_bw vs qperf tcp_bw, same nodes
    claim("dfsio.seed001.throughput.rdma_vs_ipoib", paired)
