"""A config's [[classes]] rules: which cgroups have which QoS class, and the health targets and SLO an
LS, LSR or LSE rule declares."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterable

from koordd.core.cgroup_text import match_pattern
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


Partial = tuple     # indices of the patterns whose first components match a cgroup's path so far


class ClassRules:
    """The rules as a walk of the cgroup tree matches them, parents first: each cgroup's last path
    component is matched once against the glob at its depth of each pattern its parent's components
    matched so far. So one match gives both the cgroup's rule (the first with a pattern matching it
    whole, as rule_for) and whether any pattern can match below it (nothing to walk there when none
    can), and a class root carries its rule, health targets and SLO included, out of the walk."""

    def __init__(self, rules: Iterable[ClassRule] = ()):
        self.rules = tuple(rules)
        # (rule, the pattern's components), in rule order: the first whole match is the first rule's.
        self._patterns = tuple((rule, tuple(p.split("/"))) for rule in self.rules for p in rule.patterns)
        self.patterns = tuple(p for rule in self.rules for p in rule.patterns)
        self.max_depth = max((len(parts) for _, parts in self._patterns), default=0)

    def top(self) -> Partial:
        """The match of the root cgroup (""): every pattern may still match below it."""
        return tuple(range(len(self._patterns)))

    def match(self, cgroup: str, parent: Partial) -> tuple[ClassRule | None, Partial]:
        """(the first rule matching `cgroup`, the patterns that may match below it), given `parent`, the
        patterns the parent's match left."""
        depth = cgroup.count("/") + 1
        name = cgroup.rpartition("/")[2]
        rule, below = None, []
        for i in parent:
            r, parts = self._patterns[i]
            if fnmatch.fnmatchcase(name, parts[depth - 1]):
                if len(parts) > depth:
                    below.append(i)
                elif rule is None:
                    rule = r
        return rule, tuple(below)
