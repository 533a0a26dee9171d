"""Where this host's kernel interfaces are (tests point them at fake trees), and the small reads the
feature probes of koordd's backends and sensors share (`features`, koordd/core/backend.py). A probe
reports what it finds; it never imports a heavy library to find out."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from koordd.kernel.cgroupfs import DEFAULT_ROOT, Layout, detect_layout


@dataclass
class Host:
    cgroup: Path = Path(DEFAULT_ROOT)
    sys: Path = Path("/sys")
    proc: Path = Path("/proc")
    run: Path = Path("/run")

    @cached_property
    def layout(self) -> Layout:
        # Shared by several probes; a LayoutError is not cached, so each of them reports it on its own.
        return detect_layout(self.cgroup)


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpuidle_driver(sys: Path) -> str | None:
    """The cpuidle driver's name ("none": the kernel has none, CPUs idle by the architecture's halt, which no CPU
    latency request governs), None where it cannot be read. A name is short: a longer or unprintable one is no
    name (None)."""
    try:
        name = read(sys / "devices/system/cpu/cpuidle/current_driver")
    except ValueError:          # bytes that are not UTF-8
        return None
    return name if name and len(name) <= 64 and name.isprintable() and "\ufffd" not in name else None


def find_knob(root: Path, filename: str) -> Path | None:
    """`filename` in `root` or one level below: most cpu knobs exist only in non-root cgroups."""
    if (root / filename).is_file():
        return root / filename
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return None
    return next((c / filename for c in children if (c / filename).is_file()), None)


def try_import(name: str):
    """(module, None) or (None, why): a missing optional library is a fact to report, not an error."""
    try:
        return importlib.import_module(name), None
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None, f"{name} not installed"
        return None, f"import {name}: {e}"
    except Exception as e:  # a broken optional library may raise anything
        return None, f"import {name}: {type(e).__name__}: {e}"


def installed(name: str) -> str | None:
    """None when `name` can be imported, else why not, without importing it: pyroute2 is some 16 MB of
    RSS, and koordd probes at every start."""
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):      # a None in sys.modules (tests) or a broken parent package
        found = False
    return None if found else f"{name} not installed"


def yes(flag: bool) -> str:
    return "yes" if flag else "no"
