"""How much a loop asks of `memory.reclaim`, shared by every loop that writes it (memory_evict,
proactive_reclaim).

A write to memory.reclaim returns only once the kernel reclaimed what it was asked: seconds for GiBs on
a host that swaps to disk (about 100 MB/s). The actuator bounds the TIME such writes take in one round
(koordd/act/actuator.py, SLOW_WRITE_BUDGET, KnobSpec.slow) and defers those past it; these bytes keep
each write short, so the one write in flight when that budget runs out costs little more, and bound
what a loop asks in one round at all.
"""
from __future__ import annotations

MiB = 1 << 20
# One write: at ~100 MB/s of swap-out about 0.3 s, a small part of the actuator's 1 s budget a round.
RECLAIM_WRITE_BYTES = 32 * MiB
# All of one loop's writes in one round (eight writes): more waits for the next round.
RECLAIM_ROUND_BYTES = 256 * MiB


def reclaim_writes(amount: int) -> list[int]:
    """`amount` bytes as the writes that ask for them, RECLAIM_WRITE_BYTES at most each."""
    out = []
    while amount > 0:
        out.append(min(amount, RECLAIM_WRITE_BYTES))
        amount -= out[-1]
    return out
