"""CLI: ``hpcnet qjump run`` and ``hpcnet qjump-config`` (``hpcnet plot cdf`` is the report's).

    hpcnet qjump run -p 7 -- python3 app.py ...     # like qjau.py -p 7 -c CMD (Python programs only)
    hpcnet qjump-config --bytesq 256 --timeq 5 --p0rate 100 [--link-rate 200mbit] [--dev eth0] [--apply NS]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from ...cluster import shaping as levels
from ...cluster.shaping import LEVELS, QJumpParams
from ...errors import ConfigError, LaunchError

HOOK_DIR = Path(__file__).with_name("hook")


def add_commands(subparsers) -> None:
    q = subparsers.add_parser("qjump", help="run a command with its sockets at a QJump level")
    qsub = q.add_subparsers(dest="qjump_command", required=True, metavar="ACTION")
    r = qsub.add_parser("run", help="run CMD with SO_PRIORITY of LEVEL on its sockets (Python programs)")
    r.add_argument("-p", "--priority", type=int, required=True, metavar="LEVEL", help="QJump level 0..7")
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    r.set_defaults(func=_run)

    c = subparsers.add_parser("qjump-config", help="print (and optionally apply) the tc layout of QJump levels")
    defaults = QJumpParams()
    c.add_argument("--bytesq", type=int, default=defaults.bytesq, help="bytes per epoch (default %(default)s)")
    c.add_argument("--timeq", type=float, default=defaults.timeq, help="epoch in µs (default %(default)s)")
    for level in LEVELS:
        c.add_argument(f"--p{level}rate", type=float, default=defaults.rates[level],
                       help=f"level {level}'s multiple of bytesq/timeq (default %(default)s)")
    c.add_argument("--link-rate", default="200mbit", help="the emulated link (tc rate, default %(default)s)")
    c.add_argument("--dev", default="eth0", help="egress device (default %(default)s)")
    c.add_argument("--apply", metavar="NS", default=None,
                   help="also run the commands in network namespace NS (needs root)")
    c.set_defaults(func=_config)


def hook_env(level: int, base: dict | None = None) -> dict[str, str]:
    """The environment that makes Python programs open their sockets at ``level``."""
    env = dict(os.environ if base is None else base)
    env["HPCNET_QJUMP_LEVEL"] = str(levels.check_level(level, "-p/--priority"))
    env["HPCNET_SO_PRIORITY"] = str(levels.priority_value(level))
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def looks_like_python(argv0: str) -> bool:
    """True for a python interpreter or a script whose #! line names one."""
    path = shutil.which(argv0) or argv0
    if Path(path).name.startswith("python"):
        return True
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _run(args) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise ConfigError("no command given (hpcnet qjump run -p LEVEL -- CMD ...)", "hpcnet qjump run")
    env = hook_env(args.priority)
    if not looks_like_python(cmd[0]):
        print(f"hpcnet qjump run: warning: {cmd[0]!r} does not look like a Python program; only Python "
              f"programs get the level (the hook patches Python's socket module)", file=sys.stderr)
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as e:
        raise LaunchError(f"cannot start {cmd[0]!r}: {e.strerror or e}") from None
    try:
        return proc.wait()
    except KeyboardInterrupt:  # the child got the same SIGINT; give it a moment to exit
        try:
            return proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def _config(args) -> int:
    params = QJumpParams(bytesq=args.bytesq, timeq=args.timeq,
                         rates=tuple(getattr(args, f"p{level}rate") for level in LEVELS))
    link = levels.parse_rate(args.link_rate, "--link-rate")
    commands = levels.tc_commands(args.dev, params, args.link_rate)
    print(f"# QJump levels on {args.dev}: base rate bytesq/timeq = {params.base_rate_bits / 1e6:g} Mbit/s, "
          f"link {link / 1e6:g} Mbit/s")
    for level in LEVELS:
        print(f"#   level {level}: class {levels.class_id(level)}  SO_PRIORITY {levels.priority_value(level)} "
              f"(0x{levels.priority_value(level):x})  rate {params.level_rate_bits(level, link) / 1e6:g} Mbit/s")
    prefix = ["tc"] + (["-n", args.apply] if args.apply else [])
    print(f"# on a device that has a root qdisc already, first: {shlex.join(prefix + levels.remove_command(args.dev))}")
    for cmd in commands:
        print(shlex.join(prefix + cmd))
    if args.apply:
        # HTB cannot replace itself in place: drop whatever root qdisc is there (none is fine), then add.
        subprocess.run(prefix + levels.remove_command(args.dev), capture_output=True)
        for cmd in commands:
            done = subprocess.run(prefix + cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise LaunchError(f"{shlex.join(prefix + cmd)} failed: {done.stderr.strip()}")
        print(f"# applied in namespace {args.apply}")
    return 0
