"""core/experiment.py on its own: the verdict against the signal's noise, rests that double, memory of what
helped under which conditions."""
import pytest

from koordd.core.experiment import Lab, Verdict, conditions, correlation, margin, spread, standard_error

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


def test_noise_is_the_spread_of_the_values_robust_to_wild_ones_and_correlation_from_their_steps():
    assert spread([9, 10, 11, 10, 10, 50]) == pytest.approx(1.4826 * 0.5)    # one wild value moves it little
    assert spread([5]) == 0.0
    sigma = spread([10, 12] * 10)
    assert correlation(sigma, [2] * 19) == 0.0               # values that jump about each round: independent
    assert correlation(sigma, [0.2] * 19) == pytest.approx(0.9)   # values that wander slowly: as alike as counted


def test_the_margin_counts_how_many_values_each_side_has_and_that_correlated_ones_are_worth_fewer():
    assert standard_error(1.0, 0.0, range(-4, 1), range(2, 6)) == pytest.approx((1 / 5 + 1 / 4) ** 0.5)
    assert standard_error(1.0, 0.0, [0], [2]) == pytest.approx(2 ** 0.5)
    assert standard_error(1.0, 0.7, range(-4, 1), range(2, 6)) > standard_error(1.0, 0.0, range(-4, 1), range(2, 6))
    assert margin(1000.0, 0.0, 0.0, [0], [1]) == 50.0        # no noise: 5% of the level before


def test_a_cut_within_the_noise_bought_nothing_and_one_beyond_it_helped():
    # 10-11 ms each round; after the cut at t=9 the level is 9.5-10.5 ms: within the noise
    lab = Lab(window=5, settle=2)
    [(t, v)] = run(lab, [10000, 11000] * 5 + [9500, 10500] * 4, start_at=9)
    assert t == 14 and not v.helped and v.before == 11000 and v.noise == pytest.approx(741.3)
    assert (v.n_before, v.n_after) == (3, 4)          # the confirmation span: t = 7, 8, 9
    assert "cut bought nothing: app_p99_us 11.00 ms -> 10.00 ms (noise 0.74 ms, margin" in v.text()
    lab = Lab(window=5, settle=2)
    [(t, v)] = run(lab, [10000, 11000] * 5 + [5000, 5500] * 4, start_at=9)
    assert v.helped and v.after == 5250 and t == 14


def test_before_is_the_level_over_the_window_not_the_value_that_prompted_the_cut():
    # a wild 30 ms sample among 10 ms ones: the cut on it is judged against 10 ms, and buys nothing
    lab = Lab(window=5, settle=2)
    [(_, v)] = run(lab, [10000] * 9 + [30000] + [10000] * 6, start_at=9)
    assert v.before == 10000 and not v.helped
    # the signal jumped 3 rounds ago (half the window): before is its new level, and a cut back to 10 ms helped
    lab = Lab(window=5, settle=2)
    [(_, v)] = run(lab, [10000] * 7 + [30000] * 3 + [10000] * 6, start_at=9)
    assert v.before == 30000 and v.helped


def test_a_cut_needs_the_signal_over_in_every_round_of_half_the_window():
    lab = Lab(window=5, settle=2)
    for t, v in enumerate([1000, 1000, 5000]):
        lab.observe(float(t), {KEY: v}, 1.0)
    assert not lab.confirmed(KEY, 2.0, 4000)               # one round over: no cut
    lab.observe(3.0, {KEY: 5000}, 1.0)
    assert not lab.confirmed(KEY, 3.0, 4000)               # t=1 (1000) still within 2.5 s
    lab.observe(4.0, {KEY: 5000}, 1.0)
    assert lab.confirmed(KEY, 4.0, 4000)
    # rounds without a value (an SLO scraped every second, a round every half) do not break the confirmation
    assert lab.confirmed(KEY, 4.5, 4000)


def test_rounds_further_apart_than_half_the_window_confirm_on_the_last_two():
    # A round every 3 s against a 2.5 s confirmation span: the span never holds two rounds, and before, no
    # risk was ever confirmed (no cut, however late LS was). The last two rounds decide, both over.
    lab = Lab(window=5, settle=2)
    lab.observe(0.0, {KEY: 1000}, 1.0)
    lab.observe(3.0, {KEY: 5000}, 1.0)
    assert not lab.confirmed(KEY, 3.0, 4000)               # the round before was under
    lab.observe(6.0, {KEY: 5000}, 1.0)
    assert lab.confirmed(KEY, 6.0, 4000)
    lab.observe(9.0, {KEY: 1000}, 1.0)
    assert not lab.confirmed(KEY, 9.0, 4000)


def test_a_signal_is_confirmed_only_once_seen_for_half_the_window_as_after_a_start():
    # A fresh koordd (or a service just appeared) over its target from its first round: two rounds over are not
    # enough until they span 2.5 s. In CI a cut on a fresh koordd's first two rounds had a median and a noise of
    # two values: a real 42 -> 15 ms judged "bought nothing" against a 29 ms margin, the lever rested for minutes.
    lab = Lab(window=5, settle=2)
    for t in (100.0, 101.0):
        lab.observe(t, {KEY: 5000}, 1.0)
    assert not lab.confirmed(KEY, 101.0, 4000)
    lab.observe(102.0, {KEY: 5000}, 1.0)
    assert not lab.confirmed(KEY, 102.0, 4000)             # seen 2 s
    lab.observe(102.5, {KEY: 5000}, 1.0)
    assert lab.confirmed(KEY, 102.5, 4000)                 # seen 2.5 s, over in every round of it
    assert not lab.confirmed(("other", "app_p99_us"), 102.5, 4000)   # never seen: never confirmed
    # a window longer than the history kept (60 s): seen for half of it, rounds not on whole seconds
    long = Lab(window=300, settle=120)
    for t in range(152):
        long.observe(t + 0.37, {KEY: 5000}, 1.0)
    assert not long.confirmed(KEY, 149.37, 4000) and long.confirmed(KEY, 150.37, 4000)
    # forgotten (the cgroup gone for the history's span) and back: seen afresh
    long.observe(300.0, {KEY: 5000}, 1.0)
    assert not long.confirmed(KEY, 300.0, 4000)


def test_a_cut_that_helped_is_judged_once_two_settled_rounds_are_healthy_one_that_did_not_only_at_the_end():
    lab = Lab(window=5, settle=2)
    lab.observe(0.0, {KEY: 9000}, 2.0)
    lab.start(0.0, "be_cap", KEY, 2.0, COND)
    for t in (1.0, 2.0):            # healthy, but within the settle time: the cut may not show yet
        assert lab.observe(t, {KEY: 3000}, 1.0, healthy=[KEY]) is None
    v = lab.observe(3.0, {KEY: 3000}, 1.0, healthy=[KEY])
    assert v is not None and v.helped and v.early and v.be_given_up == 1.0 and v.n_after == 2
    lab.start(3.0, "be_cap", KEY, 2.0, COND)
    for t in (4.0, 5.0, 6.0, 7.0):
        assert lab.observe(t, {KEY: 9000}, 1.0, healthy=[KEY]) is None     # worse: wait for the window


def test_one_healthy_round_right_after_a_cut_ends_no_experiment():
    # A 60 s run on 2 CPUs: a windowed p99 (most of its responses from before the cut) dipped for one round a
    # second after the floor, 15.6 -> 8.1 ms; the old early verdict called the floor "helped", BE grew back
    # and was floored again 1-4 s later, five times a minute. A dip must hold over two rounds past the settle
    # time and the signal's lag.
    lab, lags = Lab(window=5, settle=2), {KEY: 3.0}
    for t in range(10):
        lab.observe(float(t), {KEY: 15600 + 300 * (-1) ** t}, 0.6, lags=lags)
    lab.start(9.0, "be_cap", KEY, 0.6, COND)
    got = [lab.observe(10.0, {KEY: 8100}, 0.02, healthy=[KEY], lags=lags)]
    got += [lab.observe(float(t), {KEY: 15600}, 0.02, lags=lags) for t in range(11, 13)]
    assert got == [None, None, None]
    got = [lab.observe(float(t), {KEY: 8000}, 0.02, healthy=[KEY], lags=lags) for t in range(13, 15)]
    assert got[0] is None and got[1].helped and got[1].early and got[1].n_after == 2    # t = 13, 14: past 3 s


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
    assert status["be_cap"]["by_signal"]["app_p99_us"] == {"helped": 1, "bought_nothing": 0, "retracted": 0, "mean_gain": 6000.0,
                                                            "mean_be_cores_given_up": 0.0}
    assert status["hot_cap"]["by_signal"]["app_p99_us"]["bought_nothing"] == 4


def test_a_cut_that_bought_nothing_rests_long_enough_to_cost_be_at_most_the_budget():
    # a floor that took all of BE's CPU (2 -> 0 cores) for 5 s and bought nothing: 45 s of rest at 10%
    lab = Lab(window=5, settle=2, rest=10, rest_max=320, budget=0.1)
    lab.observe(0.0, {KEY: 9000}, 2.0)
    lab.start(0.0, "be_cap", KEY, 2.0, COND)
    verdicts = [lab.observe(float(t), {KEY: 9000}, 0.0) for t in range(1, 6)]
    assert verdicts[-1].cost_s == pytest.approx(5.0) and verdicts[-1].fields()["be_cost_s"] == 5.0
    assert lab.resting("be_cap", "app_p99_us", 5.0) == pytest.approx(45.0)
    # a hot cap that took half of BE's CPU: half the cost; the wake lever took none: the doubling rest alone
    for lever, be_after, rest in (("hot_cap", 1.0, 22.5), ("wake", 2.0, 10.0)):
        lab.start(100.0, lever, KEY, 2.0, COND)
        [v] = [v for t in range(101, 106) if (v := lab.observe(float(t), {KEY: 9000}, be_after))]
        assert not v.helped and lab.resting(lever, "app_p99_us", 105.0) == pytest.approx(rest), lever
    # a release that cost nothing: the kept cut's time was the waste
    lab = Lab(window=5, settle=2, rest=10, rest_max=320, budget=0.1)
    lab.observe(0.0, {KEY: 9000}, 2.0)
    lab.start(0.0, "be_cap", KEY, 2.0, COND)
    [cut] = [v for t in range(1, 6) if (v := lab.observe(float(t), {KEY: 3000}, 0.0))]
    assert cut.helped and cut.cost_s == pytest.approx(5.0)
    lab.start(5.0, "be_cap", KEY, 0.0, COND, release=cut)
    [rel] = [v for t in range(6, 11) if (v := lab.observe(float(t), {KEY: 3000}, 2.0))]
    assert not rel.helped and lab.resting("be_cap", "app_p99_us", 10.0) == pytest.approx(45.0)


def test_cuts_on_a_signal_no_cut_moves_cost_be_about_the_budget_however_noisy():
    # the loop cuts whenever the lever is free; nothing it does moves the signal. Over the first 100 s the
    # old doubling rests (10, 20, 40 s) had BE at its floor 20% of the time, a third of the first minute.
    def floored(budget):
        lab, down, rng = Lab(window=5, settle=2, rest=10, rest_max=320, budget=budget), 0, random.Random(3)
        for t in range(120):                 # 20 rounds to learn the noise, then 100 of cuts when free
            be = 0.0 if lab.running is not None else 2.0
            down += lab.running is not None
            verdict = lab.observe(float(t), {KEY: rng.gauss(9000, 500)}, be)
            assert verdict is None or not verdict.helped
            if t >= 20 and lab.running is None and not lab.resting("be_cap", "app_p99_us", float(t)):
                lab.start(float(t), "be_cap", KEY, 2.0, COND)
        return down / 100
    assert floored(0.1) <= 0.11
    assert floored(0.0) >= 0.2          # no budget: the doubling alone


def test_the_noise_leaves_out_rounds_after_the_loop_moved_a_lever():
    lab = Lab(window=5, settle=2)
    for t, v in enumerate([2, 50, 2, 50, 2, 50]):          # the loop's own cut and growth, every round
        lab.observe(float(t), {KEY: v}, 1.0)
        lab.moved()
    assert lab.history.spread(KEY) == (0.0, 0.0)


def test_the_noise_is_measured_within_each_level_koordd_set_not_across_them():
    """A minute that held BE at its floor (the service near 16 ms) and then let it go (near 27 ms) holds two
    levels: the gap between them is what the next cut buys, not noise. Judged on the pooled spread across
    both, the next cut back to 16 ms was "bought nothing" (the kernel test's 27.7 -> 16 ms against a 21.9 ms
    margin); judged on the spread within each, it helped."""
    import random as _random
    rng = _random.Random(7)
    lab = Lab(window=5, settle=2)
    t = 0.0
    for level, rounds in ((16000.0, 20), (27000.0, 20)):
        for i in range(rounds):
            lab.observe(t, {KEY: level + rng.gauss(0, 500)}, 2.0)
            t += 1.0
        lab.moved()                     # the undo that let BE go: the next round starts a new level
    noise, _ = lab.history.spread(KEY)
    assert noise < 1500, noise           # ~500, not the ~8000 of both levels' pooled spread
    lab.start(t - 1.0, "be_cap", KEY, 2.0, COND)
    verdicts = [v for v in (lab.observe(t + i, {KEY: 16000.0 + rng.gauss(0, 500)}, 1.0) for i in range(8)) if v]
    assert verdicts and verdicts[0].helped, verdicts


# --- regression to the mean: seeded simulations (no timing; each trial its own seed) -------------------------

import math  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402

LEVEL, CV = 4000.0, 0.06       # µs; the signal's relative spread: a p99 over 1000 responses or more


def signal(kind: str, rng: random.Random):
    """An endless stationary signal around LEVEL, one value a round."""
    if kind == "normal":
        while True:
            yield LEVEL * (1 + CV * rng.gauss(0, 1))
    elif kind == "lognormal":
        while True:
            yield LEVEL * math.exp(CV * rng.gauss(0, 1))
    elif kind == "heavy":               # Student's t, 3 degrees of freedom: wild samples now and then
        while True:
            chi = sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3
            yield LEVEL * (1 + 0.6 * CV * rng.gauss(0, 1) / math.sqrt(chi))
    elif kind == "ar1":                 # a wandering level: each round 0.7 of the last one's deviation
        x = 0.0
        while True:
            x = 0.7 * x + math.sqrt(1 - 0.49) * rng.gauss(0, 1)
            yield LEVEL * (1 + CV * x)
    else:                               # "window": lognormal noise over an overlapping 3-round window (a p99
        z = [rng.gauss(0, 1) for _ in range(3)]      # over the last rounds' responses)
        while True:
            z = z[1:] + [rng.gauss(0, 1)]
            yield LEVEL * math.exp(CV * sum(z) / math.sqrt(3))


KINDS = ("normal", "lognormal", "heavy", "ar1", "window")
MEDIANS = {k: statistics.median(v for v, _ in zip(signal(k, random.Random(7)), range(4000))) for k in KINDS}


def trial(kind: str, seed: int, target: float, drop: float):
    """be_suppress's way with one signal: each round observed; once it has been near or over `target` (under
    5% slack) in every round of half the window, a cut; the signal is `drop` lower after the cut. The first
    verdict, or None."""
    lab, values, cut = Lab(window=5, settle=2), signal(kind, random.Random(seed)), None
    for t in range(300):
        v = next(values) * (1 - drop if cut is not None and t > cut else 1)
        verdict = lab.observe(float(t), {KEY: v}, 1.0)
        if verdict is not None:
            return verdict
        if cut is None and t >= 30 and lab.confirmed(KEY, float(t), 0.95 * target):
            lab.start(float(t), "be_cap", KEY, 1.0, COND)
            lab.moved()
            cut = t
    return None


@pytest.mark.parametrize("target", [1.0, 0.85], ids=["target-at-median", "target-under-median"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_cut_on_a_signal_no_cut_moves_bought_nothing_and_a_30_percent_drop_helped(kind, target):
    # The old Lab judged a cut against the value that prompted it (a high one, by selection) with the noise of
    # successive differences (small for a wandering signal): on these signals it called 5-18% of useless cuts
    # "helped" (regression to the mean; 9 of these 10 cases under 190 of 200). 200 seeded trials each.
    t = MEDIANS[kind] * target
    verdicts = [trial(kind, seed, t, 0.0) for seed in range(200)]
    nothing = sum(v is not None and not v.helped for v in verdicts)
    assert nothing >= 190, (nothing, [(round(v.before), round(v.after), round(v.margin)) for v in verdicts
                                      if v is not None and v.helped][:10])
    verdicts = [trial(kind, 10_000 + seed, t, 0.3) for seed in range(200)]
    helped = sum(v is not None and v.helped for v in verdicts)
    assert helped >= 190, (helped, [(round(v.before), round(v.after), round(v.margin)) for v in verdicts
                                    if v is not None and not v.helped][:10])


def _jump_then_fall(monkeypatch=None, halve_after_cut=False):
    """20 flat rounds at 10 ms, a lever moved, then the signal at 35 ms falling 0.6 ms a round (CI's VM run: a
    windowed p99 whose window still held the service's slow start); a cut at t=29, judged at t=34."""
    lab = Lab(window=5, settle=2)
    flat = [10000 + (50 if i % 2 else -50) for i in range(20)]
    falling = [35000 - 600 * i + (50 if i % 2 else -50) for i in range(20)]
    verdicts = []
    for i, v in enumerate(flat + falling):
        v = v * 0.5 if halve_after_cut and i > 29 else v
        got = lab.observe(float(i), {KEY: v}, 2.0)
        if got:
            verdicts.append(got)
        if i == 19:
            lab.moved()
        if i == 29:
            lab.start(float(i), "be_cap", KEY, 2.0, COND)
    return lab, verdicts


def test_a_signal_falling_on_its_own_is_judged_against_where_it_was_going_not_where_it_was(monkeypatch):
    # In CI's VM run such a fall read 30.2 -> 27.3 ms against a 1.7 ms margin: the floor cut was kept, BE at its
    # floor for nothing. Judged against where the fall was going (by its factor a second: 27.67 ms), it bought
    # nothing.
    _, [v] = _jump_then_fall()
    assert not v.helped and v.expected == pytest.approx(27669.3, abs=0.1) and v.before - v.after > v.margin, v
    assert "falling on its own to 27.67 ms" in v.text() and v.fields()["expected"] == pytest.approx(27669.3)
    # a fall that halves the signal beyond the drift: helped, credited only with the gain beyond the drift
    lab, [v] = _jump_then_fall(halve_after_cut=True)
    assert v.helped and v.gain == pytest.approx(v.expected - v.after)
    assert lab.totals["be_cap"]["app_p99_us"].gain == pytest.approx(v.gain)
    # without the drift the first case is the old verdict: "helped"
    monkeypatch.setattr("koordd.core.experiment.DRIFT_TAU", 2.0)
    _, [v] = _jump_then_fall()
    assert v.helped and v.expected is None


def test_a_rising_or_merely_noisy_signal_has_no_drift_of_its_own():
    from koordd.core.experiment import drift
    assert drift([(t, 1000 * 1.3 ** t) for t in range(5)]) is None             # rising: no credit, no debit
    # a factor a second: 0.8 (its logarithm -0.223), a 1% wobble about it
    fall = drift([(t, 1000 * 0.8 ** t * (1.01 if t % 2 else 0.99)) for t in range(5)])
    assert fall.rate == pytest.approx(math.log(0.8), abs=0.01) and fall.span == 4
    assert fall.at(2) == pytest.approx(640, rel=0.02)
    assert drift([(t, 1000 * 0.98 ** t * (0.7 if t % 2 else 1.3)) for t in [0, 1, 2, 4, 6]]) is None  # lost in scatter
    assert drift([(t, 1000 * 0.8 ** t) for t in range(5)], 0.5) is None      # within 3 x the signal's noise (x4.5)
    assert drift([(0, 1000), (1, 900), (2, 1100), (3, 800), (4, 1000)]) is None   # no consistent fall
    assert drift([(t, 1000 * 0.8 ** t) for t in range(3)]) is None             # too few values to tell
    # no logarithm, no rate: a value at zero (a pressure gone quiet), or a signal whose log noise is unknown
    assert drift([(t, 1000 - 250 * t) for t in range(5)]) is None
    assert drift([(t, 1000 * 0.8 ** t) for t in range(5)], None) is None


def test_a_fall_is_projected_by_its_factor_never_through_zero_and_its_noise_is_taken_about_it():
    """CI's kernel run (a real service, its SLO's p99 over 10 s of responses, a value a second): the p99 fell
    on its own after koordd started, steeply and then slowly, to a median of 62.82 ms over the span before the
    floor. A straight line through that fall reached 0.00 ms, so the floor, which took the p99 to 14.07 ms, was
    judged against 0 and undone as "bought nothing", and the noise it had to beat held the fall itself. Here
    the same shape: the fall projected as a factor a second over no more than the 21 s it was seen over
    (about 25 ms), the noise taken about it, and the floor's 4.4-fold fall shows."""
    def p99(t):
        return 55000 + 95000 * math.exp(-(t - 2) / 3) + 1000 * (22 - t)

    def run(lab):
        verdicts, started = [], None
        for t in range(2, 100):
            got = lab.observe(float(t), {KEY: (p99(t) if t <= 22 else 14000) * (1.01 if t % 2 else 0.99)}, 2.0)
            verdicts += [got] if got else []
            if t == 22:
                started = lab.start(float(t), "be_cap", KEY, 2.0, COND)
        return started, verdicts

    e, [v] = run(Lab(window=24, settle=9.6))
    assert e.drift < 0 and e.drift_span == 20 and e.fields()["drift_log_per_s"] == round(e.drift, 4)
    assert 20000 < v.expected < 30000 and v.after == pytest.approx(14000, rel=0.02), v
    assert v.helped and "falling on its own to" in v.text(), v.text()
    # the fall's noise is the values' scatter about it: far less than their spread with the fall in
    lab = Lab(window=24, settle=9.6)
    for t in range(2, 23):
        lab.observe(float(t), {KEY: p99(t) * (1.01 if t % 2 else 0.99)}, 2.0)
    with_fall, _ = lab.history.spread(KEY)
    assert e.noise < 0.7 * with_fall, (e.noise, with_fall)


def test_a_signal_that_reaches_back_is_judged_once_the_cut_shows_in_full():
    # an SLO's p99 over its last 10 s of responses: a cut at t=9 that takes the latency from 30 to 20 ms shows a
    # tenth more each round. In CI's VM a 5 s window judged such a signal half-way, and the cut taken next was
    # credited with the other half.
    def windowed(t):
        return 30000 if t <= 9 else max(20000, 30000 - 1000 * (t - 9))

    def judged(lags):
        lab, verdicts = Lab(window=5, settle=2), []
        for t in range(40):
            got = lab.observe(float(t), {KEY: windowed(t)}, 2.0, lags=lags)
            if got:
                verdicts.append((t, got))
            if t == 9:
                assert lab.start(9.0, "be_cap", KEY, 2.0, COND).fields()["lag_s"] == (lags or {}).get(KEY, 0)
        return verdicts
    [(t, v)] = judged({KEY: 10.0})
    assert t == 22 and v.after == 20000 and v.n_after == 3     # after its lag, as many rounds as without one
    [(t, v)] = judged(None)
    assert t == 14 and v.after == 26500                        # half-way: what the old window saw


def test_a_cut_whose_signal_went_silent_lapses_at_its_due_time_without_a_verdict_or_a_rest():
    lab = Lab(window=5, settle=2)
    for t in range(10):
        lab.observe(float(t), {KEY: 10000}, 2.0)
    lab.start(9.0, "be_cap", KEY, 2.0, COND)
    for t in range(10, 14):                                  # no value since the cut (LS gone or idle)
        assert lab.observe(float(t), {}, 2.0) is None and lab.lapsed(float(t)) is None
    assert lab.observe(14.0, {}, 2.0) is None
    e = lab.lapsed(14.0)
    assert e is not None and e.lever == "be_cap" and lab.running is None
    assert lab.resting("be_cap", KEY[1], 14.0) == 0 and "be_cap" not in lab.totals
    # one value after the cut is something to judge by: a verdict, not a lapse
    lab.start(20.0, "be_cap", KEY, 2.0, COND)
    lab.observe(21.0, {KEY: 10000}, 2.0)
    assert lab.lapsed(25.0) is None and lab.observe(25.0, {}, 2.0) is not None


def test_levels_pool_their_noise_only_over_enough_values():
    from koordd.core.experiment import pooled_spread
    # CI's VM: one level of 4 close values inside a p99 wandering 21-28 ms put the noise under 0.5 ms
    wander = [[26900, 21600], [28100, 28150, 28200, 28160], [25400]]
    assert pooled_spread(wander) == pytest.approx(spread([v for r in wander for v in r]))
    # two such levels (8 values) are enough to pool: the gap between them is not noise
    two = [[10000, 10100, 9900, 10050], [20000, 20100, 19900, 20050]]
    assert pooled_spread(two) < 200 < spread([v for r in two for v in r])


# --- A/B/A: a kept cut tested by its release --------------------------------------------------------------------

def _kept_then_released(release_values):
    """A cut at t=9 that took the signal from 10 ms to 5 ms (helped), released at its verdict (t=14) and
    followed by `release_values`: the release's verdict."""
    lab = Lab(window=5, settle=2, rest=10, rest_max=40)
    [(t, kept)] = run(lab, [10000, 11000] * 5 + [5000, 5500] * 3, start_at=9)
    assert kept.helped and t == 14
    lab.start(14.0, "be_cap", KEY, 2.0 - kept.be_given_up, COND, release=kept)
    lab.moved()
    got = [(float(15 + i), lab.observe(float(15 + i), {KEY: v}, 2.0)) for i, v in enumerate(release_values)]
    return lab, [(t, v) for t, v in got if v is not None]


def test_a_release_that_costs_latency_confirms_the_cut_which_is_not_released_again_for_a_while():
    lab, [(t, v)] = _kept_then_released([10000, 11000] * 3)
    assert v.release and v.helped and t == 19
    assert v.text().startswith("release cost latency: app_p99_us 5.00 ms -> 10.50 ms") and v.text().endswith(
        "the be_cap cut helps")
    assert v.fields()["test"] == "release" and v.fields()["verdict"] == "helped"
    assert not lab.retest("be_cap", COND, 19.0 + 40) and lab.retest("be_cap", COND, 19.0 + 41)
    assert lab.retest("hot_cap", COND, 20.0)                   # another lever, or other conditions: tested
    assert lab.status(20.0)["levers"]["be_cap"]["by_signal"]["app_p99_us"]["helped"] == 1
    assert lab.chosen == {"be_cap": 1} and lab.resting("be_cap", KEY[1], 20.0) == 0


def test_a_release_that_costs_nothing_retracts_the_cuts_helped_and_rests_its_lever():
    lab, [(t, v)] = _kept_then_released([5000, 5500] * 3)
    assert v.release and not v.helped
    assert "release cost nothing" in v.text() and v.text().endswith("the be_cap cut bought nothing after all")
    record = lab.totals["be_cap"]["app_p99_us"]
    assert (record.helped, record.retracted, record.gain, record.score) == (1, 1, 0.0, 0.0)
    assert record.summary()["mean_gain"] is None
    assert lab.resting("be_cap", KEY[1], t) == 10 and lab.order(["be_cap", "hot_cap"], COND, t + 11) == [
        "hot_cap", "be_cap"]                                   # untried goes before one that proved useless


def test_a_release_must_give_back_half_of_what_the_cut_bought_to_confirm_it():
    # the cut took 10.5 ms to 5.25: a release at 7 ms is over the margin (1.7 ms) but 30% of the way back, as a
    # wandering signal returning to its median from the low the "helped" picked; at 8.25 ms it is 52% back
    lab, [(t, v)] = _kept_then_released([7000] * 6)
    assert v.release and not v.helped and v.gain > v.margin and round(v.back, 2) == 0.30
    assert v.text().startswith("release cost little: app_p99_us 5.00 ms -> 7.00 ms") and v.text().endswith(
        "30% of what the cut bought, under 50%: the be_cap cut bought nothing after all")
    assert v.fields()["given_back"] == 0.304 and lab.totals["be_cap"]["app_p99_us"].retracted == 1
    lab, [(t, v)] = _kept_then_released([8000, 8500] * 3)
    assert v.helped and round(v.back, 2) == 0.52 and "52% of what the cut bought: the be_cap cut helps" in v.text()


def wander(rng: random.Random):
    """A level wandering slowly (each round 0.95 of the last one's deviation, 12% spread): a windowed p99 of a
    service under TCG, which ran 21-31 ms over tens of seconds with nothing changed."""
    x = 0.0
    while True:
        x = 0.95 * x + math.sqrt(1 - 0.95 ** 2) * rng.gauss(0, 1)
        yield LEVEL * (1 + 2 * CV * x)


def trial_aba(kind: str, seed: int, target: float, drop: float):
    """trial(), then be_suppress's A/B/A: a cut judged helped is released at its verdict, the signal back at
    its own level, and the release judged. (the cut's verdict, the release's verdict or None)."""
    lab = Lab(window=5, settle=2)
    values = wander(random.Random(seed)) if kind == "wander" else signal(kind, random.Random(seed))
    cut = released = kept = None
    for t in range(400):
        v = next(values) * (1 - drop if cut is not None and t > cut and released is None else 1)
        verdict = lab.observe(float(t), {KEY: v}, 1.0)
        if verdict is not None and kept is not None:
            return kept, verdict
        if verdict is not None:
            if not verdict.helped:
                return verdict, None
            kept, released = verdict, t
            lab.start(float(t), "be_cap", KEY, 1.0, COND, release=verdict)
            lab.moved()
        if cut is None and t >= 30 and lab.confirmed(KEY, float(t), 0.95 * target):
            lab.start(float(t), "be_cap", KEY, 1.0, COND)
            lab.moved()
            cut = t
    return kept, None


@pytest.mark.parametrize("target", [1.0, 0.85], ids=["target-at-median", "target-under-median"])
@pytest.mark.parametrize("kind", KINDS + ("wander",))
def test_a_useless_cut_judged_helped_by_chance_is_rarely_kept_past_its_release_a_real_one_is(kind, target):
    # 200 seeded trials each. Measured (2026-11-28): useless cuts judged helped 1-5 of 200 per case, kept after
    # their release 0 of them on independent noise and 0-3 on the wandering kinds (ar1, window, wander: the
    # release's before is the low the helped verdict picked, and the level returning from it reads as a
    # cost); 30% drops kept 176-200. Without the release every useless "helped" was kept. Over 2000 trials the
    # give-back rule (GIVE_BACK) took the wandering kinds' keeps from 15, 28, 6 to 10, 21, 2, and the 30% drops'
    # from 197, 197, 182 of 200 to 197, 197, 180. The ratio test (2026-11-30, over 1000 trials per case):
    # useless cuts kept 1-3 per 1000 on independent noise (1-2 before it), 1-10 on the wandering kinds (1-9
    # before), 30% drops kept 917-1000 (862-1000 before); one of seeds 0-199 (normal, seed 99) is now kept, on
    # both tests passing by a hair (x1.17 against x1.17, then x1.14 against x1.13).
    t = 4000 * target if kind == "wander" else MEDIANS[kind] * target
    useless = [trial_aba(kind, seed, t, 0.0) for seed in range(200)]
    helped = sum(v is not None and v.helped for v, _ in useless)
    kept = sum(r is not None and r.helped for _, r in useless)
    assert kept <= 3 and kept <= helped, (helped, kept)
    if kind not in ("ar1", "window", "wander"):
        assert kept <= 1, (helped, kept)
    real = [trial_aba(kind, 10_000 + seed, t, 0.3) for seed in range(200)]
    assert sum(r is not None and r.helped for _, r in real) >= 175


def test_what_is_remembered_per_condition_is_bounded_the_oldest_going_first():
    # conditions name BE cgroups, and pods come and go: a month of verdicts must not grow the memory for good
    from koordd.core.experiment import MAX_CONDITIONS
    lab = Lab(window=5, settle=2)
    for n in range(MAX_CONDITIONS + 10):
        cond = conditions(1.0, 4, [f"be/pod-{n}"], "app_p99_us")
        run(lab, [10000, 11000] * 5 + [9500, 10500] * 4, start_at=100.0 * n + 9, t0=100.0 * n, cond=cond)
    assert len(lab.memory) == MAX_CONDITIONS
    assert conditions(1.0, 4, ["be/pod-0"], "app_p99_us") not in lab.memory
    assert conditions(1.0, 4, [f"be/pod-{MAX_CONDITIONS + 9}"], "app_p99_us") in lab.memory
    assert lab.totals["be_cap"]["app_p99_us"].nothing == MAX_CONDITIONS + 10      # the totals keep counting


def test_a_cut_is_settled_only_once_its_signal_can_show_it_past_the_settle_time_and_its_lag():
    lab = Lab(window=5, settle=2)
    assert not lab.settled(0.0)                                          # nothing running
    lab.observe(9.0, {KEY: 10000}, 2.0, lags={KEY: 3.0})
    lab.start(9.0, "be_cap", KEY, 2.0, COND)
    assert lab.running.lag == 3.0
    assert [lab.settled(t) for t in (10.0, 11.0, 12.0, 12.5)] == [False, False, False, True]
    lab.deepen(12.5)                                                     # a deeper cut: from its own move
    assert not lab.settled(14.5) and lab.settled(16.0)


def test_a_cut_no_verdict_could_call_helped_is_known_before_it_is_taken():
    # A minute that swung between 1 ms and 60 ms (a host that stalled), then 20 ms: a verdict would ask more
    # than 20 ms of the cut, which no signal can give (it cannot fall below zero).
    lab = Lab(window=5, settle=2)
    for t, v in enumerate([1000, 60000] * 15 + [20000] * 3):
        lab.observe(float(t), {KEY: v}, 2.0)
    possible, before, need = lab.can_show(KEY, 32.0)
    assert not possible and before == 20000 and need > before, (before, need)
    # taken anyway, and the signal at zero after it: bought nothing
    lab.start(32.0, "be_cap", KEY, 2.0, COND)
    verdicts = [v for t in range(33, 45) if (v := lab.observe(float(t), {KEY: 0.0}, 0.1))]
    assert verdicts and not verdicts[0].helped and verdicts[0].margin >= need
    # a calm minute at 10 ms, then 30 ms: a cut can show
    lab = Lab(window=5, settle=2)
    for t, v in enumerate([10000] * 30 + [30000] * 3):
        lab.observe(float(t), {KEY: v}, 2.0)
    assert lab.can_show(KEY, 32.0)[0]


def test_where_a_cut_cannot_show_even_a_signal_gone_to_zero_is_no_gain_200_random_minutes():
    # The least margin can_show() reckons is a lower bound of every verdict's: where it says no cut could
    # show, a cut taken anyway is never judged helped, though its signal falls to zero at once.
    impossible = 0
    for seed in range(200):
        rng = random.Random(seed)
        lab, scale, lag = Lab(window=5, settle=2), rng.choice([0.05, 0.3, 1.0, 3.0]), rng.choice([0.0, 1.5, 3.0])
        for t in range(40):
            value = max(LEVEL * (1 + scale * rng.gauss(0, 1)), 0.0) * (rng.choice([1, 1, 1, 8]) if scale > 1 else 1)
            lab.observe(float(t), {KEY: value}, 1.0, lags={KEY: lag})
        possible, before, need = lab.can_show(KEY, 39.0)
        if possible:
            continue
        impossible += 1
        lab.start(39.0, "be_cap", KEY, 1.0, COND)
        verdict = next(v for t in range(40, 80) if (v := lab.observe(float(t), {KEY: 0.0}, 0.1, lags={KEY: lag})))
        assert not verdict.helped and verdict.margin >= need - 1e-9, (seed, before, need, verdict)
    assert 20 <= impossible <= 180, impossible          # both kinds of minute were drawn (88 of 200)


def test_where_the_after_window_would_hold_too_many_rounds_to_bound_a_cut_is_let_through():
    # Rounds 10 ms apart (an interval no loop has, or a history fed twice a round): a verdict's window would
    # hold 301 values, whose least margin costs their square each to sum. can_show does not hold BE on a
    # bound it did not compute, however noisy the signal.
    lab = Lab(window=5, settle=2)
    for i, v in enumerate([1000, 60000] * 15 + [20000] * 3):
        lab.observe(i * 0.01, {KEY: v}, 2.0)
    assert lab.can_show(KEY, 32 * 0.01) == (True, 20000, 0.0)
    # the same values a second apart are held (the first test above)
    lab = Lab(window=5, settle=2)
    for t, v in enumerate([1000, 60000] * 15 + [20000] * 3):
        lab.observe(float(t), {KEY: v}, 2.0)
    assert not lab.can_show(KEY, 32.0)[0]


def test_a_signal_that_lags_is_no_noise_while_its_window_still_reaches_back_past_a_move():
    """A windowed p99 (here reaching back 30 s) ramps from one level to the other for that long after a floor.
    Those rounds were counted as noise: in a real run's A/B/A the release's noise read 33.44 ms (margin 106.12
    ms), so a release that took the SLO from 14.64 ms to 113.56 ms "cost nothing", the cut that had bought the
    same was called useless after all, and BE stayed uncapped (tests/kernel/test_be_suppress_kernel.py, on a
    fresh clone). Only the values whose window lies past the move measure the signal's noise."""
    rng = random.Random(3)
    lag = 30.0
    lab = Lab(window=24.0, settle=9.6, rest=16, rest_max=320)
    t = 0.0

    def observe(value):
        nonlocal t
        got = lab.observe(t, {KEY: value}, 2.0, lags={KEY: lag})
        t += 1.0
        return got

    for _ in range(14):                                   # BE uncapped: about 102 ms
        observe(102000 + rng.uniform(-5000, 5000))
    lab.start(t - 1, "be_cap", KEY, 2.0, COND)            # the floor
    cut, i = None, 0
    while cut is None:                                    # the p99 falls over its 30 s to 14.8 ms
        i += 1
        cut = observe(102000 - (102000 - 14800) * min(i / lag, 1.0) + rng.uniform(-900, 900))
    assert cut.helped, cut.text()
    lab.start(t - 1, "be_cap", KEY, 2.0 - cut.be_given_up, COND, release=cut)
    lab.moved()
    released, i = None, 0
    while released is None:                               # released: it climbs over its 30 s to 100 ms
        i += 1
        released = observe(14800 + (100000 - 14800) * min(i / lag, 1.0) + rng.uniform(-900, 900))
    assert released.helped and released.text().endswith("the be_cap cut helps"), released.text()
    assert released.noise < 2000 and released.margin < 5000, released.text()   # the jitter, not the ramp


# A p99 wandering slowly over 45-150 ms with BE uncapped (LS at a sixteenth of BE's weight: the kernel test's
# service), then 15 ms after a floor: its noise where it was high is tens of ms, where it is low half a ms.
HIGH_WANDER_MS = [45, 52, 60, 70, 82, 95, 110, 126, 140, 150, 140, 126, 110, 95, 82, 70, 82, 95, 110, 126]


def test_a_cut_far_below_all_a_wandering_high_level_showed_helped_by_ratio_though_not_by_its_margin():
    # CI at 8761138, the kernel test's floor: "cut bought nothing: app_p99_us 93.21 ms -> 15.11 ms (noise 33.47
    # ms, margin 105.16 ms, 12/15 rounds)". A latency's spread grows with its level: by factors the high level
    # wandered within x3.3 and the cut bought x7: 110 -> 15.30 ms against a 113.05 ms margin, x7.19 against x3.59.
    lab = Lab(window=24, settle=9.6)
    high = [ms * 1000.0 for ms in HIGH_WANDER_MS]
    verdicts = run(lab, high + [15000.0 + 300 * (i % 3) for i in range(40)], start_at=len(high) - 1)
    [(t, v)] = verdicts[:1]
    assert v.helped and not v.early and v.passes() == (False, True), v.text()
    assert v.gain < v.margin and v.noise > 25000, v.text()         # the margin test alone: bought nothing
    assert "; by ratio x" in v.text() and v.fields()["by_ratio"]["passed"] is True
    assert v.fields()["by_ratio"] == {"factor": 7.19, "needed": 3.588, "given_back": None, "passed": True}


def test_a_release_back_most_of_the_cuts_factor_confirms_it_though_short_of_half_its_ms():
    # The kernel test, locally: the cut took a p99 116.26 -> 15.40 ms, its release to 64.80 ms: 49% of the ms
    # the cut bought (under GIVE_BACK: "the cut bought nothing after all", BE uncapped with the SLO missed
    # four times over) but 71% of its factor.
    lab = Lab(window=5, settle=2)
    [(t, kept)] = run(lab, [110000.0, 122000.0] * 5 + [15000.0, 15800.0] * 3, start_at=9)
    assert kept.helped and kept.before == 122000.0
    lab.start(t, "be_cap", KEY, 2.0 - kept.be_given_up, COND, release=kept)
    lab.moved()
    got = [v for i in range(8) if (v := lab.observe(t + 1 + i, {KEY: 64800.0 + 500 * (i % 2)}, 2.0))]
    [v] = got
    assert v.release and v.helped and v.passes() == (False, True) and v.back < 0.5 < v.log_back, v.text()
    assert v.text().startswith("release cost latency: app_p99_us 15.00 ms -> 65.05 ms") and v.text().endswith(
        "of the cut's factor back): the be_cap cut helps"), v.text()
    assert lab.totals["be_cap"]["app_p99_us"].retracted == 0


def test_a_fall_to_a_value_next_to_zero_is_a_factor_that_still_prints():
    # A workload's own histogram can name a bucket of 1e-320 s: a fall from 1 s to it is a logarithm of over
    # 730, past what exp() can give (OverflowError in the decision's text and fields, the round lost).
    lab = Lab(window=5, settle=2)
    [(t, v)] = run(lab, [1e6, 1.1e6] * 5 + [1e-314] * 6, start_at=9)
    assert v.helped and v.log_gain > 710
    assert v.fields()["by_ratio"]["factor"] > 1e300 and "cut helped" in v.text()


def test_median_and_fmean_are_the_statistics_module_s():
    # koordd's own two (the statistics module costs 0.7 MB of RSS): the same values on odd, even and
    # single counts, negatives, repeats and infinities.
    from koordd.core.experiment import fmean, median
    rng = random.Random(7)
    for n in (1, 2, 3, 4, 5, 10, 11, 64):
        values = [rng.choice([rng.uniform(-1e6, 1e6), 0.0, 5.0]) for _ in range(n)]
        assert median(values) == statistics.median(values) and median(iter(values)) == statistics.median(values)
        assert fmean(values) == statistics.fmean(values)
    assert median([math.inf, 1.0, 2.0]) == 2.0
    with pytest.raises(ValueError):
        median([])


from koordd.core.experiment import CHANCE_COUNTS, Record, chance_better  # noqa: E402


def _integrated(a: tuple[int, int], b: tuple[int, int], steps: int = 20000) -> float:
    """P(X > Y), X ~ Beta(1 + a helps, 1 + a misses), Y likewise for b, by the midpoint rule on
    the integral of X's density times Y's distribution: an independent way to the same figure."""
    def density(k, n):
        logc = math.lgamma(n + 2) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        return lambda x: math.exp(logc + k * math.log(x) + (n - k) * math.log(1 - x))
    fa, fb = density(*a), density(*b)
    h = 1.0 / steps
    total, below = 0.0, 0.0
    for i in range(steps):
        x = (i + 0.5) * h
        below += fb(x) * h / 2          # Y's distribution at x (the midpoint's half step)
        total += fa(x) * below * h
        below += fb(x) * h / 2
    return total


@pytest.mark.parametrize("a,b", [((0, 0), (0, 0)), ((1, 1), (0, 0)), ((2, 3), (1, 3)), ((4, 5), (2, 3)),
                                 ((30, 45), (30, 50)), ((0, 3), (3, 3)), ((9, 12), (1, 3))])
def test_the_chance_that_one_lever_helps_more_often_than_another_is_the_posterior_s(a, b):
    record = lambda k, n: Record(helped=k, nothing=n - k)
    got = chance_better(record(*a), record(*b))
    assert got == pytest.approx(_integrated(a, b), abs=2e-3), (a, b)
    assert got + chance_better(record(*b), record(*a)) == pytest.approx(1.0, abs=1e-9)


def test_a_retracted_help_counts_as_none_and_equal_records_are_a_coin_toss():
    assert chance_better(Record(), Record()) == pytest.approx(0.5)
    assert chance_better(Record(helped=1), Record()) == pytest.approx(2 / 3)
    assert chance_better(Record(helped=3, nothing=1, retracted=2), Record(helped=1, nothing=3)) == pytest.approx(0.5)
    # 2 of 3 against 1 of 3 is no sure thing; 200 of 300 against 100 of 300 is
    assert 0.7 < chance_better(Record(helped=2, nothing=1), Record(helped=1, nothing=2)) < 0.8
    assert chance_better(Record(helped=200, nothing=100), Record(helped=100, nothing=200)) > 0.999


def test_a_long_lived_koordd_s_huge_counts_count_as_chance_counts_at_their_share():
    # the exact sum runs over the smaller record's helps, and lgamma loses digits at 10^12: past
    # CHANCE_COUNTS verdicts a record counts as that many, at its share
    scale = CHANCE_COUNTS // 1000
    assert chance_better(Record(helped=3000, nothing=1000), Record(helped=2940, nothing=1060)) == pytest.approx(
        chance_better(Record(helped=750 * scale, nothing=250 * scale), Record(helped=735 * scale, nothing=265 * scale)))
    huge = Record(helped=10 ** 12, nothing=10 ** 12)
    assert chance_better(huge, huge) == pytest.approx(0.5)
    # the huge record's share is 0.5 to many digits: the chance is that of Beta(2, 10) staying under 0.5,
    # 1 - P(Binomial(11, 0.5) <= 1) = 1 - 12/2048
    assert chance_better(huge, Record(helped=1, nothing=9)) == pytest.approx(1 - 12 / 2048, abs=1e-3)
    assert chance_better(Record(helped=1, nothing=9), huge) == pytest.approx(12 / 2048, abs=1e-3)
    assert chance_better(huge, Record(helped=10 ** 12 + 10 ** 10, nothing=10 ** 12)) == pytest.approx(
        chance_better(Record(helped=500, nothing=500), Record(helped=502, nothing=498)))


@pytest.mark.parametrize("after, release, cost", [
    (4.5, False, True),       # a move after which the signal rose by more than the margin
    (3.1, False, False),      # within the margin: nothing either way
    (2.0, False, False),      # better: no cost
    (2.0, True, True),        # a release after which the signal fell: keeping the cut was the cost
    (4.5, True, False),
])
def test_a_verdict_says_a_cost_only_where_the_signal_got_worse_by_more_than_the_margin(after, release, cost):
    """Verdict.cost: what a move that takes nothing from BE (the wake lever) is released for."""
    v = Verdict("wake", ("ls", "app_p99_us"), False, 3.0, after, 0.1, 0.3, 0.0, release=release)
    assert v.cost() is cost
    # by ratio too: worse by more than the factor a gain must pass
    assert Verdict("wake", ("ls", "app_p99_us"), False, 3.0, 3.1, 0.1, 0.3, 0.0, log_gain=-0.2, log_margin=0.05).cost()
