"""The strict loader of koordd.toml (one file per node, default /etc/koordd/koordd.toml).

Every table and key is checked against a declared `Option` when the file loads:
a misspelt name, a wrong type or an out-of-range number is an error naming the
file, the line and the key, and every such error in the file is reported at
once, so one edit fixes them all and a bad file never reaches a loop.
"""
from __future__ import annotations

import difflib
import fnmatch
import itertools
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the declared minimum is 3.11; tomli is the same parser
    import tomli as tomllib

from koordd.core.cgroup import match_pattern, normalize_cgroup
from koordd.core.classes import CLASS_NAMES, WORKLOAD_CLASSES
from koordd.core.health import HEALTH_OPTIONS, HealthTargets, LATENCY_SENSITIVE
from koordd.core.kubelet import KUBELET_OPTIONS
from koordd.core.listen import is_loopback, parse_listen
from koordd.core.loop import COMMANDS, NODE
from koordd.core.options import COMMON_LOOP_OPTIONS, ClassList, Option, PatternList
from koordd.core.reclaimable import RECLAIMABLE_OPTIONS
from koordd.core.report import REPORT_OPTIONS, url_problem
from koordd.core.slo import ALL_OPTIONS, REQUIRED, SOURCE_OPTIONS, SloTarget, source_problems
from koordd.core.trust import untrusted

DEFAULT_PATH = Path("/etc/koordd/koordd.toml")
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


class ConfigError(Exception):
    """Everything wrong with one config file, one "<file>:<line>: <message>" per entry."""

    def __init__(self, errors: Iterable[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


class Settings:
    """One section's checked values: attribute access, immutable, equal by value (reload compares them)."""
    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never look up our own slot here (copy/pickle probe before __init__)
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no option {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Settings are immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Settings are immutable")

    def __eq__(self, other: object) -> bool:
        return self._values == other._values if isinstance(other, Settings) else NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._values.items()))

    def __reduce__(self):
        return Settings, (self._values,)

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


def make_settings(options: tuple[Option, ...], values: Mapping[str, Any]) -> Settings:
    """Settings holding every option: `values` converted by their Option, the defaults for the rest.

    ValueError for an unknown name or a bad value (tests and tools build settings this way too).
    """
    known = {o.name: o for o in options}  # a later declaration of a name replaces an earlier one
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s): {', '.join(unknown)}")
    out = {}
    for name, opt in known.items():
        if name not in values:
            out[name] = opt.default
            continue
        try:
            out[name] = opt.convert(values[name])
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    return Settings(out)


def loop_options(loop_cls: type) -> tuple[Option, ...]:
    """`enabled` and `interval`, then the loop's own options."""
    return COMMON_LOOP_OPTIONS + tuple(getattr(loop_cls, "options", ()))


@dataclass(frozen=True)
class ClassRule:
    """cgroups matching any of `patterns` (globs per path component) belong to QoS class `name`;
    `health`: the targets an LS, LSR or LSE rule declares (None: the defaults); `slo`: its SLO (None: none)."""
    name: str
    patterns: tuple[str, ...]
    health: HealthTargets | None = None
    slo: SloTarget | None = None


@dataclass(frozen=True)
class Config:
    path: Path
    daemon: Settings
    classes: tuple[ClassRule, ...]
    loops: Mapping[str, Settings]  # every registered loop; absent sections hold the defaults
    metrics: Settings = field(default_factory=lambda: make_settings(METRICS_OPTIONS, {}))
    reclaimable: Settings = field(default_factory=lambda: make_settings(RECLAIMABLE_OPTIONS, {}))
    report: Settings = field(default_factory=lambda: make_settings(REPORT_OPTIONS, {}))     # the node report
    # "<file>:<line>: warning: ..." for what is valid but likely not meant (koordctl validate prints
    # them, koordd logs them at start and reload): class roots nesting across BE (nested_classes).
    warnings: tuple[str, ...] = ()

    def rule_for(self, cgroup: str) -> ClassRule | None:
        """The first rule with a pattern matching `cgroup`, or None."""
        cg = cgroup.strip("/")
        return next((rule for rule in self.classes if any(match_pattern(p, cg) for p in rule.patterns)), None)

    def classify(self, cgroup: str) -> str | None:
        """The class of the first rule with a matching pattern, or None."""
        rule = self.rule_for(cgroup)
        return rule.name if rule else None

    def health_of(self, cgroup: str) -> HealthTargets | None:
        """The health targets the rule of `cgroup` declares, or None (the defaults apply)."""
        rule = self.rule_for(cgroup)
        return rule.health if rule else None

    def slo_of(self, cgroup: str) -> SloTarget | None:
        """The SLO the rule of `cgroup` declares, or None."""
        rule = self.rule_for(cgroup)
        return rule.slo if rule else None


def load_config(path: Path | str, registry: Mapping[str, type]) -> Config:
    path = Path(path)
    why = untrusted(path)
    if why:
        raise ConfigError([f"{path}: refused: {why}; koordd runs as root and does what this file says, so "
                           f"only root may change it (chown root, chmod go-w), as sshd's StrictModes ask"])
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror or e}"]) from None
    except UnicodeDecodeError as e:  # TOML is UTF-8 by definition
        raise ConfigError([f"{path}: cannot read: not UTF-8 ({e.reason} at byte {e.start})"]) from None
    return parse_config(text, path, registry)


def parse_config(text: str, path: Path | str, registry: Mapping[str, type]) -> Config:
    path = Path(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([_syntax_error(path, text, e)]) from None
    except (ValueError, RecursionError) as e:
        # tomllib's own limits, with no position: an integer of 4300 digits or more (int() refuses it),
        # arrays or inline tables nested too deep for its recursion.
        what = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
        raise ConfigError([f"{path}:{_first_failing_line(text, type(e))}: {what}"]) from None
    c = _Checker(locate_keys(text))
    for key in data:
        if key not in TOP_LEVEL:
            c.unknown((key,), TOP_LEVEL, "table")
    daemon = c.daemon(data.get("daemon", {}))
    classes = c.classes(data.get("classes", []))
    loops = c.loops(data.get("loops", {}), registry)
    metrics = c.metrics(data.get("metrics", {}))
    reclaimable, _ = c.section(RECLAIMABLE_OPTIONS, c.table(data.get("reclaimable", {}), ("reclaimable",)) or {},
                               ("reclaimable",))
    report = c.report(data.get("report", {}))
    if c.errors:
        # Stable sort: file order, with line-less errors (none today) first.
        raise ConfigError(f"{path}:{ln}: {msg}" if ln else f"{path}: {msg}"
                          for ln, msg in sorted(c.errors, key=lambda e: e[0] or 0))
    warnings = tuple(f"{path}:{_line_of(c.lines, ('classes', i, 'cgroups'))}: warning: {msg}"
                     for i, msg in nested_classes(classes))
    return Config(path, daemon, classes, loops, metrics, reclaimable, warnings=warnings, report=report)


def nested_classes(rules: tuple[ClassRule, ...]) -> list[tuple[int, str]]:
    """(index of the BE rule, message) for each BE pattern whose cgroups can hold a cgroup another
    class's pattern matches, and each that can match inside one. A cgroup has the class of its deepest
    match, and koordd never caps, freezes or kills a cgroup that holds an LS, LSR, LSE or SYSTEM one or
    lies inside one: such a BE cgroup is BE in name only (be_suppress and memory_evict leave it alone)."""
    out = []
    for i, outer in enumerate(rules):
        for j, inner in enumerate(rules):
            if outer.name == inner.name or "BE" not in (outer.name, inner.name):
                continue
            for p, q in itertools.product(outer.patterns, inner.patterns):
                if not can_hold(p, q):
                    continue
                if outer.name == "BE":
                    out.append((i, f"BE pattern {p!r} can hold cgroups of {inner.name} pattern {q!r} "
                                   f"(classes[{j}]): a BE cgroup holding one is never capped, frozen or killed"))
                else:
                    out.append((j, f"BE pattern {q!r} can match inside {outer.name} pattern {p!r} "
                                   f"(classes[{i}]): a BE cgroup inside {outer.name} work is never capped, "
                                   f"frozen or killed"))
    return out


def can_hold(outer: str, inner: str) -> bool:
    """Whether a cgroup that pattern `inner` matches can lie below one that `outer` matches (globs per
    component)."""
    o, i = outer.split("/"), inner.split("/")
    return len(i) > len(o) and all(_globs_meet(a, b) for a, b in zip(o, i))


def _globs_meet(a: str, b: str) -> bool:
    """Whether some name matches both fnmatch globs (one path component each). Two character
    classes are taken to meet: a warning too many rather than one missed."""
    x, y, memo = _glob_tokens(a), _glob_tokens(b), {}

    def meet(i: int, j: int) -> bool:
        if (i, j) not in memo:
            if i < len(x) and x[i] == "*":         # the star matches nothing, or what y's next token does
                memo[i, j] = meet(i + 1, j) or (j < len(y) and meet(i, j + 1))
            elif j < len(y) and y[j] == "*":
                memo[i, j] = meet(i, j + 1) or (i < len(x) and meet(i + 1, j))
            elif i == len(x) or j == len(y):
                memo[i, j] = i == len(x) and j == len(y)
            else:
                memo[i, j] = _chars_meet(x[i], y[j]) and meet(i + 1, j + 1)
        return memo[i, j]
    return meet(0, 0)


def _chars_meet(a: str, b: str) -> bool:
    """Whether one character matches both single-character tokens (a literal, "?" or "[...]")."""
    if "?" in (a, b) and min(len(a), len(b)) == 1:
        return True
    if len(a) == 1 and len(b) == 1:
        return a == b
    if len(a) == 1 or len(b) == 1:
        literal, cls = (a, b) if len(a) == 1 else (b, a)
        return fnmatch.fnmatchcase(literal, cls)
    return True


def _syntax_error(path: Path, text: str, e: Exception) -> str:
    msg = str(e)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
    if m:
        return f"{path}:{m[1]}: {msg[:m.start()]} (column {m[2]})"
    m = re.search(r"\s*\(at end of document\)$", msg)
    if m:
        return f"{path}:{max(1, len(_lines(text)))}: {msg[:m.start()]} (at end of file)"
    return f"{path}: {msg}"


def _lines(text: str) -> list[str]:
    """The lines as TOML counts them: ended by LF or CRLF only. str.splitlines() also ends one at \\x85,
    \\u2028, \\x1c..., which may stand in a TOML string or quoted key: every line after would be miscounted."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _first_failing_line(text: str, error: type) -> int:
    """The line where tomllib first raises `error`: the shortest run of whole lines that raises it (a
    shorter one parses, or fails as a syntax error: TOML numbers and brackets up to that line are the
    same in both)."""
    lines = [line + "\n" for line in _lines(text)]

    def fails(n: int) -> bool:
        try:
            tomllib.loads("".join(lines[:n]))
        except error as e:
            return not isinstance(e, tomllib.TOMLDecodeError)
        except Exception:  # noqa: BLE001 - the syntax error of a cut-off document
            return False
        return False

    lo, hi = 1, max(len(lines), 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class _Checker:
    """Walks the parsed file, collecting (line, message) errors instead of stopping at the first."""

    def __init__(self, lines: Mapping[tuple, int]):
        self.lines = lines
        self.errors: list[tuple[int | None, str]] = []

    def error(self, keypath: tuple, msg: str) -> None:
        self.errors.append((_line_of(self.lines, keypath), f"{_dotted(keypath)}: {msg}"))

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


def _line_of(lines: Mapping[tuple, int], keypath: tuple) -> int | None:
    """The key's line, else its nearest enclosing table's (keys inside inline tables are not located)."""
    for n in range(len(keypath), 0, -1):
        if keypath[:n] in lines:
            return lines[keypath[:n]]
    return None


_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _dotted(keypath: tuple) -> str:
    """("classes", 0, "name") -> "classes[0].name"; keys that are not bare get quoted."""
    out = ""
    for p in keypath:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + (p if _BARE.fullmatch(p) else json.dumps(p))
    return out


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)


# --- line locator: tomllib keeps no positions, so find each key's line ourselves -----------------

def locate_keys(text: str) -> dict[tuple, int]:
    """Key path -> 1-based line of its first appearance, for a file tomllib has already accepted.

    Paths look like ("loops", "be_suppress", "threshold_percent") or ("classes", 1, "name");
    a table header maps to its own line, a dotted key's prefixes to the key's line. Lines inside a
    multi-line array, inline table or multi-line string are values, never keys.
    """
    lines: dict[tuple, int] = {}
    table: tuple = ()
    arrays: dict[tuple, int] = {}  # header name path of an array of tables -> its current index
    depth, ml = 0, None  # open brackets and open multi-line string delimiter carried across lines
    for n, line in enumerate(_lines(text), 1):
        if depth or ml:
            depth, ml = _scan_value(line, 0, depth, ml)
            continue
        s = line.lstrip()
        if s.startswith("["):
            is_array = s.startswith("[[")
            names, _ = _parse_key(s, 2 if is_array else 1)
            if not names:
                continue
            if is_array:
                arrays[names] = arrays.get(names, -1) + 1
                # A new entry starts fresh counts for arrays nested under it.
                for k in [k for k in arrays if len(k) > len(names) and k[:len(names)] == names]:
                    del arrays[k]
            table = _resolve(names, arrays)
            for i in range(1, len(table) + 1):
                lines.setdefault(table[:i], n)
            continue
        key, i = _parse_key(s, 0)
        if not key or not s.startswith("=", i):
            continue  # blank line or comment
        full = table + key
        for j in range(len(table) + 1, len(full) + 1):
            lines.setdefault(full[:j], n)
        depth, ml = _scan_value(s, i + 1, 0, None)
    return lines


def _resolve(names: tuple[str, ...], arrays: Mapping[tuple, int]) -> tuple:
    """Header names -> key path, with the current index after each array-of-tables component."""
    out: list = []
    for i, p in enumerate(names):
        out.append(p)
        if names[:i + 1] in arrays:
            out.append(arrays[names[:i + 1]])
    return tuple(out)


def _parse_key(s: str, i: int) -> tuple[tuple[str, ...], int]:
    """A dotted key (bare, "basic" or 'literal' parts) starting at s[i]; () if there is none."""
    parts: list[str] = []
    while True:
        while s.startswith((" ", "\t"), i):
            i += 1
        if s.startswith('"', i):
            j = i + 1
            while j < len(s) and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            parts.append(_unescape(s[i + 1:j]))
            i = j + 1
        elif s.startswith("'", i):
            j = s.find("'", i + 1)
            j = len(s) if j < 0 else j
            parts.append(s[i + 1:j])
            i = j + 1
        else:
            m = _BARE.match(s, i)
            if not m:
                return (), i
            parts.append(m.group())
            i = m.end()
        while s.startswith((" ", "\t"), i):
            i += 1
        if not s.startswith(".", i):
            return tuple(parts), i
        i += 1


def _unescape(inner: str) -> str:
    """A "basic" key's text as TOML reads it ("\\u0065nabled" is enabled), so that its error finds its line."""
    if "\\" not in inner:
        return inner
    try:
        return tomllib.loads(f'k = "{inner}"')["k"]
    except ValueError:
        return inner


def _scan_value(s: str, i: int, depth: int, ml: str | None) -> tuple[int, str | None]:
    """Scan value text from s[i]; returns the bracket depth and open multi-line string after the line."""
    while i < len(s):
        if ml:
            if ml == '"""' and s[i] == "\\":
                i += 2
            elif s.startswith(ml, i):
                i += 3
                for _ in range(2):  # up to two quotes may end the content right before the delimiter
                    if s.startswith(ml[0], i):
                        i += 1
                ml = None
            else:
                i += 1
            continue
        c = s[i]
        if c == "#":
            break
        if s.startswith(('"""', "'''"), i):
            ml, i = s[i:i + 3], i + 3
            continue
        if c in "\"'":
            j = i + 1
            while j < len(s) and s[j] != c:
                j += 2 if c == '"' and s[j] == "\\" else 1
            i = j + 1
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        i += 1
    return depth, ml


def _glob_tokens(glob: str) -> list[str]:
    """"*", "?", a "[...]" class (as fnmatch reads one) or one literal character each."""
    out, i = [], 0
    while i < len(glob):
        if glob[i] == "[":
            j = i + 1 + (glob[i + 1:i + 2] == "!")
            j += glob[j:j + 1] == "]"               # a "]" right after "[" or "[!" is a member
            end = glob.find("]", j)
            if end >= 0:
                out.append(glob[i:end + 1])
                i = end + 1
                continue
        out.append(glob[i])
        i += 1
    return out
