"""Run a command against N netns hosts reached through a real sshd or a real Slurm, then tear down.

    python -m pytest_hpcnet.cluster.embedded slurm 4 [--sysroot DIR] [--features F ...] -- \\
        pytest -m ib_qdr suites/mapreduce --hpcnet-verdicts report

builds ``netns:4``, starts the daemons (``sshd`` per host, or munged + slurmctld + one slurmd per host),
writes an inventory whose launcher is ``ssh`` or ``slurm``, runs the command with ``HPCNET_CLUSTER``
set to that inventory (so ``pytest`` and ``hpcnet`` use it; ``{inventory}`` in the command is replaced
by its path too), stops everything and exits with the command's status. Needs root. The vendor-CI
rehearsal and the Makefile's ``multihost-suites`` use it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import HpcnetError
from . import netns, reaper


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" not in argv:
        print("usage: python -m pytest_hpcnet.cluster.embedded ssh|slurm N [options] -- command ...",
              file=sys.stderr)
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m pytest_hpcnet.cluster.embedded")
    parser.add_argument("launcher", choices=["ssh", "slurm"])
    parser.add_argument("nodes", type=int)
    parser.add_argument("--sysroot", type=Path, help="every node's probe reads /sys and /proc under this tree")
    parser.add_argument("--features", nargs="*", default=[], help="features declared in the inventory")
    parser.add_argument("--networks", default="eth",
                        help="comma-separated networks every node has, all on its netns link (e.g. eth,ib: "
                             "the link also plays the IPoIB network a configuration's net=ib names)")
    parser.add_argument("--root", type=Path, help="where the hosts' dirs and the daemons' state go")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not netns.available():
        print(f"embedded {args.launcher}: {netns.NEEDS_ROOT}", file=sys.stderr)
        return 2
    from . import slurmbox, sshd
    why = sshd.missing() if args.launcher == "ssh" else slurmbox.missing()
    if why:
        print(f"embedded {args.launcher}: {why}", file=sys.stderr)
        return 2
    root = Path(args.root or tempfile.mkdtemp(prefix=f"hpcnet-{args.launcher}-")).absolute()
    restore = reaper.interrupt_on_signals()
    try:
        with netns.temporary_netns_cluster(args.nodes, root / "hosts") as hosts:
            daemons = (sshd.EmbeddedSshd(hosts, root / "sshd") if args.launcher == "ssh"
                       else slurmbox.EmbeddedSlurm(hosts, root / "slurm"))
            with daemons:
                sysroot = args.sysroot.absolute() if args.sysroot else None
                inventory = daemons.write_inventory(root / f"{args.launcher}.toml", sysroot=sysroot,
                                                    features=args.features,
                                                    networks=tuple(args.networks.split(",")))
                env = dict(os.environ, HPCNET_CLUSTER=str(inventory))
                for name in (reaper.RUN_ENV, reaper.CONTROLLER_ENV):
                    env.pop(name, None)
                print(f"embedded {args.launcher}: {args.nodes} netns hosts, inventory {inventory}", flush=True)
                cmd = [c.replace("{inventory}", str(inventory)) for c in command]
                return subprocess.call(cmd, env=env)
    except HpcnetError as e:
        print(f"embedded {args.launcher}: {e}", file=sys.stderr)
        return 2
    finally:
        restore()
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
