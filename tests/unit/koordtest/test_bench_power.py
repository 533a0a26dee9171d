"""How many repetitions a frontier verdict needs (koordtest/bench/power.py): one run's scatter pooled over
settings repeated with nothing changed, and the runs of each setting that tell two apart by a ratio."""
from __future__ import annotations

import math
import random
import statistics

import pytest

from koordtest.bench.power import Noise, PairedRatio, paired_ratio, pooled_log_sd, runs_needed, t_95


def test_the_scatter_is_pooled_over_groups_in_logarithms_with_its_degrees_of_freedom():
    # each group: two runs a factor e apart, whatever their level -> squares 2 x 0.5^2 each
    noise = pooled_log_sd([[1.0, math.e], [2.0, 2 * math.e], [5.0]])
    assert noise == Noise(pytest.approx(math.sqrt(0.5)), 2)
    # a group of one counts nothing, and neither do values no logarithm can take
    assert pooled_log_sd([[1.0, math.e, 0.0, -1.0, None, float("inf"), float("nan"), "7"]]) == \
        Noise(pytest.approx(math.sqrt(0.5)), 1)
    assert pooled_log_sd([[3.0], [], [None, 4.0]]) is None
    assert pooled_log_sd([[3.0, 3.0]]) == Noise(0.0, 1)


def test_the_runs_needed_are_the_textbook_sixteen_for_a_difference_of_one_standard_deviation():
    # two-sided 5%, power 80%, effect of one sd: 2 (1.96 + 0.84)^2 = 15.7 -> 16 runs of each
    assert runs_needed(math.log(2), 2.0) == 16
    assert runs_needed(2 * math.log(2), 2.0) == 63         # twice the scatter, four times the runs
    assert runs_needed(0.0, 1.05) == 2                      # no scatter: still two to compare
    # the 95% rule on a host where one run's BE work scatters by 15%: over a hundred runs of each setting
    assert runs_needed(0.15, 1 / 0.95) == 135
    for bad in (1.0, 0.9, float("nan")):
        with pytest.raises(ValueError):
            runs_needed(0.1, bad)


def test_that_many_runs_tell_the_two_apart_about_four_times_in_five():
    """The estimate's promise, simulated: log-normal runs of two settings a ratio apart, runs_needed of each,
    compared with Welch's t at the normal 5% quantile. With the sample's own sd the power lands near 80%."""
    rnd = random.Random(36)
    sd, ratio = 0.2, 1.1

    def power(n, trials=1500):
        hits = 0
        for _ in range(trials):
            a = [rnd.gauss(0.0, sd) for _ in range(n)]
            b = [rnd.gauss(math.log(ratio), sd) for _ in range(n)]
            se = math.sqrt(statistics.variance(a) / n + statistics.variance(b) / n)
            hits += abs(statistics.fmean(b) - statistics.fmean(a)) / se > 1.959964
        return hits / trials

    n = runs_needed(sd, ratio)
    assert 0.75 <= power(n) <= 0.85, n
    assert power(n // 2) < 0.6                             # and with half the runs it does not


def test_students_t_comes_from_the_table_and_beyond_it_from_the_expansion():
    assert t_95(1) == 6.314 and t_95(10) == 1.812 and t_95(30) == 1.697
    # published one-sided 95% quantiles beyond the table: 40 -> 1.684, 60 -> 1.671, 120 -> 1.658
    for freedom, published in ((40, 1.684), (60, 1.671), (120, 1.658)):
        assert t_95(freedom) == pytest.approx(published, abs=0.001)
    assert t_95(10 ** 9) == pytest.approx(1.644854)
    with pytest.raises(ValueError):
        t_95(0)


def test_a_paired_ratio_is_a_geometric_mean_with_its_90_percent_interval():
    r = paired_ratio([(1.0, 1.1), (2.0, 1.8), (0.5, 0.5), (None, 1.0), (0.0, 1.0), (1.0, float("nan"))])
    logs = [math.log(1.1), math.log(0.9), 0.0]
    sd = statistics.stdev(logs)
    half = 2.920 * sd / math.sqrt(3)
    assert r.pairs == 3 and r.ratio == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (r.low, r.high) == pytest.approx((r.ratio * math.exp(-half), r.ratio * math.exp(half)))
    assert paired_ratio([(1.0, 2.0)]) is None and paired_ratio([]) is None


def test_the_95_percent_rule_paired_is_settled_only_where_the_interval_leaves_no_doubt():
    steady = paired_ratio([(1.0, 0.99), (1.0, 1.01), (1.0, 1.0), (1.0, 0.98), (1.0, 1.02)])
    assert steady.against(0.95) == "at least 95% with 95% confidence"
    short = paired_ratio([(1.0, 0.80), (1.0, 0.82), (1.0, 0.81)])
    assert short.against(0.95) == "under 95% with 95% confidence"
    # the host's scatter: eight pairs leave it open, and the estimate of what would settle it follows the scatter
    rnd = random.Random(7)
    noisy = paired_ratio([(1.0, math.exp(rnd.gauss(0.0, 0.15))) for _ in range(8)])
    text = noisy.against(0.95)
    assert text.startswith("undetermined: about ") and text.endswith(" pairs would settle it at this scatter"), text
    need = int(text.split("about ")[1].split(" pairs")[0])
    assert need == max(9, math.ceil((1.644854 * noisy.log_sd / abs(math.log(noisy.ratio / 0.95))) ** 2))
    assert PairedRatio(4, 0.95, 0.9, 1.0, 0.05).against(0.95) == "undetermined: the ratio sits on 95%"


def test_forged_extremes_in_results_json_give_finite_figures_not_a_crash():
    r = paired_ratio([(5e-324, 1e308), (1e308, 5e-324), (1.0, 1.0)])
    assert r is not None and math.isfinite(r.log_sd) and r.ratio == pytest.approx(1.0) and r.high == math.inf
    assert r.against(0.95).startswith(("undetermined", "at least", "under"))
    assert math.isfinite(pooled_log_sd([[5e-324, 1e308]]).log_sd)
