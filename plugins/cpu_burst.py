"""cpu_burst: let latency-sensitive (LS) cgroups with a CPU quota run over it for short bursts.

Only LS cgroups with a quota (`cpu.max` other than "max") are touched. LSR and
LSE are left alone: their CPUs are reserved (cpuset), so a higher quota would
not give them more CPU to run on; BE is be_suppress's.

Static burst (needs `cpu.max.burst`, v1 `cpu.cfs_burst_us`, kernel 5.14+):
`cpu.max.burst` = base quota × `burst_percent` / 100, clamped to the quota
(the kernel refuses a burst above the quota). Quota a cgroup leaves unused is
then banked, up to the burst, and spent when a burst of work comes; the
cgroup's average stays within its quota. koordlet's default of 1000% therefore
means "burst = quota".

Dynamic quota (`dynamic_quota`): the share pool is the node's CPUs minus the
CPUs of LSE and LSR cgroups (their `cpuset.cpus`; a cpuset spanning every CPU
reserves nothing). Pool load = (node busy − LSE/LSR usage) / pool CPUs; with
`pool_ignores_be` BE usage is left out too (koordlet's rule: BE yields anyway).
  load ≥ `pool_overload_percent`        → overload: every raised quota × 0.8
  0.9 × that ≤ load < it                → cooling: hold
  below                                 → idle: a cgroup throttled since the
                                          last tick (Δnr_throttled > 0) gets × 1.2
The quota stays within [base, base × `max_quota_percent` / 100] (and at most
the whole node), where base is the cgroup's own quota — the original koordd
keeps in its restore journal while it holds the knob, so a restart that
re-adopts a raised quota still knows the base. Back at base the knob is
released. Unknown usage (first tick, a new cgroup) holds.

A token bucket per cgroup bounds how long a quota stays raised: it holds up to
base cores × `quota_burst_period` × (`max_quota_percent` − 100)% of CPU time
(running at the maximum for `quota_burst_period` empties it), starts full,
spends the CPU time used above base, and earns back base − usage while usage
is under 60% of base. With the bucket empty the quota goes back toward base
(× 0.8 per tick) whatever the node does. `quota_burst_period = 0` removes the
bucket.

Writes `cpu.max` (dynamic quota) and `cpu.max.burst` (static burst) of class LS;
a cgroup without a quota gets its burst back. The burst never exceeds the base
nor the current or new quota, so every write is valid whatever order the
actuator puts them in. Disabling either part, the loop, or stopping koordd
restores the knobs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from koordd.core.backend import InvalidValue
from koordd.core.cgroup_text import format_cpu_max, parse_cpu_max, parse_cpulist
from koordd.core.classes import RESERVED_CPUS
from koordd.core.loop import Action, Loop, restore
from koordd.core.options import Duration, Option
from koordd.core.snapshot import CgroupSample, Snapshot, own_usage

SCALE_UP = 1.2               # koordlet's steps
SCALE_DOWN = 0.8
COOLING_FRACTION = 0.9       # of the overload threshold
SPEND_ABOVE = 1.0            # of base: usage above it spends tokens
EARN_BELOW = 0.6             # of base: usage below it earns tokens

OVERLOAD, COOLING, IDLE, UNKNOWN = "overload", "cooling", "idle", "unknown"


@dataclass
class Bucket:
    """What the loop remembers about one LS cgroup between ticks."""
    tokens: float | None = None          # µs of CPU above base it may still use; None: not filled yet
    nr_throttled: int | None = None      # cumulative counter at the last tick


@dataclass
class State:
    last_time: float | None = None
    cgroups: dict[str, Bucket] = field(default_factory=dict)


@dataclass(frozen=True)
class Pool:
    state: str
    cpus: int
    load_percent: float | None
    reason: dict


class CpuBurst(Loop):
    __doc__ = __doc__
    name = "cpu_burst"
    options = (
        Option("burst_percent", float, 1000.0,
               "cpu.max.burst as percent of the base quota, clamped to the quota; 0 leaves the burst alone",
               min=0, max=100000),
        Option("dynamic_quota", bool, True, "raise the quota of throttled LS cgroups while the share pool is idle"),
        Option("pool_overload_percent", float, 50.0,
               "share-pool load at or above which raised quotas shrink (0.9 x this: hold)", min=1, max=100),
        Option("max_quota_percent", float, 300.0, "highest quota, as percent of the base quota", min=100, max=10000),
        Option("quota_burst_period", Duration, Duration(60.0),
               "how long a cgroup may run at max_quota_percent before its token bucket is empty; 0 = no bucket",
               min=0, max=86400),
        Option("pool_ignores_be", bool, False, "leave BE usage out of the pool load (koordlet's rule)"),
    )

    @staticmethod
    def needs(settings) -> frozenset[str]:
        return frozenset({"cpu_usage", "throttling", "cpu_max", "cpu_max_burst", "cpuset_cpus"})

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        out = set()
        if settings.dynamic_quota:
            out.add(("LS", "cpu.max"))
        if settings.burst_percent > 0:
            out.add(("LS", "cpu.max.burst"))
        return frozenset(out)

    @staticmethod
    def initial_state(settings) -> State:
        return State()

    @staticmethod
    def decide(snapshot: Snapshot, settings, state: State) -> list[Action]:
        dt = snapshot.time - state.last_time if state.last_time is not None else 0.0
        state.last_time = snapshot.time
        ls = sorted(snapshot.of_class("LS"), key=lambda c: c.path)
        for gone in set(state.cgroups) - {c.path for c in ls}:
            del state.cgroups[gone]           # vanished or relabelled: a new one starts afresh
        pool = share_pool(snapshot, settings) if settings.dynamic_quota else None
        actions: list[Action] = []
        for cg in ls:
            actions += _cgroup_actions(snapshot, cg, settings, state, pool, dt)
        return actions


def share_pool(snapshot: Snapshot, settings) -> Pool:
    """State of the shared CPU pool (node minus LSE/LSR cores) from this tick's usage."""
    node = snapshot.node
    cpus = frozenset(t.cpu for t in node.topology) or frozenset(range(node.cpu_count))
    reserved_cgroups = snapshot.of_class(*RESERVED_CPUS)
    reserved: set[int] = set()
    for cg in reserved_cgroups:
        try:
            own = parse_cpulist(cg.cpuset_cpus or "")
        except ValueError:
            continue
        if own and not cpus <= own:          # a cpuset spanning the node reserves nothing
            reserved |= own
    pool_cpus = len(cpus - reserved)
    excluded = reserved_cgroups + (snapshot.of_class("BE") if settings.pool_ignores_be else ())
    excluded_usage = own_usage(snapshot, excluded)       # a root nested in another counts once
    threshold = settings.pool_overload_percent
    reason = {"pool_cpus": pool_cpus, "reserved_cpus": len(cpus & reserved),
              "node_used": None if node.cpu_used is None else round(node.cpu_used, 3),
              "excluded_usage": None if excluded_usage is None else round(excluded_usage, 3),
              "pool_overload_percent": threshold}
    if node.cpu_used is None or excluded_usage is None:
        return Pool(UNKNOWN, pool_cpus, None, {**reason, "pool_state": UNKNOWN})
    if pool_cpus <= 0:
        load = 100.0                         # nothing left to share: never grow
    else:
        load = max(node.cpu_used - excluded_usage, 0.0) / pool_cpus * 100
    if load >= threshold:
        s = OVERLOAD
    elif load >= COOLING_FRACTION * threshold:
        s = COOLING
    else:
        s = IDLE
    return Pool(s, pool_cpus, load, {**reason, "pool_load_percent": round(load, 1), "pool_state": s})


def _cgroup_actions(snapshot: Snapshot, cg: CgroupSample, settings, state: State, pool: Pool | None,
                    dt: float) -> list[Action]:
    if cg.cpu_max is None:
        return []                            # no cpu controller here, or unreadable this tick: hold
    try:
        quota, period = parse_cpu_max(cg.cpu_max)
        held = snapshot.held.get((cg.path, "cpu.max"))
        base_quota, base_period = parse_cpu_max(held) if held is not None else (quota, period)
    except InvalidValue:
        return []
    if quota is None or base_quota is None:
        state.cgroups.pop(cg.path, None)
        return [restore(cg.path, "cpu.max.burst", "no CPU quota: nothing to burst")]
    base_cores = base_quota / base_period
    base = round(base_cores * period)        # base in this period's µs (a changed period keeps the cores)
    actions: list[Action] = []
    new_quota = quota
    if pool is not None:
        quota_action, new_quota = _dynamic_quota(snapshot, cg, settings, state, pool, dt, quota, period,
                                                 base, base_cores, held is not None)
        if quota_action is not None:
            actions.append(quota_action)
    if settings.burst_percent > 0 and cg.cpu_max_burst is not None:
        want = min(round(base * settings.burst_percent / 100), base, quota, new_quota)
        if str(want) != cg.cpu_max_burst:
            actions.insert(0, Action(cg.path, "cpu.max.burst", str(want),
                                     {"burst_us": want, "base_quota_us": base, "quota_us": quota,
                                      "period_us": period, "burst_percent": settings.burst_percent},
                                     f"burst {want} µs = {settings.burst_percent:g}% of base quota {base} µs, "
                                     f"at most the quota"))
    return actions


def _dynamic_quota(snapshot, cg, settings, state, pool, dt, quota, period, base, base_cores, held):
    """(the cpu.max action or None, the quota after it)."""
    bucket = state.cgroups.setdefault(cg.path, Bucket())
    throttled = _throttled_since_last_tick(cg, bucket)
    ceiling = max(base, min(math.floor(base * settings.max_quota_percent / 100),
                            snapshot.node.cpu_count * period))
    capacity = None
    if settings.quota_burst_period > 0:
        capacity = base_cores * float(settings.quota_burst_period) * (settings.max_quota_percent - 100) / 100 * 1e6
        if bucket.tokens is None:
            bucket.tokens = capacity
        usage = cg.cpu_usage
        if usage is not None and dt > 0:
            if usage > SPEND_ABOVE * base_cores:
                bucket.tokens -= (usage - base_cores) * dt * 1e6
            elif usage < EARN_BELOW * base_cores:
                bucket.tokens += (base_cores - usage) * dt * 1e6
        bucket.tokens = min(max(bucket.tokens, 0.0), capacity)
    empty = capacity is not None and bucket.tokens <= 0 and capacity > 0

    if empty:
        step, why = SCALE_DOWN, "token bucket empty: back toward base"
    elif pool.state == OVERLOAD:
        step, why = SCALE_DOWN, (f"share pool overloaded ({pool.load_percent:.0f}% ≥ "
                                 f"{settings.pool_overload_percent:g}%)")
    elif throttled and pool.state == IDLE:
        step, why = SCALE_UP, f"throttled {throttled}x on an idle share pool ({pool.load_percent:.0f}%)"
    else:
        step, why = 1.0, ""
    target = quota if step == 1.0 else math.floor(quota * step)
    target = min(max(target, base), ceiling)
    if not why:
        why = "no burst needed" if quota == base else f"quota outside [base {base}, ceiling {ceiling}] µs"
    reason = {**pool.reason, "throttled": throttled,
              "usage": None if cg.cpu_usage is None else round(cg.cpu_usage, 3),
              "base_quota_us": base, "ceiling_us": ceiling, "quota_us": target, "period_us": period,
              "bucket_us": None if capacity is None else round(bucket.tokens),
              "bucket_capacity_us": None if capacity is None else round(capacity)}
    if target == base and held:
        return restore(cg.path, "cpu.max", f"{why}: quota back to its base {base} µs", **reason), base
    if target == quota:
        return None, quota
    return Action(cg.path, "cpu.max", format_cpu_max(target, period), reason,
                  f"{why}: quota {quota} → {target} µs (base {base}, ceiling {ceiling})"), target


def _throttled_since_last_tick(cg: CgroupSample, bucket: Bucket) -> int | None:
    """Δnr_throttled since this loop last looked (other loops' snapshots in between do not hide any)."""
    thr = cg.throttling
    if thr is None:
        return None
    prev, bucket.nr_throttled = bucket.nr_throttled, thr.nr_throttled
    if prev is not None and thr.nr_throttled >= prev:
        return thr.nr_throttled - prev
    return thr.throttled_delta                # first look, or the counter went back (re-created cgroup)
