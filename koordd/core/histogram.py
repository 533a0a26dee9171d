"""Log2 histograms of waits in µs, as the run-queue BPF program fills them (and the application latency
one its responses): slot k holds waits of [2^(k-1), 2^k) µs, slot 0 those under 1 µs. Pure arithmetic,
shared by the sensors and the policies that merge several rounds (HistogramWindow: loop state, no I/O)."""
from __future__ import annotations

from collections import deque
from typing import Hashable, Iterable, Sequence


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


def share_over_us(slots: Sequence[int], target_us: float) -> float | None:
    """The share (0..1) of the events above `target_us`, the slot the target falls in counted as if its
    events were spread evenly (as quantile_us does: quantile_us(slots, 1 - share) is the target again);
    None without an event."""
    total = sum(slots)
    if total == 0:
        return None
    over = 0.0
    for slot, n in enumerate(slots):
        if not n:
            continue
        lower, upper = slot_lower_us(slot), slot_upper_us(slot)
        if lower >= target_us:
            over += n
        elif upper > target_us:
            over += n * (upper - target_us) / (upper - lower)
    return over / total


class HistogramWindow:
    """Each key's recent rounds of a histogram, so that its quantiles are taken over at least `min_count`
    events: a key with many events a round is judged by its latest round alone, one with few by its latest
    rounds together, none older than `window` seconds. A harm that lasts shows all the same (20 bad waits of
    200 are 10%, well past the 1% a p99 ignores); one wild event in a quiet second no longer decides.
    Loop state: the policy feeds it, no I/O."""

    def __init__(self, min_count: int, window: float):
        self.min_count, self.window = min_count, window
        self.rounds: dict[Hashable, deque[tuple[float, tuple[int, ...]]]] = {}
        self.spans: dict[Hashable, float] = {}    # key -> seconds its latest quantile reaches back (span())

    def add(self, key: Hashable, now: float, slots: Sequence[int]) -> list[int]:
        """Add this round's histogram of `key` and return the sum of its latest rounds that hold at least
        min_count events (all of the window's, where they hold fewer)."""
        rounds = self.rounds.setdefault(key, deque())
        rounds.append((now, tuple(slots)))
        while now - rounds[0][0] > self.window:
            rounds.popleft()
        taken, count, oldest = [], 0, now
        for t, h in reversed(rounds):
            taken.append(h)
            count += sum(h)
            oldest = t
            if count >= self.min_count:
                break
        self.spans[key] = now - oldest
        return merged(taken)

    def span(self, key: Hashable) -> float:
        """Seconds between the oldest and the newest round the key's latest quantile was taken over (0: one
        round, or none yet): how long a change takes to show in full in that quantile, the lag a verdict
        on it waits out (core/experiment.py)."""
        return self.spans.get(key, 0.0)

    def forget_except(self, keys: Iterable[Hashable]) -> None:
        keep = set(keys)
        for key in [k for k in self.rounds if k not in keep]:
            del self.rounds[key]
            self.spans.pop(key, None)
