"""The check of a koordd.toml's [[classes]] rules: each rule's name, its cgroup patterns, and the health
targets and SLO an LS class may declare. Errors go to the file's `Checker` (config_check.py), placed at
their keys' lines; a rule with any error is left out of the result.
"""
from __future__ import annotations

from typing import Any

from koordd.core.cgroup_text import normalize_pattern
from koordd.core.class_rules import ClassRule
from koordd.core.classes import CLASS_NAMES
from koordd.core.config_check import Checker, kind_of
from koordd.core.health import HEALTH_OPTIONS, HealthTargets, LATENCY_SENSITIVE
from koordd.core.settings import Settings
from koordd.core.slo import ALL_OPTIONS, REQUIRED, SOURCE_OPTIONS, SloTarget, source_problems

CLASS_KEYS = ("name", "cgroups", "health", "slo")       # of a [[classes]] rule


def check_classes(c: Checker, value: Any) -> tuple[ClassRule, ...]:
    if not isinstance(value, list):
        c.error(("classes",), f"expected an array of tables ([[classes]]), got {kind_of(value)}")
        return ()
    rules = []
    for i, entry in enumerate(value):
        rule = check_rule(c, entry, ("classes", i))
        if rule:
            rules.append(rule)
    return tuple(rules)


def check_rule(c: Checker, entry: Any, kp: tuple) -> ClassRule | None:
    """One [[classes]] table as a ClassRule; None where it has any error."""
    entry = c.table(entry, kp)
    if entry is None:
        return None
    bad = len(c.errors)
    for key in entry:
        if key not in CLASS_KEYS:
            c.unknown(kp + (key,), CLASS_KEYS, "key")
    name = entry.get("name")
    if "name" not in entry:
        c.error(kp, f"missing 'name' (one of {', '.join(CLASS_NAMES)})")
    elif name not in CLASS_NAMES:
        c.error(kp + ("name",), f"must be one of {', '.join(CLASS_NAMES)}, got {name!r}")
    patterns = _patterns(c, entry, kp)
    health = check_health(c, entry["health"], name, kp + ("health",)) if "health" in entry else None
    slo = check_slo(c, entry["slo"], name, kp + ("slo",)) if "slo" in entry else None
    return ClassRule(name, tuple(patterns), health, slo) if len(c.errors) == bad else None


def _patterns(c: Checker, entry: dict, kp: tuple) -> list[str]:
    """The rule's `cgroups`, each normalized: a non-empty array of strings, none naming the root cgroup."""
    cgroups = entry.get("cgroups")
    if "cgroups" not in entry:
        c.error(kp, "missing 'cgroups' (an array of cgroup path patterns)")
        return []
    if not isinstance(cgroups, list) or not cgroups:
        got = "an empty array" if cgroups == [] else kind_of(cgroups)
        c.error(kp + ("cgroups",), f"expected a non-empty array of cgroup path patterns, got {got}")
        return []
    patterns = []
    for j, p in enumerate(cgroups):
        try:
            if not isinstance(p, str):
                raise ValueError(f"expected a string, got {kind_of(p)}")
            patterns.append(normalize_pattern(p))
        except ValueError as e:
            c.error(kp + ("cgroups", j), str(e))
    return patterns


def _ls_table(c: Checker, value: Any, name: Any, kp: tuple, what: str) -> dict | None:
    """A table only latency-sensitive classes declare (`what` they declare in it): None, with an error,
    where it is no table or the rule's class is another known one."""
    table = c.table(value, kp)
    if table is None:
        return None
    if name in CLASS_NAMES and name not in LATENCY_SENSITIVE:
        c.error(kp, f"only LS, LSR and LSE classes declare {what}, not {name}")
        return None
    return table


def check_health(c: Checker, value: Any, name: Any, kp: tuple) -> HealthTargets | None:
    """A class's [classes.health] table: targets of latency-sensitive work, so LS classes only."""
    table = _ls_table(c, value, name, kp, "health targets")
    if table is None:
        return None
    settings, _ = c.section(HEALTH_OPTIONS, table, kp)
    return HealthTargets.from_values(settings.as_dict())


def check_slo(c: Checker, value: Any, name: Any, kp: tuple) -> SloTarget | None:
    """A class's [classes.slo] table: the latency its requests must meet, so LS classes only."""
    table = _ls_table(c, value, name, kp, "an SLO")
    if table is None:
        return None
    settings, ok = c.section(ALL_OPTIONS, table, kp)
    ok = _slo_source(c, settings, table, kp) and ok
    if "latency_p99" not in table:
        c.error(kp, 'missing \'latency_p99\' (the response time the class must meet at its 99th '
                    'percentile, e.g. "5ms")')
    elif ok and 0 < settings.latency_p999 < settings.latency_p99:
        c.error(kp + ("latency_p999",), f"must be 0 (none) or at least latency_p99, got "
                                        f"{settings.latency_p999:g}s under {settings.latency_p99:g}s")
    return SloTarget.from_values(settings.as_dict())


def _slo_source(c: Checker, settings: Settings, table: dict, kp: tuple) -> bool:
    """The SLO's options against its `source`: none of another source's, the source's required ones
    present, their values as the source takes them. False where an option is another source's."""
    source = settings.source
    ok = True
    mine = {o.name for o in SOURCE_OPTIONS.get(source, ())}
    for other, options in SOURCE_OPTIONS.items():
        for o in options:
            if other != source and o.name in table and o.name not in mine:
                c.error(kp + (o.name,), f"is an option of source = {other!r}, not of {source!r}")
                ok = False
    for key in REQUIRED.get(source, ()):
        if key not in table:
            c.error(kp, f"missing {key!r} (source = {source!r} requires it)")
    for key, why in source_problems({k: v for k, v in settings.as_dict().items() if k in table}).items():
        c.error(kp + (key,), why)
    return ok
