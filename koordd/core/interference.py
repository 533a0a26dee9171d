"""Interference detection in CPI2's manner, over any per-cgroup health signal (CPI, run-queue latency).

Policy only: pure functions and plain state, fed one sample per tick by a loop. A victim is a
latency-sensitive cgroup whose signal sits above its own baseline (mean + k·σ over a window) often
enough while it actually runs; the suspect is the best-effort cgroup whose CPU use rose and fell with
that signal over the same window (Pearson correlation). CPI2 (Google, EuroSys'13) used CPI with k = 2,
3 outliers in 5 minutes and tasks over 0.25 CPU-s/s; the same test works on run-queue latency, which
every host here can measure.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping

MIN_BASELINE = 10          # samples before a baseline is trusted


@dataclass
class Series:
    """(time, value) samples of one cgroup over the window."""
    points: deque = field(default_factory=deque)

    def add(self, t: float, value: float, window: float) -> None:
        self.points.append((t, value))
        while self.points and self.points[0][0] < t - window:
            self.points.popleft()

    def values(self) -> list[float]:
        return [v for _, v in self.points]


def mean_sigma(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Correlation of two equally long series; None when either is flat (nothing to correlate)."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    mx, sx = mean_sigma(xs)
    my, sy = mean_sigma(ys)
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (len(xs) * sx * sy)


@dataclass
class Victim:
    """What makes a cgroup a victim, for the decision's reason."""
    cgroup: str
    value: float
    mean: float
    sigma: float
    outliers: int


@dataclass
class Detector:
    """Baselines and outliers per latency-sensitive cgroup, CPU use per best-effort one, all on one
    clock of ticks (a BE series only counts ticks in which the victim was sampled too)."""
    window: float
    k_sigma: float = 2.0
    outliers_needed: int = 3
    min_cpu: float = 0.25
    signal: dict[str, Series] = field(default_factory=dict)        # LS cgroup -> its signal
    outlier_times: dict[str, deque] = field(default_factory=dict)  # LS cgroup -> times of its outliers
    cpu: dict[str, Series] = field(default_factory=dict)           # BE cgroup -> its CPU use

    def observe(self, t: float, ls: Mapping[str, tuple[float | None, float | None]],
                be: Mapping[str, float | None]) -> list[Victim]:
        """One tick: `ls` cgroup -> (signal, CPU cores), `be` cgroup -> CPU cores (None: unknown).
        Returns the cgroups that are victims now."""
        for name in set(self.signal) - set(ls):
            self.signal.pop(name)
            self.outlier_times.pop(name, None)
        for name in set(self.cpu) - set(be):
            self.cpu.pop(name)
        for name, cores in be.items():
            if cores is not None:
                self.cpu.setdefault(name, Series()).add(t, cores, self.window)
        victims = []
        for name, (value, cores) in ls.items():
            if value is None:
                continue
            series = self.signal.setdefault(name, Series())
            times = self.outlier_times.setdefault(name, deque())
            while times and times[0] < t - self.window:
                times.popleft()
            history = series.values()
            if len(history) >= MIN_BASELINE:
                mean, sigma = mean_sigma(history)
                if value > mean + self.k_sigma * sigma and (cores or 0.0) >= self.min_cpu:
                    times.append(t)
                    if len(times) >= self.outliers_needed:
                        victims.append(Victim(name, value, mean, sigma, len(times)))
            series.add(t, value, self.window)
        return victims

    def suspect(self, victim: str, candidates: Iterable[str]) -> tuple[str, float] | None:
        """The candidate whose CPU use correlates best (and positively) with the victim's signal over
        the window, with that correlation; None when none does."""
        signal = dict(self.signal.get(victim, Series()).points)
        best: tuple[str, float] | None = None
        for name in sorted(candidates):
            pairs = [(signal[t], cores) for t, cores in self.cpu.get(name, Series()).points if t in signal]
            r = pearson([p[0] for p in pairs], [p[1] for p in pairs])
            if r is not None and r > 0 and (best is None or r > best[1]):
                best = (name, r)
        return best
