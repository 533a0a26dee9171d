"""core/reclaim.py: what a loop asks of memory.reclaim is cut into writes of RECLAIM_WRITE_BYTES at most,
which add up to the amount asked (the actuator's time budget per round relies on each write being short)."""
from __future__ import annotations

from hypothesis import given, strategies as st

from koordd.core.reclaim import RECLAIM_ROUND_BYTES, RECLAIM_WRITE_BYTES, MiB, reclaim_writes


def test_an_amount_is_cut_into_short_writes_in_order():
    assert reclaim_writes(70 * MiB) == [32 * MiB, 32 * MiB, 6 * MiB]
    assert reclaim_writes(RECLAIM_WRITE_BYTES) == [RECLAIM_WRITE_BYTES]
    assert reclaim_writes(0) == [] and reclaim_writes(-5) == []


def test_a_round_is_a_whole_number_of_writes():
    assert RECLAIM_ROUND_BYTES % RECLAIM_WRITE_BYTES == 0
    assert len(reclaim_writes(RECLAIM_ROUND_BYTES)) == RECLAIM_ROUND_BYTES // RECLAIM_WRITE_BYTES


@given(st.integers(min_value=1, max_value=1 << 40))
def test_the_writes_add_up_and_none_is_empty_or_too_long(amount):
    writes = reclaim_writes(amount)
    assert sum(writes) == amount
    assert all(0 < w <= RECLAIM_WRITE_BYTES for w in writes)
