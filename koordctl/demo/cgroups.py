"""The cgroups of `koordctl demo`, and how its processes get into them.

koordd-demo-<pid> with children ls and be, made in every hierarchy the host has for CPU: on hybrid
hosts the v1 cpu hierarchy (where koordd caps BE), the v1 cpuacct one (where the usage is counted) and
the unified tree (where koordd reads PSI); on v1 without a unified tree the first two; on pure v2 the
one tree, with +cpu in the parent's cgroup.subtree_control. Nothing else is written: a v2 root without
the cpu controller for its children is an error, not something the demo changes.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable

from koordd.backends.cgroup import KNOBS
from koordd.core.backend import TargetGone, Unsupported
from koordd.core.cgroup import parse_cpu_max
from koordd.kernel.cgroupfs import CgroupFS, Layout
from koordd.sensors.cgroup import flat_keyed

CHILDREN = ("ls", "be")
PR_SET_PDEATHSIG = 1


class DemoError(Exception):
    """The demo cannot run here, or something it runs failed: one line for the user."""


def hierarchy_roots(layout: Layout) -> list[Path]:
    """The hierarchies the demo's cgroups must exist in: where CPU is limited and counted (v1 cpu and
    cpuacct, or the v2 tree) and the v2 tree on hybrid hosts too (koordd reads PSI there). A co-mounted
    cpu,cpuacct counts once."""
    if layout.mode == "v2":
        if "cpu" not in layout.v2_controllers:
            raise DemoError(f"{layout.unified}: cgroup v2 without the cpu controller")
        wanted = [layout.unified]
    else:
        missing = [c for c in ("cpu", "cpuacct") if c not in layout.v1]
        if missing:
            raise DemoError(f"no v1 {' or '.join(missing)} hierarchy under {layout.root} ({layout.describe()})")
        wanted = [layout.v1["cpu"], layout.v1["cpuacct"]] + ([layout.unified] if layout.unified else [])
    roots: dict[str, Path] = {}
    for root in wanted:
        roots.setdefault(os.path.realpath(root), root)
    return list(roots.values())


class DemoCgroups:
    """The parent cgroup `name` with children ls and be, in every hierarchy of hierarchy_roots()."""

    def __init__(self, layout: Layout, name: str):
        self.layout, self.name = layout, name
        self.fs = CgroupFS(layout)
        self.roots = hierarchy_roots(layout)
        self.made: list[Path] = []           # what create() made, in order: removed in reverse
        self.removed = 0                     # directories remove() removed

    def path(self, child: str) -> str:
        """The cgroup's name as koordd writes it: relative to the hierarchy root."""
        return f"{self.name}/{child}"

    def create(self) -> None:
        if self.layout.mode == "v2":
            enabled = (self.layout.unified / "cgroup.subtree_control").read_text().split()
            if "cpu" not in enabled:
                # The demo does not change the host's root cgroup: that is the operator's call.
                raise DemoError(f"the cpu controller is not enabled for the children of {self.layout.unified}"
                                f" (echo +cpu > {self.layout.unified}/cgroup.subtree_control)")
        for root in self.roots:
            parent = root / self.name
            try:
                parent.mkdir()
            except FileExistsError:         # not ours to remove: left by a demo that was SIGKILLed?
                raise DemoError(f"{parent} exists already (left by a demo that was killed? rmdir its"
                                " children ls and be, then it)") from None
            self.made.append(parent)
            if self.layout.mode == "v2":
                (parent / "cgroup.subtree_control").write_text("+cpu")
            for child in CHILDREN:
                (parent / child).mkdir()
                self.made.append(parent / child)

    def procs_files(self, child: str) -> list[str]:
        """The cgroup.procs file of `child` in every hierarchy: a process writes its pid into each."""
        return [str(root / self.name / child / "cgroup.procs") for root in self.roots]

    def usage_ns(self, child: str) -> int:
        """CPU time used by `child` since it was made: cpuacct.usage on v1, cpu.stat usage_usec on v2."""
        cgroup = self.path(child)
        if "cpuacct" in self.layout.v1 and "cpu" not in self.layout.v2_controllers:
            return int(self.fs.read("cpuacct", cgroup, "cpuacct.usage"))
        return flat_keyed(self.fs.read(None, cgroup, "cpu.stat"), "usage_usec")["usage_usec"] * 1000

    def be_limits(self) -> tuple[float | None, bool | None]:
        """BE's quota in CPUs (None: none) and its cpu.idle (None: the host has no cpu.idle)."""
        cgroup = self.path("be")
        try:
            quota, period = parse_cpu_max(KNOBS["cpu.max"].read(self.fs, cgroup))
        except (OSError, ValueError, TargetGone, Unsupported):
            quota, period = None, 1
        try:
            idle = KNOBS["cpu.idle"].read(self.fs, cgroup) == "1"
        except (OSError, ValueError, TargetGone, Unsupported):      # no cpu.idle on this kernel
            idle = None
        return (None if quota is None else quota / period), idle

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.made:
            try:
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
        return found

    def remove(self, timeout: float = 5.0) -> list[str]:
        """Kill whatever is still in them, then remove them, children first. What could not be done, as text."""
        deadline = time.monotonic() + timeout
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        problems = [f"processes still in {self.name}: {sorted(left)}"] if left else []
        for d in reversed(self.made):
            while True:
                try:
                    d.rmdir()
                    self.removed += 1
                    break
                except FileNotFoundError:
                    break
                except OSError as e:        # EBUSY for a moment after its last process died
                    if time.monotonic() >= deadline:
                        problems.append(f"cannot remove {d}: {e.strerror}")
                        break
                    time.sleep(0.05)
        self.made = [d for d in self.made if d.exists()]
        return problems


def joiner(procs_files: list[str], cpu: int | None, death_signal: int) -> Callable[[], None]:
    """What a child runs before exec: die with the demo, stay on `cpu`, and join the demo's cgroup in
    every hierarchy, so that none of its instructions run anywhere else."""
    def join() -> None:
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        for path in procs_files:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
    return join
