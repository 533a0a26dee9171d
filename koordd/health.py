"""What "healthy" means for latency-sensitive work, and how far LS is from it: its slack.

Each LS, LSR or LSE class rule may declare its targets in a `[classes.health]` table; a key left out
takes the default below. Loops that size best-effort work by LS health (be_suppress's rule "slack")
read the same slack: 1 - measured / target for every LS cgroup and signal, the worst one wins, so
10% slack means the worst LS signal is at 90% of its target. Pure: everything comes from the snapshot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .options import Duration, Option

LATENCY_SENSITIVE = ("LSE", "LSR", "LS")

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


def ls_signals(snapshot, runq: Mapping | None) -> list[Signal]:
    """Every LS cgroup's signals this tick against its class's targets. `runq`: the run-queue latency
    section (cgroup -> RunqLatency), or None without that sensor."""
    out: list[Signal] = []
    for c in snapshot.of_class(*LATENCY_SENSITIVE):
        t = snapshot.health_of(c.path)
        r = (runq or {}).get(c.path)
        if r is not None and r.p99_us is not None:
            out.append((c.path, "runq_p99_us", r.p99_us, t.runq_p99_us))
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
