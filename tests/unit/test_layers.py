"""The tree's architecture holds: the import-linter contracts of pyproject.toml pass, no module of koordd,
koordctl or the loops (plugins/, the package koordd_plugins) takes part in an import cycle, and no import of
koordd's own modules hides inside a function."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("koordd", "koordctl", "koordd_plugins")
FOLDER = {"koordd_plugins": "plugins"}           # a package's folder, where it is not the package's name
# Function-level imports of koordd's own modules that are not there to dodge a cycle, and why.
LAZY = {
    ("koordd/runtime/metricsfeed.py", "koordd.runtime.metrics"): "prometheus-client is optional: imported only "
                                                            "when [metrics] is enabled",
    ("koordd/runtime/metricsfeed.py", "koordd.runtime"): "the same, as `from koordd.runtime import metrics`",
}


def lint_imports() -> Path:
    found = Path(sys.executable).with_name("lint-imports")
    if not found.exists():
        pytest.fail(f"{found} is missing: import-linter is in the test extras (scripts/dev-env installs it)")
    return found


def test_the_import_linter_contracts_are_kept():
    done = subprocess.run([str(lint_imports()), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    # A broken contract names the import that breaks it (module, line, the chain of imports).
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def strongly_connected(graph: grimp.ImportGraph) -> list[set[str]]:
    """Tarjan's components of more than one module (iterative: the graph is a few hundred modules deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[set[str]] = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.add(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        out.append(component)
    return out


def test_no_import_cycle():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert len(graph.modules) > 80         # the whole tree, not an empty graph that trivially has no cycle
    assert strongly_connected(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert strongly_connected(graph) == [{"p.a", "p.b", "p.c"}]


def function_level_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for node in ast.walk(top):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    out.append(node.module)
                elif isinstance(node, ast.ImportFrom) and node.level:
                    out.append("." * node.level + (node.module or ""))
                elif isinstance(node, ast.Import):
                    out += [a.name for a in node.names]
    return [m for m in out if m.startswith(".") or m.split(".")[0] in PACKAGES]


def sources(package: str) -> list[Path]:
    """The package's modules: its folder's .py files in folders that are packages all the way up (not the
    example plugin under plugins/, a project of its own)."""
    top = ROOT / FOLDER.get(package, package)
    return [p for p in top.rglob("*.py")
            if all((d / "__init__.py").exists() for d in (p.parent, *p.parent.parents) if d == top or top in d.parents)]


def test_no_function_level_import_of_koordd_modules_but_the_optional_ones():
    found = {(str(p.relative_to(ROOT)), m) for pkg in PACKAGES for p in sources(pkg) for m in function_level_imports(p)}
    assert found - set(LAZY) == set()


def test_koordctl_validate_loads_no_daemon_runtime_and_no_demo_or_view():
    """`koordctl validate` (on every node, in CI, before a reload) loads the contracts and the loops whose
    options it checks: no kernel adapter, sensor, backend, actuator or daemon, and not the demo or top."""
    code = ("import contextlib, io, sys\nfrom koordctl.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): rc = main(['validate', sys.argv[1]])\n"
            "print(rc, ' '.join(sorted(m for m in sys.modules if m.split('.')[0] in sys.argv[2:])))")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "config" / "koordd.toml"), *PACKAGES], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    rc, *loaded = done.stdout.split()
    assert rc == "0", done.stdout
    assert "koordd.core.config" in loaded and "koordd_plugins.be_suppress" in loaded     # it did validate
    light = {"koordd", "koordd.core", "koordctl", "koordctl.cli", "koordctl.common", "koordctl.rows", "koordctl.demo"}
    assert [m for m in loaded if m not in light and not m.startswith(("koordd.core.", "koordd_plugins"))] == []
