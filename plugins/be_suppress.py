"""be_suppress: keep best-effort (BE) CPU use below what latency-sensitive work leaves over.

Reads: node CPU in use, CPU usage of every classified cgroup, `cpu.pressure`
of the LS, LSR and LSE cgroups, and the BE cgroups' current `cpu.max` /
`cpuset.cpus`.

Decides: BE allowance (cores) = CPUs × threshold_percent − non-BE usage −
system usage, where system usage is the node's busy time not inside any
classified cgroup, at least `reserved_cpus`. Non-BE plus system usage is the
peak over `usage_window`, so a short LS spike is not forgotten the next tick.
When an LS cgroup's `cpu.pressure` "some" avg10 exceeds `psi_guard_percent`,
BE shrinks by `psi_guard_shrink_percent` of its current limit every tick,
even if the usage rule would allow more. BE shrinks at once and grows by at
most 10% of the node per tick.

Writes, on the cgroups of class BE (each gets an equal share):
- policy "cfs_quota": `cpu.max` quota = share × period (at least 2000 µs);
  changes under 1% of the node are skipped.
- policy "cpuset": `cpuset.cpus` = ceil(allowance) CPUs (at least 2), whole SMT
  siblings first, spread over NUMA nodes, never the CPUs of LSE cgroups.
Switching policy puts the other knob back to its original value; disabling the
loop or stopping koordd restores both.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from koordd.cgroups import format_cpulist, parse_cpulist
from koordd.knobs import format_cpu_max, parse_cpu_max
from koordd.loop import Action, Loop, restore
from koordd.options import Duration, Option
from koordd.snapshot import CgroupSample, CpuTopology, Snapshot, total_usage

MIN_QUOTA_US = 2000          # koordlet's floor: BE keeps a trickle so it can still make progress
MIN_CPUSET_CPUS = 2
GROW_FRACTION = 0.10         # of the node, per tick
SKIP_FRACTION = 0.01         # of the node: smaller quota changes are noise
DEFAULT_PERIOD_US = 100_000
NON_BE = ("SYSTEM", "LSE", "LSR", "LS")
LATENCY_SENSITIVE = ("LSE", "LSR", "LS")


@dataclass
class State:
    demand: deque = field(default_factory=deque)     # (time, non-BE + system cores)


class BeSuppress(Loop):
    __doc__ = __doc__
    name = "be_suppress"
    options = (
        Option("threshold_percent", float, 65.0, "node CPU share that LS + system + BE may use together",
               min=1, max=100),
        Option("policy", str, "cfs_quota", "how BE is capped: cfs_quota (cpu.max) or cpuset (cpuset.cpus)",
               choices=("cfs_quota", "cpuset")),
        Option("reserved_cpus", float, 0.0, "CPUs always counted as used by the system", min=0),
        Option("usage_window", Duration, Duration(3.0), "peak LS + system usage is taken over this window",
               min=0, max=600),
        Option("psi_guard_percent", float, 40.0,
               "LS cpu.pressure some avg10 above which BE shrinks further; 0 turns the guard off", min=0, max=100),
        Option("psi_guard_shrink_percent", float, 20.0, "how much of its limit BE loses per tick under pressure",
               min=1, max=90),
    )

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        return frozenset({("BE", "cpu.max" if settings.policy == "cfs_quota" else "cpuset.cpus")})

    @staticmethod
    def needs(settings) -> frozenset[str]:
        return frozenset({"cpu_usage", "cpu_pressure", "cpu_max" if settings.policy == "cfs_quota" else "cpuset_cpus"})

    @staticmethod
    def initial_state(settings) -> State:
        return State()

    @staticmethod
    def decide(snapshot: Snapshot, settings, state: State) -> list[Action]:
        be = snapshot.of_class("BE")
        non_be = total_usage(snapshot.of_class(*NON_BE))
        be_used = total_usage(be)
        node_used = snapshot.node.cpu_used
        if not be or non_be is None or be_used is None or node_used is None:
            return []       # first tick or a sensor is blind: hold the current limits
        capacity = snapshot.node.cpu_count
        system = max(node_used - non_be - be_used, settings.reserved_cpus, 0.0)
        demand = _windowed_peak(state.demand, snapshot.time, non_be + system, settings.usage_window)
        allowance = max(capacity * settings.threshold_percent / 100 - demand, 0.0)
        pressure = _peak_pressure(snapshot.of_class(*LATENCY_SENSITIVE))
        guard = settings.psi_guard_percent > 0 and pressure is not None and pressure > settings.psi_guard_percent
        reason = {"capacity": capacity, "threshold_percent": settings.threshold_percent,
                  "non_be_usage": round(non_be, 3), "system_usage": round(system, 3),
                  "demand_peak": round(demand, 3), "be_usage": round(be_used, 3),
                  "allowance": round(allowance, 3), "ls_cpu_pressure_avg10": pressure, "psi_guard": guard}
        why = (f"BE allowance {allowance:.2f} of {capacity} CPUs = {settings.threshold_percent:g}% "
               f"- LS/system peak {demand:.2f}" + (f"; LS cpu pressure {pressure:.1f}% > "
                                                    f"{settings.psi_guard_percent:g}%, shrinking" if guard else ""))
        if settings.policy == "cfs_quota":
            return _quota_actions(be, capacity, allowance, guard, settings, reason, why)
        return _cpuset_actions(snapshot, be, capacity, allowance, guard, settings, reason, why)


def _windowed_peak(window: deque, now: float, value: float, span: float) -> float:
    window.append((now, value))
    while window and window[0][0] < now - span:
        window.popleft()
    return max(v for _, v in window)


def _peak_pressure(samples: tuple[CgroupSample, ...]) -> float | None:
    values = [s.cpu_pressure.some.avg10 for s in samples if s.cpu_pressure and s.cpu_pressure.some]
    return max(values) if values else None


def _quota_actions(be, capacity, allowance, guard, settings, reason, why) -> list[Action]:
    actions = []
    for cg in be:
        # No cpu.max (controller not enabled for the cgroup): ask anyway, so the refusal is on record.
        quota, period = parse_cpu_max(cg.cpu_max) if cg.cpu_max else (None, DEFAULT_PERIOD_US)
        node_us = capacity * period
        current = node_us if quota is None else quota
        target = allowance / len(be) * period
        if guard:
            target = min(target, current * (1 - settings.psi_guard_shrink_percent / 100))
        if target > current:
            target = min(target, current + GROW_FRACTION * node_us)
        target = round(max(target, MIN_QUOTA_US))
        actions.append(restore(cg.path, "cpuset.cpus", "policy is cfs_quota"))
        if quota is not None and abs(target - current) < SKIP_FRACTION * node_us:
            continue
        actions.append(Action(cg.path, "cpu.max", format_cpu_max(target, period),
                              {**reason, "quota_us": target, "period_us": period, "be_cgroups": len(be)}, why))
    return actions


def _cpuset_actions(snapshot, be, capacity, allowance, guard, settings, reason, why) -> list[Action]:
    topology = snapshot.node.topology or tuple(CpuTopology(c, c, 0) for c in range(capacity))
    lse = set()
    for cg in snapshot.of_class("LSE"):
        lse |= parse_cpulist(cg.cpuset_cpus or "")
    usable = [t for t in topology if t.cpu not in lse]
    current = parse_cpulist(be[0].cpuset_cpus or "") or {t.cpu for t in usable}
    want = max(math.ceil(allowance - 1e-9), MIN_CPUSET_CPUS)
    if guard:
        want = min(want, len(current) - max(1, math.floor(len(current) * settings.psi_guard_shrink_percent / 100)))
    want = min(max(want, MIN_CPUSET_CPUS), len(current) + math.ceil(GROW_FRACTION * len(topology)), len(usable))
    cpus = format_cpulist(pick_cpus(usable, want))
    actions = []
    for cg in be:
        actions.append(restore(cg.path, "cpu.max", "policy is cpuset"))
        actions.append(Action(cg.path, "cpuset.cpus", cpus, {**reason, "cpus": want, "lse_cpus": len(lse)}, why))
    return actions


def pick_cpus(usable: list[CpuTopology], n: int) -> set[int]:
    """n CPUs: whole SMT cores first, taken round-robin over NUMA nodes, highest cores and nodes first
    (CPU 0 and its neighbours usually carry the host's interrupts). Same input, same answer,
    and a larger n is a superset of a smaller one, so BE's set only grows or shrinks at the edge."""
    nodes: dict[int, dict[int, list[int]]] = {}
    for t in usable:
        nodes.setdefault(t.numa_node, {}).setdefault(t.core, []).append(t.cpu)
    queues = [sorted(cores.values(), key=lambda cpus: -min(cpus))
              for _, cores in sorted(nodes.items(), reverse=True)]
    order: list[int] = []
    while any(queues):
        for q in queues:
            if q:
                order.extend(sorted(q.pop(0)))
    return set(order[:n])
