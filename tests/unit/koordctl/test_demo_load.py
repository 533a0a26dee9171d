"""What the demo's LS worker asks for, and how it burns it."""
from __future__ import annotations

import time

import pytest

from koordctl.demo.load import burn_until, demand, mean_demand

PERIOD, LOW, HIGH = 20.0, 0.1, 0.7


@pytest.mark.parametrize("t, expected", [(0, LOW), (PERIOD / 4, (LOW + HIGH) / 2), (PERIOD / 2, HIGH),
                                         (PERIOD, LOW), (1.5 * PERIOD, HIGH)])
def test_demand_starts_low_and_peaks_half_a_period_later(t, expected):
    assert demand(t, PERIOD, LOW, HIGH) == pytest.approx(expected)


def test_demand_stays_between_low_and_high():
    values = [demand(t / 10, PERIOD, LOW, HIGH) for t in range(1000)]
    assert min(values) >= LOW - 1e-12 and max(values) <= HIGH + 1e-12


@pytest.mark.parametrize("t0, t1", [(0, 0.1), (3.3, 3.8), (9.95, 10.05), (0, PERIOD), (7, 31), (12.5, 12.6)])
def test_mean_demand_is_the_mean_over_the_window(t0, t1):
    n = 20000
    numeric = sum(demand(t0 + (i + 0.5) * (t1 - t0) / n, PERIOD, LOW, HIGH) for i in range(n)) / n
    assert mean_demand(t0, t1, PERIOD, LOW, HIGH) == pytest.approx(numeric, rel=1e-6)


def test_mean_demand_over_whole_periods_is_the_middle():
    assert mean_demand(3, 3 + 2 * PERIOD, PERIOD, LOW, HIGH) == pytest.approx((LOW + HIGH) / 2)


def test_mean_demand_of_an_empty_window_is_the_demand_then():
    assert mean_demand(5, 5, PERIOD, LOW, HIGH) == demand(5, PERIOD, LOW, HIGH)


def test_burn_until_gives_up_at_the_deadline():
    before = time.thread_time()
    burn_until(3600.0, deadline=time.monotonic())        # an hour of work, no time left: returns at once
    assert time.thread_time() - before < 1.0


def test_burn_until_uses_the_cpu_time_asked_for():
    before = time.thread_time()
    burn_until(0.02, deadline=time.monotonic() + 60)
    assert time.thread_time() - before >= 0.02
