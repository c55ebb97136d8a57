"""Nothing outlives its controller: a reaper process per controller, and a watchdog in every server.

The *controller* is the process that starts things on a cluster (pytest, an xdist worker, the CLI).
Every process a local or netns launcher starts carries ``HPCNET_RUN=<token>`` (unique per controller)
and ``HPCNET_CONTROLLER=<boot id>:<pid>:<start time>`` in its environment, and so does everything it
forks.

- The **reaper** (``ensure_started()``) is a small process in its own session that holds the read end
  of a pipe whose write end only the controller has. When the controller exits -- normally, by an
  exception, by SIGTERM or by SIGKILL -- the kernel closes that end, the reaper reads EOF, kills every
  process on this host whose environment carries the token (SIGTERM, then SIGKILL after a grace
  period), deletes the network namespaces the controller registered (``watch_namespace``) and exits.
  It first runs the shell commands the controller registered (``watch_command``: ``scancel`` of Slurm
  steps and allocations). On a normal exit the controller has already stopped everything and the reaper
  finds nothing to do.
- The **watchdog** (``start_watchdog()``), called by long-running servers (engine workers, DFS metadata
  service and datanodes, RPC servers), checks once a second that the controller named in
  ``HPCNET_CONTROLLER`` still exists (same pid *and* start time, so a reused pid does not count) and
  otherwise ends its own process group. It only acts when the controller runs on the same kernel
  (same boot id); a server on another machine relies on its control connection instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

RUN_ENV = "HPCNET_RUN"
CONTROLLER_ENV = "HPCNET_CONTROLLER"
GRACE = 2.0            # seconds between SIGTERM and SIGKILL
WATCH_INTERVAL = 1.0   # how often a watchdog checks its controller

_state: dict = {}      # pid of the controller -> (token, reaper Popen, pipe write fd)
_lock = threading.Lock()


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def controller_id(pid: int | None = None) -> str:
    pid = pid or os.getpid()
    return f"{boot_id()}:{pid}:{start_time(pid)}"


def run_env() -> dict[str, str]:
    """What a launcher adds to a started process's environment (starts the reaper on first use)."""
    token = ensure_started()
    return {RUN_ENV: token, CONTROLLER_ENV: controller_id()}


def ensure_started() -> str:
    """Start this controller's reaper if it is not running; return the run token."""
    with _lock:
        pid = os.getpid()
        state = _state.get(pid)
        if state is not None:
            return state[0]
        _state.clear()                       # a forked child is a new controller with its own reaper
        token = f"{pid}-{uuid.uuid4().hex[:12]}"
        read_fd, write_fd = os.pipe()        # non-inheritable by default: only the reaper gets read_fd
        env = {k: v for k, v in os.environ.items() if k not in (RUN_ENV, CONTROLLER_ENV)}
        proc = subprocess.Popen([sys.executable, "-m", __name__, token], stdin=read_fd,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, env=env, close_fds=True)
        os.close(read_fd)
        _state[pid] = (token, proc, write_fd)
        return token


def _send(line: str) -> None:
    ensure_started()
    state = _state.get(os.getpid())
    try:
        os.write(state[2], (line + "\n").encode())
    except OSError:
        pass


def watch_namespace(name: str) -> None:
    """The reaper deletes ``name`` if this controller dies before ``forget_namespace(name)``."""
    _send(f"ns {name}")


def forget_namespace(name: str) -> None:
    if os.getpid() in _state:
        _send(f"done {name}")


def watch_link(name: str) -> None:
    """The reaper deletes the root-namespace link ``name`` first (a veth pair goes at once, where a
    deleted namespace's devices go only when the kernel gets round to it)."""
    _send(f"link {name}")


def watch_command(line: str) -> None:
    """The reaper runs the shell command ``line`` (one line) if this controller dies before
    ``forget_command(line)``: e.g. ``scancel`` of a Slurm allocation or of the run's job steps, which
    live under slurmd, on other machines, where killing local processes does not reach."""
    _send(f"cmd {line}")


def forget_command(line: str) -> None:
    if os.getpid() in _state:
        _send(f"done {line}")


def processes_of(token: str) -> list[int]:
    """Pids on this host whose environment carries ``HPCNET_RUN=token``."""
    needle = f"{RUN_ENV}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def processes_of_controller(pid: int) -> list[int]:
    """Pids on this host started (directly or not) by the controller with this pid, by their
    ``HPCNET_CONTROLLER`` (what tests use to check that nothing of a killed run is left)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(CONTROLLER_ENV.encode() + b"=") and item.split(b":")[1:2] == [str(pid).encode()]:
                found.append(int(entry.name))
                break
    return found


def kill_run(token: str, grace: float = GRACE) -> None:
    """SIGTERM every process of the run, SIGKILL what is left after ``grace`` seconds."""
    pids = processes_of(token)
    for pid in pids:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = processes_of(token)
    for _ in range(3):
        pids = processes_of(token)
        if not pids:
            return
        for pid in pids:
            _kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def delete_link(name: str) -> None:
    try:
        subprocess.run(["ip", "link", "delete", name], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _delete_namespace(name: str) -> None:
    try:
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                              timeout=10).stdout.split()
        for pid in pids:
            _kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass


def reap(token: str, stream) -> None:
    """The reaper's body: read registrations until EOF (the controller is gone), then clean up."""
    namespaces: list[str] = []
    links: list[str] = []
    commands: list[str] = []
    for raw in stream:
        kind, _, name = raw.decode(errors="replace").strip().partition(" ")
        if kind in ("ns", "link", "cmd") and name not in namespaces + links + commands:
            {"ns": namespaces, "link": links, "cmd": commands}[kind].append(name)
        elif kind == "done":
            for known in (namespaces, links, commands):
                if name in known:
                    known.remove(name)
    for line in commands:     # first: a Slurm step's tasks are not this host's processes
        try:
            subprocess.run(["sh", "-c", line], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
    kill_run(token)
    for name in links:
        delete_link(name)
    for name in reversed(namespaces):
        _delete_namespace(name)


def start_watchdog(interval: float = WATCH_INTERVAL) -> bool:
    """In a server: end this process group once the controller is gone. False if there is nothing to
    watch (no controller in the environment, or it runs on another machine)."""
    value = os.environ.get(CONTROLLER_ENV, "")
    parts = value.split(":")
    if len(parts) != 3 or parts[0] != boot_id() or not parts[1].isdigit():
        return False
    pid, started = int(parts[1]), parts[2]

    def watch():
        while True:
            time.sleep(interval)
            if start_time(pid) != started:
                _suicide()
    threading.Thread(target=watch, name="hpcnet-watchdog", daemon=True).start()
    return True


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so the same teardown runs (pytest reports "interrupted")."""


def interrupt_on_signals(signals=(signal.SIGTERM, signal.SIGHUP)):
    """In the controller's main thread: turn ``signals`` into ``Terminated`` (a KeyboardInterrupt), so
    fixtures, launchers and namespaces are torn down as on Ctrl-C. Returns a function that restores the
    previous handlers. Outside the main thread it does nothing (the reaper still cleans up)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise Terminated(f"received {signal.Signals(signum).name}")
    previous = {sig: signal.signal(sig, handler) for sig in signals}

    def restore():
        for sig, old in previous.items():
            signal.signal(sig, old)
    return restore


def _suicide() -> None:
    try:
        if os.getpgrp() == os.getpid():           # a group leader (launchers start one): take the group
            os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(3)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    for sig in (signal.SIGINT, signal.SIGHUP):   # a terminal's Ctrl-C or hangup is for the controller
        signal.signal(sig, signal.SIG_IGN)
    reap(argv[0], sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
