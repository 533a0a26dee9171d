"""core/experiment.py on its own: the verdict against the signal's noise, rests that double, memory of what
helped under which conditions."""
import pytest

from koordd.core.experiment import Lab, conditions, noise

KEY = ("ls", "app_p99_us")
COND = conditions(1.0, 4, ["be/a"], "app_p99_us")


def run(lab, values, start_at, t0=0.0, lever="be_cap", cond=COND):
    verdicts = []
    for i, v in enumerate(values):
        t = t0 + i
        got = lab.observe(t, {KEY: v}, 2.0)
        if got:
            verdicts.append((t, got))
        if t == start_at:
            lab.start(t, lever, KEY, 2.0, cond)
    return verdicts


def test_noise_is_the_jitter_of_successive_values_not_their_level():
    assert noise([10, 12, 10, 12, 10]) == pytest.approx(2.1)
    assert noise([10, 10, 10, 50, 50, 50]) == 0.0          # a level shift is not noise
    assert noise([5]) == 0.0


def test_a_cut_within_the_noise_bought_nothing_and_one_beyond_it_helped():
    # jitter of about 1 ms around 10 ms; after the cut at t=10 the level is 9.5 ms: within 2 x noise
    lab = Lab(window=5, settle=2)
    [(t, v)] = run(lab, [10000, 11000] * 5 + [9500, 10500] * 4, start_at=9)
    assert t == 14 and not v.helped and v.before == 11000 and v.noise == pytest.approx(1050.0)
    assert "cut bought nothing: app_p99_us 11.00 ms -> 10.00 ms" in v.text()
    lab = Lab(window=5, settle=2)
    [(t, v)] = run(lab, [10000, 11000] * 5 + [5000, 5500] * 4, start_at=9)
    assert v.helped and v.after == 5250 and t == 14


def test_a_cut_that_helped_is_judged_as_soon_as_the_signal_is_healthy_one_that_did_not_only_at_the_end():
    lab = Lab(window=5, settle=2)
    lab.observe(0.0, {KEY: 9000}, 2.0)
    lab.start(0.0, "be_cap", KEY, 2.0, COND)
    v = lab.observe(1.0, {KEY: 3000}, 1.0, healthy=[KEY])
    assert v is not None and v.helped and v.early and v.be_given_up == 1.0
    lab.start(1.0, "be_cap", KEY, 2.0, COND)
    assert lab.observe(2.0, {KEY: 9000}, 1.0, healthy=[KEY]) is None     # worse: wait for the window


def test_a_lever_that_bought_nothing_rests_doubling_and_one_that_helped_goes_first():
    lab = Lab(window=5, settle=2, rest=10, rest_max=40)
    for n, t0 in enumerate((0.0, 100.0, 200.0, 300.0)):
        [(t, v)] = run(lab, [9000] * 8, start_at=t0 + 1, t0=t0, lever="hot_cap")
        assert lab.resting("hot_cap", "app_p99_us", t) == min(10 * 2 ** n, 40)
    assert lab.order(["hot_cap", "be_cap"], COND, 301.0) == ["be_cap"]
    assert lab.order(["hot_cap", "be_cap"], COND, 1000.0) == ["be_cap", "hot_cap"]   # rested; untried first
    [(_, v)] = run(lab, [9000, 9000, 3000, 3000, 3000, 3000, 3000, 3000], start_at=1001, t0=1000, lever="be_cap")
    assert v.helped and lab.resting("be_cap", "app_p99_us", 1010) == 0
    assert lab.order(["hot_cap", "be_cap"], COND, 2000.0) == ["be_cap", "hot_cap"]
    # the same load band and signal with other BE cgroups busy: what is known nearby still ranks
    near = conditions(1.0, 4, ["be/b"], "app_p99_us")
    assert lab.order(["hot_cap", "be_cap"], near, 2000.0) == ["be_cap", "hot_cap"]
    status = lab.status(2000.0)["levers"]
    assert status["be_cap"]["by_signal"]["app_p99_us"] == {"helped": 1, "bought_nothing": 0, "mean_gain": 6000.0,
                                                            "mean_be_cores_given_up": 0.0}
    assert status["hot_cap"]["by_signal"]["app_p99_us"]["bought_nothing"] == 4


def test_the_noise_leaves_out_rounds_after_the_loop_moved_a_lever():
    lab = Lab(window=5, settle=2)
    for t, v in enumerate([2, 50, 2, 50, 2, 50]):          # the loop's own cut and growth, every round
        lab.observe(float(t), {KEY: v}, 1.0)
        lab.moved()
    assert lab.history.noise(KEY) == 0.0
