"""What a koordd.toml may hold, and the walk that checks a parsed one against it.

Every table and key is checked against a declared `Option`: a misspelt name, a wrong type or an
out-of-range number is an error naming the key path, placed at its line (toml_lines.py); every error
in the file is collected, none stops the walk.
"""
from __future__ import annotations

import difflib
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from koordd.core.cgroup_text import normalize_cgroup
from koordd.core.class_rules import ClassRule
from koordd.core.classes import CLASS_NAMES, WORKLOAD_CLASSES
from koordd.core.health import HEALTH_OPTIONS, HealthTargets, LATENCY_SENSITIVE
from koordd.core.kubelet import KUBELET_OPTIONS
from koordd.core.listen import is_loopback, parse_listen
from koordd.core.loop import COMMANDS, NODE
from koordd.core.options import ClassList, Option, PatternList
from koordd.core.report import REPORT_OPTIONS, url_problem
from koordd.core.settings import Settings, loop_options, make_settings
from koordd.core.slo import ALL_OPTIONS, REQUIRED, SOURCE_OPTIONS, SloTarget, source_problems
from koordd.core.toml_lines import dotted, line_of

TOP_LEVEL = ("daemon", "classes", "loops", "metrics", "reclaimable", "report")
CLASS_KEYS = ("name", "cgroups", "health", "slo")       # of a [[classes]] rule

DAEMON_OPTIONS: tuple[Option, ...] = (
    Option("cgroup_root", str, "", 'cgroup hierarchy root; "" detects v2, v1 or hybrid under /sys/fs/cgroup '
                                   "(takes effect on restart)"),
    Option("state_dir", str, "/var/lib/koordd", "restore journal, decision log and status file (takes effect "
                                                "on restart)"),
    Option("dry_run", bool, False, "decide and log every write, but write nothing (takes effect on restart)"),
    Option("log_level", str, "info", "log verbosity", choices=("debug", "info", "warning", "error")),
) + KUBELET_OPTIONS          # which knobs of the kubelet's cgroups koordd leaves to it (koordd/core/kubelet.py)

# The Prometheus endpoint (koordd/runtime/metrics.py, docs/metrics.md). Workload-chosen cgroup names become label
# values: the allow-list and the cap keep their number bounded whatever the workloads do.
METRICS_OPTIONS: tuple[Option, ...] = (
    Option("enable", bool, False, "serve Prometheus metrics (/metrics) and a liveness check (/healthz) over HTTP"),
    Option("listen", str, "127.0.0.1:9316", '"address:port" to serve on: a loopback address (127.0.0.0/8, '
                                           "[::1], localhost) unless allow_remote"),
    Option("allow_remote", bool, False, "let listen be a non-loopback address: the metrics name cgroups and "
                                        "knobs, and koordd's unit still allows localhost only (IPAddressAllow=)"),
    Option("max_cgroups", int, 100, "per-cgroup series for at most this many cgroups (class roots first, then "
                                    "by path), and as many held knobs; the rest are counted, not shown", min=0,
           max=100_000),
    ClassList("cgroup_classes", tuple, WORKLOAD_CLASSES, "classes whose cgroups (roots and the pods "
              "a loop reads) get per-cgroup series", choices=CLASS_NAMES),
    PatternList("cgroup_patterns", tuple, (), "cgroups (globs per path component) that get per-cgroup series "
                                              "whatever their class, with the cgroups below them"),
)


class Checker:
    """Walks the parsed file, collecting (line, message) errors instead of stopping at the first."""

    def __init__(self, lines: Mapping[tuple, int]):
        self.lines = lines
        self.errors: list[tuple[int | None, str]] = []

    def error(self, keypath: tuple, msg: str) -> None:
        self.errors.append((line_of(self.lines, keypath), f"{dotted(keypath)}: {msg}"))

    def unknown(self, keypath: tuple, choices: Iterable[str], what: str) -> None:
        choices = list(choices)
        close = difflib.get_close_matches(str(keypath[-1]), choices, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(choices) or 'none'}"
        self.error(keypath, f"unknown {what} ({hint})")

    def table(self, value: Any, keypath: tuple) -> dict | None:
        if isinstance(value, dict):
            return value
        self.error(keypath, f"expected a table, got {_kind(value)}")
        return None

    def section(self, options: tuple[Option, ...], table: dict, keypath: tuple) -> tuple[Settings, bool]:
        """Settings of one table (defaults in place of bad values) and whether it was all good."""
        known = {o.name: o for o in options}
        values, ok = {}, True
        for key, value in table.items():
            opt = known.get(key)
            if opt is None:
                self.unknown(keypath + (key,), known, "key")
                ok = False
                continue
            try:
                values[key] = opt.convert(value)
            except ValueError as e:
                self.error(keypath + (key,), str(e))
                ok = False
        return make_settings(options, values), ok

    def daemon(self, value: Any) -> Settings:
        table = self.table(value, ("daemon",))
        s, _ = self.section(DAEMON_OPTIONS, table or {}, ("daemon",))
        # A relative path would depend on the daemon's working directory.
        if s.cgroup_root and not s.cgroup_root.startswith("/"):
            self.error(("daemon", "cgroup_root"), f'must be an absolute path or "", got {s.cgroup_root!r}')
        if not s.state_dir.startswith("/"):
            self.error(("daemon", "state_dir"), f"must be an absolute path, got {s.state_dir!r}")
        return s

    def metrics(self, value: Any) -> Settings:
        s, _ = self.section(METRICS_OPTIONS, self.table(value, ("metrics",)) or {}, ("metrics",))
        try:
            host, _ = parse_listen(s.listen)
        except ValueError as e:
            self.error(("metrics", "listen"), str(e))
            return s
        if not is_loopback(host) and not s.allow_remote:
            # The series name every cgroup and knob koordd sees: off the node only when asked for.
            self.error(("metrics", "listen"), f"{host} is not a loopback address; the endpoint serves on the node "
                                              "only unless allow_remote = true")
        return s

    def report(self, value: Any) -> Settings:
        """[report]: the node report's tenants and where it is pushed (koordd/core/report.py)."""
        s, _ = self.section(REPORT_OPTIONS, self.table(value, ("report",)) or {}, ("report",))
        if (why := url_problem(s.url)) is not None:
            self.error(("report", "url"), why)
        return s

    def classes(self, value: Any) -> tuple[ClassRule, ...]:
        if not isinstance(value, list):
            self.error(("classes",), f"expected an array of tables ([[classes]]), got {_kind(value)}")
            return ()
        rules = []
        for i, entry in enumerate(value):
            rule = self.class_rule(entry, ("classes", i))
            if rule:
                rules.append(rule)
        return tuple(rules)

    def class_rule(self, entry: Any, kp: tuple) -> ClassRule | None:
        entry = self.table(entry, kp)
        if entry is None:
            return None
        bad = len(self.errors)
        for key in entry:
            if key not in CLASS_KEYS:
                self.unknown(kp + (key,), CLASS_KEYS, "key")
        name = entry.get("name")
        if "name" not in entry:
            self.error(kp, f"missing 'name' (one of {', '.join(CLASS_NAMES)})")
        elif name not in CLASS_NAMES:
            self.error(kp + ("name",), f"must be one of {', '.join(CLASS_NAMES)}, got {name!r}")
        patterns = []
        cgroups = entry.get("cgroups")
        if "cgroups" not in entry:
            self.error(kp, "missing 'cgroups' (an array of cgroup path patterns)")
        elif not isinstance(cgroups, list) or not cgroups:
            got = "an empty array" if cgroups == [] else _kind(cgroups)
            self.error(kp + ("cgroups",), f"expected a non-empty array of cgroup path patterns, got {got}")
        else:
            for j, p in enumerate(cgroups):
                try:
                    if not isinstance(p, str):
                        raise ValueError(f"expected a string, got {_kind(p)}")
                    norm = normalize_cgroup(p)
                    if not norm:  # knobs are never written on the root cgroup
                        raise ValueError(f"pattern names the root cgroup: {p!r}")
                    patterns.append(norm)
                except ValueError as e:
                    self.error(kp + ("cgroups", j), str(e))
        health = self.health(entry["health"], name, kp + ("health",)) if "health" in entry else None
        slo = self.slo(entry["slo"], name, kp + ("slo",)) if "slo" in entry else None
        return ClassRule(name, tuple(patterns), health, slo) if len(self.errors) == bad else None

    def health(self, value: Any, name: Any, kp: tuple) -> HealthTargets | None:
        """A class's [classes.health] table: targets of latency-sensitive work, so LS classes only."""
        table = self.table(value, kp)
        if table is None:
            return None
        if name in CLASS_NAMES and name not in LATENCY_SENSITIVE:
            self.error(kp, f"only LS, LSR and LSE classes declare health targets, not {name}")
            return None
        settings, _ = self.section(HEALTH_OPTIONS, table, kp)
        return HealthTargets.from_values(settings.as_dict())

    def slo(self, value: Any, name: Any, kp: tuple) -> SloTarget | None:
        """A class's [classes.slo] table: the latency its requests must meet, so LS classes only."""
        table = self.table(value, kp)
        if table is None:
            return None
        if name in CLASS_NAMES and name not in LATENCY_SENSITIVE:
            self.error(kp, f"only LS, LSR and LSE classes declare an SLO, not {name}")
            return None
        settings, ok = self.section(ALL_OPTIONS, table, kp)
        source = settings.source
        mine = {o.name for o in SOURCE_OPTIONS.get(source, ())}
        for other, options in SOURCE_OPTIONS.items():
            for o in options:
                if other != source and o.name in table and o.name not in mine:
                    self.error(kp + (o.name,), f"is an option of source = {other!r}, not of {source!r}")
                    ok = False
        for key in REQUIRED.get(source, ()):
            if key not in table:
                self.error(kp, f"missing {key!r} (source = {source!r} requires it)")
        for key, why in source_problems({k: v for k, v in settings.as_dict().items() if k in table}).items():
            self.error(kp + (key,), why)
        if "latency_p99" not in table:
            self.error(kp, 'missing \'latency_p99\' (the response time the class must meet at its 99th '
                           'percentile, e.g. "5ms")')
        elif ok and 0 < settings.latency_p999 < settings.latency_p99:
            self.error(kp + ("latency_p999",), f"must be 0 (none) or at least latency_p99, got "
                                               f"{settings.latency_p999:g}s under {settings.latency_p99:g}s")
        return SloTarget.from_values(settings.as_dict())

    def loops(self, value: Any, registry: Mapping[str, type]) -> Mapping[str, Settings]:
        checked: dict[str, tuple[Settings, bool]] = {}
        for name, table in (self.table(value, ("loops",)) or {}).items():
            kp = ("loops", name)
            if name not in registry:
                self.unknown(kp, registry, "loop")
            elif (table := self.table(table, kp)) is not None:
                settings, ok = self.section(loop_options(registry[name]), table, kp)
                problems = getattr(registry[name], "problems", None)    # optional for loops not built on Loop
                for option, why in (problems(settings) if ok and problems else {}).items():
                    self.error(kp + (option,), why)
                    ok = False
                checked[name] = (settings, ok)
        self.ownership(checked, registry)
        return MappingProxyType({name: checked[name][0] if name in checked else make_settings(loop_options(cls), {})
                                 for name, cls in registry.items()})

    def ownership(self, checked: Mapping[str, tuple[Settings, bool]], registry: Mapping[str, type]) -> None:
        """Two enabled loops writing one knob of one class would fight: the later section gets the error."""
        owner: dict[tuple[str, str], str] = {}
        for name, (s, ok) in checked.items():  # file order
            if not (ok and s.enabled):  # a section with errors would only add noise
                continue
            clashes: dict[str, list[tuple[str, str]]] = {}
            for pair in sorted(registry[name].writes(s)):
                if pair[1] in COMMANDS:
                    continue        # an act, not a value: nothing for two loops to fight over
                first = owner.setdefault(pair, name)
                if first != name:
                    clashes.setdefault(first, []).append(pair)
            for first, pairs in clashes.items():
                knobs = ", ".join(f"knob {k!r} of " + ("the node" if c == NODE else f"class {c}") for c, k in pairs)
                self.error(("loops", name), f"loops {first!r} and {name!r} both write {knobs};"
                                            " enable only one of them")


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)
