"""The protocol between the controller and the programs it starts on nodes (``python -m ...`` servers,
clients and probes), in one place.

Node side:

- ``announce(event, ...)`` prints one *announcement* on stdout and flushes it at once (a program whose
  stdout is a pipe or a file is block-buffered: without the flush the controller, or a shell pipeline,
  would see the line only when the program exits).
- ``serve_until_signalled(stop, ready=...)`` installs handlers for SIGTERM and SIGINT, calls
  ``ready()`` (the announcement), blocks until one of them arrives, then calls ``stop()``: a clean
  shutdown, exit status 0.
- ``node_main(parser, run, label)`` is the shared ``main``: parse the arguments, start the watchdog
  (``reaper``: the program ends when the controller that started it is gone), run, and turn a library
  error (``HpcnetError``) or an unusable path (``OSError``) into one line on stderr and exit status 2.

Controller side:

- ``await_ready(proc, event)`` waits for a process's announcement and returns it parsed
  (``Announcement``); a process that exits first, or stays silent past the time-out, is a
  ``LaunchError`` carrying the end of its stderr.

An announcement is one line::

    EVENT [on TRANSPORT HOST:PORT] [(KEY=VALUE, KEY=VALUE, ...)]

e.g. ``listening on tcp 10.199.0.2:40123 (buffers=pooled, impl=native)``, ``ready``, ``sending``. Events
and keys are words; a host may be an IPv6 address (``[::1]:4242``); values are free of ``,``, ``(`` and ``)``.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, TypeVar

from ..errors import HpcnetError, LaunchError
from ..timeouts import scaled

LISTENING = "listening"
T = TypeVar("T")
_WORD = re.compile(r"^[A-Za-z][\w.-]*$")
_LINE = re.compile(r"^(?P<event>[A-Za-z][\w.-]*)"
                   r"(?: on (?P<transport>[\w.-]+) (?P<host>\[[^\]]*\]|[^\s\[\]:]+):(?P<port>\d+))?"
                   r"(?: \((?P<details>[^()]*)\))?$")


@dataclass(frozen=True)
class Announcement:
    event: str
    transport: str | None = None
    host: str | None = None
    port: int | None = None
    details: Mapping[str, str] = field(default_factory=dict)

    @property
    def address(self) -> tuple[str, int]:
        if self.host is None or self.port is None:
            raise LaunchError(f"announcement {self.event!r} carries no address")
        return self.host, self.port

    def __str__(self) -> str:
        return format_announcement(self.event, transport=self.transport,
                                   address=None if self.host is None else self.address, **self.details)


def format_announcement(event: str, *, transport: str | None = None, address: tuple[str, int] | None = None,
                        **details) -> str:
    if not _WORD.match(event):
        raise ValueError(f"an announcement's event is a word, got {event!r}")
    line = event
    if address is not None:
        host, port = address[0], int(address[1])
        line += f" on {transport or 'tcp'} {f'[{host}]' if ':' in host else host}:{port}"
    if details:
        for key, value in details.items():
            if not _WORD.match(key) or re.search(r"[,()\n]", str(value)):
                raise ValueError(f"announcement detail {key}={value!r}: keys are words, values lack , ( ) and newlines")
        line += " (" + ", ".join(f"{k}={v}" for k, v in details.items()) + ")"
    return line


def parse_announcement(line: str) -> Announcement | None:
    """The announcement on ``line``, or None if the line is something else (a program's other output)."""
    m = _LINE.match(line.strip())
    if not m:
        return None
    details = {}
    if m["details"]:
        for item in m["details"].split(", "):
            key, sep, value = item.partition("=")
            if not sep or not _WORD.match(key):
                return None
            details[key] = value
    host = m["host"]
    return Announcement(m["event"], m["transport"], host.strip("[]") if host else None,
                        int(m["port"]) if m["port"] else None, details)


def announce(event: str, *, transport: str | None = None, address: tuple[str, int] | None = None,
             **details) -> None:
    """Print one announcement and flush it now (see the module's docstring for the line's shape)."""
    print(format_announcement(event, transport=transport, address=address, **details), flush=True)


def serve_until_signalled(stop: Callable[[], None] | None = None, *, ready: Callable[[], None] | None = None,
                          poll: float = 0.5) -> None:
    """Block the main thread until SIGTERM or SIGINT, then ``stop()`` (close listeners, join workers).
    ``ready()`` (typically the ``announce``) runs once the handlers are in place, so a controller that
    signals right after reading the announcement gets the clean shutdown, not the default death.
    The work itself runs in other threads; signal handlers run in the main thread, which only waits."""
    stopped = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopped.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if ready is not None:
            ready()
        while not stopped.wait(poll):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if stop is not None:
            stop()


def run_guarded(call: Callable[[], int | None], label: str) -> int:
    """Run ``call``; a library error or an unusable path is one line on stderr and exit status 2."""
    try:
        return int(call() or 0)
    except HpcnetError as e:
        print(f"{label}: {e}", file=sys.stderr, flush=True)
        return 2
    except OSError as e:   # a path the user named cannot be read or written: say which, in one line
        where = f"{e.filename}: " if e.filename else ""
        print(f"{label}: {where}{e.strerror or e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130


def node_main(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int | None],
              argv=None, *, label: str | None = None, watchdog: bool = True) -> int:
    """The ``main`` of a node program: parse ``argv``, start the watchdog, ``run(args)`` guarded."""
    args = parser.parse_args(argv)
    if watchdog:
        from .reaper import start_watchdog
        start_watchdog()   # exits when the controller that started it is gone (see cluster.reaper)
    return run_guarded(lambda: run(args), label or parser.prog)


# -- controller side --------------------------------------------------------------------------------
def _find(text: str, event: str) -> Announcement | None:
    for line in text.splitlines():
        found = parse_announcement(line)
        if found is not None and found.event == event:
            return found
    return None


def _describe(proc) -> str:
    argv = " ".join(map(str, getattr(proc, "argv", None) or getattr(proc, "args", None) or ["?"]))
    node = getattr(getattr(proc, "node", None), "name", None)
    return f"{argv} on {node}" if node else argv


def await_ready(proc, event: str = LISTENING, timeout: float = 30.0) -> Announcement:
    """Wait until ``proc`` announces ``event``; return the announcement.

    ``proc`` is a launcher's process (``output()`` so far) or a ``subprocess.Popen`` with a text stdout
    pipe (read line by line; what follows the announcement stays in the pipe). ``timeout`` is a real
    machine's budget for a start-up, scaled like every such budget (``pytest_hpcnet.timeouts``)."""
    timeout = scaled(timeout)
    if isinstance(proc, subprocess.Popen):
        return _await_pipe(proc, event, timeout)
    return poll_output(proc, lambda out: _find(out, event), f"announce {event!r}", timeout)


def poll_output(proc, find: Callable[[str], T | None], what: str, timeout: float) -> T:
    """Poll a launcher process's stdout until ``find(stdout so far)`` returns something, and return it.
    A process that exits first, or ``timeout`` seconds (already scaled) without it, is a LaunchError
    naming ``what`` was awaited (the process is killed at the time-out)."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        out, err = proc.output()
        found = find(out)
        if found is not None:
            return found
        code = proc.poll()
        if code is not None:
            found = find(proc.output()[0])   # printed just before it exited
            if found is not None:
                return found
            raise LaunchError(f"{_describe(proc)} exited with {code} before it would {what}; "
                              f"stderr: {err.strip()[-800:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise LaunchError(f"{_describe(proc)} did not {what} within {timeout:g}s; "
                              f"stderr: {err.strip()[-800:]}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _await_pipe(proc: subprocess.Popen, event: str, timeout: float) -> Announcement:
    # One line at a time, each read in a helper thread the deadline can give up on (a select() on the
    # pipe would miss lines the text wrapper has buffered already); killing the process ends the read.
    deadline = time.monotonic() + timeout
    while True:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()))
        if not box:
            proc.kill()
            reader.join(5)
            raise LaunchError(f"{_describe(proc)} did not announce {event!r} within {timeout:g}s")
        line = box[0]
        if not line:
            code = proc.wait()
            err = proc.stderr.read() if proc.stderr is not None else ""
            raise LaunchError(f"{_describe(proc)} exited with {code} before it would announce {event!r}; "
                              f"stderr: {(err or '').strip()[-800:]}")
        found = parse_announcement(line)
        if found is not None and found.event == event:
            return found
