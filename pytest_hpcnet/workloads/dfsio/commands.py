"""``hpcnet dfsio``: TestDFSIO's options plus where to run.

    hpcnet dfsio -write -nrFiles 4 -size 64MB --fs posix:/scratch/x [--fsync close] [--cluster local:4]
    hpcnet dfsio -read -nrFiles 4 -size 64MB --fs blockstore --transport shm --replication 3

Single-dash options are TestDFSIO's (see ``options``). Double-dash options are ours:
``--fs`` (posix:/abs/path | posix:local | posix:shared | blockstore; default posix:shared),
``--cluster`` (local:N, netns:N or an inventory; default local:4), ``--workdir`` (root of an embedded
cluster's node dirs; default $TMPDIR/hpcnet-dfsio, kept so a -read can follow a -write),
``--fsync`` (none | close | every-buffer; for the block store none | close, the datanodes syncing
each replica before they acknowledge it; default none), ``--transport`` (tcp | shm),
``--replication`` (1-3; default 3, at most the node count), ``--block-size`` (a size; default 128MB),
``--verify`` (check read data against the write pattern), ``--timeout`` (seconds; default 600),
``--progress`` / ``--no-progress`` (a bar of finished files on stderr; default: on a terminal only).
For ``--fs blockstore`` the command starts the metadata service and a datanode per node, runs the
job and stops them; the store's state stays in the node dirs for the next command.
"""

from __future__ import annotations

import getpass
import os
import stat
import sys
import tempfile
from pathlib import Path

from ...cluster import load_cluster
from ...cluster.pool import Launchers
from ... import progress
from ...errors import ConfigError
from .job import parse_fs, run_dfsio
from .options import parse_dfsio_args, parse_size

USAGE = """\
usage: hpcnet dfsio (-write | -append | -read [-random | -backward | -skip [-skipSize SIZE]] | -truncate
                     | -clean) [-nrFiles N] [-size SIZE] [-bufferSize BYTES] [-resFile FILE]
                    [--fs posix:/abs/dir | posix:local | posix:shared | blockstore] [--fsync none|close|every-buffer]
                    [--cluster local:N | netns:N | INVENTORY.toml] [--workdir DIR] [--transport tcp|shm]
                    [--replication 1-3] [--block-size SIZE] [--verify] [--timeout SECONDS]
                    [--progress | --no-progress]

TestDFSIO (single-dash options, as Hadoop's) over a POSIX directory or the reference block store.

options:
  --fs          where files go (default posix:shared); a posix:/abs/dir must already exist
  --fsync       none (default), close (fsync before close; blockstore: each replica before its
                last ack, HDFS's dfs.datanode.synconclose), every-buffer (posix only)
  --cluster     nodes that run the tasks (default local:4)
  --workdir     root of an embedded cluster's node dirs (default $TMPDIR/hpcnet-dfsio-$USER, kept so a
                -read can follow a -write)
  --transport   blockstore only: tcp (default) or shm
  --replication blockstore only: 1-3 (default 3, at most the node count)
  --block-size  blockstore only: block size (default 128MB)
  --verify      check read data against the write pattern
  --timeout     seconds for the job (default 600)
  --progress    a bar of finished files on stderr even when it is not a terminal (default: only on a
                terminal, and only after 2 s); --no-progress: never

example: hpcnet dfsio -write -nrFiles 4 -size 64MB --fs posix:/scratch/x --fsync close
"""

FLAGS = {"--verify", "--progress", "--no-progress"}
VALUED = {"--fs", "--cluster", "--workdir", "--fsync", "--transport", "--replication", "--block-size",
          "--timeout"}


def split_args(argv: list[str]) -> tuple[list[str], dict]:
    """TestDFSIO's arguments, and ours (``--name value`` or ``--name=value``)."""
    ours: dict = {}
    theirs: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name in FLAGS and not eq:
                ours[name] = True
            elif name in VALUED:
                if not eq:
                    if i + 1 >= len(argv):
                        raise ConfigError("needs a value", name)
                    i += 1
                    value = argv[i]
                ours[name] = value
            else:
                raise ConfigError(f"unknown option {name!r} (ours: {', '.join(sorted(FLAGS | VALUED))})")
        else:
            theirs.append(arg)
        i += 1
    return theirs, ours


def _int_option(ours: dict, name: str, default: int, lo: int, hi: int) -> int:
    text = ours.get(name, str(default))
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not a whole number", name) from None
    if not lo <= value <= hi:
        raise ConfigError(f"{value} is outside {lo}..{hi}", name)
    return value


def run_command(args) -> int:
    argv = list(args.dfsio_args)
    if any(a in ("-h", "--help", "-help") for a in argv):
        print(USAGE, end="")
        return 0
    theirs, ours = split_args(argv)
    opts = parse_dfsio_args(theirs)
    target = parse_fs(ours.get("--fs", "posix:shared"), ours.get("--fsync", "none"))
    timeout = float(_int_option(ours, "--timeout", 600, 1, 86400))
    store_options = [name for name in ("--transport", "--replication", "--block-size") if name in ours]
    if target.kind != "blockstore" and store_options:
        raise ConfigError("applies to --fs blockstore only", store_options[0])
    transport = ours.get("--transport", "tcp")
    block_size = parse_size(ours.get("--block-size", "128MB"), "--block-size")
    root = Path(ours.get("--workdir") or own_dir(Path(tempfile.gettempdir()) / f"hpcnet-dfsio-{getpass.getuser()}"))
    cluster = load_cluster(ours.get("--cluster", "local:4"), root, where="--cluster")
    replication = _int_option(ours, "--replication", min(3, len(cluster.nodes)), 1, 3)
    if target.kind == "posix" and target.root not in ("local", "shared") \
            and all(n.launcher == "local" for n in cluster.nodes) and not Path(target.root).is_dir():
        # TestDFSIO writes under a file system's existing directory (a Lustre mount, a scratch dir):
        # a mistyped path must not quietly become a new directory on the wrong disk
        raise ConfigError(f"no such directory {target.root!r} (the posix target must exist)", "--fs")
    with Launchers(cluster, root / "logs") as launchers:
        store = None
        try:
            if target.kind == "blockstore":
                from ...reference.dfs.store import BlockStore
                store = BlockStore(launchers, cluster, transport=transport,
                                   sync_on_close=target.fsync == "close").start()
                target.store = store.spec(replication=replication, block_size=block_size)
            show = True if "--progress" in ours else False if "--no-progress" in ours else None
            with progress.bar(opts.nr_files if opts.test_type != "cleanup" else 0,
                              desc=f"dfsio -{opts.test_type}", unit="file", show=show) as advance:
                result = run_dfsio(opts, target, launchers, cluster, verify=bool(ours.get("--verify")),
                                   timeout=timeout, progress=advance)
        finally:
            if store is not None:
                store.stop()
    if result is None:
        print("Cleaning up test files: done", file=sys.stderr)
        return 0
    sys.stdout.write(result.block())
    config = ", ".join(f"{k}={v}" for k, v in result.config.items())
    print(f"(hpcnet: {config}; results appended to {os.path.abspath(opts.res_file)})", file=sys.stderr)
    return 0


def add_commands(subparsers) -> None:
    # TestDFSIO's single-dash options would confuse argparse, so this subcommand takes its words
    # verbatim ('+' as the only option prefix) and parses them itself.
    p = subparsers.add_parser("dfsio", prefix_chars="+", add_help=False,
                              help="TestDFSIO over a POSIX directory or the reference block store")
    p.add_argument("dfsio_args", nargs="*")
    p.set_defaults(func=run_command)


def own_dir(path: Path) -> Path:
    """A private work dir at a predictable name (so a -read can follow a -write): made 0700 if new;
    if it exists it must be a real directory (not a symlink) owned by us that nobody else may write,
    or it is refused, since another user could have made it to catch our files."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ConfigError(f"{path} exists but is not a private directory of this user (a symlink, "
                          f"another owner, or writable by others); remove it or pass --workdir",
                          "dfsio work dir")
    return path
