"""Scratch cgroups on the host's real hierarchy: those of `koordctl demo`, and the one implementation the
benchmarks and kernel tests use too (koordtest.bench.cgroup_tree, koordtest.kernel): it lives here
because the demo ships and runs on nodes.

A ScratchTree is a parent cgroup directly under each hierarchy root it is given, with children below
it; processes join a child in every hierarchy before their first instruction; remove() kills what is in
it and removes the directories, children first. Nothing else is written, except the cgroup.subtree_control
of our own parents (the controllers passed down on cgroup v2) and, on v1 cpuset, our cgroups' cpus and mems
(copied from the parent: an empty cpuset takes no task).

The demo's: koordd-demo-<pid> with children ls and be, made in every hierarchy the host has for CPU: on
hybrid hosts the v1 cpu hierarchy (where koordd caps BE), the v1 cpuacct one (where the usage is counted)
and the unified tree (where koordd reads PSI); on v1 without a unified tree the first two; on pure v2 the
one tree, with +cpu in the parent's cgroup.subtree_control. Nothing else is written: a v2 root without
the cpu controller for its children is an error, not something the demo changes.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Callable

from koordd.backends.cgroup_knobs import KNOBS
from koordd.core.backend import TargetGone, Unsupported
from koordd.core.cgroup_text import parse_cpu_max
from koordd.kernel.cgroupfs import CgroupFS, Layout
from koordd.sensors.cgroup_stats import flat_keyed

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
    else:
        missing = [c for c in ("cpu", "cpuacct") if c not in layout.v1]
        if missing:
            raise DemoError(f"no v1 {' or '.join(missing)} hierarchy under {layout.root} ({layout.describe()})")
    return layout_roots(layout, ("cpu", "cpuacct"))


def distinct(roots: Iterable[Path]) -> list[Path]:
    """`roots` in order, each hierarchy once (a co-mounted cpu,cpuacct is reached through two names)."""
    out: dict[str, Path] = {}
    for root in roots:
        out.setdefault(os.path.realpath(root), root)
    return list(out.values())


def layout_roots(layout: Layout, controllers: Iterable[str]) -> list[Path]:
    """The cgroup2 root on v2; else the v1 hierarchies of `controllers` the host has, and the unified tree
    if mounted (koordd reads PSI there)."""
    if layout.mode == "v2":
        return [layout.unified]
    wanted = [layout.v1[c] for c in controllers if c in layout.v1]
    return distinct(wanted + ([layout.unified] if layout.unified else []))


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child before exec: get `sig` when its parent dies, so nothing started outlives a killed run."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def joiner(procs_files: list[str], cpu: int | None = None, death_signal: int = signal.SIGKILL,
           idle_policy: bool = False) -> Callable[[], None]:
    """What a child runs before exec: die with its parent, stay on `cpu`, join the cgroup in every
    hierarchy (so that none of its instructions run anywhere else) and, with `idle_policy`, become a
    SCHED_IDLE task (its threads inherit the policy)."""
    def join() -> None:
        die_with_parent(death_signal)
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        for path in procs_files:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        if idle_policy:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return join


class ScratchTree:
    """`name` (koordd's name for the parent: its path below every root) with children below it, in every
    hierarchy of `roots`; `pass_down`: the controllers our parents enable for their children (cgroup v2:
    those of them the root enables for its own children)."""

    def __init__(self, name: str, roots: Iterable[Path], pass_down: Iterable[str] = ()):
        self.name = name
        self.roots = distinct(roots)
        self.pass_down = tuple(pass_down)
        self.made: list[Path] = []           # what create() made, in order
        self.procs: list[subprocess.Popen] = []
        self.removed = 0                     # directories remove() removed

    def path(self, child: str = "") -> str:
        """The cgroup's name as koordd writes it: relative to the hierarchy root."""
        return f"{self.name}/{child}" if child else self.name

    def create(self, children: Iterable[str]) -> None:
        """The parent and `children` (paths below it, parents listed before their children). A directory
        that exists already raises FileExistsError: it is not ours to use or remove."""
        children = list(children)
        parents = {""} | {c.rpartition("/")[0] for c in children}
        for root in self.roots:
            for child in [""] + children:
                d = root / self.path(child)
                d.mkdir()
                self.made.append(d)
                if "cpuset" in root.resolve().name.split(","):
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (d / f).write_text((d.parent / f).read_text())
                if self.pass_down and child in parents:
                    self._pass_controllers(root, d)

    def _pass_controllers(self, root: Path, d: Path) -> None:
        enabled = set((root / "cgroup.subtree_control").read_text().split())
        wanted = " ".join(f"+{c}" for c in self.pass_down if c in enabled)
        if wanted:
            (d / "cgroup.subtree_control").write_text(wanted)

    def procs_files(self, child: str) -> list[str]:
        """The cgroup.procs file of `child` in every hierarchy: a process writes its pid into each."""
        return [str(root / self.path(child) / "cgroup.procs") for root in self.roots]

    def spawn(self, child: str, argv: list[str], idle_policy: bool = False, **popen) -> subprocess.Popen:
        """Start `argv` inside `child` of every hierarchy, before its first instruction, in a session of
        its own (a Ctrl-C reaches only its parent, which then stops things in order); killed by remove()."""
        popen.setdefault("stdin", subprocess.DEVNULL)
        popen.setdefault("start_new_session", True)
        p = subprocess.Popen(argv, preexec_fn=joiner(self.procs_files(child), idle_policy=idle_policy),
                             close_fds=True, **popen)
        self.procs.append(p)
        return p

    def dirs(self) -> list[Path]:
        """Our directories: what create() made (a subclass that makes its own says which)."""
        return list(self.made)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs():
            try:
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
        return found

    def kill_processes(self, timeout: float = 5.0) -> list[str]:
        """SIGKILL what spawn() started and anything else inside our cgroups; what would not die, as text."""
        problems = []
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                problems.append(f"process {p.pid} did not exit after SIGKILL")
            if p.stdout:
                p.stdout.close()
        self.procs = []
        deadline = time.monotonic() + timeout
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        return problems + ([f"processes still in {self.name}: {sorted(left)}"] if left else [])

    def remove(self, timeout: float = 5.0) -> list[str]:
        """Kill whatever is still in them, then remove them, children first. What could not be done, as text."""
        problems = self.kill_processes(timeout)
        deadline = time.monotonic() + timeout
        for d in sorted(self.dirs(), key=lambda p: -len(p.parts)):
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

    def __enter__(self) -> "ScratchTree":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        problems = self.remove()
        if problems and exc_type is None:
            raise RuntimeError("cleanup failed: " + "; ".join(problems))
        if problems:                         # the error that brought us here stays the one raised
            print("cleanup failed: " + "; ".join(problems), file=sys.stderr)


class DemoCgroups(ScratchTree):
    """The parent cgroup `name` with children ls and be, in every hierarchy of hierarchy_roots()."""

    def __init__(self, layout: Layout, name: str):
        super().__init__(name, hierarchy_roots(layout), ("cpu",) if layout.mode == "v2" else ())
        self.layout = layout
        self.fs = CgroupFS(layout)

    def create(self) -> None:
        if self.layout.mode == "v2":
            enabled = (self.layout.unified / "cgroup.subtree_control").read_text().split()
            if "cpu" not in enabled:
                # The demo does not change the host's root cgroup: that is the operator's call.
                raise DemoError(f"the cpu controller is not enabled for the children of {self.layout.unified}"
                                f" (echo +cpu > {self.layout.unified}/cgroup.subtree_control)")
        try:
            super().create(CHILDREN)
        except FileExistsError as e:        # not ours to remove: left by a demo that was SIGKILLed?
            raise DemoError(f"{e.filename} exists already (left by a demo that was killed? rmdir its"
                            " children ls and be, then it)") from None

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
