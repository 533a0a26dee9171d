"""A benchmark's own cgroups on this host's real hierarchy: the scratch tree of koordctl.demo.cgroups (the
one implementation, shipped because the demo runs on nodes), in every hierarchy the benchmark names:
the cgroup2 root on a v2 host; each v1 hierarchy of the named controllers plus the unified tree on v1
and hybrid hosts. See ScratchTree for what is written and how it is removed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from koordctl.demo.cgroups import ScratchTree, die_with_parent, layout_roots
from koordd.kernel.cgroupfs import detect_layout

CGROUP = Path("/sys/fs/cgroup")

__all__ = ["CGROUP", "CgroupTree", "die_with_parent", "hierarchy_roots", "is_v2_host"]


def is_v2_host(base: Path = CGROUP) -> bool:
    return (base / "cgroup.controllers").is_file()


def hierarchy_roots(controllers: Iterable[str], base: Path = CGROUP) -> list[Path]:
    """The cgroup2 root on v2; else the v1 hierarchies serving any of `controllers` (a co-mounted
    "cpu,cpuacct" once) and the unified tree if mounted."""
    return layout_roots(detect_layout(base), controllers)


class CgroupTree(ScratchTree):
    """`name` (koordd's name for the parent: its path below every root) with children below it, in the
    hierarchies of `controllers`; on v2 the parents pass those controllers down (those the root enables)."""

    def __init__(self, name: str, controllers: Iterable[str], base: Path = CGROUP):
        controllers = tuple(controllers)
        super().__init__(name, hierarchy_roots(controllers, base), controllers if is_v2_host(base) else ())
        self.base, self.controllers = base, controllers
