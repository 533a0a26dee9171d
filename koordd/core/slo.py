"""Service-level objectives of latency-sensitive classes: the latency their own users may see.

An LS, LSR or LSE class rule may declare an SLO in a `[classes.slo]` table: the response time at the
99th percentile (`latency_p99`, required), optionally at the 99.9th (`latency_p999`), where the latency
comes from (`source`) and the share of requests allowed over `latency_p99` (`violation_target`). Its
slack is Heracles' (target - measured) / target, read by every loop that reads LS slack next to the
run-queue and PSI signals (core/health.py's ls_signals): the worst one wins. Pure: the measurements come
from the snapshot, the window over rounds is loop state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from koordd.core.histogram import HistogramWindow, quantile_us, share_over_us
from koordd.core.options import Duration, Option

# Where an SLO's latency comes from -> the optional sensor that measures it (its name is its snapshot
# section; "app_latency" is core/snapshot.py's APP_LATENCY, which imports this module). The one list of
# sources: the option's choices, the sensor the daemon runs for an SLO and the section ls_signals reads.
SOURCES: Mapping[str, str] = {
    "measured": "app_latency",      # the application latency sensor (docs/app-latency.md)
}

MIN_RESPONSES = 1000    # a p99.9 over fewer responses is their maximum; a p99 of 1000 ignores its 10 worst
WINDOW = 10.0           # seconds: no older round counts (the benchmark judges an SLO over 10 s windows)

SLO_OPTIONS = (
    Option("latency_p99", Duration, Duration(0), "required (no default): the response time the class's requests "
           "must meet at the 99th percentile (the share violation_target allows over it)", min=0.00001, max=60),
    Option("latency_p999", Duration, Duration(0), "the response time at the 99.9th percentile; 0: none",
           min=0, max=60),
    Option("source", str, "measured", "where the latency comes from: measured (the app_latency sensor, "
           "docs/app-latency.md)", choices=tuple(SOURCES)),
    Option("violation_target", float, 1.0, "percent of requests allowed over latency_p99: 1 judges the p99, "
           "5 the p95", min=0.01, max=50),
)


@dataclass(frozen=True)
class SloTarget:
    latency_p99_us: float
    latency_p999_us: float = 0.0     # 0: none
    source: str = "measured"
    violation_target: float = 1.0    # percent of requests allowed over latency_p99_us

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> SloTarget:
        """From checked config values (option name -> value); a key left out takes its default."""
        v = {o.name: values.get(o.name, o.default) for o in SLO_OPTIONS}
        return cls(round(v["latency_p99"] * 1e6, 3), round(v["latency_p999"] * 1e6, 3), v["source"],
                   float(v["violation_target"]))

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
