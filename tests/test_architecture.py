"""The package's layering, read from its imports with ``ast`` (every import, including those inside
functions: a lazy import is still a dependency), so an upward arrow or a cycle fails here, not in review.

An *area* is a subpackage of ``pytest_hpcnet`` (``cluster``, ``reference``, ...) or a top-level module
(``measure``, ``hardware``, ...). The rules are the design's: the cluster layer starts processes and
shapes links and knows nothing of what runs on it; the reference implementation never reaches into the
plugin, the workloads or the reports; the report renders data and reads result files, nothing more;
suites do not import each other; no two areas import each other, directly or round a loop.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

import pytest_hpcnet

PACKAGE = Path(pytest_hpcnet.__file__).parent
SUITES = PACKAGE.parent / "suites"

# area -> areas it must not import
FORBIDDEN = {
    "cluster": {"qjump", "workloads", "report", "suites", "reference", "targets", "hardware", "nodeprobe",
                "plugin", "session", "cli", "claims", "vocabulary", "crosscheck"},
    "reference": {"qjump", "workloads", "report", "suites", "targets", "hardware", "plugin", "session", "cli"},
    "report": {"cluster", "reference", "workloads", "qjump", "suites", "targets", "plugin", "session", "cli"},
    "workloads": {"qjump", "suites", "plugin", "session", "cli"},
    "features": {"cluster", "hardware", "nodeprobe"},
}
# an area nothing else may import (none today; the check stays for the next shim)
NOBODY_IMPORTS: set[str] = set()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> set[str]:
    """Absolute names of everything ``path`` imports (``from x import y`` gives both x and x.y)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def area_graph(root: Path) -> dict[str, dict[str, set[str]]]:
    """area -> imported area -> the modules of ``area`` that import it (for the failure message)."""
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    top = root.name
    graph: dict[str, dict[str, set[str]]] = collections.defaultdict(lambda: collections.defaultdict(set))

    def area(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "<package>"

    for name, path in modules.items():
        for target in imports_of(path, root):
            if target.split(".")[0] != top or target not in modules:
                continue
            a, b = area(name), area(target)
            if a != b:
                graph[a][b].add(name)
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components with more than one area (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def violations(graph) -> list[str]:
    out = []
    for area, forbidden in FORBIDDEN.items():
        for target in sorted(set(graph.get(area, {})) & forbidden):
            out.append(f"{area} -> {target} (in {', '.join(sorted(graph[area][target]))})")
    for area, targets in graph.items():
        for target in sorted(set(targets) & NOBODY_IMPORTS):
            out.append(f"{area} -> {target} (in {', '.join(sorted(targets[target]))})")
    return out


def test_no_area_imports_upward():
    assert violations(area_graph(PACKAGE)) == []


def test_no_two_areas_import_each_other_even_round_a_loop():
    assert cycles(area_graph(PACKAGE)) == []


def test_suites_do_not_import_each_other():
    crossing = []
    for path in SUITES.rglob("*.py"):
        own = path.relative_to(SUITES).parts[0]
        for target in imports_of(path, SUITES):
            parts = target.split(".")
            if parts[0] == "suites" and len(parts) > 1 and parts[1] != own and parts[1] != "conftest":
                crossing.append(f"{path.relative_to(SUITES.parent)} imports {target}")
    assert crossing == []


def test_the_library_never_imports_pytest():
    """Logic lives in library modules that asv, the CLI and remote workers load: only the plugin's
    wiring (``plugin``, ``hookspec``) may import pytest or pluggy."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path, PACKAGE)
        if name in ("pytest_hpcnet.plugin", "pytest_hpcnet.hookspec"):
            continue
        if {"pytest", "pluggy", "_pytest"} & {t.split(".")[0] for t in imports_of(path, PACKAGE)}:
            offenders.append(name)
    assert offenders == []


# -- the checker itself fails on what it must catch ---------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_sees_an_upward_import_inside_a_function(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "", "cluster/__init__.py": "", "workloads/__init__.py": "",
        "cluster/netns.py": "def f():\n    from ..workloads.qjump import levels\n",
        "workloads/qjump/__init__.py": "", "workloads/qjump/levels.py": "",
    })
    assert violations(area_graph(root)) == ["cluster -> workloads (in pkg.cluster.netns)"]


def test_the_checker_sees_a_cycle_round_three_areas(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "", "a.py": "from . import b\n", "b.py": "import pkg.c\n", "c.py": "from .a import x\n",
        "d.py": "from . import a\n",
    })
    assert cycles(area_graph(root)) == [["a", "b", "c"]]


@pytest.mark.parametrize("source, expected", [
    ("from .. import errors", {"pkg", "pkg.errors"}),
    ("from ..errors import ConfigError", {"pkg.errors", "pkg.errors.ConfigError"}),
    ("from . import shaping", {"pkg.cluster", "pkg.cluster.shaping"}),
    ("import pkg.report.cdf", {"pkg.report.cdf"}),
])
def test_relative_imports_resolve_against_the_module_s_package(tmp_path, source, expected):
    root = _tree(tmp_path, {"__init__.py": "", "cluster/__init__.py": "", "cluster/netns.py": source + "\n"})
    assert imports_of(root / "cluster/netns.py", root) == expected
