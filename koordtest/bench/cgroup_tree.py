"""A benchmark's own cgroups on this host's real hierarchy: one parent directly under each hierarchy
root the benchmark needs (the cgroup2 root on a v2 host; each v1 hierarchy of the named controllers
plus the unified tree on v1 and hybrid hosts), children below it, processes placed in a child from
their first instruction, and everything removed again: the processes in it killed, then the
directories, children first. Nothing else is written, except the parent's own cgroup.subtree_control
on v2 (to pass the controllers down) and, on v1 cpuset, our cgroups' cpus and mems (copied from the
parent: an empty cpuset takes no task).
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

CGROUP = Path("/sys/fs/cgroup")
PR_SET_PDEATHSIG = 1


def is_v2_host(base: Path = CGROUP) -> bool:
    return (base / "cgroup.controllers").is_file()


def hierarchy_roots(controllers: Iterable[str], base: Path = CGROUP) -> list[Path]:
    """The cgroup2 root on v2; else the v1 hierarchies serving any of `controllers` (a co-mounted
    "cpu,cpuacct" once, not again through its cpu and cpuacct links) and the unified tree if mounted."""
    if is_v2_host(base):
        return [base]
    wanted = set(controllers)
    return [d for d in sorted(base.iterdir())
            if d.is_dir() and not d.is_symlink() and (d / "cgroup.procs").is_file()
            and (wanted & set(d.name.split(",")) or (d / "cgroup.controllers").is_file())]


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child before exec: get `sig` when the benchmark dies, so nothing it started outlives it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class CgroupTree:
    """`name` (koordd's name for the parent: its path below every root) with children below it."""

    def __init__(self, name: str, controllers: Iterable[str], base: Path = CGROUP):
        self.name, self.base = name, base
        self.controllers = tuple(controllers)
        self.roots = hierarchy_roots(self.controllers, base)
        self.made: list[Path] = []
        self.procs: list[subprocess.Popen] = []

    def path(self, child: str = "") -> str:
        """koordd's name for a child (relative to the hierarchy root)."""
        return f"{self.name}/{child}" if child else self.name

    def create(self, children: Iterable[str]) -> None:
        """The parent and `children` (paths below it, parents listed before their children)."""
        children = list(children)
        parents = {""} | {c.rpartition("/")[0] for c in children}
        for root in self.roots:
            for child in [""] + children:
                d = root / self.path(child)
                d.mkdir()
                self.made.append(d)
                if root.name == "cpuset" or "cpuset" in root.name.split(","):
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (d / f).write_text((d.parent / f).read_text())
                if is_v2_host(self.base) and child in parents:
                    self._pass_controllers(root, d)

    def _pass_controllers(self, root: Path, d: Path) -> None:
        enabled = set((root / "cgroup.subtree_control").read_text().split())
        wanted = " ".join(f"+{c}" for c in self.controllers if c in enabled)
        if wanted:
            (d / "cgroup.subtree_control").write_text(wanted)

    def spawn(self, child: str, argv: list[str], idle_policy: bool = False, **popen) -> subprocess.Popen:
        """Start `argv` inside `child` of every hierarchy, before its first instruction; with
        `idle_policy`, as a SCHED_IDLE task (its threads inherit the policy)."""
        targets = [str(root / self.path(child) / "cgroup.procs") for root in self.roots]

        def join():
            die_with_parent()
            for t in targets:
                with open(t, "w") as f:
                    f.write(str(os.getpid()))
            if idle_policy:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

        popen.setdefault("stdin", subprocess.DEVNULL)
        # A session of its own: Ctrl-C reaches only the benchmark, which then stops things in order.
        p = subprocess.Popen(argv, preexec_fn=join, close_fds=True, start_new_session=True, **popen)
        self.procs.append(p)
        return p

    def pids(self) -> set[int]:
        out = set()
        for d in self.made:
            try:
                out |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
        return out

    def kill_processes(self) -> list[str]:
        """SIGKILL what we started and anything else inside our cgroups; what would not die."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        problems = []
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                problems.append(f"process {p.pid} did not exit after SIGKILL")
        self.procs = []
        for _ in range(50):
            left = self.pids()
            if not left:
                return problems
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        return problems + [f"processes still in {self.name}: {sorted(self.pids())}"]

    def remove(self) -> list[str]:
        """Kill the processes, remove every directory made (children first); what could not be."""
        problems = self.kill_processes()
        for d in sorted(self.made, key=lambda p: -len(p.parts)):
            if not _rmdir(d):
                problems.append(f"cannot remove {d}")
        self.made = []
        return problems

    def __enter__(self) -> "CgroupTree":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        problems = self.remove()
        if problems:
            message = "cleanup failed: " + "; ".join(problems)
            if exc_type is None:
                raise RuntimeError(message)
            print(message, file=sys.stderr)      # the error that brought us here stays the one raised


def _rmdir(d: Path, timeout: float = 5.0) -> bool:
    """rmdir, retried: a cgroup whose last task just died is busy for a moment."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
