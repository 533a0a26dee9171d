"""The unit tests mirror the code (issue 37 item 6): tests/unit/<package>/ per package, and each module of
koordd/, koordctl/ and plugins/ has a test file named after it there, or a line in tests/unit/COVERAGE.toml
naming the theme files that test it and why. The kernel and system tiers stay in tests/kernel and
tests/system (CI and scripts/vmtest run them by those paths)."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"
COVERAGE = UNIT / "COVERAGE.toml"
# tests/unit/<folder>: the packages of koordd, koordctl, the loops (plugins/, package koordd_plugins) and
# koordtest (the benchmark and VM-test tooling, and scripts/). Cross-cutting themes lie in tests/unit/.
FOLDERS = {"core", "kernel", "sensors", "backends", "act", "runtime", "plugins", "koordctl", "koordtest"}


def modules() -> dict[str, Path]:
    """Each module of koordd/, koordctl/ and plugins/ (no __init__.py, not the example plugin, which has its
    own tests) -> the test file named after it: koordd/<package>/x.py -> tests/unit/<package>/test_x.py,
    koordctl/demo/x.py -> tests/unit/koordctl/test_demo_x.py, plugins/x.py -> tests/unit/plugins/test_x.py."""
    out = {}
    for top in ("koordd", "koordctl", "plugins"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT / top)
            if path.name == "__init__.py" or rel.parts[0] == "example-hello":
                continue
            parts = rel.with_suffix("").parts
            folder, name = (parts[0], parts[1:]) if top == "koordd" else (top, parts)
            out[str(path.relative_to(ROOT))] = UNIT / folder / f"test_{'_'.join(name)}.py"
    return out


def coverage() -> dict[str, dict]:
    return tomllib.loads(COVERAGE.read_text())


def test_the_tiers_are_folders_and_no_test_lies_flat_in_tests():
    assert sorted(p.name for p in (ROOT / "tests").glob("*.py")) == ["conftest.py"]
    assert {"unit", "kernel", "system"} <= {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()}


def test_the_unit_folders_are_the_packages():
    folders = {p.name for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == FOLDERS, f"tests/unit/ holds {sorted(folders - FOLDERS)}, lacks {sorted(FOLDERS - folders)}"
    # Packages: two test files of one name in two folders (sensors/test_avx.py, kernel/test_avx.py) do not clash.
    assert all((UNIT / f / "__init__.py").is_file() for f in FOLDERS) and (UNIT / "__init__.py").is_file()


def test_every_module_has_its_test_file_or_a_line_saying_which_theme_file_covers_it():
    listed = coverage()
    missing = [f"{m} (no {t.relative_to(ROOT)})" for m, t in modules().items() if not t.is_file() and m not in listed]
    assert not missing, ("a module with no test file named after it and no entry in tests/unit/COVERAGE.toml: "
                         + "; ".join(missing))


def test_every_coverage_entry_is_true():
    mods = modules()
    wrong = []
    for module, entry in coverage().items():
        if module not in mods:
            wrong.append(f"{module}: no such module")
        elif mods[module].is_file():
            wrong.append(f"{module}: has {mods[module].relative_to(ROOT)} now, drop its entry")
        if set(entry) != {"tests", "why"} or not entry["tests"] or not entry["why"].strip():
            wrong.append(f"{module}: wants tests = [...] and why = '...', got {sorted(entry)}")
            continue
        wrong += [f"{module}: no tests/unit/{t}" for t in entry["tests"]
                  if not t.endswith(".py") or not (UNIT / t).is_file()]
    assert not wrong, "tests/unit/COVERAGE.toml: " + "; ".join(wrong)


def test_the_names_are_the_ones_the_layout_gives():
    mods = modules()
    assert mods["koordd/core/config.py"] == UNIT / "core" / "test_config.py"
    assert mods["koordctl/demo/cgroups.py"] == UNIT / "koordctl" / "test_demo_cgroups.py"
    assert mods["plugins/be_suppress.py"] == UNIT / "plugins" / "test_be_suppress.py"
    assert not [m for m in mods if m.endswith("__init__.py") or "example-hello" in m]
