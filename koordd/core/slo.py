"""Service-level objectives of latency-sensitive classes: the latency their own users may see.

An LS, LSR or LSE class rule may declare an SLO in a `[classes.slo]` table: the response time at the
99th percentile (`latency_p99`, required), optionally at the 99.9th (`latency_p999`), where the latency
comes from (`source`) and the share of requests allowed over `latency_p99` (`violation_target`). Its
slack is Heracles' (target - measured) / target, read by every loop that reads LS slack next to the
run-queue and PSI signals (core/health.py's ls_signals): the worst one wins. Pure: the measurements come
from the snapshot, the window over rounds is loop state.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from koordd.core.histogram import HistogramWindow, quantile_us, share_over_us
from koordd.core.options import Duration, Option

# Where an SLO's latency comes from -> the optional sensor that measures it (its name is its snapshot
# section; "app_latency" is core/snapshot.py's APP_LATENCY, which imports this module). The one list of
# sources: the option's choices, the sensor the daemon runs for an SLO and the section ls_signals reads.
SOURCES: Mapping[str, str] = {
    "measured": "app_latency",      # the application latency sensor (docs/app-latency.md)
    "prometheus": "slo_prometheus",  # the service's own Prometheus histogram (sensors/slo_prometheus.py)
    "probe": "slo_probe",           # a synthetic request koordd sends and times (sensors/slo_probe.py)
}

# The longest a network peer's exchange may take (a probe's, a report push's): well under half of the
# shipped unit's WatchdogSec=30s, though no stop or reload waits on an exchange (kernel/netpeer.py cancels it).
PEER_TIMEOUT_MAX = 10.0

MIN_RESPONSES = 1000    # a p99.9 over fewer responses is their maximum; a p99 of 1000 ignores its 10 worst
WINDOW = 10.0           # seconds: no older round counts (the benchmark judges an SLO over 10 s windows)

SLO_OPTIONS = (
    Option("latency_p99", Duration, Duration(0), "required (no default): the response time the class's requests "
           "must meet at the 99th percentile (the share violation_target allows over it)", min=0.00001, max=60),
    Option("latency_p999", Duration, Duration(0), "the response time at the 99.9th percentile; 0: none",
           min=0, max=60),
    Option("source", str, "measured", "where the latency comes from: measured (the app_latency sensor, "
           "docs/app-latency.md), prometheus (the service's own histogram: url, metric, labels) or probe "
           "(a request koordd sends and times: probe, probe_send, probe_expect, probe_interval, "
           "probe_timeout)", choices=tuple(SOURCES)),
    Option("violation_target", float, 1.0, "percent of requests allowed over latency_p99: 1 judges the p99, "
           "5 the p95", min=0.01, max=50),
)


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
MAX_LABELS = 16


class LabelMatchers(Option):
    """A table of exact label matchers, label name -> value, kept as a sorted tuple of pairs (hashable)."""

    def convert(self, value):
        items = value.items() if isinstance(value, Mapping) else value
        if not isinstance(items, (tuple, list)) and not isinstance(value, Mapping):
            raise ValueError('expected a table of label = "value"')
        try:
            pairs = [(k, v) for k, v in items]
        except (TypeError, ValueError):
            raise ValueError('expected a table of label = "value"') from None
        if len(pairs) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} label matchers, got {len(pairs)}")
        for k, v in pairs:
            if not isinstance(k, str) or not _LABEL_NAME.match(k) or k == "le":
                raise ValueError(f"{k!r} is not a label name a histogram series can be matched on")
            if not isinstance(v, str):
                raise ValueError(f"label {k}: expected a string, got {type(v).__name__}")
        return tuple(sorted(pairs))


def _metric(value: str) -> str | None:
    return None if _METRIC_NAME.match(value) else f"not a metric name: {value!r}"


# The options of one source each: a key of another source's list is an error (config.py).
PROMETHEUS_OPTIONS = (
    Option("url", str, "", 'source prometheus, required: the service\'s metrics, "http://host:port/path" '
           "(scraped every second, 2 s at most all told; less often while its answers cost over 2% of a CPU)"),
    Option("metric", str, "", "source prometheus, required: the histogram's base name (koordd reads its "
           "_bucket series; bounds in seconds)"),
    LabelMatchers("labels", dict, (), "source prometheus: exact label matchers (a table); the series that "
                  "match are summed"),
)
PROBE_OPTIONS = (
    Option("probe", str, "", 'source probe, required: where to send it, "tcp://host:port" or "unix:/path"'),
    Option("probe_send", str, "PING\r\n", "source probe: the request, sent on a fresh connection"),
    Option("probe_expect", str, "", "source probe: what the answer must start with; \"\": any answer"),
    Option("probe_interval", Duration, Duration(1.0), "source probe: how often it is sent", min=0.01, max=60),
    Option("probe_timeout", Duration, Duration(0), "source probe: an answer later than this counts at it (a "
           "violation); 0: latency_p99 x 10, at most 5s", min=0, max=PEER_TIMEOUT_MAX),
)
SOURCE_OPTIONS: Mapping[str, tuple[Option, ...]] = {"measured": (), "prometheus": PROMETHEUS_OPTIONS,
                                                     "probe": PROBE_OPTIONS}
REQUIRED: Mapping[str, tuple[str, ...]] = {"measured": (), "prometheus": ("url", "metric"), "probe": ("probe",)}
ALL_OPTIONS = SLO_OPTIONS + PROMETHEUS_OPTIONS + PROBE_OPTIONS
assert set(SOURCE_OPTIONS) == set(SOURCES) == set(REQUIRED)


def url_problem(url: str) -> str | None:
    """Why `url` is no scrape target; None for an http://host[:port]/path URL."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return f"not a URL: {url!r} ({e})"
    if parts.scheme != "http":
        return f"must start with http://, got {url!r}"
    if not parts.hostname:
        return f"names no host: {url!r}"
    if port == 0:
        return f"port 0 cannot be reached: {url!r}"
    if any(c.isspace() or ord(c) < 32 for c in url):
        return f"contains white space or control characters: {url!r}"
    return None


def parse_probe(address: str) -> tuple[str, Any]:
    """("tcp", (host, port)) or ("unix", path) of a probe address; ValueError saying what is wrong."""
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        if not path.startswith("/") or "\0" in path or len(path.encode()) > 107:
            raise ValueError(f'expected "unix:/absolute/path" (at most 107 bytes), got {address!r}')
        return "unix", path
    if address.startswith("tcp://"):
        try:
            parts = urlsplit(address)
            port = parts.port
        except ValueError as e:
            raise ValueError(f"not an address: {address!r} ({e})") from None
        if not parts.hostname or not port or parts.path or parts.query or parts.fragment or parts.username:
            raise ValueError(f'expected "tcp://host:port" with a port of 1 to 65535, got {address!r}')
        return "tcp", (parts.hostname, port)
    raise ValueError(f'expected "tcp://host:port" or "unix:/path", got {address!r}')


def source_problems(values: Mapping[str, Any]) -> dict[str, str]:
    """Option name -> why its value cannot be used, for the source-specific keys set in `values`."""
    out: dict[str, str] = {}
    if "url" in values and (why := url_problem(values["url"])):
        out["url"] = why
    if "metric" in values and (why := _metric(values["metric"])):
        out["metric"] = why
    if "probe" in values:
        try:
            parse_probe(values["probe"])
        except ValueError as e:
            out["probe"] = str(e)
    if "probe_send" in values and not values["probe_send"]:
        out["probe_send"] = "must not be empty: the probe times the answer to a request"
    for key in ("probe_send", "probe_expect"):
        if len(values.get(key, "").encode()) > 4096:
            out[key] = "at most 4096 bytes"
    return out


@dataclass(frozen=True)
class SloTarget:
    latency_p99_us: float
    latency_p999_us: float = 0.0     # 0: none
    source: str = "measured"
    violation_target: float = 1.0    # percent of requests allowed over latency_p99_us
    # source "prometheus": where the histogram is scraped, its base name and exact label matchers
    url: str = ""
    metric: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    # source "probe": the address, the request, the answer's start ("": any), seconds between probes and
    # the timeout (0: latency_p99 x 10, at most 5 s)
    probe: str = ""
    probe_send: str = "PING\r\n"
    probe_expect: str = ""
    probe_interval: float = 1.0
    probe_timeout: float = 0.0

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> SloTarget:
        """From checked config values (option name -> value); a key left out takes its default."""
        v = {o.name: values.get(o.name, o.default) for o in ALL_OPTIONS}
        return cls(round(v["latency_p99"] * 1e6, 3), round(v["latency_p999"] * 1e6, 3), v["source"],
                   float(v["violation_target"]), v["url"], v["metric"], tuple(v["labels"]), v["probe"],
                   v["probe_send"], v["probe_expect"], float(v["probe_interval"]), float(v["probe_timeout"]))

    @property
    def timeout(self) -> float:
        """Seconds the probe waits for an answer: probe_timeout, else latency_p99 x 10, at most 5 s."""
        return self.probe_timeout or min(self.latency_p99_us * 10 / 1e6, 5.0)

    @property
    def quantile(self) -> float:
        """The quantile held to latency_p99_us: 0.99 at the default violation_target of 1%."""
        return 1 - self.violation_target / 100

    @property
    def section(self) -> str:
        """The snapshot section (the optional sensor) its latency comes from."""
        return SOURCES[self.source]


def violation_rate(slots: Sequence[int], target_us: float) -> float | None:
    """Requests over `target_us` / requests (0..1) of a log2 histogram of response times, interpolated
    within the slot the target falls in as quantile_us does; None without a request."""
    return share_over_us(slots, target_us)


@dataclass(frozen=True)
class SloReading:
    """An SLO's measurement over enough responses: their count, the latency at the SLO's quantile (its
    p99 at the default violation_target), the p99.9, and the share of them over latency_p99."""
    count: int
    tail_us: float
    p999_us: float
    violations: float


def reading(slots: Sequence[int], target: SloTarget) -> SloReading | None:
    """`target`'s measurement of one histogram; None without a response."""
    count = sum(slots)
    if count == 0:
        return None
    return SloReading(count, quantile_us(slots, target.quantile), quantile_us(slots, 0.999),
                      violation_rate(slots, target.latency_p99_us))


class SloWindow(HistogramWindow):
    """Each class root's recent rounds of response times, so that its tail is taken over at least
    MIN_RESPONSES responses and no round older than WINDOW seconds counts (HistogramWindow: a busy service
    is judged by its latest round alone, a quiet one by its latest rounds together). Loop state, no I/O."""

    def __init__(self, min_responses: int = MIN_RESPONSES, window: float = WINDOW):
        super().__init__(min_responses, window)

    def reading(self, path: str, now: float, slots: Sequence[int], target: SloTarget) -> SloReading | None:
        """Add this round's histogram of `path` and return its measurement over enough recent responses."""
        return reading(self.add(path, now, slots), target)


def sensor_users(slos: Iterable[tuple[str, SloTarget]]) -> dict[str, list[str]]:
    """(class name, its SLO) of each rule that declares one -> sensor name -> its users ("the SLO of class
    LS"): the sensors the daemon runs for the SLOs, whatever the loops need."""
    out: dict[str, list[str]] = {}
    for cls, target in slos:
        users = out.setdefault(target.section, [])
        if (user := f"the SLO of class {cls}") not in users:
            users.append(user)
    return out
