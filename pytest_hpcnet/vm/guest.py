"""What the Soft-RoCE guest is: its packages, kernel modules, boot script, and the results channel.

Everything here is pure (no subprocesses) so the host test suite can check it without qemu.

The guest has no disk and no network card: the root filesystem is the initramfs, and the only way out
is the serial console. The boot script (``/init``, PID 1) loads the RDMA modules, binds Soft-RoCE
(``rdma_rxe``) to a dummy netdev with ``GUEST_ADDRESS`` (rdma_cm cannot use 127.0.0.1: loopback has no
RDMA device), runs the command it was given, and prints the results directory as a base64 tar between
two marker lines, then its exit status, then powers off. The host cuts that block out of the log.
"""

from __future__ import annotations

import base64
import io
import re
import shlex
import tarfile
from pathlib import Path

from ..errors import HpcnetError
from ..timeouts import ENV as TIMEOUT_ENV

SUITE = "bookworm"
# perftest and qperf: the fabric's own ceiling beside each rehearsed RDMA claim (ib_send_lat/ib_write_bw
# on rxe0 against qperf's tcp_lat/tcp_bw over the same netdev's address)
PACKAGES = ("python3", "python3-pyverbs", "rdma-core", "ibverbs-providers", "perftest", "qperf", "iproute2",
            "kmod")
# Python packages the project needs at run time in the guest (Debian bookworm's pytest/numpy/protobuf
# are older than pyproject.toml's minimums, so these come from PyPI as cp311 wheels, the guest's Python).
PYTHON_REQUIREMENTS = ("pytest>=8", "pytest-timeout>=2.3", "numpy>=1.26", "scipy>=1.11", "tabulate>=0.9",
                       "protobuf>=4.25")
# Kernel modules (relative to lib/modules/<ver>/kernel) the guest needs; dependencies among them are
# resolved by depmod/modprobe in the guest. rxe fails with "failed to init crc32 algorithm" unless a
# crc32 implementation is loaded first.
MODULE_PATHS = ("drivers/infiniband", "drivers/net/dummy.ko", "drivers/net/veth.ko",
                "net/ipv4/udp_tunnel.ko", "net/ipv6/ip6_udp_tunnel.ko", "fs/configfs",
                "crypto/crc32_generic.ko", "crypto/crc32c_generic.ko", "arch/x86/crypto/crc32-pclmul.ko",
                "arch/x86/crypto/crc32c-intel.ko", "lib/libcrc32c.ko")
MODULES_TO_LOAD = ("crc32_generic", "crc32-pclmul", "configfs", "dummy", "ib_uverbs", "rdma_ucm", "rdma_rxe")
NETDEV = "dummy0"
GUEST_ADDRESS = "10.0.0.1"
RDMA_DEVICE = "rxe0"
# Every budget of the code and suites written ``scaled(seconds)`` (``pytest_hpcnet.timeouts``) is this many
# times longer in the guest: under TCG one rdma_cm connection costs 0.2-1.5 s where hardware takes a
# millisecond, and up to ~11 s was measured with the host's cores busy. Exported by /init, so the
# servers, workers and tools the tests start inherit it.
TIMEOUT_SCALE = 4

BEGIN, END = "HPCNET-RESULTS-BEGIN", "HPCNET-RESULTS-END"
EXIT_RE = re.compile(r"^HPCNET-EXIT (\d+)\s*$", re.M)
READY = "HPCNET-READY"


class VmError(HpcnetError):
    """The guest could not be built, booted, or did not report back."""


def init_script(command: str, workdir: str = "/opt/hpcnet", results: str = "/results") -> str:
    """The guest's ``/init``: set up Soft-RoCE, run ``command`` in ``workdir``, report ``results``.

    A failing setup step still reaches the report (the command then fails and says why), so the host
    always gets an exit status instead of waiting for its timeout.
    """
    modules = " ".join(MODULES_TO_LOAD)
    return f"""#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
export {TIMEOUT_ENV}={TIMEOUT_SCALE}
mount -t proc proc /proc; echo "hpcnet-init: started at $(cut -d' ' -f1 /proc/uptime) s"; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /tmp {results}; mount -t devpts devpts /dev/pts; mount -t tmpfs shm /dev/shm
mount -t tmpfs tmp /tmp; mount -t configfs configfs /sys/kernel/config 2>/dev/null
ip link set lo up
for m in {modules}; do modprobe $m || echo "hpcnet-init: modprobe $m failed"; done
[ -e /sys/class/net/{NETDEV} ] || ip link add {NETDEV} type dummy   # the dummy module may have made it
ip addr add {GUEST_ADDRESS}/24 dev {NETDEV}; ip link set {NETDEV} up
rdma link add {RDMA_DEVICE} type rxe netdev {NETDEV} || echo "hpcnet-init: rdma link add failed"
rdma link show
echo "{READY} at $(cut -d' ' -f1 /proc/uptime) s"
cd {workdir}
: > {results}/output.txt; tail -f {results}/output.txt > /dev/console 2>&1 &   # progress, live on the serial log
tailer=$!
sh -c {shlex.quote(command)} > {results}/output.txt 2>&1
rc=$?
sleep 1; kill $tailer
tail -n 60 {results}/output.txt
echo {BEGIN}
tar -C {results} -czf - . | base64 -w 76
echo {END}
echo "HPCNET-EXIT $rc"
sync
echo o > /proc/sysrq-trigger
sleep 5
"""


def encode_results(directory: Path) -> str:
    """The block the guest prints for ``directory`` (what ``tar -czf - . | base64`` produces)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(directory, arcname=".")
    text = base64.encodebytes(buf.getvalue()).decode()
    return f"{BEGIN}\n{text}{END}\n"


def decode_results(log: str, into: Path) -> int:
    """Unpack the results block from a guest's serial ``log`` into ``into``; return the exit status.

    Raises VmError naming what is missing when the guest did not finish its report (it crashed, hung
    or was killed), with the end of the log so the reason is visible.
    """
    log = log.replace("\r\n", "\n")
    start, end = log.rfind(BEGIN + "\n"), log.rfind("\n" + END)
    status = EXIT_RE.findall(log)
    if start < 0 or end < start or not status:
        tail = "\n".join(log.splitlines()[-25:])
        raise VmError(f"the guest did not report its results (no complete {BEGIN}/{END} block and "
                      f"exit status in the serial log); log tail:\n{tail}")
    payload = "".join(log[start + len(BEGIN) + 1:end].split())
    try:
        data = base64.b64decode(payload, validate=True)
        into.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(into, filter="data")
    except (ValueError, tarfile.TarError, EOFError, OSError) as e:
        raise VmError(f"the guest's results block is corrupt: {e}") from None
    return int(status[-1])


def guest_pytest_command(args: list[str], results: str = "/results", junit: str = "junit.xml",
                         report: str = "report", env: dict | None = None, cache: str | None = None) -> str:
    """The shell command that runs pytest in the guest with junit XML and the run record in ``results``
    (pytest's cache only where ``cache`` names its directory: a rerun of the failed tests reads it)."""
    quoted = " ".join(shlex.quote(a) for a in args)
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted((env or {}).items()))
    cache_args = f"-o cache_dir={shlex.quote(cache)}" if cache else "-p no:cacheprovider"
    return (f"{prefix}python3 -m pytest {cache_args} --junitxml={results}/{junit} "
            f"--hpcnet-report={results}/{report} {quoted}")


RERUN_JUNIT = "junit-rerun.xml"
_RERUN_CACHE = "/tmp/pytest-cache"


def rerun_failed_command(args: list[str], results: str = "/results") -> str:
    """pytest once, then -- only if tests failed (exit status 1) -- the failed ones once more, with
    their own junit XML (``RERUN_JUNIT``); the status is the second run's. Under emulation a timing
    budget is sometimes missed once; the host still sees every first failure (junit.xml) and reports
    it as flaky, while a test that fails twice fails the guest run."""
    first = guest_pytest_command(args, results, cache=_RERUN_CACHE)
    again = guest_pytest_command(["--last-failed", "--last-failed-no-failures", "none", *args], results,
                                 junit=RERUN_JUNIT, report="report-rerun", cache=_RERUN_CACHE)
    return f"{first}; first=$?; if [ $first -eq 1 ]; then {again}; first=$?; fi; (exit $first)"


def all_of(commands: list[str]) -> str:
    """Run every command (a failing one does not stop the rest); exit with the first non-zero status."""
    parts = [f"{c}; s=$?; [ $rc -eq 0 ] && rc=$s" for c in commands]
    return "rc=0; " + "; ".join(parts) + "; exit $rc"


# The paper claims as written, on the guest's rxe device: their hardware assumed (``ib`` is the rxe
# netdev, see fixtures/clusters/softroce.toml) and their verdicts reported, not enforced -- under
# emulation Soft-RoCE is no QDR/EDR fabric, so they fail. What this shows is that the claims' verbs
# configurations run end to end: RPC (latency), the MapReduce shuffle (seed 000 TeraSort against
# IPoIB, local disks and Lustre-only) and the block store's pipeline (seed 001 TestDFSIO), at sizes
# that keep it to about 8 minutes alone on a 2-core host (one boot: RPC 108 s, TeraSort 190 s,
# TestDFSIO 147 s). An emulated RPC takes 3-10 ms, so the latency sweep makes 30 calls per size and
# round (100 took 168 s against 108 s); smaller DFSIO files saved nothing (fixed costs dominate). No
# comparison grows past 3 rounds (--hpcnet-max-rounds): a verdict that is only reported gains nothing
# from the rounds that settle a straddling CI, and they tripled the seed 000 TeraSort whose CI straddled
# (6 paired rounds, 144 s, against 50 s for its twin's 2).
REHEARSAL_ARGS = ["suites/rpc/test_paper_claims.py", "suites/mapreduce/test_paper_claims.py",
                  "suites/dfsio/test_performance.py",
                  "-k", "latency or (seed000 and terasort and rdma_vs_ipoib) or seed001_testdfsio",
                  "--hpcnet-cluster", "fixtures/clusters/softroce.toml",
                  "--hpcnet-assume", "ib_qdr,lustre,edr,power8",
                  "--hpcnet-verdicts", "report", "--hpcnet-rounds", "3", "--hpcnet-max-rounds", "3"]
REHEARSAL_ENV = {"HPCNET_MAPREDUCE_PAPER_ROWS": "20000", "HPCNET_MAPREDUCE_PAPER_ROUNDS": "2",
                 "HPCNET_RPC_PAPER_ITERATIONS": "30",
                 "HPCNET_DFSIO_PAPER_FILES": "3", "HPCNET_DFSIO_PAPER_SIZE_MB": "4", "HPCNET_DFSIO_PAPER_BLOCK_MB": "1"}
REHEARSED_CLAIMS = {"rpc.seed003.latency.rdma_vs_10gige", "rpc.seed003.latency.rdma_vs_ipoib",
                    "mapreduce.seed000.local_disks.terasort.rdma_vs_ipoib",
                    "mapreduce.seed000.lustre_only.terasort.rdma_vs_ipoib",
                    "dfsio.seed001.throughput.rdma_vs_ipoib"}


def rehearsal_command(results: str = "/results") -> str:
    return guest_pytest_command(REHEARSAL_ARGS, results, junit="rehearsal.xml", report="rehearsal",
                                env=REHEARSAL_ENV)
