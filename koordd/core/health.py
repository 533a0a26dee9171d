"""What "healthy" means for latency-sensitive work, and how far LS is from it: its slack.

Each LS, LSR or LSE class rule may declare its targets in a `[classes.health]` table; a key left out
takes the default below. Loops that size best-effort work by LS health (be_suppress's rule "slack")
read the same slack: 1 - measured / target for every LS cgroup and signal, the worst one wins, so
10% slack means the worst LS signal is at 90% of its target. A class that declares an SLO
(`[classes.slo]`, core/slo.py) adds its application's own latency to its signals. Pure: everything
comes from the snapshot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from koordd.core.classes import LATENCY_SENSITIVE
from koordd.core.histogram import HistogramWindow, quantile_us
from koordd.core.options import Duration, Option
from koordd.core.slo import SloWindow, reading


HEALTH_OPTIONS = (
    Option("runq_p99", Duration, Duration(0.002), "run-queue latency p99 (eBPF sensor): how long the class's "
           "threads may wait for a CPU", min=0.00001, max=10),
    Option("runq_mean", Duration, Duration(0.0005), "the mean run-queue wait, used where only schedstat "
           "measures it (no eBPF)", min=0.00001, max=10),
    Option("cpu_pressure", float, 20.0, "cpu.pressure \"some\" avg10, percent: the share of time some of "
           "the class's threads waited for a CPU", min=0.1, max=100),
)


@dataclass(frozen=True)
class HealthTargets:
    runq_p99_us: float
    runq_mean_us: float
    cpu_pressure: float          # percent

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> HealthTargets:
        """From checked config values (option name -> value); a key left out takes its default."""
        v = {o.name: values.get(o.name, o.default) for o in HEALTH_OPTIONS}
        return cls(round(v["runq_p99"] * 1e6, 3), round(v["runq_mean"] * 1e6, 3), float(v["cpu_pressure"]))


DEFAULT_HEALTH = HealthTargets.from_values({})

# A signal: (cgroup, signal name, measured, target)
Signal = tuple[str, str, float, float]


# The SLO's own signals (a class root's, against what its SLO declares); every other signal is a proxy.
SLO_QUANTILES = ("app_p99_us", "app_p999_us")   # its latency at a quantile, over the SloWindow's responses
SOCKET_FULL = "app_socket_full"                 # the round's share of responses sent while their socket was full
SLO_SIGNALS = SLO_QUANTILES + (SOCKET_FULL,)
MIN_WAITS = 200      # a p99 of fewer waits is little more than their maximum: one unlucky wait
WINDOW = 5.0         # seconds: no older round counts


class RunqWindow(HistogramWindow):
    """Each LS cgroup's recent rounds of run-queue waits (eBPF histograms), so that its p99 is taken
    over at least MIN_WAITS waits and no older round than WINDOW seconds counts (HistogramWindow)."""

    def __init__(self, min_waits: int = MIN_WAITS, window: float = WINDOW):
        super().__init__(min_waits, window)

    def p99(self, path: str, now: float, slots: tuple[int, ...]) -> float | None:
        """Add this round's histogram of `path` and return its p99 over enough recent waits."""
        return quantile_us(self.add(path, now, slots), 0.99)


def ls_signals(snapshot, runq: Mapping | None, window: RunqWindow | None = None,
               slo_window: SloWindow | None = None) -> list[Signal]:
    """Every LS cgroup's signals this tick against its class's targets. `runq`: the run-queue latency
    section (cgroup -> RunqLatency), or None without that sensor; `window`: where the p99 is taken
    over enough waits (fed with this round), else the round's own p99. A class root with an SLO
    (core/slo.py) adds its application latency where its source measured any this round: at the SLO's
    quantile (the p99 at the default violation_target) against `latency_p99` ("app_p99_us"), and the
    p99.9 against `latency_p999` where one is declared ("app_p999_us"); `slo_window`: where those are
    taken over enough responses, else the round's own. Where its source tells which responses went out on a
    socket near its limit (the kernel sensor), their share of the round against the share violation_target
    allows ("app_socket_full"): the clients of such a socket wait outside it, so a quantile of the server's
    times reads them early however late they are (docs/app-latency.md)."""
    out: list[Signal] = []
    ls = snapshot.of_class(*LATENCY_SENSITIVE)
    if window is not None:
        window.forget_except(c.path for c in ls)
    if slo_window is not None:
        slo_window.forget_except(c.path for c in ls if snapshot.slo_of(c.path) is not None)
    for c in ls:
        t = snapshot.health_of(c.path)
        r = (runq or {}).get(c.path)
        p99 = window.p99(c.path, snapshot.time, r.slots) if window is not None and r is not None and r.slots \
            else (r.p99_us if r is not None else None)
        if p99 is not None:
            out.append((c.path, "runq_p99_us", p99, t.runq_p99_us))
        elif r is not None and r.mean_us is not None:
            out.append((c.path, "runq_mean_us", r.mean_us, t.runq_mean_us))
        if c.cpu_pressure is not None and c.cpu_pressure.some is not None:
            out.append((c.path, "cpu_pressure_avg10", c.cpu_pressure.some.avg10, t.cpu_pressure))
        out += _slo_signals(snapshot, c.path, slo_window)
    return out


def _slo_signals(snapshot, path: str, slo_window: SloWindow | None) -> list[Signal]:
    """The SLO signals of class root `path`: none without an SLO or without a measurement this round (a
    service that answered nothing is not late)."""
    slo = snapshot.slo_of(path)
    if slo is None:
        return []
    app = (snapshot.section(slo.section) or {}).get(path)      # an AppLatency of the round, or None
    if app is None:
        return []
    if app.slots:
        got = slo_window.reading(path, snapshot.time, app.slots, slo) if slo_window is not None \
            else reading(app.slots, slo)
        tail, p999 = (got.tail_us, got.p999_us) if got is not None else (app.p99_us, app.p999_us)
    else:
        tail, p999 = app.p99_us, app.p999_us
    out = [(path, SLO_QUANTILES[0], tail, slo.latency_p99_us)]
    if slo.latency_p999_us > 0:
        out.append((path, SLO_QUANTILES[1], p999, slo.latency_p999_us))
    if app.crowded is not None:
        out.append((path, SOCKET_FULL, app.crowded / app.count, slo.violation_target / 100))
    return out


def worst_slack(signals: list[Signal], raised: Mapping[tuple[str, str], float] | None = None
                ) -> tuple[float, dict] | None:
    """The worst slack over `signals`, with what set it; None when there is no signal. `raised`:
    (cgroup, signal) -> a target raised above the declared one for a while (used where it is higher)."""
    worst: tuple[float, dict] | None = None
    for cgroup, name, value, target in signals:
        target = max(target, (raised or {}).get((cgroup, name), 0.0))
        slack = 1 - value / target
        if worst is None or slack < worst[0]:
            worst = (slack, {"cgroup": cgroup, "signal": name, "value": round(value, 3), "target": round(target, 3)})
    return worst
