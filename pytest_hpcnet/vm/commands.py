"""``hpcnet vm build`` and ``hpcnet vm test``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .. import progress

# every rdma-marked test of the suites: verbs RPC, the block store and the TeraSort shuffle over verbs, and
# the paper claims (which skip in the guest, naming the hardware Soft-RoCE is not)
DEFAULT_TESTS = ["-m", "rdma", "suites"]


def add_commands(sub) -> None:
    vm = sub.add_parser("vm", help="the Soft-RoCE guest (QEMU) that runs the verbs tests")
    vm_sub = vm.add_subparsers(dest="vm_command", required=True, metavar="ACTION")
    b = vm_sub.add_parser("build", help="build (or reuse) the cached guest")
    b.add_argument("--cache", type=Path, help="cache directory (default $HPCNET_VM_CACHE or ~/.cache/hpcnet-vm)")
    progress.add_flags(b)
    b.set_defaults(func=_build)
    t = vm_sub.add_parser("test", help="boot the guest and run pytest inside; results come back to --results")
    t.add_argument("--cache", type=Path)
    t.add_argument("--results", type=Path, default=Path(".hpcnet/vm"), help="where junit.xml, output.txt, report/ land")
    t.add_argument("--timeout", type=float, default=900, help="seconds before the guest is killed")
    t.add_argument("--source", type=Path, help="project tree to copy into the guest (default: this package's)")
    t.add_argument("--command", help="run this shell command in the guest instead of pytest")
    t.add_argument("--rehearse-claims", action="store_true",
                   help="then run the paper claims on the Soft-RoCE device, verdicts reported not enforced "
                        "(rehearsal.xml, rehearsal/)")
    t.add_argument("pytest_args", nargs="*", help=f"pytest arguments in the guest (default {' '.join(DEFAULT_TESTS)})")
    t.set_defaults(func=_test)


def _build(args) -> int:
    from . import build

    start = time.monotonic()
    # steps take minutes each (debootstrap, the kernel package, pip): the bar shows they are moving
    with progress.bar(len(build.BUILD_STEPS), desc="guest build", unit="step", show=args.progress) as advance:
        from tqdm import tqdm
        g = build.build(args.cache, log=tqdm.write, progress=advance)
    print(f"guest ready in {time.monotonic() - start:.1f} s: kernel {g.kernel_version}, base {g.base} "
          f"({g.base.stat().st_size / 2**20:.0f} MiB)")
    return 0


def _test(args) -> int:
    from ..errors import ConfigError
    from . import boot, guest

    # checked before the build and boot, which take minutes
    if not args.timeout > 0:
        raise ConfigError(f"must be a positive number of seconds, got {args.timeout:g}", "--timeout")
    if args.results.exists() and not args.results.is_dir():
        raise ConfigError(f"{str(args.results)!r} is not a directory", "--results")
    if args.source is not None and not args.source.is_dir():
        raise ConfigError(f"no such project tree {str(args.source)!r}", "--source")
    command = args.command or guest.guest_pytest_command(args.pytest_args or DEFAULT_TESTS)
    if args.rehearse_claims:
        command = guest.all_of([command, guest.rehearsal_command()])
    run = boot.run(command, args.results.resolve(), timeout=args.timeout, cache=args.cache, source=args.source,
                   log=lambda m: print(m, file=sys.stderr))
    output = run.results / "output.txt"
    if output.exists():
        sys.stdout.write(output.read_text(errors="replace"))
    print(f"guest exit status {run.exit_status}; boot {run.boot_seconds:.1f} s, total {run.total_seconds:.1f} s; "
          f"results in {run.results}, serial log {run.log}")
    return run.exit_status
