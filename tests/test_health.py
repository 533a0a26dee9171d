"""LS health: the p99 over enough waits (RunqWindow), and the slack over every LS signal."""
from __future__ import annotations

import pytest

from koordd.core.health import DEFAULT_HEALTH, RunqWindow, ls_signals, worst_slack
from koordd.core.histogram import merged, quantile_us
from koordd.core.snapshot import CgroupSample, NodeSample, RunqLatency, Snapshot


def hist(**slots: int) -> tuple[int, ...]:
    """A histogram from slot counts: hist(s10=5) is 5 waits in [512, 1024) µs."""
    out = [0] * (1 + max(int(k[1:]) for k in slots))
    for k, n in slots.items():
        out[int(k[1:])] = n
    return tuple(out)


def test_merged_adds_slot_by_slot_whatever_the_lengths():
    assert merged([(1, 2), (0, 0, 3), ()]) == [1, 2, 3]
    assert quantile_us(merged([hist(s5=99), hist(s12=1)]), 0.99) == 32.0     # the 99th of 100: the last in [16, 32)


def test_a_busy_cgroup_is_judged_by_its_latest_round_alone():
    w = RunqWindow(min_waits=200)
    assert w.p99("ls", 1.0, hist(s5=300)) == pytest.approx(16 + 16 * 0.99)
    # 300 waits of ~3 ms now: the quiet past does not dilute them.
    assert w.p99("ls", 2.0, hist(s12=300)) == pytest.approx(2048 + 2048 * 0.99)


def test_a_quiet_cgroup_is_judged_over_its_recent_rounds():
    w = RunqWindow(min_waits=200, window=5.0)
    for t in range(9):                                       # 50 waits of 16-32 µs a second
        w.p99("ls", float(t), hist(s5=50))
    # One wild wait (4-8 ms) among 201: below the p99, where alone it would be the p99.
    assert w.p99("ls", 9.0, hist(s5=49, s13=1)) < 32
    assert quantile_us(hist(s5=49, s13=1), 0.99) > 4096
    # A harm that lasts shows: 20 of ~200 waits at 4-8 ms are 10% of them.
    assert w.p99("ls", 10.0, hist(s5=30, s13=20)) > 4096


def test_rounds_older_than_the_window_do_not_count():
    w = RunqWindow(min_waits=1000, window=5.0)
    w.p99("ls", 0.0, hist(s13=100))                          # long waits, long ago
    assert w.p99("ls", 10.0, hist(s5=10)) < 32
    w.forget_except(["other"])
    assert w.rounds == {}


def snapshot(t=1.0):
    """One LS and one BE cgroup; the LS class declares no targets (the defaults apply)."""
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=1.0),
                    cgroups={"ls": CgroupSample(path="ls", cls="LS"), "be": CgroupSample(path="be", cls="BE")})


def test_ls_signals_use_the_window_where_there_is_a_histogram_and_the_rounds_p99_elsewhere():
    w = RunqWindow(min_waits=200)
    for t in range(4):                                        # 100 short waits a second
        ls_signals(snapshot(float(t)), {"ls": RunqLatency("ebpf", 100, 10.0, 10.0, 20.0, 32.0, hist(s5=100))}, w)
    one_wild = {"ls": RunqLatency("ebpf", 1, 5000.0, 5000.0, 5000.0, 8192.0, hist(s13=1))}
    [(cg, name, value, target)] = ls_signals(snapshot(4.0), one_wild, w)
    assert (cg, name, target) == ("ls", "runq_p99_us", DEFAULT_HEALTH.runq_p99_us) and value < 32
    [(_, _, value, _)] = ls_signals(snapshot(4.0), one_wild)   # no window: the round's own p99
    assert value == 5000.0
    schedstat = {"ls": RunqLatency("schedstat", 100, 600.0)}    # a mean only: its own target
    assert ls_signals(snapshot(5.0), schedstat, w) == [("ls", "runq_mean_us", 600.0, DEFAULT_HEALTH.runq_mean_us)]


def test_worst_slack_picks_the_furthest_signal_and_honours_raised_targets():
    signals = [("a", "runq_p99_us", 1000.0, 2000.0), ("b", "cpu_pressure_avg10", 30.0, 20.0)]
    slack, worst = worst_slack(signals)
    assert slack == pytest.approx(-0.5) and worst["cgroup"] == "b"
    slack, worst = worst_slack(signals, {("b", "cpu_pressure_avg10"): 60.0})
    assert slack == pytest.approx(0.5) and worst == {"cgroup": "a", "signal": "runq_p99_us", "value": 1000.0,
                                                     "target": 2000.0}
    assert worst_slack([]) is None
