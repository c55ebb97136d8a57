"""The ``hpcnet`` command. Each area contributes its subcommands through ``add_commands(subparsers)``.

A subcommand's parser gets ``func=`` set to a callable taking the parsed args and returning an exit
code. Errors the library raises for bad input (``HpcnetError``), and a file the user named that cannot
be read or written (``OSError``), end the command with one line on stderr and exit status 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys


# Modules that provide add_commands(subparsers); add yours here.
COMMAND_MODULES = (
    "pytest_hpcnet.hardware",
    "pytest_hpcnet.report.commands",
    "pytest_hpcnet.compare",
    "pytest_hpcnet.report.asv_site",
    "pytest_hpcnet.workloads.qjump.commands",
    "pytest_hpcnet.reference.mapreduce.commands",
    "pytest_hpcnet.reference.rpc.cli",
    "pytest_hpcnet.workloads.dfsio.commands",
    "pytest_hpcnet.crosscheck",
    "pytest_hpcnet.vm.commands",
    "pytest_hpcnet.asv_import",
    "pytest_hpcnet.history",
    "pytest_hpcnet.export",
)


def _version() -> str:
    from importlib import metadata
    try:
        return metadata.version("pytest-hpcnet")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpcnet", description="pytest-hpcnet tools: probe nodes, generate and check data, run the "
        "reference RPC, DFS and MapReduce by hand, read and compare run records.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def run(args: argparse.Namespace, label: str) -> int:
    """Run a parsed subcommand: a library error is one line on stderr and exit status 2."""
    from .cluster.nodeprogram import run_guarded
    return run_guarded(lambda: args.func(args), label)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args, f"hpcnet {args.command}")


if __name__ == "__main__":
    sys.exit(main())
