"""LS health: the p99 over enough waits (RunqWindow), the SLOs' violation rate and window, and the slack
over every LS signal."""
from __future__ import annotations

import dataclasses

import pytest

from koordd.core.health import DEFAULT_HEALTH, RunqWindow, ls_signals, worst_slack
from koordd.core.histogram import merged, quantile_us
from koordd.core.slo import SloTarget, SloWindow, reading, violation_rate
from koordd.core.snapshot import (APP_LATENCY, AppLatency, CgroupSample, NodeSample, Pressure, PressureStat,
                                  RUNQ_LATENCY, RunqLatency, Snapshot)


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
    # Its p99 reaches back over the rounds it was taken from (4 rounds of 50 hold 200): a cut's lag
    assert w.span("ls") == 3.0 and w.span("other") == 0.0
    w.p99("ls", 11.0, hist(s5=300))
    assert w.span("ls") == 0.0                               # a busy round alone


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


# --- SLOs (core/slo.py): the application's own latency against its class's declared target ----------------

def test_the_violation_rate_counts_requests_over_the_target_interpolating_in_its_slot():
    h = hist(s5=90, s7=10)                                  # 90 answers in [16, 32) µs, 10 in [64, 128) µs
    assert violation_rate(h, 128.0) == 0.0 and violation_rate(h, 10.0) == 1.0
    assert violation_rate(h, 64.0) == pytest.approx(0.10)
    assert violation_rate(h, 96.0) == pytest.approx(0.05)   # half of the slot's 10 lie above 96 µs
    assert violation_rate((), 1000.0) is None
    # The rate and the quantile read a histogram the same way: the (1 - rate)-quantile is the target.
    assert quantile_us(h, 1 - violation_rate(h, 96.0)) == pytest.approx(96.0)


def test_an_slo_reading_takes_the_quantile_its_violation_target_allows():
    h = hist(s10=900, s14=100)                              # 10% of the answers take 8-16 ms
    p99 = SloTarget(5000.0)
    got = reading(h, p99)
    assert got.count == 1000 and got.violations == pytest.approx(0.10) and got.tail_us > 8192
    assert reading(h, SloTarget(5000.0, violation_target=20)).tail_us < 1024     # the p80: in the fast slot
    assert reading((), p99) is None


def test_the_slo_window_takes_enough_responses_and_no_older_round_than_its_window():
    w = SloWindow(min_responses=1000, window=10.0)
    target = SloTarget(1000.0, 4000.0)
    for t in range(9):                                       # 200 fast answers a second
        w.reading("ls", float(t), hist(s8=200), target)
    # 3 slow answers in the latest 1000 (five rounds): 0.3%, under the 1% a p99 allows; alone they would be
    # 1.5% of their round's.
    calm = w.reading("ls", 9.0, hist(s8=197, s13=3), target)
    assert calm.count == 1000 and calm.tail_us < 256 and calm.violations == pytest.approx(3 / 1000)
    assert reading(hist(s8=197, s13=3), target).tail_us > 4096
    # A busy service is judged by its latest round alone.
    busy = w.reading("ls", 10.0, hist(s8=900, s13=100), target)
    assert busy.count == 1000 and busy.tail_us > 4096 and busy.p999_us > 4096
    assert w.reading("ls", 30.0, hist(s8=10), target).count == 10        # the rest are older than 10 s
    w.forget_except([])
    assert w.rounds == {}


def slo_snapshot(t=1.0, runq_p99=500.0, app=None, slo=None):
    """One LS class root with an SLO (5 ms p99, 20 ms p99.9 by default) and one BE."""
    slo = slo if slo is not None else SloTarget(5000.0, 20_000.0)
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=1.0),
                    cgroups={"ls": CgroupSample(path="ls", cls="LS", cpu_pressure=PressureStat(
                        Pressure(2.0, 0, 0, 0), None)), "be": CgroupSample(path="be", cls="BE")},
                    sections={RUNQ_LATENCY: {"ls": RunqLatency("ebpf", 500, 100.0, 100.0, runq_p99, 512.0)},
                              APP_LATENCY: {"ls": app} if app is not None else {}},
                    slo={"ls": slo})


def app_latency(slots) -> AppLatency:
    return AppLatency(sum(slots), 0.0, quantile_us(slots, 0.5), quantile_us(slots, 0.99),
                      quantile_us(slots, 0.999), 0.0, slots)


def test_an_slo_adds_the_applications_latency_and_its_slack_can_be_the_worst():
    # The run queue is calm (p99 0.5 ms of 2 ms: 75% slack) and so is PSI, but 5% of the answers take
    # 8-16 ms (membw interference does not show as run-queue waits): the SLO's p99 is past 5 ms.
    slow = app_latency(hist(s10=950, s14=50))
    signals = ls_signals(slo_snapshot(app=slow), None, None, SloWindow())
    by_name = {name: (value, target) for _, name, value, target in signals}
    assert set(by_name) == {"cpu_pressure_avg10", "app_p99_us", "app_p999_us"}
    assert by_name["app_p99_us"][0] > 8192 and by_name["app_p99_us"][1] == 5000.0
    assert by_name["app_p999_us"][1] == 20_000.0
    runq = {"ls": RunqLatency("ebpf", 500, 100.0, 100.0, 500.0, 512.0)}
    slack, worst = worst_slack(ls_signals(slo_snapshot(app=slow), runq, RunqWindow(), SloWindow()))
    assert worst["signal"] == "app_p99_us" and slack < -0.6
    # Without a p99.9 target there is no p99.9 signal; without an SLO, no application signal at all.
    assert [n for _, n, _, _ in ls_signals(slo_snapshot(app=slow, slo=SloTarget(5000.0)), None)] == \
        ["cpu_pressure_avg10", "app_p99_us"]
    no_slo = dataclasses.replace(slo_snapshot(app=slow), slo={})
    assert [n for _, n, _, _ in ls_signals(no_slo, runq)] == ["runq_p99_us", "cpu_pressure_avg10"]
    # A round without answers measures nothing: not late, not healthy, just no application signal.
    assert [n for _, n, _, _ in ls_signals(slo_snapshot(), None)] == ["cpu_pressure_avg10"]
    # Fast answers give the SLO slack: the worst signal is the run queue's again.
    fast = app_latency(hist(s10=1000))
    slack, worst = worst_slack(ls_signals(slo_snapshot(app=fast), runq, RunqWindow(), SloWindow()))
    assert worst["signal"] == "runq_p99_us" and slack == pytest.approx(0.75)


def test_responses_sent_on_a_full_socket_are_the_slos_own_signal_against_its_violation_share():
    """A server a socket's buffer behind: its clients wait outside the socket, so the server's times read fast
    (here every response under 1 ms) however late the clients are. Where the source counts the responses sent
    on a socket near its limit (the kernel's: AppLatency.crowded), their share of the round is an SLO signal
    against the share violation_target allows, and it rules the worst slack; a source that cannot tell (None)
    adds none, and a round with none crowded has the whole slack."""
    fast = app_latency(hist(s10=1000))
    crowded = dataclasses.replace(fast, crowded=300)
    signals = ls_signals(slo_snapshot(app=crowded, slo=SloTarget(5000.0)), None, None, SloWindow())
    by_name = {name: (value, target) for _, name, value, target in signals}
    assert by_name["app_socket_full"] == (0.3, 0.01)            # 30% of the round against 1% allowed
    slack, worst = worst_slack(signals)
    assert worst["signal"] == "app_socket_full" and slack == pytest.approx(1 - 0.3 / 0.01)
    looser = SloTarget(5000.0, violation_target=50.0)            # half the responses may be late
    by_name = {n: (v, t) for _, n, v, t in ls_signals(slo_snapshot(app=crowded, slo=looser), None)}
    assert by_name["app_socket_full"] == (0.3, 0.5)
    assert "app_socket_full" not in [n for _, n, _, _ in ls_signals(slo_snapshot(app=fast), None)]
    calm = {n: v for _, n, v, _ in ls_signals(slo_snapshot(app=dataclasses.replace(fast, crowded=0)), None)}
    assert calm["app_socket_full"] == 0.0
