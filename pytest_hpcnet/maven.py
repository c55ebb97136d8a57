"""Run Maven and show what it downloads: ``python -m pytest_hpcnet.maven MVN-ARGS...``.

``make hadoop-jars`` fetches the Hadoop target's jars (about 800 files, 120 MB: a minute on a first run) with
Maven, whose ``-q`` would hide that wait. This runs ``mvn -B MVN-ARGS``, reads its
"Downloaded from REPO: URL (SIZE ...)" lines and counts them on a tqdm bar (on a terminal), then prints one
line saying how many artifacts and bytes came in. On failure it prints Maven's last lines and exits with
Maven's status.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import time

from . import progress

DOWNLOADED = re.compile(r"Downloaded from (\S+): (\S+) \(([\d.]+) (B|kB|KB|MB|GB)")
UNITS = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}
TAIL = 25


def downloaded_bytes(line: str) -> int | None:
    """The size a 'Downloaded from' line reports, or None for any other line."""
    m = DOWNLOADED.search(line)
    return int(float(m.group(3)) * UNITS[m.group(4)]) if m else None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    mvn = shutil.which("mvn")
    if mvn is None:
        print("maven: mvn not found", file=sys.stderr)
        return 127
    print("maven: resolving and downloading " + " ".join(a for a in args if not a.startswith("-D"))
          + " (a first run downloads from Maven Central into ~/.m2)", file=sys.stderr, flush=True)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL)
    files = total = 0
    start = time.monotonic()
    with progress.bar(None, desc="maven downloads", unit="B", unit_scale=True) as advance, \
            subprocess.Popen([mvn, "-B", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace") as proc:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            size = downloaded_bytes(line)
            if size is not None:
                files += 1
                total += size
                advance(size)
        status = proc.wait()
    took = time.monotonic() - start
    if status != 0:
        print("\n".join(tail), file=sys.stderr)
        print(f"maven: mvn failed (exit status {status}) after {took:.0f} s", file=sys.stderr)
        return status
    print(f"maven: done in {took:.0f} s; downloaded {files} artifact file(s), {total / 1e6:.1f} MB"
          + ("" if files else " (all were in ~/.m2 already)"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
