"""A config's [[classes]] rules: which cgroups have which QoS class, and the health targets and SLO an
LS, LSR or LSE rule declares."""
from __future__ import annotations

from dataclasses import dataclass

from koordd.core.cgroup import match_pattern
from koordd.core.health import HealthTargets
from koordd.core.slo import SloTarget


@dataclass(frozen=True)
class ClassRule:
    """cgroups matching any of `patterns` (globs per path component) belong to QoS class `name`;
    `health`: the targets an LS, LSR or LSE rule declares (None: the defaults); `slo`: its SLO (None: none)."""
    name: str
    patterns: tuple[str, ...]
    health: HealthTargets | None = None
    slo: SloTarget | None = None


def rule_for(rules: tuple[ClassRule, ...], cgroup: str) -> ClassRule | None:
    """The first rule with a pattern matching `cgroup`, or None."""
    cg = cgroup.strip("/")
    return next((rule for rule in rules if any(match_pattern(p, cg) for p in rule.patterns)), None)
