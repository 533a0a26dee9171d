"""What a koordd.toml may hold, and the walk that checks a parsed one against it.

Every table and key is checked against a declared `Option`: a misspelt name, a wrong type or an
out-of-range number is an error naming the key path, placed at its line (toml_lines.py); every error
in the file is collected, none stops the walk.

The parts: `Checker` collects the errors and checks one table against its options; the sections
([daemon], [metrics], [report]) and the loops' sections are checked here, the [[classes]] rules in
class_check.py.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Iterable, Mapping

from koordd.core.classes import CLASS_NAMES, WORKLOAD_CLASSES
from koordd.core.kubelet import KUBELET_OPTIONS
from koordd.core.listen import is_loopback, parse_listen
from koordd.core.loop import COMMANDS, NODE
from koordd.core.options import ClassList, Option, PatternList
from koordd.core.report import REPORT_OPTIONS, url_problem
from koordd.core.settings import Settings, loop_options, make_settings
from koordd.core.toml_lines import dotted, line_of

TOP_LEVEL = ("daemon", "classes", "loops", "metrics", "reclaimable", "report")

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
        import difflib      # here, not at the top: a valid config never needs it, and the daemon keeps what it imports
        choices = list(choices)
        close = difflib.get_close_matches(str(keypath[-1]), choices, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(choices) or 'none'}"
        self.error(keypath, f"unknown {what} ({hint})")

    def table(self, value: Any, keypath: tuple) -> dict | None:
        if isinstance(value, dict):
            return value
        self.error(keypath, f"expected a table, got {kind_of(value)}")
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

    def top(self, options: tuple[Option, ...], value: Any, name: str) -> Settings:
        """A top-level [name] table's settings (all defaults where it is no table)."""
        s, _ = self.section(options, self.table(value, (name,)) or {}, (name,))
        return s


# --- the sections ----------------------------------------------------------------------------------

def check_daemon(c: Checker, value: Any) -> Settings:
    s = c.top(DAEMON_OPTIONS, value, "daemon")
    # A relative path would depend on the daemon's working directory.
    if s.cgroup_root and not s.cgroup_root.startswith("/"):
        c.error(("daemon", "cgroup_root"), f'must be an absolute path or "", got {s.cgroup_root!r}')
    if not s.state_dir.startswith("/"):
        c.error(("daemon", "state_dir"), f"must be an absolute path, got {s.state_dir!r}")
    return s


def check_metrics(c: Checker, value: Any) -> Settings:
    s = c.top(METRICS_OPTIONS, value, "metrics")
    try:
        host, _ = parse_listen(s.listen)
    except ValueError as e:
        c.error(("metrics", "listen"), str(e))
        return s
    if not is_loopback(host) and not s.allow_remote:
        # The series name every cgroup and knob koordd sees: off the node only when asked for.
        c.error(("metrics", "listen"), f"{host} is not a loopback address; the endpoint serves on the node "
                                       "only unless allow_remote = true")
    return s


def check_report(c: Checker, value: Any) -> Settings:
    """[report]: the node report's tenants and where it is pushed (koordd/core/report.py)."""
    s = c.top(REPORT_OPTIONS, value, "report")
    if (why := url_problem(s.url)) is not None:
        c.error(("report", "url"), why)
    return s


# --- the loops' sections ---------------------------------------------------------------------------

def check_loops(c: Checker, value: Any, registry: Mapping[str, type]) -> Mapping[str, Settings]:
    """[loops.<name>] of every registered loop (defaults for those the file leaves out)."""
    checked: dict[str, tuple[Settings, bool]] = {}
    for name, table in (c.table(value, ("loops",)) or {}).items():
        kp = ("loops", name)
        if name not in registry:
            c.unknown(kp, registry, "loop")
        elif (table := c.table(table, kp)) is not None:
            checked[name] = _loop(c, registry[name], table, kp)
    _ownership(c, checked, registry)
    return MappingProxyType({name: checked[name][0] if name in checked else make_settings(loop_options(cls), {})
                             for name, cls in registry.items()})


def _loop(c: Checker, cls: type, table: dict, kp: tuple) -> tuple[Settings, bool]:
    """One loop's settings, and whether they are all good: its options, then its own problems()."""
    settings, ok = c.section(loop_options(cls), table, kp)
    problems = getattr(cls, "problems", None)    # optional for loops not built on Loop
    for option, why in (problems(settings) if ok and problems else {}).items():
        c.error(kp + (option,), why)
        ok = False
    return settings, ok


def _ownership(c: Checker, checked: Mapping[str, tuple[Settings, bool]], registry: Mapping[str, type]) -> None:
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
            knobs = ", ".join(f"knob {k!r} of " + ("the node" if cls == NODE else f"class {cls}") for cls, k in pairs)
            c.error(("loops", name), f"loops {first!r} and {name!r} both write {knobs};"
                                     " enable only one of them")


def kind_of(value: Any) -> str:
    """A TOML value's kind, as an error names it ("an integer", "a table")."""
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)
