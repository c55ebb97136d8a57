"""Boot the guest under QEMU and collect what it reports on its serial console.

TCG, not KVM: on nested paravirtual KVM (``kvm_pvm``) a stock Debian kernel hangs, and TCG behaves
the same on every CI box. The guest has no NIC (``-nic none``) and no disk; it powers off itself, and
the host kills QEMU (it started it, by pid) when the timeout passes, so a hung guest never hangs the
caller.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import build, guest
from .guest import VmError

DEFAULT_MEMORY_MB = 2048
# Everything TCG emulates except AVX2: QEMU 7.2's (Debian 12's) TCG AVX2 was new and gets numpy 2's
# AVX2 argsort wrong (unsorted uint64 argsort results, then segfaults), which broke TeraSort's map
# sort in the guest on every transport. Without AVX2 numpy dispatches to its SSE4/scalar loops.
CPU_MODEL = "max,avx2=off"
# The kernel's command line. tsc=reliable: under TCG the kernel's watchdog rejects the TSC and falls
# back to the HPET, whose every read is an emulated device access (2026-12-02, one boot each: a
# time.perf_counter_ns() from Python 1.37 us on the HPET, 0.65 us on the TSC), and the native verbs
# RPC, which reads the clock in its busy-polls, paid about 8 us per round trip for it (64 B echo
# 68-70 -> 60-63 us). TCG's TSC is the host's, the same on every vCPU; perftest's ib_send_lat reads it
# directly either way.
KERNEL_ARGS = "console=ttyS0 panic=-1 rdinit=/init quiet loglevel=3 tsc=reliable clocksource=tsc"


@dataclass
class GuestRun:
    exit_status: int
    results: Path          # junit.xml, output.txt, report/ as the guest wrote them
    log: Path              # the whole serial log
    boot_seconds: float    # QEMU start until the guest's init printed READY
    total_seconds: float


def qemu_command(kernel: Path, initrd: Path, log: Path, memory_mb: int = DEFAULT_MEMORY_MB,
                 cpus: int = 2) -> list[str]:
    return ["qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", CPU_MODEL, "-m", str(memory_mb),
            "-smp", str(cpus), "-kernel", str(kernel), "-initrd", str(initrd),
            "-append", KERNEL_ARGS,
            "-nic", "none", "-display", "none", "-no-reboot", "-monitor", "none", "-serial", f"file:{log}"]


def run(command: str, results: Path, timeout: float = 900, cache: Path | None = None, log=print,
        memory_mb: int | None = None, source: Path | None = None) -> GuestRun:
    """Build (cached) and boot the guest, run the shell ``command`` in /opt/hpcnet, and unpack what
    it left in /results into ``results``; ``source`` is the project tree to copy in (default: the one
    this package is in). Raises VmError if the guest does not report back."""
    g = build.build(cache, log=log)
    memory_mb = memory_mb or int(os.environ.get("HPCNET_VM_MEMORY_MB", DEFAULT_MEMORY_MB))
    results.mkdir(parents=True, exist_ok=True)
    serial = results.parent / (results.name + ".serial.log")
    with tempfile.TemporaryDirectory(prefix="hpcnet-vm-") as tmp:
        work = Path(tmp)
        overlay = build.make_overlay(work, guest.init_script(command), source)
        initrd = work / "initrd.img"
        with open(initrd, "wb") as out:   # overlay first, then the compressed base
            for part in (overlay, g.base):
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        serial.unlink(missing_ok=True)
        cmd = qemu_command(g.kernel, initrd, serial, memory_mb)
        log("booting the guest: " + " ".join(cmd))
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        boot_seconds = _wait(proc, serial, start, timeout)
        total = time.monotonic() - start
        qemu_out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    text = serial.read_text(errors="replace") if serial.exists() else ""
    if proc.returncode not in (0, None) and guest.BEGIN not in text:
        raise VmError(f"qemu exited with status {proc.returncode}: {qemu_out.strip()[-800:]}")
    status = guest.decode_results(text, results)
    return GuestRun(status, results, serial, boot_seconds, total)


def _wait(proc: subprocess.Popen, serial: Path, start: float, timeout: float) -> float:
    """Wait for QEMU to exit; return seconds until READY appeared (nan if never). Kill it at timeout."""
    ready = float("nan")
    deadline = start + timeout
    try:
        while proc.poll() is None:
            if ready != ready and serial.exists() and guest.READY in serial.read_text(errors="replace"):
                ready = time.monotonic() - start
            if time.monotonic() > deadline:
                tail = "\n".join(serial.read_text(errors="replace").splitlines()[-40:]) if serial.exists() else ""
                raise VmError(f"the guest did not finish within {timeout:.0f} s; serial log: {serial}; "
                              f"its tail (the guest's output as it ran):\n{tail}")
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)   # our own session: QEMU and nothing else
            proc.wait()
    if ready != ready and serial.exists() and guest.READY in serial.read_text(errors="replace"):
        ready = time.monotonic() - start
    return ready
