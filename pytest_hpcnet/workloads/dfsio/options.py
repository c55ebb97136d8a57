"""TestDFSIO's command line (``TestDFSIO.1.8``), parsed the way Hadoop parses it.

Options are case-insensitive; ``-read*`` and ``-compression*`` match by prefix as in Hadoop.
``-random``, ``-backward`` and ``-skip`` must follow ``-read``. Sizes are ``<digits>[B|KB|MB|GB|TB]``
with binary multiples and no unit meaning MB; ``-skipSize`` takes a size too (so ``-skipSize 1`` is
1 MB). ``-backward`` sets skipSize to -bufferSize; ``-skip`` without ``-skipSize`` skips bufferSize.
Unlike Hadoop, a bad option is a ``ConfigError`` naming it, not a usage dump.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ...errors import ConfigError

DEFAULT_BUFFER_SIZE = 1000000
DEFAULT_RES_FILE = "TestDFSIO_results.log"
MEGA = 1 << 20
MULTIPLES = {"": MEGA, "B": 1, "KB": 1 << 10, "MB": MEGA, "GB": 1 << 30, "TB": 1 << 40}
TEST_TYPES = ("write", "read", "append", "random read", "backward read", "skip read", "truncate",
              "cleanup")
# Codecs we implement with Python's standard library, by our short name and Hadoop's class name.
CODECS = {"zlib": "zlib", "org.apache.hadoop.io.compress.DefaultCodec": "zlib",
          "gzip": "gzip", "org.apache.hadoop.io.compress.GzipCodec": "gzip",
          "bz2": "bz2", "bzip2": "bz2", "org.apache.hadoop.io.compress.BZip2Codec": "bz2"}
USAGE = ("Usage: TestDFSIO -read [-random | -backward | -skip [-skipSize Size]] | -write | -append | "
         "-truncate | -clean [-compression codec] [-nrFiles N] [-size Size[B|KB|MB|GB|TB]] "
         "[-resFile resultFileName] [-bufferSize Bytes]")


@dataclass(frozen=True)
class DfsioOptions:
    test_type: str = "write"
    nr_files: int = 1
    size: int = MEGA                    # bytes per file (for truncate: the new length)
    buffer_size: int = DEFAULT_BUFFER_SIZE
    skip_size: int = 0                  # effective: negative for backward, > 0 for skip read
    res_file: str = DEFAULT_RES_FILE
    compression: str | None = None      # "zlib", "gzip" or "bz2"

    def with_(self, **changes) -> "DfsioOptions":
        return replace(self, **changes)


def parse_size(text: str, where: str = "-size") -> int:
    """Hadoop's ``parseSize``: leading digits, then an optional unit; no unit = MB."""
    m = re.fullmatch(r"(\d+)(\D.*)?", text)
    if not m:
        raise ConfigError(f"{text!r} is not a size (digits and an optional B/KB/MB/GB/TB unit)", where)
    unit = (m.group(2) or "").upper()
    if unit not in MULTIPLES:
        raise ConfigError(f"{text!r}: unsupported unit {m.group(2)!r} (use B, KB, MB, GB or TB)", where)
    return int(m.group(1)) * MULTIPLES[unit]


def _int(text: str, where: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not a whole number", where) from None
    if value < minimum:
        raise ConfigError(f"{value} is less than {minimum}", where)
    return value


def parse_dfsio_args(args: list[str]) -> DfsioOptions:
    if not args:
        raise ConfigError("missing arguments; " + USAGE, "TestDFSIO")
    test_type = None
    values: dict = {}
    skip_given = None
    i = 0

    def value_of(name: str) -> str:
        nonlocal i
        if i + 1 >= len(args):
            raise ConfigError(f"{name} needs a value", "TestDFSIO")
        i += 1
        return args[i]

    while i < len(args):
        arg = args[i]
        low = arg.lower()
        if low.startswith("-read"):
            test_type = "read"
        elif low in ("-write", "-append", "-truncate"):
            test_type = low[1:]
        elif low == "-clean":
            test_type = "cleanup"
        elif low in ("-random", "-backward", "-skip"):
            if test_type != "read":
                raise ConfigError(f"{arg} must follow -read", "TestDFSIO")
            test_type = {"-random": "random read", "-backward": "backward read", "-skip": "skip read"}[low]
        elif low.startswith("-compression"):
            codec = value_of(arg)
            if codec not in CODECS:
                raise ConfigError(f"unsupported codec {codec!r}; this implementation has "
                                  f"{', '.join(sorted(set(CODECS)))}", arg)
            values["compression"] = CODECS[codec]
        elif low == "-nrfiles":
            values["nr_files"] = _int(value_of(arg), arg)
        elif low in ("-size", "-filesize"):
            values["size"] = parse_size(value_of(arg), arg)
        elif low == "-skipsize":
            skip_given = parse_size(value_of(arg), arg)
        elif low == "-buffersize":
            values["buffer_size"] = _int(value_of(arg), arg)
        elif low == "-resfile":
            values["res_file"] = value_of(arg)
        elif low in ("-storagepolicy", "-erasurecodepolicy"):
            raise ConfigError("storage and erasure-coding policies are HDFS features; the posix and "
                              "blockstore targets have none", arg)
        elif low.startswith("-seq"):
            raise ConfigError("sequential mode (-seq) is not implemented; tasks always run as a job",
                              arg)
        else:
            raise ConfigError(f"illegal argument {arg!r}; " + USAGE, "TestDFSIO")
        i += 1
    if test_type is None:
        raise ConfigError("no test type given (-write, -read, -append, -truncate or -clean)", "TestDFSIO")
    opts = DfsioOptions(test_type=test_type, **values)
    skip = skip_given or 0
    if test_type == "backward read":
        skip = -opts.buffer_size
    elif test_type == "skip read" and skip == 0:
        skip = opts.buffer_size
    if opts.compression and test_type not in ("write", "read"):
        raise ConfigError(f"compression applies to sequential -write and -read only, not {test_type} "
                          "(a compressed stream has no random access and cannot be appended to "
                          "or truncated in place)", "-compression")
    return opts.with_(skip_size=skip)
