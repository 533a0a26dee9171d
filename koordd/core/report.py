"""The node report: what a cluster scheduler (a scheduler extender, the origin's sidecar) needs of a node in
one document. Per latency-sensitive workload with an SLO, its latency and the share of its requests over
target; per tenant, its share of the node's CPU and memory, and how evenly the tenants share the node;
the node's usage and capacity, and its reclaimable capacity (koordd/core/reclaimable.py).

    workload      an LS, LSR or LSE class root whose rule declares an SLO (core/slo.py) and that answered
                  requests within the last WINDOW seconds: its latency at the SLO's quantile and p99.9,
                  its requests, and its violation rate (requests over latency_p99 / requests), all over
                  those seconds' histograms together (ReportWindow)
    tenant        the class roots a `[report] tenants` entry's patterns match (a root, or a cgroup above
                  it; the first entry that matches wins); without tenants, or for a root no entry
                  matches, each class root is its own tenant, named by its path
    cpu share     the tenant's cores used / the node's CPUs
    memory share  the tenant's memory.current / the node's MemTotal
    dominant      max(cpu share, memory share): DRF's dominant share
    fairness      Jain's index over the tenants' dominant shares, (Σx)² / (n·Σx²): 1 when all are equal
                  (all zero included), 1/n when one tenant holds everything; None without a tenant

A class root nested in another (an LS job in be.slice) counts its own usage, not its parent's
(Snapshot.own_usage). Pure: `build()` is a function of the snapshot, the settings, the reclaimable
figure and its own state (the window of histograms, and the workloads' history).

    history       per workload, one point per HISTORY_STEP seconds over the last HISTORY_SECONDS (the
                  workload's figures of that round: time, latency at the SLO's quantile, p99.9, violation
                  rate, slack = 1 - latency / target, requests), for at most HISTORY_WORKLOADS workloads
                  (those seen first keep their place); in status.json (`slo_history`, for koordctl slo),
                  not in the pushed report
"""
from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from koordd.core.classes import LATENCY_SENSITIVE
from koordd.core.cgroup_text import normalize_pattern, pattern_rank
from koordd.core.options import Duration, Option
from koordd.core.reclaimable import Reclaimable
from koordd.core.slo import PEER_TIMEOUT_MAX, WINDOW as SLO_WINDOW, SloReading, SloWindow
from koordd.core.snapshot import Snapshot, own_usage

SCHEMA = 1              # the report's schema version: a field's meaning changed, or one was removed
WINDOW = SLO_WINDOW     # seconds of response times a workload's figures are taken over (all of them)
URL_SCHEMES = ("http", "https")
HISTORY_STEP = 10.0         # seconds between two points of a workload's history
HISTORY_SECONDS = 600.0     # how far back the history goes
HISTORY_POINTS = int(HISTORY_SECONDS / HISTORY_STEP)    # 60
HISTORY_WORKLOADS = 16      # workloads with a history, at most (as the metrics' max_cgroups bounds series)
HISTORY_FIELDS = ("time", "latency_us", "latency_p999_us", "violation_rate", "slack", "requests")


class TenantMap(Option):
    """Tenant name -> cgroup patterns (globs per path component), kept as a tuple of (name, patterns) in
    the file's order. Written as a table (`web = ["web.slice", "cache.slice"]`, a single pattern as a
    string) or an array of tables (`{name = "web", cgroups = [...]}`). Converting twice gives the same
    value."""

    def convert(self, value: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
        if isinstance(value, tuple):            # already converted
            pairs = list(value)
        elif isinstance(value, dict):
            pairs = list(value.items())
        elif isinstance(value, list):
            pairs = []
            for i, entry in enumerate(value):
                if not isinstance(entry, dict) or set(entry) != {"name", "cgroups"}:
                    raise ValueError(f"entry {i}: expected a table with 'name' and 'cgroups', got "
                                     f"{entry!r:.60}")
                pairs.append((entry["name"], entry["cgroups"]))
        else:
            raise ValueError("expected a table of tenant name -> cgroup patterns, or an array of tables "
                             "{name, cgroups}")
        out, seen = [], set()
        for name, patterns in pairs:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"a tenant's name must be a non-empty string, got {name!r}")
            if name in seen:
                raise ValueError(f"tenant {name!r} is named twice")
            seen.add(name)
            if isinstance(patterns, str):
                patterns = [patterns]
            if not isinstance(patterns, (list, tuple)) or not patterns \
                    or not all(isinstance(p, str) for p in patterns):
                raise ValueError(f"tenant {name!r}: expected a non-empty array of cgroup path patterns")
            out.append((name, tuple(normalize_pattern(p, f"tenant {name!r}: ") for p in patterns)))
        return tuple(out)


REPORT_OPTIONS = (
    Option("url", str, "", "where the report is POSTed as JSON (http:// or https://; the report names cgroups); "
           "empty: not pushed"),
    Option("interval", Duration, Duration(10.0), "how often the report is pushed", min=0.1, max=3600),
    Option("timeout", Duration, Duration(2.0), "how long one push may take, all told: name lookup, connect, "
           "send and the answer's head", min=0.01, max=PEER_TIMEOUT_MAX),
    TenantMap("tenants", tuple, (), "tenant name -> cgroup patterns that group class roots into tenants "
              "(first match wins); empty: each class root is its own tenant"),
)


def url_problem(url: str) -> str | None:
    """Why `url` cannot be pushed to; None for "" (off) and a usable http:// or https:// URL."""
    if not url:
        return None
    from urllib.parse import urlsplit      # stdlib text parsing, no I/O
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return f"not a URL: {url!r} ({e})"
    if parts.scheme not in URL_SCHEMES:
        return f"must start with http:// or https://, got {url!r}"
    if not parts.hostname:
        return f"names no host: {url!r}"
    if port == 0:
        return f"port 0 cannot be reached: {url!r}"
    if any(c.isspace() for c in url):
        return f"contains white space: {url!r}"
    return None


# --- the report ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    cgroup: str
    cls: str
    requests: int                   # responses over the window
    quantile: float                 # the SLO's quantile (0.99 at violation_target 1%)
    tail_us: float | None           # latency at that quantile
    p999_us: float | None
    target_us: float                # latency_p99
    target_p999_us: float           # latency_p999; 0: none
    violation_rate: float | None    # requests over target_us / requests, 0..1
    violation_target: float         # the share allowed over target_us, 0..1


@dataclass(frozen=True)
class Tenant:
    name: str
    cgroups: tuple[str, ...]        # its class roots
    cpu_cores: float | None
    memory_bytes: float | None
    cpu_share: float | None
    memory_share: float | None
    dominant_share: float | None


@dataclass(frozen=True)
class NodeReport:
    node: str
    time: float                     # Unix time of the snapshot
    cpu_cores: float                # the node's capacity
    memory_bytes: float | None
    cpu_used: float | None          # cores busy
    memory_used: float | None       # MemTotal - MemAvailable
    workloads: tuple[Workload, ...]
    tenants: tuple[Tenant, ...]
    fairness: float | None          # Jain's index over the tenants' dominant shares
    reclaimable: Reclaimable | None
    history: Mapping[str, Any] | None = None    # History.as_dict() of this round; not part of as_dict()

    def as_dict(self) -> dict:
        def r(x, n=6):
            return None if x is None else round(x, n)
        return {
            "schema": SCHEMA, "node": self.node, "time": round(self.time, 3), "window_seconds": WINDOW,
            "capacity": {"cpu_cores": r(self.cpu_cores, 3), "memory_bytes": _int(self.memory_bytes)},
            "usage": {"cpu_cores": r(self.cpu_used, 3), "memory_bytes": _int(self.memory_used)},
            "reclaimable": self.reclaimable.as_dict() if self.reclaimable is not None else None,
            "workloads": [{"cgroup": w.cgroup, "class": w.cls, "requests": w.requests, "quantile": w.quantile,
                           "latency_us": r(w.tail_us, 1), "latency_p999_us": r(w.p999_us, 1),
                           "target_us": w.target_us, "target_p999_us": w.target_p999_us or None,
                           "violation_rate": r(w.violation_rate), "violation_target": r(w.violation_target)}
                          for w in self.workloads],
            "tenants": [{"name": t.name, "cgroups": list(t.cgroups), "cpu_cores": r(t.cpu_cores, 3),
                         "memory_bytes": _int(t.memory_bytes), "cpu_share": r(t.cpu_share),
                         "memory_share": r(t.memory_share), "dominant_share": r(t.dominant_share)}
                        for t in self.tenants],
            "fairness": {"jain_index": r(self.fairness), "tenants": len(self.tenants)},
        }


def _int(x: float | None) -> int | None:
    return None if x is None else int(x)


def jain_index(shares: Sequence[float]) -> float | None:
    """Jain's fairness index (Σx)² / (n·Σx²) of `shares` (each ≥ 0): 1 when all are equal, zero usage
    included (nobody is favoured), down to 1/n when one holds everything; None for no share."""
    n = len(shares)
    if n == 0:
        return None
    square = sum(x * x for x in shares)
    if square == 0:
        return 1.0
    return min(1.0, sum(shares) ** 2 / (n * square))


def dominant_share(cpu_share: float | None, memory_share: float | None) -> float | None:
    """max(cpu share, memory share), of those known; None when neither is."""
    known = [s for s in (cpu_share, memory_share) if s is not None]
    return max(known) if known else None


def share(used: float | None, capacity: float | None) -> float | None:
    return None if used is None or not capacity else used / capacity


def tenant_of(root: str, tenants: Sequence[tuple[str, Sequence[str]]]) -> str:
    """The first tenant with a pattern naming class root `root` or a cgroup above it; else the root's own
    path (the root is a tenant of its own)."""
    for name, patterns in tenants:
        if pattern_rank(root, patterns) < len(patterns):
            return name
    return root or "/"


def slack(w: Workload) -> float | None:
    """Heracles' slack of a workload's latency against its target: 1 - latency / target."""
    return None if w.tail_us is None or not w.target_us else 1 - w.tail_us / w.target_us


class History:
    """Each workload's recent figures, one point per `step` seconds of the monotonic clock over the last
    `span` seconds, for at most `most` workloads (those seen first keep their place; the others are
    counted as left out). State only: the report's builder feeds it every round, no I/O."""

    def __init__(self, most: int = HISTORY_WORKLOADS, step: float = HISTORY_STEP, span: float = HISTORY_SECONDS):
        self.most, self.step, self.span = most, step, span
        self.points: dict[str, deque[tuple[float, tuple]]] = {}    # cgroup -> (monotonic time, point)
        self.slos: dict[str, dict] = {}                             # cgroup -> its class and targets, latest
        self.left_out = 0

    def observe(self, now: float, wall: float, workloads: Sequence[Workload], roots: Iterable[str]) -> None:
        """Add this round's `workloads` (a point for each whose latest is `step` seconds old or more) at
        monotonic `now`, Unix `wall`; forget the cgroups no longer among `roots` (the SLO roots)."""
        keep = set(roots)
        for path in [p for p in self.points if p not in keep]:
            del self.points[path]
        left_out = 0
        for w in workloads:
            if w.cgroup not in keep:
                continue
            points = self.points.get(w.cgroup)
            if points is None:
                if len(self.points) >= self.most:
                    left_out += 1
                    continue
                points = self.points[w.cgroup] = deque(maxlen=max(1, int(self.span / self.step)))
            self.slos[w.cgroup] = {"class": w.cls, "target_us": w.target_us,
                                   "target_p999_us": w.target_p999_us or None,
                                   "violation_target": _r(w.violation_target, 6)}
            if points and now - points[-1][0] < self.step:
                continue
            s = slack(w)
            points.append((now, (round(wall, 1), _r(w.tail_us, 1), _r(w.p999_us, 1), _r(w.violation_rate, 5),
                                 _r(s, 4), w.requests)))
        for path, points in list(self.points.items()):
            while points and now - points[0][0] > self.span:
                points.popleft()
            if not points:
                del self.points[path]
        for path in [p for p in self.slos if p not in self.points]:
            del self.slos[path]
        self.left_out = left_out

    def as_dict(self) -> dict:
        return {"step_seconds": self.step, "seconds": self.span, "fields": list(HISTORY_FIELDS),
                "workloads": {path: [list(p) for _, p in points] for path, points in sorted(self.points.items())},
                "slos": {path: dict(self.slos[path]) for path in sorted(self.points)}, "left_out": self.left_out}


def _r(x: float | None, n: int) -> float | None:
    return None if x is None else round(x, n)


class ReportWindow(SloWindow):
    """Each workload's response times over the last WINDOW seconds, all of them (the report states a rate
    over a fixed window, not the loops' "at least 1000 responses"): core/slo.py's window, state only; and
    the workloads' history (History)."""

    def __init__(self, window: float = WINDOW, history: History | None = None):
        super().__init__(min_responses=sys.maxsize, window=window)
        self.history = history if history is not None else History()


def workloads(snapshot: Snapshot, window: ReportWindow) -> tuple[Workload, ...]:
    """Every LS, LSR or LSE class root with an SLO that answered a request within the window, by path.
    A round without responses adds an empty histogram (the window moves on, older rounds drop out)."""
    out = []
    roots = [c for c in snapshot.of_class(*LATENCY_SENSITIVE) if snapshot.slo_of(c.path) is not None]
    window.forget_except(c.path for c in roots)
    for c in sorted(roots, key=lambda c: c.path):
        slo = snapshot.slo_of(c.path)
        app = (snapshot.section(slo.section) or {}).get(c.path)
        got: SloReading | None = window.reading(c.path, snapshot.time, app.slots if app is not None else (), slo)
        if got is None:
            continue
        out.append(Workload(c.path, c.cls, got.count, round(slo.quantile, 6), got.tail_us, got.p999_us,
                            slo.latency_p99_us, slo.latency_p999_us, got.violations, slo.violation_target / 100))
    window.history.observe(snapshot.time, snapshot.wall, out, (c.path for c in roots))
    return tuple(out)


def tenants(snapshot: Snapshot, patterns: Sequence[tuple[str, Sequence[str]]]) -> tuple[Tenant, ...]:
    """Every tenant with a class root this round: configured ones in their order, then the roots of their
    own by path. Each root counts its own usage (nested roots are theirs), so no cgroup counts twice."""
    roots = sorted(snapshot.of_class(*{c.cls for c in snapshot.cgroups.values() if c.cls}), key=lambda c: c.path)
    groups: dict[str, list] = {name: [] for name, _ in patterns}
    for c in roots:
        groups.setdefault(tenant_of(c.path, patterns), []).append(c)
    cpus, memory = float(snapshot.node.cpu_count), snapshot.node.memory_total
    out = []
    for name, members in groups.items():
        if not members:
            continue
        cpu = own_usage(snapshot, members)
        mem = own_usage(snapshot, members, "memory_current")
        cs, ms = share(cpu, cpus), share(mem, memory)
        out.append(Tenant(name, tuple(c.path for c in members), cpu, mem, cs, ms, dominant_share(cs, ms)))
    return tuple(out)


def build(snapshot: Snapshot, settings, window: ReportWindow, reclaimable: Reclaimable | None = None,
          node: str = "") -> NodeReport:
    """This round's report; `settings`: [report] (its tenants); `window` advanced by the snapshot."""
    n = snapshot.node
    ts = tenants(snapshot, settings.tenants)
    used = n.memory_total - n.memory_available if n.memory_total is not None and n.memory_available is not None \
        else None
    ws = workloads(snapshot, window)
    return NodeReport(node, snapshot.wall, float(n.cpu_count), n.memory_total, n.cpu_used, used, ws, ts,
                      jain_index([t.dominant_share for t in ts if t.dominant_share is not None]), reclaimable,
                      window.history.as_dict())


# What build() reads of each class root (already read every round for the reclaimable figure).
FIELDS = frozenset(("cpu_usage", "memory_current"))

