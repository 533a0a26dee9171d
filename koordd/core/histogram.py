"""Log2 histograms of waits in µs, as the run-queue BPF program fills them: slot k holds waits of
[2^(k-1), 2^k) µs, slot 0 those under 1 µs. Pure arithmetic, shared by the sensor and the policies
that merge several rounds."""
from __future__ import annotations

from typing import Iterable, Sequence


def slot_upper_us(slot: int) -> float:
    """The largest wait a slot holds (its upper bound): what the maximum is reported as."""
    return float(2 ** slot) if slot > 0 else 1.0


def slot_lower_us(slot: int) -> float:
    return float(2 ** (slot - 1)) if slot > 0 else 0.0


def quantile_us(slots: Sequence[int], q: float) -> float | None:
    """The q-quantile, interpolated within its slot as if the slot's waits were spread evenly (as
    Prometheus' histogram_quantile does): a slot spans 2x, and reporting its upper bound would put a
    p99 of 1.1 ms at 2.048 ms, past a 2 ms target it does not reach."""
    total = sum(slots)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for slot, n in enumerate(slots):
        if n and seen + n >= rank:
            lower, upper = slot_lower_us(slot), slot_upper_us(slot)
            return lower + (upper - lower) * max(rank - seen, 0) / n
        seen += n
    return slot_upper_us(max(i for i, n in enumerate(slots) if n))


def merged(histograms: Iterable[Sequence[int]]) -> list[int]:
    """The sum of histograms, slot by slot."""
    out: list[int] = []
    for h in histograms:
        if len(h) > len(out):
            out += [0] * (len(h) - len(out))
        for i, n in enumerate(h):
            out[i] += n
    return out
