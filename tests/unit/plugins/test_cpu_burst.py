"""Decision tests for cpu_burst: hand-built snapshots in, actions out. No kernel.

The last tests run the decisions through the real actuator on fake cgroup trees, to show that
none of the values the loop asks for is refused by the kernel rules (burst <= quota).
"""
from __future__ import annotations

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import KNOBS
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.decisions import REFUSED
from koordd.core.snapshot import CgroupSample, CpuTopology, NodeSample, Snapshot, Throttling
from koordd_plugins.cpu_burst import CpuBurst, share_pool

LS = "ls.slice/app"
BASE = "50000 100000"


def settings(**kw):
    return make_settings(loop_options(CpuBurst), {"enabled": True, **kw})


def ls(path=LS, quota=BASE, burst="0", usage=0.3, throttled=0, nr_throttled=None, cls="LS", cpuset=""):
    """A sample; `throttled` is this tick's Δnr_throttled (the cumulative counter defaults to it)."""
    thr = None if throttled is None else Throttling(100, throttled if nr_throttled is None else nr_throttled,
                                                    0, 10, throttled)
    return CgroupSample(path=path, cls=cls, cpu_usage=usage, throttling=thr, cpu_max=quota, cpu_max_burst=burst,
                        cpuset_cpus=cpuset)


def snap(node_used, cgroups, cpus=2, t=100.0, held=None, topology=()):
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=cpus, cpu_used=node_used, topology=topology),
                    cgroups={c.path: c for c in cgroups}, held=dict(held or {}),
                    supported=frozenset({"cpu.max", "cpu.max.burst"}))


def decide(snapshot, state=None, **kw):
    s = settings(**kw)
    return CpuBurst.decide(snapshot, s, state if state is not None else CpuBurst.initial_state(s))


def values(actions, knob):
    """The values set on `knob` (None for a restore), in action order."""
    return [a.value for a in actions if a.knob == knob]


# --- static burst ------------------------------------------------------------------------------

@pytest.mark.parametrize("burst_percent, quota, burst_now, held, expect", [
    (1000, BASE, "0", None, ["50000"]),                  # koordlet's 1000% clamped to the quota
    (40, BASE, "0", None, ["20000"]),
    (100, BASE, "0", None, ["50000"]),
    (1000, BASE, "50000", None, []),                     # already in place
    (40, BASE, "50000", None, ["20000"]),                # someone else's larger burst comes down
    (1000, "90000 100000", "0", BASE, ["50000"]),        # raised quota: burst from the base, not the raise
    (1000, "40000 100000", "0", BASE, ["40000"]),        # quota below its base (another writer): <= quota
    (1000, "100000 200000", "0", None, ["100000"]),      # other periods work the same
    (1000, "max 100000", "0", None, [None]),             # no quota: nothing to burst, ours goes back
    (0, BASE, "0", None, []),                            # burst off
])
def test_static_burst_is_clamped_to_the_quota(burst_percent, quota, burst_now, held, expect):
    h = {(LS, "cpu.max"): held} if held else {}
    actions = decide(snap(0.4, [ls(quota=quota, burst=burst_now)], held=h), burst_percent=burst_percent,
                     dynamic_quota=False)
    assert values(actions, "cpu.max.burst") == expect
    assert values(actions, "cpu.max") == []


def test_burst_is_not_written_where_the_host_has_none():
    assert decide(snap(0.4, [ls(burst=None)]), dynamic_quota=False) == []


# --- the share pool ---------------------------------------------------------------------------

def topo(n):
    return tuple(CpuTopology(c, c, 0) for c in range(n))


@pytest.mark.parametrize("node_used, cpus, others, kw, state, load", [
    (0.5, 2, [], {}, "idle", 25.0),
    (0.9, 2, [], {}, "cooling", 45.0),                   # 0.9 × 50% is where cooling starts
    (0.99, 2, [], {}, "cooling", 49.5),
    (1.0, 2, [], {}, "overload", 50.0),
    (1.0, 2, [], {"pool_overload_percent": 80}, "idle", 50.0),
    # An LSR cgroup pinned to CPUs 2-3 of 4: the pool is 2 CPUs, and its usage is not pool load.
    (2.6, 4, [ls("lsr", cls="LSR", usage=1.8, cpuset="2-3")], {}, "idle", 40.0),
    (2.6, 4, [ls("lse", cls="LSE", usage=1.8, cpuset="3"), ls("lsr", cls="LSR", usage=0.0, cpuset="2")], {},
     "idle", 40.0),
    # An LSE cgroup whose cpuset spans the node reserves no CPU (but its usage is still its own).
    (2.6, 4, [ls("lse", cls="LSE", usage=1.8, cpuset="0-3")], {}, "idle", 20.0),
    (2.6, 4, [ls("lse", cls="LSE", usage=1.8, cpuset="")], {}, "idle", 20.0),
    # Every CPU reserved: nothing to share, never grow.
    (1.0, 2, [ls("lse", cls="LSE", usage=0.5, cpuset="0"), ls("lsr", cls="LSR", usage=0.5, cpuset="1")], {},
     "overload", 100.0),
    # BE counts towards the pool load unless pool_ignores_be.
    (1.6, 2, [ls("be", cls="BE", usage=1.2)], {}, "overload", 80.0),
    (1.6, 2, [ls("be", cls="BE", usage=1.2)], {"pool_ignores_be": True}, "idle", 20.0),
    # Unknown: node usage on the first sample, or an LSE/LSR cgroup's usage.
    (None, 2, [], {}, "unknown", None),
    (1.0, 4, [ls("lsr", cls="LSR", usage=None, cpuset="3")], {}, "unknown", None),
])
def test_pool_state(node_used, cpus, others, kw, state, load):
    pool = share_pool(snap(node_used, [ls(), *others], cpus=cpus, topology=topo(cpus)), settings(**kw))
    assert pool.state == state
    assert pool.load_percent == (pytest.approx(load) if load is not None else None)


def test_pool_without_topology_counts_cpu_ids_from_the_cpu_count():
    pool = share_pool(snap(1.0, [ls("lsr", cls="LSR", usage=0.0, cpuset="3")], cpus=4), settings())
    assert (pool.cpus, pool.state) == (3, "idle")


# --- dynamic quota ---------------------------------------------------------------------------

@pytest.mark.parametrize("node_used, quota, held, throttled, expect", [
    (0.5, BASE, None, 5, ["60000 100000"]),              # idle + throttled: × 1.2
    (0.5, BASE, None, 0, []),                            # idle, not throttled: hold
    (0.5, BASE, None, None, []),                         # no throttling counters: hold
    (0.92, BASE, None, 5, []),                           # cooling: hold
    (0.92, "90000 100000", BASE, 5, []),
    (1.2, "90000 100000", BASE, 5, ["72000 100000"]),    # overload: × 0.8, throttled or not
    (1.2, "90000 100000", BASE, 0, ["72000 100000"]),
    (1.2, "60000 100000", BASE, 0, [None]),              # × 0.8 falls below base: back to it, knob released
    (1.2, BASE, None, 5, []),                            # at base already: nothing to lower
    (None, "90000 100000", BASE, 5, []),                 # unknown pool: hold
    (0.5, "140000 100000", BASE, 5, ["150000 100000"]),  # ceiling: base × 300%
    (0.5, "150000 100000", BASE, 5, []),
])
def test_dynamic_quota_per_pool_state(node_used, quota, held, throttled, expect):
    h = {(LS, "cpu.max"): held} if held else {}
    actions = decide(snap(node_used, [ls(quota=quota, throttled=throttled)], held=h), burst_percent=0)
    assert values(actions, "cpu.max") == expect
    for a in actions:
        assert a.message and {"pool_state", "pool_load_percent", "throttled", "base_quota_us"} <= set(a.reason)


def test_ceiling_is_at_most_the_whole_node():
    # base 1.5 cores on a 2-CPU node: 300% would be 4.5 cores.
    actions = decide(snap(0.5, [ls(quota="190000 100000", throttled=3)], held={(LS, "cpu.max"): "150000 100000"}),
                     burst_percent=0)
    assert values(actions, "cpu.max") == ["200000 100000"]


def test_base_comes_from_the_held_original_also_after_a_restart():
    raised = ls(quota="90000 100000", throttled=0)
    # koordd holds cpu.max with original 50000: overload takes it down toward 50000 ...
    assert values(decide(snap(1.2, [raised], held={(LS, "cpu.max"): BASE}), burst_percent=0), "cpu.max") == \
        ["72000 100000"]
    # ... and a fresh state (restart that re-adopted the knob) knows the same base: 55000 × 0.8 < base.
    low = ls(quota="55000 100000")
    assert values(decide(snap(1.2, [low], held={(LS, "cpu.max"): BASE}), burst_percent=0), "cpu.max") == [None]
    # Not held: the current quota is the base, and overload never takes it below.
    assert values(decide(snap(1.2, [raised]), burst_percent=0), "cpu.max") == []


def test_lsr_lse_and_be_cgroups_are_never_touched():
    others = [ls("lsr", cls="LSR", throttled=9, cpuset="1"), ls("lse", cls="LSE", throttled=9, cpuset="1"),
              ls("be", cls="BE", throttled=9), ls("sys", cls="SYSTEM", throttled=9)]
    actions = decide(snap(0.5, others, cpus=4))
    assert actions == []
    assert CpuBurst.writes(settings()) == {("LS", "cpu.max"), ("LS", "cpu.max.burst")}
    assert CpuBurst.writes(settings(dynamic_quota=False)) == {("LS", "cpu.max.burst")}
    assert CpuBurst.writes(settings(burst_percent=0)) == {("LS", "cpu.max")}


def test_throttling_is_counted_since_this_loops_last_tick():
    s, state = settings(burst_percent=0), CpuBurst.initial_state(settings())
    # First look: the sensor's delta. Later: the cumulative counter, so ticks of other loops in between
    # (which reset the sensor's delta) hide nothing.
    a = CpuBurst.decide(snap(0.5, [ls(throttled=0, nr_throttled=10)], t=1.0), s, state)
    assert values(a, "cpu.max") == []
    a = CpuBurst.decide(snap(0.5, [ls(throttled=0, nr_throttled=12)], t=2.0), s, state)
    assert values(a, "cpu.max") == ["60000 100000"] and a[0].reason["throttled"] == 2
    # A re-created cgroup (counter went back): the sensor's delta again.
    a = CpuBurst.decide(snap(0.5, [ls(throttled=0, nr_throttled=1)], t=3.0), s, state)
    assert values(a, "cpu.max") == []


# --- the token bucket -------------------------------------------------------------------------

class Kernel:
    """The LS cgroup's quota as the actuator would leave it: set, restore (to the held original)."""

    def __init__(self, quota=BASE):
        self.quota, self.held, self.nr_throttled = quota, {}, 0

    def apply(self, actions):
        for a in actions:
            if a.knob != "cpu.max":
                continue
            key = (a.target, a.knob)
            if a.value is None:
                if key in self.held:
                    self.quota = self.held.pop(key)
            else:
                self.held.setdefault(key, self.quota)
                self.quota = a.value

    def cores(self):
        q, p = map(int, self.quota.split())
        return q / p


def run(ticks, kernel, state, s, usage, throttled=5, node_used=0.5, t0=0.0):
    """`ticks` one-second ticks, `throttled` periods in each; returns the quota (cores) after each."""
    out = []
    for i in range(ticks):
        t = t0 + i + 1
        use = usage(kernel.cores()) if callable(usage) else usage
        kernel.nr_throttled += throttled
        sample = ls(quota=kernel.quota, usage=use, throttled=throttled, nr_throttled=kernel.nr_throttled)
        kernel.apply(CpuBurst.decide(snap(node_used, [sample], t=t, held=kernel.held), s, state))
        out.append(round(kernel.cores(), 3))
    return out


def test_bucket_drains_while_over_base_and_refills_under_60_percent():
    # base 0.5 cores, ceiling 1.5; bucket = 0.5 × 10 s × 200% = 10 CPU-seconds above base.
    s = settings(burst_percent=0, quota_burst_period="10s")
    state, kernel = CpuBurst.initial_state(s), Kernel()
    # Throttled on an idle node and using all it gets: the quota climbs to the ceiling...
    quotas = run(40, kernel, state, s, usage=lambda q: q)
    assert quotas[:7] == [0.6, 0.72, 0.864, 1.037, 1.244, 1.493, 1.5]
    # ...and the bucket runs dry (sum of usage above base ≈ 10 CPU-s), after which it goes back down to
    # base although the node is idle and the cgroup still throttled.
    assert quotas[-1] == 0.5 and max(quotas) == 1.5
    first_down = next(i for i in range(1, len(quotas)) if quotas[i] < quotas[i - 1])
    spent = sum(q - 0.5 for q in quotas[:first_down])
    assert 9.0 <= spent <= 11.0, (spent, quotas)
    assert state.cgroups[LS].tokens == 0
    assert kernel.held == {}                              # back at base: released
    # Empty bucket: no raise however throttled.
    assert run(3, kernel, state, s, usage=0.5, t0=40) == [0.5, 0.5, 0.5]
    # Under 60% of base (0.1 < 0.3) it earns base - usage = 0.4 CPU-s per second, and may burst again.
    assert run(1, kernel, state, s, usage=0.1, t0=43) == [0.6]
    assert state.cgroups[LS].tokens == pytest.approx(0.4e6)
    # Between 60% and 100% of base it neither earns nor spends.
    tokens = state.cgroups[LS].tokens
    run(1, kernel, state, s, usage=0.4, throttled=0, t0=44)
    assert state.cgroups[LS].tokens == tokens


def test_bucket_is_capped_and_zero_period_means_no_bucket():
    s = settings(burst_percent=0, quota_burst_period="10s")
    state, kernel = CpuBurst.initial_state(s), Kernel()
    run(5, kernel, state, s, usage=0.0, throttled=0)
    assert state.cgroups[LS].tokens == pytest.approx(10e6)          # full from the start, never more
    s = settings(burst_percent=0, quota_burst_period=0)
    state, kernel = CpuBurst.initial_state(s), Kernel()
    quotas = run(60, kernel, state, s, usage=lambda q: q)
    assert quotas[-1] == 1.5 and state.cgroups[LS].tokens is None


def test_vanished_cgroup_is_forgotten_and_comes_back_with_a_full_bucket():
    s = settings(burst_percent=0, quota_burst_period="10s")
    state, kernel = CpuBurst.initial_state(s), Kernel()
    run(30, kernel, state, s, usage=lambda q: q)
    assert state.cgroups[LS].tokens == 0
    CpuBurst.decide(snap(0.5, [ls("ls.slice/other")], t=31.0), s, state)
    assert LS not in state.cgroups and "ls.slice/other" in state.cgroups
    kernel = Kernel()                                     # re-created with the same name
    assert run(1, kernel, state, s, usage=0.5, t0=31) == [0.6]
    assert state.cgroups[LS].tokens == pytest.approx(10e6)


# --- options ----------------------------------------------------------------------------------

@pytest.mark.parametrize("line, error", [
    ("burst_percent = -1", "must be >= 0"),
    ("pool_overload_percent = 0", "must be >= 1"),
    ("pool_overload_percent = 120", "must be <= 100"),
    ("max_quota_percent = 50", "must be >= 100"),
    ('quota_burst_period = "soon"', "not a duration"),
    ('dynamic_quota = "yes"', "expected true or false"),
    ("pool_ignores_be = 1", "expected true or false"),
    ("burst_percnt = 100", "did you mean 'burst_percent'"),
])
def test_options_are_checked_when_the_config_loads(line, error):
    with pytest.raises(ConfigError) as ei:
        parse_config(f"[loops.cpu_burst]\nenabled = true\n{line}\n", "koordd.toml", {"cpu_burst": CpuBurst})
    assert "koordd.toml:3: loops.cpu_burst." in str(ei.value) and error in str(ei.value)


def test_defaults():
    s = settings()
    assert (s.burst_percent, s.dynamic_quota, s.pool_overload_percent, s.max_quota_percent,
            float(s.quota_burst_period), s.pool_ignores_be, float(s.interval)) == (1000, True, 50, 300, 60, False, 1)


# --- through the actuator: nothing it asks for is refused -------------------------------------

@pytest.mark.parametrize("mode", ["v2", "hybrid"])
def test_every_write_passes_the_kernel_rules_and_stop_restores(tmp_path, mode):
    tree = FakeCgroups(tmp_path, mode).add(LS)
    if mode == "v2":
        tree.set(LS, "cpu", "cpu.max", BASE + "\n")
    else:
        tree.set(LS, "cpu", "cpu.cfs_quota_us", "50000\n")
    journal = RestoreJournal(tmp_path / "state")
    act = Actuator(tree.fs, journal, DecisionLog(tmp_path / "state"))
    s = settings(quota_burst_period="5s")
    state = CpuBurst.initial_state(s)
    seen, nr_throttled = [], 0
    # idle + throttled (raise), overload (lower to base), idle + throttled again.
    script = [(0.5, 5)] * 8 + [(1.5, 0)] * 8 + [(0.5, 5)] * 4
    for i, (node_used, throttled) in enumerate(script):
        nr_throttled += throttled
        quota = KNOBS["cpu.max"].read(tree.fs, LS)
        burst = KNOBS["cpu.max.burst"].read(tree.fs, LS)
        usage = int(quota.split()[0]) / 100000 if quota.split()[0] != "max" else 1.0
        sample = ls(quota=quota, burst=burst, usage=usage, throttled=throttled, nr_throttled=nr_throttled)
        held = {(h.target, h.knob): h.original for h in journal.entries()}
        decisions = act.apply("cpu_burst", CpuBurst.decide(snap(node_used, [sample], t=float(i), held=held), s,
                                                           state))
        assert not [d for d in decisions if d.outcome == REFUSED], decisions
        q, b = KNOBS["cpu.max"].read(tree.fs, LS), KNOBS["cpu.max.burst"].read(tree.fs, LS)
        assert int(b) <= int(q.split()[0]), (q, b)
        seen.append(int(q.split()[0]))
    assert seen[0] == 60000 and max(seen) == 150000 and 50000 in seen[8:16], seen
    assert KNOBS["cpu.max.burst"].read(tree.fs, LS) == "50000"
    act.restore_all("koordd stopping")
    assert KNOBS["cpu.max"].read(tree.fs, LS) == BASE and KNOBS["cpu.max.burst"].read(tree.fs, LS) == "0"
    assert journal.entries() == []
