"""scripts/ holds entry points: each Python script there is a docstring, `from koordtest... import main`
and a call, its logic importable (and tested) in koordtest; nothing in scripts/ or koordtest/ edits
sys.path."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "scripts"
# Python scripts with logic of their own, and why.
FAT = {
    "gpu-check": "runs on nodes, where only koordd is installed (no koordtest): a sensor sample printed",
}


def python_scripts() -> list[Path]:
    return sorted(p for p in SCRIPTS.iterdir()
                  if p.is_file() and p.read_text(errors="replace").splitlines()[:1] in
                  (["#!/usr/bin/env python3"], ["#!/usr/bin/python3"]))


def test_every_python_script_is_an_entry_point_of_koordtest():
    scripts = python_scripts()
    assert len(scripts) >= 10, scripts
    for path in scripts:
        if path.name in FAT:
            continue
        tree = ast.parse(path.read_text(), str(path))
        defined = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not defined, f"{path.name} defines {defined}: its logic belongs in koordtest"
        imported = [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
        assert len(imported) == 1 and imported[0].startswith("koordtest."), (path.name, imported)
        module = ROOT / (imported[0].replace(".", "/") + ".py")
        assert module.is_file(), f"{path.name} names {imported[0]}, which is not in koordtest"
        assert str(module.relative_to(ROOT)) in ast.get_docstring(tree), f"{path.name}'s docstring names its module"


def test_nothing_edits_sys_path():
    for path in [*python_scripts(), *(ROOT / "koordtest").rglob("*.py")]:
        assert "sys.path." not in path.read_text(), path
