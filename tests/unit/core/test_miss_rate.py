"""The miss ledger (koordd/core/miss_rate.py): how often LS begins to miss at each level of BE's use, and
whether a miss is blamed on BE's level."""
from __future__ import annotations

import math

import pytest

from koordd.core.miss_rate import HALF_LIFE, MAX_BINS, MIN_EXPOSURE, MissLedger, poisson_at_least


def feed(ledger: MissLedger, rounds, start: float = 0.0) -> float:
    """Rounds a second apart: (BE level, LS at risk). Returns the next round's time."""
    t = start
    for level, at_risk in rounds:
        ledger.note(t, level, at_risk)
        t += 1.0
    return t


def episodes(level: float, seconds: int, every: int, length: int = 3):
    """`seconds` rounds at `level` with an episode of `length` rounds at risk every `every` rounds."""
    return [(level, (t % every) >= every - length) for t in range(seconds)]


def test_a_fresh_ledger_blames_the_first_miss_on_be():
    ledger = MissLedger(0.25)
    feed(ledger, [(1.5, False)] * 20 + [(1.5, True)])
    blame = ledger.blame(1.5)
    assert blame.blamed and blame.chance is None
    assert blame.below == (0.0, 0.0) and blame.at_or_above == pytest.approx((1.0, 20.0), rel=0.05)   # faded


def test_misses_as_frequent_with_less_be_are_not_blamed_on_its_level():
    # a minute at 0.25 CPUs with a miss every 15 s, then 10 s at 1.5 CPUs and a miss: chance, not BE
    ledger = MissLedger(0.25)
    t = feed(ledger, episodes(0.25, 60, 15))
    feed(ledger, [(1.5, False)] * 10 + [(1.5, True)], start=t)
    blame = ledger.blame(1.5)
    assert not blame.blamed, blame
    # 4 onsets in 48 s healthy, faded over the 70 s since
    assert blame.below == pytest.approx((4, 48), rel=0.15) and blame.chance > 0.3
    assert blame.text().startswith("LS began to miss 4 times in 4") and "below 1.50 BE CPUs, 1 in 10s at or" in blame.text()


def test_misses_rare_with_less_be_and_frequent_with_more_are_blamed():
    # two minutes at 0.25 CPUs with one miss, then a miss every 10 s at 1.5 CPUs for a minute
    ledger = MissLedger(0.25)
    t = feed(ledger, [(0.25, False)] * 60 + [(0.25, True)] * 3 + [(0.25, False)] * 60)
    feed(ledger, episodes(1.5, 60, 10), start=t)
    blame = ledger.blame(1.5)
    assert blame.blamed and blame.chance is not None and blame.chance < 0.05, blame


def test_too_little_time_with_less_be_decides_nothing_and_the_miss_is_blamed():
    ledger = MissLedger(0.25)
    t = feed(ledger, episodes(0.25, int(MIN_EXPOSURE) - 5, 5))       # misses, but under MIN_EXPOSURE healthy
    feed(ledger, [(1.5, False)] * 60 + [(1.5, True)], start=t)
    blame = ledger.blame(1.5)
    assert blame.blamed and blame.chance is None and blame.below[1] < MIN_EXPOSURE


def test_exposure_counts_only_while_ls_is_healthy_and_not_across_a_long_gap():
    ledger = MissLedger(0.25)
    feed(ledger, [(0.5, False)] * 5 + [(0.5, True)] * 5 + [(0.5, False)] * 5)
    b = ledger.bins[2]
    # 14 intervals: 4 healthy, the onset's (healthy at its start), 4 at risk with the recovery's, 4 healthy
    assert b.onsets == pytest.approx(1.0, rel=0.05) and b.exposure == pytest.approx(9.0, rel=0.05)
    ledger.note(14.0 + 60.0, 0.5, False)            # koordd stopped for a minute: no exposure for it
    assert ledger.bins[2].exposure < 10.0


def test_what_ls_tolerated_long_ago_fades_with_the_half_life():
    ledger = MissLedger(0.25)
    feed(ledger, [(0.5, False)] * 3 + [(0.5, True)])
    onsets = ledger.bins[2].onsets
    for i in range(1, int(HALF_LIFE) + 1):          # healthy at another level for a half-life
        ledger.note(3.0 + i, 1.5, False)
    assert ledger.bins[2].onsets == pytest.approx(onsets / 2, rel=0.01)


@pytest.mark.parametrize("level", [math.nan, math.inf, -math.inf, -5.0, 1e300, 1e18])
def test_a_level_from_a_hostile_kernel_file_keeps_the_ledger_bounded(level):
    ledger = MissLedger(0.0625)
    for t in range(100):
        ledger.note(float(t), level if t % 2 else 0.5 * t, t % 7 == 0)
    assert len(ledger.bins) <= MAX_BINS + 1 and max(ledger.bins) <= MAX_BINS
    assert isinstance(ledger.blame(level).blamed, bool)


def test_poisson_tail():
    assert poisson_at_least(0, 3.0) == 1.0 and poisson_at_least(3, 0.0) == 0.0
    assert poisson_at_least(1, 0.125) == pytest.approx(1 - math.exp(-0.125))
    assert poisson_at_least(2, 1.0) == pytest.approx(1 - 2 * math.exp(-1))
    assert poisson_at_least(3, 1000.0) == pytest.approx(1.0)         # exp(-1000) underflows: summed in logs
    assert poisson_at_least(2000, 1000.0) < 1e-9
    assert poisson_at_least(1, math.nan) == 0.0 and poisson_at_least(1, math.inf) == 1.0
