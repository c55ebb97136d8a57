"""What ``hpcnet`` imports before it runs a command.

Every command builds its parser from all the command modules (``pytest_hpcnet.cli``), so what any of
them imports at the top is paid by every invocation, ``hpcnet --help`` and each one-line error included.
scipy.stats alone is about a second of import; it and the plotting libraries are imported where used.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("scipy.stats", "matplotlib", "pandas")


def test_building_the_parser_imports_no_heavy_library():
    code = ("import json, sys; from pytest_hpcnet.cli import build_parser; build_parser(); "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
