"""Builds the snapshot: finds the classified cgroups and asks each sensor for its part."""
from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping, Sequence

from ..cgroups import CgroupFS
from ..knobs import KNOBS, unsupported_knobs
from ..snapshot import CGROUP_FIELDS, Snapshot
from .cgroup import CgroupSensor
from .contract import SensorContext
from .lifecycle import SensorManager
from .node import NodeSensor

Classify = Callable[[str], "str | None"]


def find_classified(fs: CgroupFS, classify: Classify, max_depth: int) -> dict[str, str]:
    """cgroup -> class for each cgroup a rule matches. A matched cgroup is a class root: the
    cgroups below it belong to it and are not listed again, so usage is never counted twice."""
    found: dict[str, str] = {}

    def matched(cg: str) -> bool:
        cls = classify(cg)
        if cls is not None:
            found[cg] = cls
        return cls is not None

    for _ in fs.walk(fs.walk_controller(), max_depth, prune=matched):
        pass
    return found


class Sensors:
    def __init__(self, fs: CgroupFS, classify: Classify, patterns: Sequence[str],
                 proc_root="/proc", sys_root="/sys", optional: SensorManager | None = None):
        self.fs = fs
        self.node = NodeSensor(proc_root, sys_root)
        self.cgroups = CgroupSensor(fs)
        self.set_classes(classify, patterns)
        # The optional sensors (GPU, ...): the daemon starts those the enabled loops need (require()).
        self.optional = optional if optional is not None else SensorManager({})
        self.probe()

    def probe(self) -> None:
        """Which knobs this host has, file by file, and a new chance for unavailable optional sensors
        (at start, and again on reload)."""
        self.unsupported = unsupported_knobs(self.fs)
        self.supported = frozenset(KNOBS) - self.unsupported.keys()
        self.optional.reprobe()

    def close(self) -> None:
        """Stop the optional sensors (the cgroup files are the CgroupFS's to close)."""
        self.optional.stop_all("koordd stopping")

    def set_classes(self, classify: Classify, patterns: Sequence[str]) -> None:
        self.classify = classify
        self.max_depth = max((p.count("/") + 1 for p in patterns), default=0)

    def snapshot(self, watch: Iterable[str] = (), held: Mapping[tuple[str, str], str] | None = None,
                 member_classes: Iterable[str] = (), fields: frozenset[str] = CGROUP_FIELDS,
                 member_fields: frozenset[str] | None = None) -> Snapshot:
        """`watch`: cgroups a loop needs even without a class (e.g. the scope memory_evict protects);
        `held`: the originals of the knobs koordd holds changed, for loops that reason from a base value;
        `member_classes`: classes whose roots' children are sampled too (loops acting per pod);
        `fields`: the CgroupSample fields the loops read: nothing else is read;
        `member_fields`: those read of the members (default: `fields`).
        The optional sensors running (those the loops need) fill the snapshot's sections."""
        now = time.monotonic()
        walk = self.fs.walk_controller()
        classes = find_classified(self.fs, self.classify, self.max_depth)
        for cg in watch:
            if cg not in classes and self.fs.exists(walk, cg):
                classes[cg] = ""
        wanted = set(member_classes)
        children = {root: self.fs.children(walk, root) for root, cls in classes.items() if cls and cls in wanted}
        alive = set(classes) | {c for kids in children.values() for c in kids}
        self.cgroups.forget_except(alive)
        self.fs.close_except(alive)
        samples = {cg: self.cgroups.sample(cg, cls, now, fields) for cg, cls in classes.items()}
        member_fields = fields if member_fields is None else member_fields
        members = {root: tuple(self.cgroups.sample(c, classes[root], now, member_fields) for c in kids)
                   for root, kids in children.items() if kids}
        sampled = {**classes, **{m.path: classes[root] for root, ms in members.items() for m in ms}}
        sections = self.optional.sample(SensorContext(now, sampled))
        return Snapshot(time=now, wall=time.time(), node=self.node.sample(now), cgroups=samples, sections=sections,
                        members=members, held=dict(held or {}), supported=self.supported)
