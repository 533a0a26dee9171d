"""How often LS starts to miss at each level of BE's CPU use: the evidence behind a growth ceiling.

be_suppress stops BE's growth short of the BE use at which LS last missed (its ceiling: _grow_allowance).
Taken from the last miss alone, a miss that BE did not cause lowers the ceiling as much as one it did. On
2 CPUs over minutes (memcached 2000-key at 20% against the membw antagonist, docs/benchmarks.md) LS missed
with BE at 0.02 to 0.95 CPUs within one minute, every miss lowered the ceiling, and it fell to 0.40 CPUs:
a one-line cpu.idle (BE never cut) did more BE work at the same p99 in 3 repetitions of 4.

The ledger counts, per level of BE's use (a bin of `width` CPUs), the seconds LS spent healthy there (its
exposure: a miss can begin only then) and the misses that began there (onsets), both fading with a
HALF_LIFE. A miss at a level is blamed on BE (blame) unless LS, over MIN_EXPOSURE seconds with less BE,
began missing often enough that the onsets seen at that level and above are what chance gives at the lower
rate (a Poisson tail of at least CHANCE). Without that evidence (a fresh ledger, no miss with less BE) the
miss is blamed: the ceiling is kept as before.

Pure: no I/O; the loop feeds it one round at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

HALF_LIFE = 300.0      # seconds: what LS tolerated ten minutes ago weighs a quarter
MIN_EXPOSURE = 30.0    # seconds healthy with less BE before a miss is compared with the misses there
CHANCE = 0.05          # a tail this likely at the lower rate: the miss is no more BE's than the lower ones
MAX_GAP = 10.0         # seconds: a longer gap between rounds (koordd stopped, a stall) adds no exposure
MAX_BINS = 64          # the top bin holds every level above: a node's 32 bins, and whatever a kernel file says


@dataclass
class Bin:
    exposure: float = 0.0     # seconds LS was healthy with BE at this level
    onsets: float = 0.0       # misses that began with BE at this level


@dataclass(frozen=True)
class Blame:
    """Whether a miss at `level` is BE's doing, with the counts that decided it (the decision's text)."""
    blamed: bool
    level: float
    below: tuple[float, float]          # (onsets, exposure s) with less BE
    at_or_above: tuple[float, float]    # (onsets, exposure s) at this level and above
    chance: float | None                # P(as many onsets at the lower rate); None: not compared

    def text(self) -> str:
        lo, hi = self.below, self.at_or_above
        return (f"LS began to miss {lo[0]:.0f} times in {lo[1]:.0f}s below {self.level:.2f} BE CPUs, "
                f"{hi[0]:.0f} in {hi[1]:.0f}s at or above")


@dataclass
class MissLedger:
    width: float                                    # CPUs a bin spans (> 0)
    bins: dict[int, Bin] = field(default_factory=dict)
    last: float | None = None                       # the last round's time
    at_risk: bool = False                           # LS was at risk in the last round

    def note(self, now: float, level: float, at_risk: bool) -> None:
        """One round: BE used `level` CPUs since the last round (its measured use over that interval), and LS
        is at risk now or not. The interval counts at that level: as exposure where LS was healthy at its
        start, with an onset where LS is at risk at its end."""
        k = self._bin(level)
        if self.last is not None and now > self.last:
            dt = now - self.last
            fade = 0.5 ** (dt / HALF_LIFE)
            for b in self.bins.values():
                b.exposure *= fade
                b.onsets *= fade
            if not self.at_risk and dt <= MAX_GAP:
                self.bins.setdefault(k, Bin()).exposure += dt
        if at_risk and not self.at_risk:
            self.bins.setdefault(k, Bin()).onsets += 1.0
        self.last, self.at_risk = now, at_risk

    def blame(self, level: float) -> Blame:
        """Whether LS's miss at `level` (already noted) is BE's doing: see the module docstring."""
        k = self._bin(level)
        lo = [b for i, b in self.bins.items() if i < k]
        hi = [b for i, b in self.bins.items() if i >= k]
        below = (sum(b.onsets for b in lo), sum(b.exposure for b in lo))
        above = (sum(b.onsets for b in hi), sum(b.exposure for b in hi))
        if below[1] < MIN_EXPOSURE or below[0] < 0.5:
            return Blame(True, level, below, above, None)
        expected = below[0] / below[1] * above[1]
        chance = poisson_at_least(round(above[0]), expected)
        return Blame(chance < CHANCE, level, below, above, chance)

    def _bin(self, level: float) -> int:
        # A level read from the kernel is bounded here, not trusted: at most MAX_BINS bins are ever kept.
        return min(max(int(level / self.width), 0), MAX_BINS) if math.isfinite(level) else 0


def poisson_at_least(n: int, mean: float) -> float:
    """P(N >= n) for N ~ Poisson(mean), summed in logarithms (exp(-mean) underflows past 745)."""
    if n <= 0:
        return 1.0
    if not mean > 0:
        return 0.0
    if not math.isfinite(mean):
        return 1.0
    below = sum(math.exp(i * math.log(mean) - mean - math.lgamma(i + 1)) for i in range(min(n, 100_000)))
    return min(max(1.0 - below, 0.0), 1.0)
