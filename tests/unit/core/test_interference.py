"""Antagonist detection (CPI2's manner) on any health signal: the detector's arithmetic, and
be_suppress capping the BE pod whose CPU use follows an LS victim's run-queue latency."""
from __future__ import annotations

import random

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.core.config import loop_options, make_settings, parse_config
from koordd.core.decisions import APPLIED, RESTORED
from koordd.core.interference import Detector, MIN_BASELINE, mean_sigma, pearson
from koordd.core.snapshot import CgroupSample, CpiSample, NodeSample, RUNQ_LATENCY, RunqLatency, Snapshot
from koordd_plugins.be_suppress import BeSuppress
from koordd.runtime.runner import Runner


def test_mean_sigma_and_pearson():
    assert mean_sigma([1.0, 3.0]) == (2.0, 1.0)
    assert pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    assert pearson([1, 2, 3, 4], [8, 6, 4, 2]) == pytest.approx(-1.0)
    assert pearson([1, 2, 3], [5, 5, 5]) is None and pearson([1, 2], [1, 2]) is None


def calm_then(detector, spikes, cores=1.0, start=0.0):
    """MIN_BASELINE calm ticks (signal 100 ± 1), then `spikes` values; the victims of each tick."""
    out = []
    t = start
    for i in range(MIN_BASELINE):
        t += 1
        detector.observe(t, {"ls": (100.0 + (i % 2), cores)}, {})
    for v in spikes:
        t += 1
        out.append([x.cgroup for x in detector.observe(t, {"ls": (v, cores)}, {})])
    return out


def test_a_victim_takes_enough_outliers_within_the_window():
    d = Detector(window=60, outliers_needed=3)
    assert calm_then(d, [300, 101, 300, 100, 300]) == [[], [], [], [], ["ls"]]


def test_an_ls_cgroup_that_hardly_runs_is_never_a_victim():
    d = Detector(window=60, outliers_needed=1, min_cpu=0.25)
    assert calm_then(d, [900, 900], cores=0.1) == [[], []]


def test_outliers_older_than_the_window_do_not_count():
    d = Detector(window=15, outliers_needed=2)
    got = calm_then(d, [300] + [100] * 20 + [300])
    assert got[-1] == []                      # the first spike left the window long ago


def test_the_suspect_is_the_be_cgroup_whose_cpu_follows_the_signal():
    d = Detector(window=100, outliers_needed=99)
    rng = random.Random(1)
    for t in range(40):
        spike = t % 7 == 0
        d.observe(float(t), {"ls": (500.0 if spike else 100.0 + rng.random(), 1.0)},
                  {"be/steady": 1.0 + rng.random() * 0.1, "be/bully": 1.9 if spike else 0.2 + rng.random() * 0.1,
                   "be/anti": 0.1 if spike else 1.0})
    name, r = d.suspect("ls", ["be/steady", "be/bully", "be/anti"])
    assert name == "be/bully" and r > 0.9
    assert d.suspect("ls", ["be/anti"]) is None          # following it the wrong way round is no evidence


# --- be_suppress with antagonist_signal = "runq" ---------------------------------------------------------

def settings(**kw):
    return make_settings(loop_options(BeSuppress), {"enabled": True, "antagonist_signal": "runq",
                                                    "antagonist_window": 60, "antagonist_cap_duration": 30, **kw})


def world(t, p99_us, bully_cpu, ls_cpu=1.0, held=()):
    """An LS root, a BE root with two pods; ls's run-queue p99 and the pods' CPU use as given."""
    roots = {"ls": CgroupSample("ls", "LS", cpu_usage=ls_cpu, cpu_max="max 100000"),
             "be": CgroupSample("be", "BE", cpu_usage=bully_cpu + 0.3, cpu_max="max 100000")}
    pods = (CgroupSample("be/bully", "BE", cpu_usage=bully_cpu), CgroupSample("be/quiet", "BE", cpu_usage=0.3))
    return Snapshot(t, 0.0, NodeSample(4, 1.0 + bully_cpu + 0.3), roots, members={"be": pods},
                    sections={RUNQ_LATENCY: {"ls": RunqLatency("ebpf", 100, p99_us / 2, p99_us / 2, p99_us, p99_us)}},
                    held={k: "max 100000" for k in held})


def antagonist_actions(actions):
    return [(a.target, a.value) for a in actions if a.target.startswith("be/")]


def test_be_suppress_caps_the_pod_behind_the_ls_latency_then_lets_it_go():
    s = settings(threshold_percent=100)
    state = BeSuppress.initial_state(s)
    t = 0.0
    for i in range(MIN_BASELINE + 2):                      # calm: the bully idles, LS waits ~64 µs
        t += 1
        assert antagonist_actions(BeSuppress.decide(world(t, 64 + i % 3, 0.2), s, state)) == []
    caps = []
    for _ in range(3):                                     # three times the bully runs, LS waits 4 ms
        t += 1
        caps = antagonist_actions(BeSuppress.decide(world(t, 4096, 1.8), s, state))
        t += 1
        BeSuppress.decide(world(t, 65, 0.2), s, state)
    assert caps == [("be/bully", "1000 100000")]           # 0.01 CPUs
    [cap] = [a for a in BeSuppress.decide(world(t + 1, 65, 0.2), s, state) if a.target == "be/bully"]
    assert cap.reason == {"step": "hold"}                  # held while it lasts (free: skip if equal)

    actions = BeSuppress.decide(world(t + 40, 65, 0.2), s, state)    # 30 s later: its own value back
    assert [(a.target, a.knob, a.value) for a in actions if a.target == "be/bully"] == \
        [("be/bully", "cpu.max", None)]


def test_the_decision_says_why(tmp_path):
    s = settings(threshold_percent=100, antagonist_outliers=1)
    state = BeSuppress.initial_state(s)
    for t in range(1, MIN_BASELINE + 3):
        BeSuppress.decide(world(float(t), 64 + t % 3, 0.2 + (t % 2) * 0.05), s, state)
    [cap] = [a for a in BeSuppress.decide(world(50.0, 4096, 1.8), s, state) if a.target == "be/bully"]
    assert cap.reason["victim"] == "ls" and cap.reason["signal"] == "runq" and cap.reason["value"] == 4096
    assert cap.reason["outliers"] == 1 and cap.reason["correlation"] >= 0.3 and cap.reason["suspect_cpus"] == 1.8
    assert "ls's runq 4.1e+03 is above its baseline" in cap.message and "be/bully" in cap.message


def test_a_cap_from_before_a_restart_is_lifted():
    s = settings()
    actions = BeSuppress.decide(world(1.0, 64, 0.2, held=[("be/bully", "cpu.max")]), s, BeSuppress.initial_state(s))
    assert ("be/bully", None) in antagonist_actions(actions)


def test_off_by_default_and_only_then_reading_members_and_signals():
    off = make_settings(loop_options(BeSuppress), {"enabled": True, "rule": "threshold"})
    assert BeSuppress.members_of(off) == frozenset() and RUNQ_LATENCY not in BeSuppress.needs(off)
    assert BeSuppress.writes(off) == {("BE", "cpu.max")}
    on = settings(policy="cpuset")
    assert BeSuppress.members_of(on) == {"BE"} and RUNQ_LATENCY in BeSuppress.needs(on)
    # (rule slack: and the wake lever's request on the node)
    assert BeSuppress.writes(on) == {("BE", "cpuset.cpus"), ("BE", "cpu.max"), ("node", "cpu_dma_latency")}
    assert "cpi" in BeSuppress.needs(settings(antagonist_signal="cpi"))


def test_cpi_is_a_signal_too():
    s = settings(threshold_percent=100, antagonist_signal="cpi", antagonist_outliers=1)
    state = BeSuppress.initial_state(s)

    def tick(t, cpi, bully):
        snap = world(t, 64, bully)
        return BeSuppress.decide(Snapshot(snap.time, 0.0, snap.node, snap.cgroups, members=snap.members,
                                          sections={"cpi": {"ls": CpiSample(cpi * 1e9, 1e9, 1.0)}}), s, state)
    for t in range(1, MIN_BASELINE + 3):
        tick(float(t), 1.0 + (t % 2) * 0.01, 0.2 + (t % 2) * 0.01)
    assert ("be/bully", "1000 100000") in antagonist_actions(tick(20.0, 2.5, 1.8))


def test_end_to_end_the_cap_lands_on_the_pod_and_goes_away_on_stop(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("ls").add("be/bully").add("be/quiet")
    registry = {"be_suppress": BeSuppress}
    conf = parse_config('[[classes]]\nname = "LS"\ncgroups = ["ls"]\n[[classes]]\nname = "BE"\ncgroups = ["be"]\n'
                        '[loops.be_suppress]\nenabled = true\nthreshold_percent = 100\nantagonist_signal = "runq"\n'
                        'antagonist_outliers = 1\n', "k.toml", registry)
    journal = RestoreJournal(tmp_path / "state")
    runner = Runner(registry, Actuator(tree.fs, journal, DecisionLog(tmp_path / "state")))
    runner.configure(conf, now=0.0)
    run = runner.runs["be_suppress"]
    for t in range(1, MIN_BASELINE + 3):
        runner.tick([run], world(float(t), 64 + t % 3, 0.2 + (t % 2) * 0.05))
    runner.tick([run], world(50.0, 4096, 1.8))
    assert tree.read("be/bully", "cpu", "cpu.max").strip() == "1000 100000"
    assert tree.read("be/quiet", "cpu", "cpu.max").strip() == "max 100000"
    assert [h.target for h in journal.entries() if h.target.startswith("be/")] == ["be/bully"]
    runner.stop("be_suppress", "loop disabled")
    assert tree.read("be/bully", "cpu", "cpu.max").strip() == "max 100000" and journal.entries() == []
