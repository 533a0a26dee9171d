"""Which cgroups no loop may evict or throttle: those of a protected class (SYSTEM, LSE, LSR, LS), the
cgroups of PID 1 and koordd, and every cgroup above them. Pure: the loops pick their targets with it
and the actuator's guard (koordd/act/protect.py) refuses by it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from koordd.core.classes import PROTECTED_CLASSES




def _ancestry(cgroup: str) -> list[str]:
    """`cgroup` and every cgroup above it, up to the root ""."""
    out = [cgroup]
    while cgroup:
        cgroup = cgroup.rpartition("/")[0]
        out.append(cgroup)
    return out


@dataclass(frozen=True)
class Protected:
    """The protected cgroups of one round: built from the snapshot's classes and the cgroups of
    PID 1 and koordd. why(target) says why a target is protected, or None."""
    classes: Mapping[str, str] = field(default_factory=dict)      # cgroup -> protected class, as sampled
    holders: Mapping[str, str] = field(default_factory=dict)      # cgroup -> what it is or holds

    @staticmethod
    def of(classes: Mapping[str, str | None], processes: Mapping[str, str]) -> "Protected":
        """`classes`: cgroup -> class (the snapshot's); `processes`: cgroup -> whose it is."""
        protected = {cg: cls for cg, cls in classes.items() if cls in PROTECTED_CLASSES}
        holders: dict[str, str] = {}
        for cg, whose in processes.items():
            holders[cg] = f"is the cgroup of {whose}"
            for up in _ancestry(cg)[1:]:
                holders.setdefault(up, f"holds {cg or '/'}, the cgroup of {whose}")
        for cg, cls in sorted(protected.items()):
            for up in _ancestry(cg)[1:]:
                holders.setdefault(up, f"holds {cg}, of class {cls}")
        return Protected(protected, holders)

    @staticmethod
    def of_snapshot(snapshot) -> "Protected":
        """The classes' part of the guard for a snapshot's class roots, for loops choosing targets:
        what they pick the actuator would not refuse (it adds the cgroups of PID 1 and koordd)."""
        return Protected.of({path: c.cls for path, c in snapshot.cgroups.items()}, {})

    def why(self, target: str) -> str | None:
        target = target.strip("/")
        held = self.holders.get(target)
        if held is not None:
            return held
        # _ancestry(target) walked without building it: asked for every pod of a class each round.
        classes, up = self.classes, target
        while True:
            cls = classes.get(up)
            if cls is not None:
                return f"is of class {cls}" if up == target else f"lies below {up}, of class {cls}"
            if not up:
                return None
            up = up.rpartition("/")[0]
