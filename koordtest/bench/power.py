"""How many repetitions a frontier verdict needs at the scatter a run measured (issue 36's instrument).

The frontier report's spreads say whether this run could see a difference; this says how many repetitions
would. Runs with nothing changed between them (one static setting repeated, a cap that never bound pooled
with its base, be-idle run twice) scatter; the pooled standard deviation of the logarithm of their values
estimates one run's noise as a factor (logarithms: a p99's noise grows with its level, and a ratio of BE
work is what the 95% rule judges). Telling two settings apart by a ratio r, two-sided at 5% with power 80%,
takes about 2 (1.96 + 0.84)^2 (sd / ln r)^2 runs of each: the normal approximation for two independent
samples of equal size. It is an estimate from few degrees of freedom, so the report gives them.

Why it matters: on the 2-CPU hosts one static setting's BE work scattered 13-42% between repetitions with
nothing changed (docs/benchmarks.md), so the 95% rule (a 5% difference) needs on the order of a hundred
repetitions of each setting there, where a run takes two or three.

Pure functions of numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Iterable, Sequence

Z_TWO_SIDED_5 = NormalDist().inv_cdf(0.975)     # the normal quantile for a two-sided 5% test (1.96)
Z_POWER_80 = NormalDist().inv_cdf(0.80)         # ... and for 80% power (0.84)
Z_ONE_SIDED_5 = NormalDist().inv_cdf(0.95)      # ... and for a one-sided 5% bound (1.645)


def positive(v) -> bool:
    """A value a logarithm can take: a finite number over 0 (a forged or missing figure in results.json is not)."""
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


@dataclass(frozen=True)
class Noise:
    """One run's scatter as the standard deviation of the logarithm of a value, pooled over groups of runs
    with the same knobs, and the degrees of freedom behind it (runs less groups)."""
    log_sd: float
    freedom: int


def pooled_log_sd(groups: Iterable[Sequence[float]]) -> Noise | None:
    """The pooled standard deviation of log values over `groups` (each group: one setting's repeated runs).
    Values that are not positive numbers are left out; groups of fewer than two count nothing. None where no
    group had two."""
    squares, freedom = 0.0, 0
    for group in groups:
        logs = [math.log(v) for v in group if positive(v)]
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        squares += sum((x - mean) ** 2 for x in logs)
        freedom += len(logs) - 1
    return Noise(math.sqrt(squares / freedom), freedom) if freedom else None


def runs_needed(log_sd: float, ratio: float) -> int:
    """Runs of each of two settings to tell their typical values apart by `ratio` (> 1), two-sided at 5% with
    power 80%, where one run scatters by `log_sd`; at least 2."""
    if not ratio > 1:
        raise ValueError(f"ratio must be over 1, got {ratio}")
    n = 2 * (Z_TWO_SIDED_5 + Z_POWER_80) ** 2 * (log_sd / math.log(ratio)) ** 2
    return max(2, math.ceil(n))


# One-sided 95% quantiles of Student's t for 1 ... 30 degrees of freedom (any table; scipy is not a dependency:
# the 16-CPU proof runs where nothing of ours is installed). Beyond 30, the Cornish-Fisher expansion below is
# within 0.001 of the table.
T_95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def t_95(freedom: int) -> float:
    """The one-sided 95% quantile of Student's t with `freedom` (>= 1) degrees of freedom."""
    if freedom < 1:
        raise ValueError(f"degrees of freedom must be 1 or more, got {freedom}")
    if freedom <= len(T_95):
        return T_95[freedom - 1]
    z = Z_ONE_SIDED_5
    return z + (z ** 3 + z) / (4 * freedom) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * freedom ** 2)


@dataclass(frozen=True)
class PairedRatio:
    """b over a over pairs of runs that shared their repetition (its arrivals, LS alone, BE alone, the host's
    hour): the geometric mean of the ratios, and the one-sided 95% bounds on it (together a 90% interval)."""
    pairs: int
    ratio: float
    low: float
    high: float
    log_sd: float             # the scatter of one pair's log ratio

    def against(self, share: float) -> str:
        """Whether b's typical value is at least `share` of a's, with 95% confidence either way, or how many
        pairs would settle it at this scatter."""
        if self.low >= share:
            return f"at least {100 * share:.0f}% with 95% confidence"
        if self.high < share:
            return f"under {100 * share:.0f}% with 95% confidence"
        gap = abs(math.log(self.ratio / share))
        if gap == 0:
            return f"undetermined: the ratio sits on {100 * share:.0f}%"
        need = math.ceil((Z_ONE_SIDED_5 * self.log_sd / gap) ** 2)
        return f"undetermined: about {max(need, self.pairs + 1)} pairs would settle it at this scatter"


def paired_ratio(pairs: Iterable[tuple[float, float]]) -> PairedRatio | None:
    """b / a over `pairs` of (a, b); pairs with a value that is not a positive number are left out. None for
    fewer than two pairs."""
    logs = [math.log(b) - math.log(a) for a, b in pairs if positive(a) and positive(b)]    # b / a may overflow
    if len(logs) < 2:
        return None
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    half = t_95(len(logs) - 1) * sd / math.sqrt(len(logs))
    return PairedRatio(len(logs), exp_or_inf(mean), exp_or_inf(mean - half), exp_or_inf(mean + half), sd)


def exp_or_inf(x: float) -> float:
    """e ** x, infinite past what a float holds (a forged ratio of 1e308 over 5e-324 is not a crash)."""
    return math.exp(x) if x < 709 else math.inf
