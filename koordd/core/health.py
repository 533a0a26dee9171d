"""What "healthy" means for latency-sensitive work, and how far LS is from it: its slack.

Each LS, LSR or LSE class rule may declare its targets in a `[classes.health]` table; a key left out
takes the default below. Loops that size best-effort work by LS health (be_suppress's rule "slack")
read the same slack: 1 - measured / target for every LS cgroup and signal, the worst one wins, so
10% slack means the worst LS signal is at 90% of its target. Pure: everything comes from the snapshot.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from koordd.core.classes import LATENCY_SENSITIVE
from koordd.core.histogram import merged, quantile_us
from koordd.core.options import Duration, Option


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


MIN_WAITS = 200      # a p99 of fewer waits is little more than their maximum: one unlucky wait
WINDOW = 5.0         # seconds: no older round counts


class RunqWindow:
    """Each LS cgroup's recent rounds of run-queue waits (eBPF histograms), so that its p99 is taken
    over at least MIN_WAITS waits: a cgroup that waits often is judged by its latest round alone, one
    that waits rarely by its latest rounds together, none older than WINDOW seconds. A harm that lasts
    shows all the same (20 bad waits of 200 are 10%, well past the 1% a p99 ignores); one wild wait
    in a quiet second no longer decides. Loop state: the policy feeds it, no I/O."""

    def __init__(self, min_waits: int = MIN_WAITS, window: float = WINDOW):
        self.min_waits, self.window = min_waits, window
        self.rounds: dict[str, deque[tuple[float, tuple[int, ...]]]] = {}

    def p99(self, path: str, now: float, slots: tuple[int, ...]) -> float | None:
        """Add this round's histogram of `path` and return its p99 over enough recent waits."""
        rounds = self.rounds.setdefault(path, deque())
        rounds.append((now, slots))
        while now - rounds[0][0] > self.window:
            rounds.popleft()
        taken, count = [], 0
        for _, h in reversed(rounds):
            taken.append(h)
            count += sum(h)
            if count >= self.min_waits:
                break
        return quantile_us(merged(taken), 0.99)

    def forget_except(self, paths: Iterable[str]) -> None:
        keep = set(paths)
        for path in [p for p in self.rounds if p not in keep]:
            del self.rounds[path]


def ls_signals(snapshot, runq: Mapping | None, window: RunqWindow | None = None) -> list[Signal]:
    """Every LS cgroup's signals this tick against its class's targets. `runq`: the run-queue latency
    section (cgroup -> RunqLatency), or None without that sensor; `window`: where the p99 is taken
    over enough waits (fed with this round), else the round's own p99."""
    out: list[Signal] = []
    ls = snapshot.of_class(*LATENCY_SENSITIVE)
    if window is not None:
        window.forget_except(c.path for c in ls)
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
