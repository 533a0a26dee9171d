"""Builds the snapshot: finds the classified cgroups and asks each sensor for its part."""
from __future__ import annotations

import fnmatch
import time
from dataclasses import replace
from typing import Callable, Iterable, Mapping, Sequence

from koordd.backends.cgroup_knobs import KNOBS, unsupported_knobs
from koordd.core.class_rules import ClassRule, ClassRules
from koordd.core.snapshot import CGROUP_FIELDS, Snapshot
from koordd.kernel.cgroupfs import CgroupFS
from koordd.sensors.cgroup_stats import CgroupSensor
from koordd.sensors.contract import SensorContext
from koordd.sensors.lifecycle import SensorManager
from koordd.sensors.node import NodeSensor

Classify = Callable[[str], "str | None"]


def find_roots(fs: CgroupFS, rules: ClassRules) -> dict[str, ClassRule]:
    """cgroup -> its rule for each class root: a cgroup a rule matches whose class differs from the one
    it lies in. The walk goes on below a match, so a root nested in another (an LS job in be.slice, a
    BE job in an LS pod) is found at any depth: a cgroup has the class of its deepest match. A match of
    the class it already lies in is no root of its own: it belongs to the root above, whose usage
    holds its usage. Each cgroup is matched once (ClassRules.match): its rule, and whether any pattern
    reaches below it (the walk spares the subtrees none does)."""
    rule_of: dict[str, ClassRule] = {}
    partial = {"": rules.top()}             # cgroup -> the patterns that may still match below it

    def match(cg: str) -> tuple[str | None, bool]:
        rule, partial[cg] = rules.match(cg, partial[cg.rpartition("/")[0]])
        if rule is not None:
            rule_of[cg] = rule
        return (rule.name if rule else None), not partial[cg]

    return {cg: rule_of[cg] for cg in _walk_roots(fs, rules.max_depth, match)}


def find_classified(fs: CgroupFS, classify: Classify, max_depth: int,
                    patterns: Sequence[str] | None = None) -> dict[str, str]:
    """cgroup -> class for each class root, as find_roots finds them, of a bare `classify` function
    (tools and tests). `patterns` (the rules' patterns), when given, spare the walk the subtrees no
    pattern reaches into."""
    reaches = _reach(patterns) if patterns is not None else None
    return _walk_roots(fs, max_depth, lambda cg: (classify(cg), reaches is not None and not reaches(cg)))


def _walk_roots(fs: CgroupFS, max_depth: int, match: Callable[[str], "tuple[str | None, bool]"]) -> dict[str, str]:
    """cgroup -> class of each class root; `match(cgroup)`: (its class or None, whether nothing below it
    can match), called parents first."""
    found: dict[str, str] = {}
    inherited: dict[str, str | None] = {"": None}     # cgroup -> the class it has (its own or its parent's)

    def seen(cg: str) -> bool:
        above = inherited.get(cg.rpartition("/")[0])
        cls, done = match(cg)
        if cls is not None and cls != above:
            found[cg] = cls
        inherited[cg] = cls if cls is not None else above
        return done        # True: nothing below can match

    for _ in fs.walk(fs.walk_controller(), max_depth, prune=seen):
        pass
    return found


def _reach(patterns: Sequence[str]) -> Callable[[str], bool]:
    """Whether some pattern can match a cgroup below `cg` (it is longer, and its first parts match cg's)."""
    split = [p.split("/") for p in patterns]

    def reaches(cg: str) -> bool:
        parts = cg.split("/")
        return any(len(pp) > len(parts) and all(fnmatch.fnmatchcase(c, p) for p, c in zip(pp, parts))
                   for pp in split)
    return reaches


class Sensors:
    def __init__(self, fs: CgroupFS, rules: Iterable[ClassRule], proc_root="/proc", sys_root="/sys",
                 optional: SensorManager | None = None, supported: frozenset[str] | None = None):
        """`rules`: the config's [[classes]] rules (Config.classes)."""
        self.fs = fs
        self.node = NodeSensor(proc_root, sys_root)
        self.cgroups = CgroupSensor(fs)
        self.set_classes(rules)
        # The optional sensors (GPU, ...): the daemon starts those the enabled loops need (require()).
        self.optional = optional if optional is not None else SensorManager({})
        # Knobs this host has, for loops to choose from: the daemon's, probed from every backend; else
        # (tools, tests) the cgroup knobs, probed here.
        self.supported = frozenset(KNOBS) - unsupported_knobs(fs).keys() if supported is None else supported

    def set_supported(self, supported: frozenset[str]) -> None:
        """The knobs this host has, probed again (on reload)."""
        self.supported = supported

    def reprobe(self) -> None:
        """A new chance for unavailable optional sensors (on reload)."""
        self.optional.reprobe()

    def close(self) -> None:
        """Stop the optional sensors (the cgroup files are the CgroupFS's to close)."""
        self.optional.stop_all("koordd stopping")

    def set_classes(self, rules: Iterable[ClassRule]) -> None:
        """The class rules (on reload): each class root's rule gives it its class, and its health targets
        and SLO the snapshot carries (Snapshot.health, Snapshot.slo)."""
        self.rules = ClassRules(rules)
        self.patterns = self.rules.patterns
        self.max_depth = self.rules.max_depth

    def class_roots(self) -> dict[str, str]:
        """cgroup -> class of every class root as the tree is now (OSError if it cannot be listed)."""
        return {cg: rule.name for cg, rule in find_roots(self.fs, self.rules).items()}

    def snapshot(self, watch: Iterable[str] = (), held: Mapping[tuple[str, str], str] | None = None,
                 member_classes: Iterable[str] = (), fields: frozenset[str] = CGROUP_FIELDS,
                 member_fields: frozenset[str] | None = None,
                 class_fields: Mapping[str, frozenset[str]] | None = None) -> Snapshot:
        """`watch`: cgroups a loop needs even without a class (e.g. the scope memory_evict protects);
        `held`: the originals of the knobs koordd holds changed, for loops that reason from a base value;
        `member_classes`: classes whose roots' children are sampled too (loops acting per pod);
        `fields`: the CgroupSample fields the loops read: nothing else is read;
        `member_fields`: those read of the members (default: `fields`);
        `class_fields`: class -> fields read of that class's roots beyond `fields` (Loop.class_needs).
        The optional sensors running (those the loops need) fill the snapshot's sections."""
        now = time.monotonic()
        walk = self.fs.walk_controller()
        roots = find_roots(self.fs, self.rules)        # the round's one match of the cgroups against the rules
        classes = {cg: rule.name for cg, rule in roots.items()}
        for cg in watch:
            if cg not in classes and self.fs.exists(walk, cg):
                classes[cg] = ""
        wanted = set(member_classes)
        # A class root nested in another is sampled as a root, never as the other's member (a BE pod
        # memory_evict could kill, or whose usage would count twice).
        children = {root: [c for c in self.fs.children(walk, root) if not classes.get(c)]
                    for root, cls in classes.items() if cls and cls in wanted}
        alive = set(classes) | {c for kids in children.values() for c in kids}
        self.cgroups.forget_except(alive)
        self.fs.close_except(alive)
        extra = class_fields or {}
        samples = {cg: self.cgroups.sample(cg, cls, now, fields | extra.get(cls, frozenset()))
                   for cg, cls in classes.items()}
        member_fields = fields if member_fields is None else member_fields   # frozenset(): listed, not read
        members = {root: tuple(self.cgroups.sample(c, classes[root], now, member_fields) for c in kids)
                   for root, kids in children.items() if kids}
        sampled = {**classes, **{m.path: classes[root] for root, ms in members.items() for m in ms}}
        # What the roots' rules declare: the health targets and SLO loops read of the snapshot.
        slo = {cg: rule.slo for cg, rule in roots.items() if rule.slo is not None}
        sections = self.optional.sample(SensorContext(now, sampled, slo))
        health = {cg: rule.health for cg, rule in roots.items() if rule.health is not None}
        return Snapshot(time=now, wall=time.time(), node=self.node.sample(now), cgroups=samples, sections=sections,
                        members=members, held=dict(held or {}), supported=self.supported, health=health, slo=slo)

    def fill_members(self, snapshot: Snapshot, fields: frozenset[str]) -> Snapshot:
        """The snapshot with its members (listed by snapshot(member_fields=frozenset())) read: `fields`
        of each, at the snapshot's time. Rates are averaged since a member was last read."""
        if not fields or not snapshot.members:
            return snapshot
        members = {root: tuple(self.cgroups.sample(m.path, m.cls, snapshot.time, fields) for m in kids)
                   for root, kids in snapshot.members.items()}
        return replace(snapshot, members=members)
