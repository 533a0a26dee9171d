"""Decision tests for be_suppress: hand-built snapshots in, actions out. No files, no kernel."""
from dataclasses import replace

import pytest

from koordd.core.config import loop_options, make_settings
from koordd.core.snapshot import CgroupSample, CpuTopology, NodeSample, Pressure, PressureStat, Snapshot
from koordd_plugins.be_suppress import BeSuppress, pick_cpus

PERIOD = 100_000


def settings(**kw):
    # The threshold rule unless a test asks for slack (the default): most tables here are koordlet's.
    return make_settings(loop_options(BeSuppress), {"enabled": True, "rule": "threshold", **kw})


def snap(node_used, cgroups, cpus=2, t=100.0, topology=()):
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=cpus, cpu_used=node_used, topology=topology),
                    cgroups={c.path: c for c in cgroups})


def cg(path, cls, usage, cpu_max="max 100000", cpuset="", pressure=None):
    psi = PressureStat(Pressure(pressure, 0, 0, 0), None) if pressure is not None else None
    return CgroupSample(path=path, cls=cls, cpu_usage=usage, cpu_max=cpu_max, cpuset_cpus=cpuset, cpu_pressure=psi)


def decide(snapshot, state=None, **kw):
    s = settings(**kw)
    return BeSuppress.decide(snapshot, s, state if state is not None else BeSuppress.initial_state(s))


def quota_of(actions):
    sets = [a for a in actions if a.knob == "cpu.max" and a.value is not None]
    return [None if a.value.startswith("max") else int(a.value.split()[0]) for a in sets]


@pytest.mark.parametrize("node_used, ls, be, cpus, expect_quota", [
    # 2 CPUs × 65% = 1.3; LS 1.0, no system → 0.3 cores → 30000 µs, but growth from max is a shrink: at once.
    (2.0, 1.0, 1.0, 2, 30000),
    # system usage (node − cgroups) 0.2 comes off too.
    (2.2, 1.0, 1.0, 4, int((4 * 0.65 - 1.2) * PERIOD)),
    # LS above the threshold: floor of 2000 µs.
    (2.0, 1.9, 0.1, 2, 2000),
])
def test_quota_follows_the_koordlet_rule(node_used, ls, be, cpus, expect_quota):
    s = snap(node_used, [cg("ls", "LS", ls), cg("be", "BE", be)], cpus=cpus)
    assert quota_of(decide(s)) == [expect_quota]


def test_unknown_usage_holds_the_current_limits():
    assert decide(snap(None, [cg("ls", "LS", 1.0), cg("be", "BE", 1.0)])) == []
    assert decide(snap(2.0, [cg("ls", "LS", None), cg("be", "BE", 1.0)])) == []


def test_no_be_cgroups_no_actions():
    assert decide(snap(1.0, [cg("ls", "LS", 1.0)])) == []


def test_growth_is_limited_per_tick_and_shrink_is_immediate():
    # LS went idle: allowance 1.3 cores, current 30000 → at most +10% of 2 × 100000 per tick.
    s = snap(0.3, [cg("ls", "LS", 0.0), cg("be", "BE", 0.3, cpu_max="30000 100000")])
    assert quota_of(decide(s)) == [50000]
    # LS busy again: straight down to the allowance.
    s = snap(2.0, [cg("ls", "LS", 1.2), cg("be", "BE", 0.8, cpu_max="120000 100000")])
    assert quota_of(decide(s)) == [10000]


def test_changes_under_one_percent_are_skipped():
    s = snap(1.3, [cg("ls", "LS", 1.0), cg("be", "BE", 0.3, cpu_max="29000 100000")])
    assert quota_of(decide(s)) == []


def test_usage_window_remembers_an_ls_spike():
    state = BeSuppress.initial_state(settings())
    spike = snap(2.0, [cg("ls", "LS", 1.2), cg("be", "BE", 0.8)], t=10.0)
    assert quota_of(decide(spike, state)) == [10000]
    calm = snap(0.5, [cg("ls", "LS", 0.2), cg("be", "BE", 0.3, cpu_max="10000 100000")], t=11.0)
    assert quota_of(decide(calm, state)) == []            # the spike is still inside the 3 s window
    later = snap(0.5, [cg("ls", "LS", 0.2), cg("be", "BE", 0.3, cpu_max="10000 100000")], t=20.0)
    assert quota_of(decide(later, state)) == [30000]      # window passed: grow by 10% of the node


def test_psi_guard_shrinks_below_the_usage_rule():
    calm = snap(0.5, [cg("ls", "LS", 0.2, pressure=5.0), cg("be", "BE", 0.3, cpu_max="80000 100000")])
    assert quota_of(decide(calm)) == [100000]
    pressured = snap(0.5, [cg("ls", "LS", 0.2, pressure=55.0), cg("be", "BE", 0.3, cpu_max="80000 100000")])
    actions = decide(pressured)
    assert quota_of(actions) == [64000]                    # 80000 × (1 − 20%)
    assert actions[-1].reason["psi_guard"] is True and "pressure" in actions[-1].message
    assert quota_of(decide(pressured, psi_guard_percent=0)) == [100000]


def test_allowance_is_split_between_be_cgroups_and_every_action_explains_itself():
    s = snap(2.0, [cg("ls", "LS", 0.7), cg("be1", "BE", 0.6), cg("be2", "BE", 0.7)])
    actions = [a for a in decide(s) if a.value is not None]
    assert [(a.target, a.value) for a in actions] == [("be1", "30000 100000"), ("be2", "30000 100000")]
    assert {"allowance", "non_be_usage", "system_usage", "capacity"} <= set(actions[0].reason)


def test_quota_policy_resets_cpuset_and_cpuset_policy_resets_quota():
    s = snap(2.0, [cg("ls", "LS", 1.0), cg("be", "BE", 1.0)], cpus=4)
    assert ("be", "cpuset.cpus", None) in [(a.target, a.knob, a.value) for a in decide(s)]
    cpuset_actions = decide(s, policy="cpuset")
    assert ("be", "cpu.max", None) in [(a.target, a.knob, a.value) for a in cpuset_actions]
    assert BeSuppress.writes(settings(policy="cpuset")) == {("BE", "cpuset.cpus")}
    assert BeSuppress.writes(settings()) == {("BE", "cpu.max")}


def topo(pairs_per_node=2, nodes=2):
    """CPUs numbered like Linux: siblings are c and c + n_cores."""
    cores = pairs_per_node * nodes
    return tuple(CpuTopology(c, c % cores, (c % cores) // pairs_per_node) for c in range(2 * cores))


@pytest.mark.parametrize("n, expect", [
    (2, {3, 7}),                 # one whole core (3 and its sibling 7): highest core of the highest node
    (4, {1, 5, 3, 7}),           # then a whole core from the other NUMA node
    (6, {1, 5, 3, 7, 2, 6}),
    (8, set(range(8))),
])
def test_pick_cpus_takes_whole_cores_spread_over_numa(n, expect):
    assert pick_cpus(list(topo()), n) == expect


def test_cpuset_policy_respects_floor_growth_and_lse():
    t = topo()
    lse = cg("lse", "LSE", 0.5, cpuset="3,7")
    # 8 CPUs × 65% = 5.2 − 6.5 → floor 2 CPUs, never LSE's 3 and 7.
    s = snap(7.0, [lse, cg("ls", "LS", 6.0), cg("be", "BE", 0.5, cpuset="")], cpus=8, topology=t)
    sets = [a for a in decide(s, policy="cpuset") if a.knob == "cpuset.cpus"]
    assert sets[0].value == "2,6"
    # Idle node from 2 CPUs: grows by ceil(10% × 8) = 1 per tick.
    s = snap(0.5, [lse, cg("ls", "LS", 0.0), cg("be", "BE", 0.0, cpuset="1,5")], cpus=8, topology=t)
    sets = [a for a in decide(s, policy="cpuset") if a.knob == "cpuset.cpus"]
    assert len(sets[0].value.replace("-", ",").split(",")) >= 2 and sets[0].reason["cpus"] == 3


def test_a_be_cgroup_without_cpu_max_still_gets_an_action_so_the_refusal_is_recorded():
    s = snap(2.0, [cg("ls", "LS", 1.0), cg("be", "BE", 1.0, cpu_max=None)])
    assert quota_of(decide(s)) == [30000]


# --- rule "slack": LS health sizes BE (Heracles) ---------------------------------------------------------

import dataclasses  # noqa: E402

from koordd.core.health import HealthTargets  # noqa: E402
from koordd.core.histogram import quantile_us  # noqa: E402
from koordd.core.slo import SloTarget  # noqa: E402
from koordd.core.snapshot import APP_LATENCY, AppLatency, RUNQ_LATENCY, RunqLatency  # noqa: E402


def health(t, ls_usage, be_quota, p99_us=None, mean_us=None, psi=None, be_usage=0.5, cpus=4):
    """An LS cgroup with a run-queue latency (p99 from eBPF, or only a mean) and cpu pressure; one BE."""
    runq = {}
    if p99_us is not None or mean_us is not None:
        runq["ls"] = RunqLatency("ebpf" if p99_us is not None else "schedstat", 100, mean_us or p99_us / 2,
                                 p99_us and p99_us / 2, p99_us, p99_us)
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=cpus, cpu_used=ls_usage + be_usage),
                    cgroups={"ls": cg("ls", "LS", ls_usage, pressure=psi),
                             "be": cg("be", "BE", be_usage, cpu_max=f"{be_quota} 100000")},
                    sections={RUNQ_LATENCY: runq})


def at(i: int) -> float:
    """Round i's time in a table of rounds: a second apart, but 2.5 s between the first two. A cut needs its
    signal over the threshold in every round of the last half experiment window (2.5 s of the default 5 s) and
    seen at least that long (core/experiment.py's confirmed()): a signal over from round 0 is confirmed at
    round 1, as it would be at any later round."""
    return 0.0 if i == 0 else i + 1.5


def slack_run(snaps, **kw):
    s = settings(rule="slack", **kw)
    state = BeSuppress.initial_state(s)
    out = []
    for snap in snaps:
        actions = BeSuppress.decide(snap, s, state)
        out.append((quota_of(actions), round(state.allowance, 3) if state.allowance is not None else None))
    return out


def test_slack_grows_be_towards_the_whole_node_while_ls_is_healthy():
    # LS uses 1 of 4 CPUs, its p99 is 0.5 ms of a 2 ms target (slack 75%): BE grows 1 CPU a tick
    # (slack_grow_percent 25 of the node) from its 1 CPU, up to all 4: it may use whatever LS leaves
    # idle at any moment, and there the cap is lifted.
    got = slack_run([health(float(t), 1.0, 100_000 + 100_000 * t, p99_us=500, psi=1.0) for t in range(5)])
    assert [a for _, a in got] == [2.0, 3.0, 4.0, 4.0, 4.0]
    assert [q for q, _ in got][:3] == [[200_000], [300_000], [None]]      # None: "max"
    assert slack_run([health(1.0, 1.0, 100_000, p99_us=500)], slack_grow_percent=10) == [([140_000], 1.4)]
    # A BE without a quota has the whole node already: it keeps it.
    snap = health(1.0, 1.0, 0, p99_us=500)
    snap.cgroups["be"] = cg("be", "BE", 0.5, cpu_max="max 100000")
    assert slack_run([snap]) == [([], 4.0)]


def test_slack_holds_between_5_and_10_percent_and_gives_back_under_5():
    hold = slack_run([health(1.0, 1.0, 100_000, p99_us=1850)])              # slack 7.5%
    assert hold == [([], 1.0)]
    # slack 2.5%: held one round (a cut needs the signal near its target for half the experiment window: at()),
    # then 30% of what BE uses (0.5 CPUs) at once, not of its allowance
    shrink = slack_run([health(at(0), 1.0, 100_000, p99_us=1950), health(at(1), 1.0, 100_000, p99_us=1950)])
    assert shrink == [([], 1.0), ([35_000], 0.35)]


def test_below_zero_twice_be_drops_to_its_floor_and_stays_there_until_ls_recovers():
    got = slack_run([health(at(0), 1.0, 200_000, p99_us=4096),   # slack -100%: held (one round is no reason) ...
                     health(at(1), 1.0, 200_000, p99_us=4096),   # ... and below zero again: the floor
                     health(at(2), 1.0, 2_000, p99_us=1900),     # 5%: still recovering, held at the floor
                     health(at(3), 1.0, 2_000, p99_us=1000),     # 50%: one round of health is not recovery ...
                     health(at(4), 1.0, 2_000, p99_us=1000)])    # ... two past the settle time are: grows again
    # half the way back to the 0.5 CPUs BE used when LS missed, not a whole step (1 CPU) past it
    assert [a for _, a in got] == [2.0, 0.02, 0.02, 0.02, 0.26]
    assert [q for q, _ in got][:2] == [[], [2000]]


def test_one_round_below_zero_is_not_the_floor():
    # One wild sample between healthy rounds costs BE nothing: a cut needs the signal over in every round of
    # half the experiment window (at least two), so that the cut is judged against the state that prompted it.
    got = slack_run([health(1.0, 1.0, 200_000, p99_us=4096), health(2.0, 1.0, 200_000, p99_us=500)])
    assert [a for _, a in got] == [2.0, 3.0]


def test_slack_is_the_worst_of_the_ls_signals_and_says_which():
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    assert [a for a in BeSuppress.decide(health(at(0), 1.0, 300_000, p99_us=500, psi=30.0), s, state) if a.value] == []
    [act] = [a for a in BeSuppress.decide(health(at(1), 1.0, 300_000, p99_us=500, psi=30.0), s, state) if a.value]
    assert act.reason["worst"] == {"cgroup": "ls", "signal": "cpu_pressure_avg10", "value": 30.0, "target": 20.0}
    assert act.reason["slack"] == -0.5 and act.reason["step"] == "floor" and "LS slack -50%" in act.message


def test_where_only_schedstat_measures_the_mean_is_held_to_its_own_target():
    assert slack_run([health(at(t), 1.0, 100_000, mean_us=700) for t in (0, 1)])[1][1] == 0.02   # 700 > 500 µs: floor
    assert slack_run([health(1.0, 1.0, 100_000, mean_us=100)])[0][1] == 2.0          # 80% slack: grow


def test_each_ls_class_is_judged_by_its_own_health_targets():
    # Two LS cgroups wait 6 ms at p99: a batchy API that declared 10 ms (40% slack) and a cache on the
    # 2 ms default (-200%). The cache sets the slack; with the cache at 1 ms the API's 40% does.
    def snap(cache_p99, t=1.0):
        runq = {"api": RunqLatency("ebpf", 100, 3000, 3000, 6000, 6000),
                "cache": RunqLatency("ebpf", 100, cache_p99 / 2, cache_p99 / 2, cache_p99, cache_p99)}
        return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=4, cpu_used=1.5),
                        cgroups={"api": cg("api", "LS", 0.5), "cache": cg("cache", "LS", 0.5),
                                 "be": cg("be", "BE", 0.5, cpu_max="100000 100000")},
                        sections={RUNQ_LATENCY: runq}, health={"api": HealthTargets(10_000.0, 500.0, 20.0)})
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    BeSuppress.decide(snap(6000, t=at(0)), s, state)
    [act] = [a for a in BeSuppress.decide(snap(6000, t=at(1)), s, state) if a.value]
    assert act.reason["worst"] == {"cgroup": "cache", "signal": "runq_p99_us", "value": 6000, "target": 2000.0}
    [act] = [a for a in BeSuppress.decide(snap(1000), s, BeSuppress.initial_state(s)) if a.value]
    assert act.reason["worst"] == {"cgroup": "api", "signal": "runq_p99_us", "value": 6000, "target": 10_000.0}
    assert act.reason["slack"] == 0.4 and act.reason["step"] == "grow"


def test_an_slo_missed_shrinks_be_while_the_run_queue_and_psi_look_healthy():
    # Memory-bandwidth interference: LS's threads do not wait for a CPU (run-queue p99 0.5 ms of 2 ms,
    # PSI 1% of 20%) but its answers are slow: 5% of them take 8-16 ms against a 5 ms p99 SLO. The
    # SLO's slack is the worst: BE gives back at once, and at the second round below zero drops to its
    # floor. The app_latency section is read although be_suppress's needs() do not name it: the daemon
    # runs that sensor for the SLO (conftest's check allows the snapshot's slo_sections()).
    def snap(t, slots):
        s = health(t, 1.0, 200_000, p99_us=500, psi=1.0)
        app = AppLatency(sum(slots), 0.0, 0.0, quantile_us(slots, 0.99), quantile_us(slots, 0.999), 0.0, slots)
        return dataclasses.replace(s, sections={**s.sections, APP_LATENCY: {"ls": app}},
                                   slo={"ls": SloTarget(5000.0)})
    slow, fast = (0,) * 10 + (950, 0, 0, 0, 50), (0,) * 10 + (1000,)
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    assert [a for a in BeSuppress.decide(snap(at(0), slow), s, state) if a.value] == []   # confirming
    [act] = [a for a in BeSuppress.decide(snap(at(1), slow), s, state) if a.value]
    assert act.reason["worst"]["signal"] == "app_p99_us" and act.reason["worst"]["target"] == 5000.0
    assert act.reason["slack"] < 0 and act.reason["step"] == "floor" and quota_of([act]) == [2000]
    # The same rounds without the SLO: run-queue and PSI alone say LS is healthy, and BE grows.
    no_slo = [dataclasses.replace(snap(1.0, slow), slo={})]
    assert slack_run(no_slo) == [([300_000], 3.0)]
    # Answers back under 1 ms: the SLO has 80%+ slack again and decides (the run queue, 75%, only guards), BE grows.
    state = BeSuppress.initial_state(s)
    [act] = [a for a in BeSuppress.decide(snap(1.0, fast), s, state) if a.value]
    assert act.reason["worst"]["signal"] == "app_p99_us" and act.reason["step"] == "grow"
    assert act.reason["guard"]["signal"] == "runq_p99_us" and act.reason["guard"]["slack"] == 0.75
    assert APP_LATENCY not in BeSuppress.needs(s)       # the SLO, not the loop, runs the sensor


def test_without_any_ls_signal_slack_holds_what_be_has():
    assert slack_run([health(1.0, 1.0, 100_000)]) == [([], None)]
    assert RUNQ_LATENCY in BeSuppress.needs(settings(rule="slack"))
    assert RUNQ_LATENCY not in BeSuppress.needs(settings())


def test_when_the_ls_cgroups_go_be_grows_back_its_cut_undone_and_blind_sensors_still_hold():
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    for t in (0, 1):
        BeSuppress.decide(health(at(t), 1.0, 200_000, p99_us=4096), s, state)
    assert state.at_floor and state.lab.running is not None and state.allowance == pytest.approx(0.02)
    gone = dataclasses.replace(health(at(2), 1.0, 200_000, p99_us=4096), sections={RUNQ_LATENCY: {}})
    gone = dataclasses.replace(gone, cgroups={"be": gone.cgroups["be"]})        # the LS service and its cgroup gone
    [act] = [a for a in BeSuppress.decide(gone, s, state) if a.knob == "cpu.max"]
    assert act.reason["step"] == "grow: no LS cgroup on the node, nothing to protect", act.reason
    assert state.lab.running is None and not state.at_floor
    assert state.allowance == pytest.approx(3.0)      # the cut put back (2 CPUs), then a healthy round's growth
    later = dataclasses.replace(gone, time=at(3))
    [act] = [a for a in BeSuppress.decide(later, s, state) if a.knob == "cpu.max"]
    assert act.value == "max 100000"                  # the whole node: no cap
    # the LS cgroup there but nothing measured (a sensor gone blind): BE holds what it has
    blind = dataclasses.replace(health(at(4), 1.0, 50_000), sections={RUNQ_LATENCY: {}})
    state.allowance = 0.5
    assert [a for a in BeSuppress.decide(blind, s, state) if a.knob == "cpu.max"] == []


def test_when_the_floor_helps_but_not_enough_the_targets_rise_to_what_ls_shows_without_be():
    # LS's p99 goes from 4 ms to 3 ms with BE at its floor (the cut helped) but stays over 2 ms (its own
    # threads contend). Not healthy, so the floor is released for a window to test it (A/B/A): LS is back at
    # 4 ms, the floor goes back, confirmed. After slack_floor_hold (10 s) at the floor again koordd raises the
    # target to 3.75 ms (+25%) and BE grows again; after 5 minutes the declared 2 ms target is back.
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    steps = {}
    for t in range(23):
        p99 = 3000 if state.allowance is not None and state.allowance * PERIOD <= 2000 else 4096
        actions = BeSuppress.decide(health(at(t), 1.0, 200_000, p99_us=p99), s, state)
        steps[t] = next((a.reason["step"] for a in actions if a.value), None)
    assert [steps[t] for t in range(6)] == [None] + ["floor"] * 5     # held one round (confirming), then the floor
    assert steps[6].startswith("release to test: cut helped: runq_p99_us 4.10 ms -> 3.00 ms")
    assert steps[11].startswith("cut again: release cost latency: runq_p99_us 3.00 ms -> 4.10 ms")
    assert steps[21].startswith("LS misses its targets without BE too") and not state.at_floor
    assert state.raised == {("ls", "runq_p99_us"): (pytest.approx(3750.0), at(21) + 300)}
    assert steps[22] == "grow"                                  # 3 ms against 3.75 ms: 20% slack
    [act] = [a for a in BeSuppress.decide(health(at(23), 1.0, 200_000, p99_us=3900), s, state) if a.value]
    assert act.reason["worst"]["target"] == 3750.0 and act.reason["raised_targets"] == {"ls runq_p99_us": 3750.0}
    assert act.reason["step"].startswith("hold: runq_p99_us near or over")   # worse than LS alone: no growth,
    BeSuppress.decide(health(at(24), 1.0, 200_000, p99_us=3900), s, state)
    [act] = [a for a in BeSuppress.decide(health(at(25), 1.0, 200_000, p99_us=3900), s, state) if a.value]
    # confirmed (over for half the window, below zero twice), 4% over its raised target: a shrink, not the floor
    assert act.reason["step"] == "shrink (below zero)"
    for t in (26, 27, 28):             # recovered (two rounds past the settle time): the cut helped, BE grows
        BeSuppress.decide(health(at(t), 1.0, 200_000, p99_us=1000), s, state)
    assert not state.at_floor and state.lab.running is None
    # Past RAISED_FOR the declared target judges again.
    [act] = [a for a in BeSuppress.decide(health(at(321), 1.0, 200_000, p99_us=3000), s, state) if a.value]
    assert act.reason["worst"]["target"] == 2000.0 and state.raised == {}


def test_a_floor_that_bought_nothing_rests_long_enough_to_cost_be_at_most_its_budget():
    # LS waits 3 ms at p99 whatever BE gets; BE uses what its quota allows (2 cores uncapped). The floor took
    # all of it for 5 s and bought nothing: be_cap rests 45 s (10%: experiment_budget_percent), not 10 s.
    def undos(**kw):
        s = settings(rule="slack", **kw)
        state, log = BeSuppress.initial_state(s), []
        for t in range(120):
            quota = 200_000 if state.allowance is None else round(state.allowance * PERIOD)
            snap = health(at(t), 1.0, quota, p99_us=3000, be_usage=min(2.0, quota / PERIOD))
            log += [(t, a.reason["step"]) for a in BeSuppress.decide(snap, s, state) if a.value]
        return [(t, step) for t, step in log if step.startswith("undo")]
    got = undos()
    assert [t for t, _ in got] == [6, 56, 106] and "be_cap rests 44.6s" in got[0][1], got   # 99% of BE for 5 s
    assert [t for t, _ in undos(experiment_budget_percent=100)][:2] == [6, 21]     # the doubling rest alone


def test_ls_that_recovers_at_the_floor_keeps_its_declared_targets():
    got = slack_run([health(at(t), 1.0, 200_000, p99_us=p99)
                     for t, p99 in ((0, 4096), (1, 4096), (5, 1900), (20, 1000))])
    assert [a for _, a in got] == [2.0, 0.02, 0.02, 0.26]      # towards the 0.5 CPUs BE used at the miss


# --- every cut an experiment; the SLO decides where one is declared (core/experiment.py) ---------------------

def slo_met(t, runq_p99_us, be_quota=200_000):
    """An LS class with an SLO of 5 ms that its service meets (all answers within 1-2 ms), its run queue at
    `runq_p99_us` (over the 2 ms proxy target when above it)."""
    s = health(t, 1.0, be_quota, p99_us=runq_p99_us, psi=1.0)
    slots = (0,) * 10 + (1000,)
    app = AppLatency(1000, 0.0, 0.0, quantile_us(slots, 0.99), quantile_us(slots, 0.999), 0.0, slots)
    return dataclasses.replace(s, sections={**s.sections, APP_LATENCY: {"ls": app}}, slo={"ls": SloTarget(5000.0)})


def guarded_rounds(rounds: int, start_quota: int):
    """Rounds a second apart with the SLO met and the run queue at 4 ms (over its 2 ms proxy target), BE's
    quota as the loop last wrote it (`start_quota` before). Returns the quotas written, the steps, BE's
    allowance after each round and the loop's state."""
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    quotas, steps, allowances = [], [], []
    for t in range(rounds):
        quota = start_quota if state.allowance is None else round(state.allowance * PERIOD)   # the knob as written
        actions = BeSuppress.decide(slo_met(at(t), 4096, quota), s, state)
        quotas += quota_of(actions)
        steps += [a.reason["step"] for a in actions if a.value]
        allowances.append(round(state.allowance, 2))
    return quotas, steps, allowances, state


def test_with_the_slo_met_a_run_queue_over_target_cannot_floor_be_only_cut_it_for_a_bounded_time():
    # The old rule floored BE at the second round of a 4 ms run-queue p99 whatever the SLO said. Now the
    # SLO is met, so the run queue only guards: one cut of 30% (BE 2 -> 1.4 CPUs) once confirmed, never
    # deeper, undone when it bought nothing; the guard then holds BE (cutting no more) until it has held
    # guard_cut_max (30 s), and BE grows: the SLO decides.
    quotas, steps, _, state = guarded_rounds(40, start_quota=200_000)
    assert min(q for q in quotas if q is not None) == 140_000 and 2000 not in quotas, quotas   # never the floor
    assert steps[0].startswith("guard: one cut") and quotas[0] == 140_000
    assert sum(x.startswith("guard: one cut") for x in steps) == 1, steps
    undo = next(x for x in steps if x and x.startswith("undo"))
    # the guard rests guard_cut_max from its cut's bound (cut at 0, undone at 5, bound 30): 55 s from the undo
    assert "cut bought nothing: runq_p99_us 4.10 ms -> 4.10 ms" in undo and "be_cap rests 55s" in undo
    assert quotas[1] == 200_000                                          # BE back where it was
    assert steps[2] == "grow" and state.allowance == 4.0, steps          # the guard held 30 s: BE grows


def test_a_guard_cut_undone_early_still_leaves_2_x_guard_cut_max_before_the_next_with_slow_rounds():
    # CI's VM (rounds 5 s apart under TCG, guard_cut_max 15 s): each guard cut bought nothing and was undone
    # after one window, and the guard rested from the undo, so the next cut could come 20-28 s after the
    # last. Whenever the undo comes, the guard rests from the cut's bound: one cut per 2 x guard_cut_max.
    s = settings(rule="slack", guard_cut_max="15s")
    state = BeSuppress.initial_state(s)
    cuts = []
    for i in range(60):
        t = 5.0 * i
        q = 200_000 if state.allowance is None else round(state.allowance * PERIOD)
        for a in BeSuppress.decide(slo_met(t, 4096, q), s, state):
            if a.value and a.reason["step"].startswith("guard: one cut"):
                cuts.append(t)
    assert len(cuts) >= 3, cuts
    assert all(b - a >= 30.0 for a, b in zip(cuts, cuts[1:])), cuts


@pytest.mark.parametrize("interval", [2.6, 3.0, 5.0])
def test_rounds_further_apart_than_half_the_experiment_window_still_confirm_a_miss_and_cut(interval):
    # A risk is confirmed over half the experiment window (2.5 s of the default 5 s) and at least two rounds.
    # With rounds further apart than that the span never held two, and koordd never cut BE, however late LS
    # was: an operator's interval = "3s" turned the loop's protection off.
    s = settings(rule="slack", interval=f"{interval}s")
    state = BeSuppress.initial_state(s)
    late = (0,) * 13 + (1000,)                        # every answer 4-8 ms against the SLO's 5 ms
    cut_at = None
    for i in range(10):
        t = interval * i
        q = 200_000 if state.allowance is None else round(state.allowance * PERIOD)
        app = AppLatency(1000, 0.0, 0.0, quantile_us(late, 0.99), quantile_us(late, 0.999), 0.0, late)
        met = slo_met(t, 100, q)
        snap = dataclasses.replace(met, sections={**met.sections, APP_LATENCY: {"ls": app}})
        if any(a.value and a.reason["step"] in ("floor", "shrink") for a in BeSuppress.decide(snap, s, state)):
            cut_at = i
            break
    assert cut_at == 1, cut_at                        # the second round: two rounds over


def test_with_the_slo_met_a_guard_cut_that_helped_still_ends_within_guard_cut_max():
    s = settings(rule="slack", guard_cut_max="8s")
    state = BeSuppress.initial_state(s)
    allowances = []
    for t in range(12):
        q = state.allowance
        BeSuppress.decide(slo_met(at(t), 4096 if q is None or q >= 2.0 else 2100), s, state)
        allowances.append(round(state.allowance, 2))
    # confirmed at t=1, cut (4.1 -> 2.1 ms helped, yet the proxy stays over its 2 ms and the SLO is met): held,
    # never deeper, and at t=9 the cut ends: BE has its 2 CPUs back
    assert allowances[:10] == [2.0] + [1.4] * 8 + [2.0], allowances


def test_where_the_slo_comes_at_risk_during_a_guard_cut_be_keeps_the_cut_and_the_slo_decides_from_there():
    # redis against the memory antagonist on 2 CPUs: a guard cut (runq_p99_us over, the SLO met), then the SLO
    # at risk ended it and BE got its CPU back for the 2 s the SLO's own cut took to confirm, then lost it again.
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    late = (0,) * 13 + (1000,)                        # every answer 4-8 ms against the SLO's 5 ms
    allowances, steps = [], []
    for t in range(8):
        quota = 200_000 if state.allowance is None else round(state.allowance * PERIOD)
        snap = slo_met(at(t), 4096, quota)
        if t >= 3:
            app = AppLatency(1000, 0.0, 0.0, quantile_us(late, 0.99), quantile_us(late, 0.999), 0.0, late)
            snap = dataclasses.replace(snap, sections={**snap.sections, APP_LATENCY: {"ls": app}})
        steps.append([a.reason["step"] for a in BeSuppress.decide(snap, s, state) if a.value])
        allowances.append(round(state.allowance, 2))
    assert steps[1] and steps[1][0].startswith("guard: one cut") and allowances[1] == 1.4, (steps, allowances)
    # the SLO at risk from t=3: the guard's cut ends (the guard rests), BE keeps it while the SLO's cut confirms
    assert state.guard_cut is None and allowances[3] == allowances[4] == 1.4, (steps, allowances)
    assert max(allowances[2:]) <= 1.4 and any(x and not x[0].startswith("guard") for x in steps[4:]), steps


def test_a_guard_whose_cuts_the_slo_never_needed_rests_twice_as_long_each_time_until_the_slo_is_at_risk():
    # Ten minutes on 4 CPUs, the SLO met throughout; LS's run queue waits 4.1 ms at p99 while BE may use the
    # whole node and 2.1 ms (still over its 2 ms proxy target) once it is cut: each guard's cut helped the
    # proxy and the SLO never needed it. At a fixed rest the guard cut BE by 30% for 30 s of every minute
    # (cuts at 1, 62, 123, ..., 550: ten): now it rests 30, 60, 120, 240 s. Then the SLO at risk for a few
    # rounds (its own cut) starts the rest over.
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    late = (0,) * 13 + (1000,)                        # every answer 4-8 ms against the SLO's 5 ms
    cuts, rests, allowances = [], [], []
    for t in range(900):
        q = state.allowance
        snap = slo_met(at(t), 4096 if q is None or q >= 3.9 else 2100, 400_000 if q is None else round(q * PERIOD))
        if 600 <= t < 606:
            app = AppLatency(1000, 0.0, 0.0, quantile_us(late, 0.99), quantile_us(late, 0.999), 0.0, late)
            snap = dataclasses.replace(snap, sections={**snap.sections, APP_LATENCY: {"ls": app}})
        for a in BeSuppress.decide(snap, s, state):
            if a.value and a.reason["step"].startswith("guard: one cut"):
                cuts.append(t)
            if a.value and a.reason["step"].startswith("guard cut ends"):
                rests.append(a.reason["step"].rsplit(" ", 1)[1])
        if t < 600:
            allowances.append(state.allowance)
    assert [c for c in cuts if c < 600] == [1, 61, 151, 301, 571], cuts
    assert rests[:4] == ["30s", "60s", "120s", "240s"], rests
    assert sum(allowances) / len(allowances) > 3.65, sum(allowances) / len(allowances)     # 3.40 at a fixed rest
    # the SLO at risk at 600-605 ended the guard's cut (and cut BE itself): the guard's rest started over, so
    # its hold from 606 rests 30 s, not 480. Its cut at 630 (BE already cut by the SLO: 2.1 ms either way)
    # bought nothing and was undone at 635; the guard rests 30 s from that cut's bound (660), so the next
    # comes at 690: one cut per 2 x guard_cut_max whenever the undo comes
    assert [c for c in cuts if 600 <= c < 700] == [630, 690], cuts
    assert rests[4] == "60s", rests
    # the LS service gone from the node: the next one starts anew
    assert state.guard_rest_times > 1
    gone = slo_met(at(900), 4096)
    gone = dataclasses.replace(gone, sections={}, slo={}, cgroups={"be": gone.cgroups["be"]})
    BeSuppress.decide(gone, s, state)
    assert state.guard_rest_times == 1


def test_a_guard_neither_holds_nor_cuts_be_at_its_floor_while_the_slo_is_met():
    # A 60 s run on 2 CPUs: BE left at its floor, the SLO met (52% slack), LS's own threads keeping its
    # cpu.pressure over target. The guard "cut" BE at its floor and held it there for guard_cut_max (30 s) while
    # the SLO was met: the floor the SLO did not ask for. Now BE grows; a guard may hold it above its floor.
    _, steps, allowances, _ = guarded_rounds(8, start_quota=2000)
    assert allowances[0] == 1.02 and steps[0] == "grow", (steps, allowances)      # floor 0.02 + 25% of 4 CPUs
    assert not any(x.startswith("guard") for x in steps[:1]), steps
    assert max(allowances) < 4.0 and any(x.startswith("guard") for x in steps), (steps, allowances)  # then guarded


def test_where_every_cut_rests_after_buying_nothing_be_grows_back():
    # LS misses its target whatever BE gets, and BE's allowance was left at 1 CPU of 4 (by an earlier step):
    # with every cut resting, leaving BE alone gives it back the node (cpu.idle decides who runs). Before, "leave"
    # only stopped cutting, and a BE left at its floor this way stayed there for the rest of a 60 s run.
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    allowances, steps = [], []
    for t in range(40):
        quota = 100_000 if state.allowance is None else round(state.allowance * PERIOD)
        actions = BeSuppress.decide(health(at(t), 1.0, quota, p99_us=3000), s, state)
        steps += [(t, a.reason["step"]) for a in actions if a.value]
        allowances.append(round(state.allowance, 2))
    undo = next(t for t, x in steps if x.startswith("undo"))
    assert allowances[undo] == 1.0, (steps, allowances)                   # the floor undone: back to 1 CPU
    leave = [t for t, x in steps if x.startswith("leave BE alone") and x.endswith("BE grows back")]
    assert leave and leave[0] == undo + 1 and allowances[undo + 3] == 4.0, (steps, allowances)


def test_a_missed_slo_still_cuts_to_the_floor():
    def missed(t):
        s = slo_met(t, 500)
        slots = (0,) * 10 + (950, 0, 0, 0, 50)
        app = AppLatency(1000, 0.0, 0.0, quantile_us(slots, 0.99), quantile_us(slots, 0.999), 0.0, slots)
        return dataclasses.replace(s, sections={**s.sections, APP_LATENCY: {"ls": app}})
    assert [q for q, _ in slack_run([missed(at(0)), missed(at(1))])] == [[], [2000]]


def miss_rounds(p99s: list[float], be_usage: float = 0.5, state=None):
    """Rounds a second apart, no SLO: LS's run-queue p99 (target 2 ms) takes the values given, BE (one cgroup)
    uses `be_usage` of 4 CPUs, its quota as the loop last wrote it. Returns (step, quota) per round."""
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s) if state is None else state
    out = []
    for t, p99 in enumerate(p99s):
        quota = 200_000 if state.allowance is None else round(state.allowance * PERIOD)
        actions = BeSuppress.decide(health(at(t), 1.0, quota, p99_us=p99, be_usage=be_usage), s, state)
        steps = [a.reason["step"] for a in actions if a.knob == "cpu.max" and a.value]
        out.append((steps[0] if steps else None, (quota_of(actions) or [None])[0]))
    return out


def test_a_round_in_which_the_hypervisor_held_a_vcpu_off_says_so_in_the_decision():
    """A stall of the host shows in the guest only as steal: the decision that answers the miss names it, so
    an operator reading journalctl sees why LS was slow where the guest's own sensors saw nothing."""
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    for t, steal in ((0, 0.0), (1, 0.1)):
        snapshot = health(at(t), 1.0, 200_000, p99_us=3000.0)
        snapshot = replace(snapshot, node=replace(snapshot.node, steal_worst=steal))
        actions = [a for a in BeSuppress.decide(snapshot, s, state) if a.knob == "cpu.max" and a.value]
    assert actions[0].reason["steal_worst_ms"] == 100.0
    assert "the hypervisor held a vCPU off for 100 ms this round (steal)" in actions[0].message
    quiet = health(at(2), 1.0, 200_000, p99_us=3000.0)      # bare metal: steal 0.0 or unknown, nothing said
    said = [a for a in BeSuppress.decide(quiet, s, state) if a.knob == "cpu.max"]
    assert all("hypervisor" not in a.message and a.reason.get("steal_worst_ms") is None for a in said)


def stolen_rounds(s, state, t0, n, stolen_every=0, slo=None):
    """n rounds a second apart on 4 CPUs, LS using 1 and BE 3 (the node full): every `stolen_every`-th round a
    vCPU loses 100 ms to steal and LS's run-queue p99 is over its target (3 ms of 2) the round after it, else
    healthy (0.5 ms). BE's quota is the one the loop last wrote. `slo`: LS declares an SLO of 5 ms, "met" (its
    answers within 1-2 ms) or "silent" (no value yet). Returns the cpu.max actions that carry a value."""
    out = []
    for i in range(n):
        quota = 400_000 if state.allowance is None else round(state.allowance * PERIOD)
        stolen = bool(stolen_every) and i % stolen_every == stolen_every - 1
        after = bool(stolen_every) and i % stolen_every == 0 and i > 0
        snapshot = health(t0 + i, 1.0, quota, p99_us=3000.0 if after else 500.0, be_usage=3.0)
        snapshot = replace(snapshot, node=replace(snapshot.node, steal_worst=0.1 if stolen else 0.0))
        if slo is not None:
            met = slo_met(t0 + i, 500.0)
            snapshot = replace(snapshot, slo=met.slo, sections={
                **snapshot.sections, **({APP_LATENCY: met.sections[APP_LATENCY]} if slo == "met" else {})})
        out += [a for a in BeSuppress.decide(snapshot, s, state) if a.knob == "cpu.max" and a.value]
    return out


def test_where_the_host_takes_busy_vcpus_while_ls_misses_a_standing_headroom_is_tried_and_kept_if_it_pays():
    """steal_headroom_percent (core/headroom.py): BE filling a 4-CPU node, a vCPU stolen every 30 s and LS over
    its target right after each. Per-miss cuts cannot answer that (one round over is not confirmed). After the
    third such stall BE is held to 90% of the node less LS's 1 CPU (2.6 CPUs) for a trial; with no stall in
    it and LS healthy it is kept, with the decision saying what it bought, and released after HOLD. Not before
    the headroom has watched for WATCH (300 s): the tenth stall, at 299 s, starts nothing; the round after does."""
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    before = stolen_rounds(s, state, 0.0, 300, stolen_every=30)
    assert state.headroom.phase == "watching" and not any(a.reason.get("headroom") for a in before)
    before = stolen_rounds(s, state, 300.0, 1, stolen_every=30)
    assert state.headroom.phase == "trial"
    trial = [a for a in before if a.reason.get("headroom")]
    assert trial[0].value == "260000 100000" and trial[0].reason["headroom"]["ceiling"] == 2.6, trial[0]
    assert "headroom trial for 145 rounds" in trial[0].message
    judged = stolen_rounds(s, state, 301.0, 145)
    kept = [a for a in judged if a.reason.get("step") and "headroom" in a.message and "bought" in a.message]
    assert state.headroom.phase == "kept" and kept, judged[-3:]
    assert kept[-1].value == "260000 100000" and kept[-1].say      # nothing moves: on record all the same
    assert "headroom bought latency: stolen in 10 of 301 rounds -> 0 of 145" in kept[-1].message
    report = BeSuppress.report(s, state)["headroom"]
    assert report["phase"] == "kept" and report["left_s"] == 600.0, report
    after = stolen_rounds(s, state, 446.0, 605)                    # HOLD (600 s), then BE grows back to the node
    assert state.headroom.phase == "watching" and after[-1].value == "max 100000", after[-1]
    assert any("headroom released to test it" in a.message for a in after)


def test_a_standing_headroom_that_bought_nothing_is_undone_and_off_means_never_tried():
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    stolen_rounds(s, state, 0.0, 301, stolen_every=30)
    assert state.headroom.phase == "trial"
    judged = stolen_rounds(s, state, 301.0, 145, stolen_every=30)     # the host steals as before
    undone = [a for a in judged if "headroom bought nothing" in a.message]
    assert state.headroom.phase == "resting" and undone, judged[-3:]
    assert stolen_rounds(s, state, 446.0, 10)[-1].value == "max 100000"   # BE grows back to the whole node
    off = settings(rule="slack", steal_headroom_percent=0)
    state = BeSuppress.initial_state(off)
    actions = stolen_rounds(off, state, 0.0, 600, stolen_every=30)
    assert state.headroom.phase == "watching" and not any(a.reason.get("headroom") for a in actions)


def test_a_guard_over_its_target_after_each_stall_starts_no_standing_headroom_where_the_slo_rules():
    # The stalls and run-queue misses that start a trial above (without an SLO, after 300 s), but LS declares an
    # SLO: met, or with no value yet (koordd's first seconds: on 2 CPUs such a trial held BE to 1.00 of 2 CPUs
    # through a window in which the SLO had 60% slack). The run queue only guards; it starts no trial of minutes.
    s = settings(rule="slack")
    for slo in ("met", "silent"):
        state = BeSuppress.initial_state(s)
        actions = stolen_rounds(s, state, 0.0, 600, stolen_every=30, slo=slo)
        assert state.headroom.phase == "watching", (slo, state.headroom.phase)
        assert not any(a.reason.get("headroom") for a in actions), slo


def test_a_shallow_miss_takes_a_share_of_what_be_uses_a_deep_one_the_floor():
    """The floor takes 98% of BE's CPU for the 5 s or more its verdict needs: only for a miss deeper than a
    quarter of the target and than the signal's own noise. A shallower one gives back slack_shrink_percent
    (30%) of what BE uses: of a 2-CPU allowance BE used 0.5 of, the old 30% of the allowance (1.4 CPUs) took
    nothing."""
    shallow = miss_rounds([2200.0] * 3)                 # 10% over the 2 ms target: confirmed at the second round
    assert shallow[1] == ("shrink (below zero)", 35_000), shallow      # 0.7 x 0.5 CPUs, not the floor
    assert shallow[2] == (None, None)                   # then judged; a shallow miss does not deepen it
    deep = miss_rounds([3000.0] * 3)                    # 50% over
    assert deep[1] == ("floor", 2000), deep
    # 50% over, but within what the signal wandered through before (0.1-3.9 ms, every other round over the
    # target, never confirmed: its noise, 1.4826 x the median absolute deviation of the quiet rounds, is about
    # 1.4 ms), so no evidence for the floor. Confirmed once every value of the last 2.5 s is over: the 3.6 ms
    # that ends the wander and two rounds at 3 ms.
    lows = [100, 900, 400, 1700, 1200, 600, 1500, 300, 1100, 800, 1800, 200]
    highs = [3900, 2100, 3100, 2600, 3500, 2300, 2900, 3700, 2000, 3300, 2500, 3600]
    wander = [float(v) for pair in zip(lows, highs) for v in pair]
    state = BeSuppress.initial_state(settings(rule="slack"))
    noisy = miss_rounds(wander + [3000.0] * 4, state=state)
    assert all(q is None or step == "grow" for step, q in noisy[:len(wander) + 1]), noisy
    # Confirmed, but a cut's verdict would ask 3.23 ms of a signal at 3 ms (Lab.can_show): it holds a round,
    # until the steady 3 ms outweigh the wander in the noise (1.19 ms, a margin of 2.72 ms), then shrinks.
    assert noisy[len(wander) + 1][0].startswith("hold: no cut could show here (runq_p99_us at 3.00 ms"), noisy
    assert noisy[len(wander) + 2] == ("shrink (below zero)", 35_000), noisy
    assert BeSuppress.report(settings(rule="slack"), state)["unshowable_rounds"] == 1     # in status.json
    # the same miss after a quiet minute (0.4-0.6 ms): confirmed a round later (the last quiet value is under)
    calm = miss_rounds([500.0, 600.0, 400.0, 550.0] * 6 + [3000.0] * 3)
    assert calm[len(wander) + 2] == ("floor", 2000), calm


def test_a_cut_that_bought_nothing_is_undone_the_lever_rests_and_the_rest_doubles():
    # No SLO: the run queue steers. LS waits 3 ms at p99 whatever BE gets.
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    log = []
    for t in range(60):
        quota = 200_000 if state.allowance is None else round(state.allowance * PERIOD)   # the knob as written
        actions = BeSuppress.decide(health(at(t), 1.0, quota, p99_us=3000), s, state)
        log += [(t, a.reason["step"]) for a in actions if a.value]
    undos = [(t, step) for t, step in log if step.startswith("undo")]
    assert [t for t, _ in undos][:2] == [6, 21], log   # 5 s after the floor; rest 10 s, floor again, 5 s
    assert "rests 10s" in undos[0][1] and "rests 20s" in undos[1][1]
    assert state.lab.status(60.0)["levers"]["leave"]["chosen"] > 20
    assert state.lab.status(60.0)["levers"]["be_cap"]["by_signal"]["runq_p99_us"]["bought_nothing"] == 3   # t 6, 21, 46


def test_a_server_whose_socket_is_full_misses_its_slo_though_its_own_times_are_fast_and_a_cut_that_empties_it_helps():
    """The kernel's times start when the server reads: a server a socket's buffer behind answers each request it
    reads in under 1 ms while its clients wait outside the socket. The sensor counts the responses sent on a
    socket found near its limit (AppLatency.crowded): 40% of them against the 1% violation_target allows is a
    miss of the SLO's own (app_socket_full), deep: the floor. That share is the round's (no window of
    responses behind it), so the experiment takes no lag for it, and the floor that empties the socket is
    judged "helped" one window on."""
    fast = (0,) * 10 + (1000,)

    def snap(t, crowded):
        s = slo_met(t, 500)
        app = AppLatency(1000, 0.0, 0.0, quantile_us(fast, 0.99), quantile_us(fast, 0.999), 0.0, fast, crowded)
        return dataclasses.replace(s, sections={**s.sections, APP_LATENCY: {"ls": app}})
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    assert [a for a in BeSuppress.decide(snap(at(0), 400), s, state) if a.value] == []   # confirming
    [act] = [a for a in BeSuppress.decide(snap(at(1), 400), s, state) if a.value]
    worst = act.reason["worst"]
    assert (worst["signal"], worst["value"], worst["target"]) == ("app_socket_full", 0.4, 0.01), act.reason
    assert act.reason["step"] == "floor" and quota_of([act]) == [2000]
    assert "(ls app_socket_full 0.4 of 0.01 of its responses sent on a full socket: its clients wait where the " \
        "kernel cannot time them): floor" in act.message, act.message
    assert act.reason["experiment"]["signal"] == "app_socket_full" and act.reason["experiment"]["lag_s"] == 0.0
    verdicts = []
    for i in range(2, 12):
        for a in BeSuppress.decide(snap(at(i), 0), s, state):
            if (a.reason.get("experiment") or {}).get("verdict"):
                verdicts.append((a.reason["experiment"]["verdict"], a.reason["experiment"]["signal"]))
    assert verdicts and verdicts[0] == ("helped", "app_socket_full"), verdicts
