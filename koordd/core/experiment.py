"""Every cut is an experiment: did taking CPU from best-effort work buy latency-sensitive work anything?

A loop that takes a resource from BE (a quota, a cpuset, a cap on one BE cgroup) names the lever it
moved and the LS signal it acted on; the `Lab` keeps that signal's recent values, compares its level
before the cut with its level after it has settled, and says whether the cut bought more than the
signal's own noise. The comparison is built so that a signal no cut can move is judged "bought
nothing" (tests/unit/core/test_experiment.py's seeded simulations: 200 trials per kind of noise) while
a real improvement is still judged "helped":

- confirmation (`confirmed()`): the loop cuts only once the signal has been over its threshold in every
  round of the last `confirm` seconds (half the window), at least CONFIRM_ROUNDS of them, and has been seen
  that long (a fresh koordd too). One wild sample is no reason to cut, and the rounds before the cut then
  describe the state that prompted it;
- before: the median of the signal's values over the confirmation span (half the window) up to the cut. Not the value the
  loop acted on: a cut taken because the signal was high would be judged by its highest sample, and a
  signal that only wanders (regression to the mean) would look improved by any cut. With the
  confirmation covering half of that window, the median is a value of the state that prompted the cut
  (for a signal that just jumped, the new level, not its healthy past);
- noise: the spread of the signal's values themselves, 1.4826 x their median absolute deviation (the
  standard deviation, for normal noise; robust to a few wild samples), over the quiet rounds of the last
  minute (after a round in which the loop moved nothing: `moved()`, and, for a signal that lags, once its
  value no longer reaches back past the last move: until then it ramps from one level to the other, and a
  release that took an SLO from 14.64 ms to 113.56 ms was judged "cost nothing" against a noise of 33.44 ms
  made of that ramp, in a fresh clone's kernel test), each value taken from the median of
  its own level (the quiet rounds between two moves: a minute that held BE at its floor and then let it
  go holds two levels, and the gap between them is what a cut buys, not noise), and how strongly successive values move together (an overlapping p99 window: a wandering
  level, not independent samples), estimated from the same rounds' successive differences;
- after: the median of its values from `settle` seconds after the lever last moved, judged `window`
  seconds after that move; earlier only in the safe direction: once CONFIRM_ROUNDS rounds in a row past
  `settle` (and the lag, next) show the signal back in health, and their level is better by more than the
  margin (the cut helped). Before, one healthy round right after a cut was enough: in a 60 s run on 2 CPUs a
  windowed p99 that dipped for a round (8.1 ms against 15.6 ms, one second after the floor; most of its
  responses from before the cut) ended the floor as "helped", BE grew back, and the floor came again 1-4 s
  later, five times a minute;
- lag: a quantile taken over several rounds (an SLO's p99 over its last 1000 responses, up to 10 s of
  them) shows a move in full only once its rounds all come after it. The loop says how far back each
  signal's value reaches (`observe(lags=)`: HistogramWindow.span()); an experiment on a signal that lags
  takes its after values only from rounds past that lag and is judged as many rounds later as one without.
  In CI's VM a 5 s window judged a slow service's p99 (10 s of responses) half-way: the wake lever got
  half its effect, the floor cut taken next the other half, and "helped" kept BE at its floor;
- drift: a signal that was already falling on its own before the cut (its values over the window up to the
  cut falling consistently, Kendall's tau at most -DRIFT_TAU, by more than NOISE_K x its noise and its
  scatter about the slope) is expected to go on falling: the level the cut is judged against is before x
  exp(that fall's rate) over the time from the before span to the after span, never projected further than
  the span the fall was seen over, nor past one window. A windowed p99 whose window still held a service's
  slow start fell 32 -> 16 ms over a minute under TCG; a floor cut in the middle of it was judged "helped"
  (30.2 -> 27.3 ms against a 1.7 ms margin) and kept BE at its floor for nothing. The rate is a factor per
  second (Theil-Sen on the logarithms): a latency or a pressure falls by factors (a PSI average decays
  exponentially, a windowed quantile towards the level its window turns over to), never through zero. A
  straight line did: in CI a p99 falling after koordd's start (its window still holding responses slowed
  while koordd started) was projected to 0.00 ms, and a floor that took it 62.82 -> 14.07 ms was undone as
  "bought nothing". The noise the cut must beat is then the values' scatter about the fall (Fall.noise),
  not their spread with the fall in. A signal with a value at or below zero has no such rate: its cut is
  judged against its level before. A signal that was rising is judged against its level, not its rise: a cut gets no credit for
  a climb it may or may not have stopped;
- the cut helped when before (or the level expected, where it was falling) - after > max(NOISE_K x noise x
  sqrt(1/n_before + 1/n_after), MIN_GAIN x before), where n_before and n_after are the rounds on each
  side, each counted as fewer where successive values move together (n x (1 - r) / (1 + r), for lag-one
  correlation r): a median of five rounds of a slowly wandering p99 is hardly better than one round.
  Successive differences alone (the old measure) see almost no noise in such a signal and call its
  wandering a gain;
- or by ratio: the same test on the logarithms of the values (History.log_spread; the gain a factor, the
  margin max(NOISE_K x their standard error, the factor 1 / (1 - MIN_GAIN)), a release's give-back a share
  of the cut's factor), where every value is above zero. A latency's spread grows with its level: a p99
  that wandered 45-150 ms with BE uncapped has a noise of tens of ms, at 15 ms under a floor half a ms. Its
  margin, taken at the high level, asked more than the whole fall: in CI a floor that took an SLO from 93.21
  to 15.11 ms was judged "bought nothing" against a 105.16 ms margin, and a release that took one from 15.40
  back to 64.80 ms gave back 49% of the 116.26 ms before (71% of the factor) and retracted the cut. Either
  test passing is "helped": over 1000 seeded trials per kind of noise the two together judged useless cuts
  "helped" up to 3 in 1000 more often than the margin alone, and real 30% drops up to 6% more often.

A cut judged "helped" whose signal is still not healthy is tested once more the other way (A/B/A:
`start(release=)`): the loop releases it for one window, and the release is judged as a cut is, with the
sign turned: where the signal got worse by more than the margin the cut helps, and the loop puts it back;
where it did not, the cut bought nothing after all (its "helped" is retracted from the lever's record) and
stays released. The release is judged against the low the cut's verdict picked, so a signal that wanders
back from that low reads as a cost: the release must also give back at least GIVE_BACK of what the cut
bought (its level at least halfway back from the cut's after to the cut's before). A real cut's release
brings the signal back to where it was; a chance low's does not, because the cut was taken when the
signal was over its threshold, above its own median, and a wandering signal comes back to the median. One
before/after comparison of a signal that wanders (a p99 under TCG: 21-31 ms over tens of seconds with
nothing changed) called 4 useless floors of 13 "helped" in CI's VM, and a kept floor held BE there until
the targets were raised; the release costs LS one window where the cut was real, so a lever the release
confirmed under the same conditions is not released again for `rest_max` seconds.

A cut that bought nothing is the loop's to undo; the lever then rests for that signal, `rest` seconds
the first time, doubling each time in a row up to `rest_max` (as a failing loop backs off), and a cut
that helped ends the doubling. The rest is at least what keeps such cuts within `budget` of BE's time
(budget_rest): a cut that held all of BE's CPU for 6 s before it was judged useless buys 54 s of rest at
10%, so trying costs BE at most a tenth of its work per lever and signal, however noisy the signal (up to
`rest_max`). Doubling alone let a signal that no cut could move be floored for 5 s of every 15, then 25,
then 45: 20% of the first 100 s, a third of the first minute (tests/unit/core/test_experiment.py). What a
lever bought is remembered for the conditions it was tried in (LS load band, the busy BE cgroups, the
signal), and `order()` puts the levers that helped there first. Pure policy: no I/O, fed one round at a time by the loop, its state is plain data.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

Key = tuple[str, str]            # (LS cgroup, signal name), as core/health.py's signals name them

NOISE_K = 3.0                    # an improvement must exceed this many standard errors of before - after ...
MIN_GAIN = 0.05                  # ... and this share of the level before the cut
CONFIRM_ROUNDS = 2               # a cut needs the signal over its threshold in at least this many rounds
MAX_CORRELATION = 0.9            # successive values never count as more alike than this
LEVEL_ROUNDS = 4                 # a run of quiet values this long is a level of its own (pooled_spread)
POOLED_VALUES = 2 * LEVEL_ROUNDS  # ... and levels pool their noise only over this many values together
MAD_SIGMA = 1.4826               # the median absolute deviation of normal noise x this = its deviation
DRIFT_TAU = 0.8                  # values before a cut falling this consistently (Kendall's tau) fall on their own
DRIFT_ROUNDS = 4                 # ... judged over at least this many values
LOAD_BANDS = 5                   # LS load in fifths of the node
# The control arm: a confirmed risk left alone (nothing moved), judged as a cut is. Its "helped" is how often
# the signal recovers on its own within a window; a cut is worth its BE work only where it helps more often.
LEAVE = "leave"
BUSY_CORES = 0.1                 # a BE cgroup using less is not "busy" in a condition
MAX_CONDITIONS = 256             # conditions remembered (they name BE cgroups: pods come and go), oldest dropped
MAX_AFTER_ROUNDS = 32            # can_show() bounds a verdict's margin over at most this many values after a cut
GIVE_BACK = 0.5                  # a release confirms a cut only where it gives back this share of what the cut bought


def median(values: Iterable[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count), as statistics.median: that
    module imports fractions and decimal, 0.8 MB in every koordd for two one-line functions."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def fmean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


@dataclass
class History:
    """Recent (time, value) points per key over `span` seconds; the times of the quiet ones (no lever moved
    in the round before) apart."""
    span: float
    points: dict[Any, deque] = field(default_factory=dict)
    quiet: dict[Any, set] = field(default_factory=dict)
    first: dict[Any, float] = field(default_factory=dict)     # when each key was first seen (since forgotten)

    def add(self, now: float, key: Any, value: float, quiet: bool = True) -> None:
        self.first.setdefault(key, now)
        q = self.points.setdefault(key, deque())
        q.append((now, float(value)))
        marks = self.quiet.setdefault(key, set())
        if quiet:
            marks.add(now)
        while q and q[0][0] < now - self.span:
            marks.discard(q.popleft()[0])

    def spread(self, key: Any, until: float | None = None) -> tuple[float, float]:
        """(spread, lag-one correlation) of the key's quiet values (those up to `until`): spread() of the
        values, and how much successive quiet values move together (correlation())."""
        return self._spread(key, self._upto(key, until))

    def log_spread(self, key: Any, until: float | None = None) -> tuple[float, float] | None:
        """spread() of the logarithms of the key's values: the noise as a factor, for the ratio test (module
        docstring); None where a value is not above zero (a pressure or a wait at 0 has no logarithm)."""
        pts = self._upto(key, until)
        if any(v <= 0 for _, v in pts):
            return None
        return self._spread(key, [(t, math.log(v)) for t, v in pts])

    def _upto(self, key: Any, until: float | None) -> list[tuple[float, float]]:
        return [(t, v) for t, v in self.points.get(key, ()) if until is None or t <= until]

    def _spread(self, key: Any, pts: list[tuple[float, float]]) -> tuple[float, float]:
        marks = self.quiet.get(key, set())
        steps = [abs(b - a) for (_, a), (t, b) in zip(pts, pts[1:]) if t in marks]
        sigma = pooled_spread(levels(pts, marks))
        return sigma, correlation(sigma, steps)

    def forget_stale(self, now: float) -> None:
        """Forget the keys with no value within the span (a cgroup gone); a key without a value this round
        (an SLO scraped every second, a round every half) keeps its history."""
        for k in [k for k, q in self.points.items() if not q or q[-1][0] < now - self.span]:
            del self.points[k]
            self.quiet.pop(k, None)
            self.first.pop(k, None)

    def forget_except(self, keys: Iterable[Any]) -> None:
        keep = set(keys)
        for k in [k for k in self.points if k not in keep]:
            del self.points[k]
            self.quiet.pop(k, None)
            self.first.pop(k, None)

    def values(self, key: Any, since: float | None = None) -> list[float]:
        return [v for t, v in self.points.get(key, ()) if since is None or t >= since]

    def series(self, key: Any) -> dict[float, float]:
        return dict(self.points.get(key, ()))


@dataclass(frozen=True)
class Fall:
    """A signal falling on its own (drift()): the line through its logarithm, and the span it was seen over."""
    rate: float          # the logarithm's change a second (< 0): a factor exp(rate) a second
    offset: float        # the line's logarithm at time 0
    span: float          # seconds the fall was seen over: it is projected no further

    def at(self, t: float) -> float:
        return math.exp(self.offset + self.rate * t)

    def noise(self, pts: Sequence[tuple[float, float]], log: bool = False) -> tuple[float, float]:
        """(spread, lag-one correlation) of `pts` about the fall (of their logarithms about its line where
        `log`): the signal's noise once its fall is taken out. Measured with the fall in, the noise counted
        the fall twice, once as the level the cut is judged against and once as the margin it must pass: in
        the unit test shaped after CI's run a floor that took a falling p99 from 61 to 14 ms, judged against
        the fall's 25 ms, was "bought nothing" against a 51 ms margin (x1.8 against x2.2 needed)."""
        dev = [(math.log(v) - self.offset - self.rate * t) if log else v - self.at(t) for t, v in pts]
        sigma = spread(dev)
        return sigma, correlation(sigma, [abs(b - a) for a, b in zip(dev, dev[1:])])


def drift(pts: Sequence[tuple[float, float]], log_noise: float | None = 0.0) -> Fall | None:
    """The signal's own fall over `pts` (time, value), as a line through its logarithm: the Theil-Sen slope
    (the median of the slopes between every two points) where the values fall consistently (Kendall's tau
    at most -DRIFT_TAU, over at least DRIFT_ROUNDS points) and over their span by more than NOISE_K x both
    their scatter around that line and the signal's `log_noise` (a wandering signal falls back towards its
    level now and then: that is no drift to project); else None. None where a value is not above zero or the
    noise of the logarithms is unknown (None), and for a rise (module docstring: it earns a cut no credit)."""
    if len(pts) < DRIFT_ROUNDS or log_noise is None or any(v <= 0 for _, v in pts):
        return None
    logs = [(t, math.log(v)) for t, v in pts]
    pairs = [(a, b) for i, a in enumerate(logs) for b in logs[i + 1:] if b[0] > a[0]]
    if not pairs:
        return None
    tau = sum((b[1] > a[1]) - (b[1] < a[1]) for a, b in pairs) / len(pairs)
    slope = median((b[1] - a[1]) / (b[0] - a[0]) for a, b in pairs)
    if tau > -DRIFT_TAU or slope >= 0:
        return None
    offset = median(v - slope * t for t, v in logs)
    scatter = spread([v - slope * t - offset for t, v in logs] + [0.0])
    span = logs[-1][0] - logs[0][0]
    return Fall(slope, offset, span) if -slope * span > NOISE_K * max(scatter, log_noise) else None


def levels(pts: Sequence[tuple[float, float]], marks: set) -> list[list[float]]:
    """The quiet values cut where a lever moved (the round after a move is not quiet): each run of values
    one level of the signal, as koordd's own steps set it (BE floored, then uncapped)."""
    out, run = [], []
    for t, v in pts:
        if t in marks:
            run.append(v)
        elif run:
            out.append(run)
            run = []
    return out + ([run] if run else [])


def pooled_spread(runs: Sequence[Sequence[float]]) -> float:
    """spread() of the values around their own run's median, pooled over the runs of at least LEVEL_ROUNDS:
    the noise within each level, not the distance between levels (a minute that held BE at its floor and
    then uncapped it is two levels, and their gap is what a cut buys, not noise). spread() of all the values
    where those runs hold fewer than POOLED_VALUES values together: deviations from a median of four values
    are half of them near zero by construction, and one such level seen in CI's VM put the noise of a p99
    wandering 21-28 ms under 0.5 ms, so a 2 ms wander was a floor that "helped"."""
    long = [r for r in runs if len(r) >= LEVEL_ROUNDS]
    if sum(len(r) for r in long) < POOLED_VALUES:
        return spread([v for r in runs for v in r])
    residuals = [v - median(r) for r in long for v in r]
    return MAD_SIGMA * median(abs(x) for x in residuals)


def spread(values: Sequence[float]) -> float:
    """The noise of a signal's values: 1.4826 x their median absolute deviation (the standard deviation of
    normal noise; a few wild values or a level shift in part of them move it little); 0 for fewer than
    two values."""
    if len(values) < 2:
        return 0.0
    mid = median(values)
    return MAD_SIGMA * median(abs(v - mid) for v in values)


def correlation(sigma: float, steps: Sequence[float]) -> float:
    """How much successive values move together, from their spread `sigma` and the |differences| of
    successive values: for noise of deviation s and lag-one correlation r the differences have deviation
    s x sqrt(2 (1 - r)). Clamped to [0, MAX_CORRELATION]; 0 without spread or differences."""
    if sigma <= 0 or not steps:
        return 0.0
    step = MAD_SIGMA * median(steps)
    return min(max(1 - step * step / (2 * sigma * sigma), 0.0), MAX_CORRELATION)


def standard_error(noise: float, r: float, before: Sequence[int], after: Sequence[int]) -> float:
    """The standard deviation of (level before - level after) where nothing changed: values of deviation
    `noise` at rounds `before` and `after` (their places in the signal's sequence), successive values
    correlated `r` (an AR(1) process: rounds k apart correlate r^k). Independent values give the familiar
    noise x sqrt(1/n_before + 1/n_after); correlated ones count as fewer values, and less so where the
    two windows lie close together (what wanders moves both)."""
    def pairs(xs: Sequence[int], ys: Sequence[int]) -> float:
        return sum(r ** abs(x - y) for x in xs for y in ys) / (len(xs) * len(ys))
    if not before or not after:
        return noise * math.sqrt(2)
    var = pairs(before, before) + pairs(after, after) - 2 * pairs(before, after)
    return noise * math.sqrt(max(var, 0.0))


def margin(before: float, noise: float, r: float, at_before: Sequence[int], at_after: Sequence[int]) -> float:
    """How much better than `before` the level after a cut must be to count as bought (module docstring):
    `at_before`, `at_after` are the places of the values each level was taken over."""
    return max(NOISE_K * standard_error(noise, r, at_before, at_after), MIN_GAIN * abs(before))


def conditions(ls_cores: float, capacity: int, busy_be: Iterable[str], signal: str) -> tuple:
    """The conditions a lever's effect is remembered for: LS load in fifths of the node, the BE cgroups
    that were busy, the signal that was over."""
    band = min(int(max(ls_cores, 0.0) / max(capacity, 1) * LOAD_BANDS), LOAD_BANDS - 1)
    return band, tuple(sorted(busy_be)), signal


@dataclass
class Experiment:
    lever: str
    key: Key
    started: float
    changed: float               # when the lever last moved (a deeper cut restarts the after window)
    before: float                # the median over the window up to the cut
    noise: float                 # the signal's spread (History.spread)
    be_before: float             # BE cores when it started
    conditions: tuple
    undo: Any = None             # what puts the lever back (the loop's to read)
    bound: float | None = None   # a guard's cut: undone by this time whatever it bought
    n_before: int = 1            # the values the median before was taken over
    correlation: float = 0.0     # how much successive values move together (History.spread)
    seen: int = 0                # the signal's values since the cut (their places after it)
    calm: int = 0                # settled rounds in a row (past settle and lag) with the signal in health
    drift: float = 0.0           # the signal's own fall before the cut, its logarithm's per second (drift(); <= 0)
    drift_span: float = 0.0      # seconds that fall was seen over: it is projected no further
    lag: float = 0.0             # seconds the signal's value reaches back when the cut was taken
    before_at: float = 0.0       # the middle of the span `before` was taken over
    release: Verdict | None = None     # a release of a kept cut (A/B/A): the verdict that kept it
    log_noise: float | None = None     # the noise of the signal's logarithm (History.log_spread; None: not above 0)
    log_correlation: float = 0.0
    after: list = field(default_factory=list)      # (time, value, place)
    be_after: list = field(default_factory=list)   # BE cores after the cut

    def fields(self) -> dict:
        return {"lever": self.lever, "cgroup": self.key[0], "signal": self.key[1], "before": round(self.before, 3),
                "noise": round(self.noise, 3), "n_before": self.n_before, "correlation": round(self.correlation, 3),
                "drift_log_per_s": round(self.drift, 4), "lag_s": round(self.lag, 3), "started": self.started,
                "bound": self.bound, "test": "release" if self.release is not None else "cut"}


@dataclass(frozen=True)
class Verdict:
    lever: str
    key: Key
    helped: bool
    before: float
    after: float
    noise: float
    margin: float
    be_given_up: float           # BE cores: before the cut minus after it
    early: bool = False          # judged before the window ended (back in health)
    n_before: int = 1            # rounds the level before was taken over
    n_after: int = 1             # rounds the level after was taken over
    expected: float | None = None    # where the signal was falling on its own: the level it would have reached
    release: bool = False        # the test of a kept cut by its release: `helped` says the cut helps
    back: float | None = None    # a release: the share of what the cut bought that it gave back (given_back)
    cost_s: float = 0.0          # seconds of all of BE's CPU the cut held until judged (its share of BE x time)
    log_gain: float | None = None      # the ratio test (module docstring): the gain as a logarithm of a factor,
    log_margin: float | None = None    # ... the margin it had to pass,
    log_back: float | None = None      # ... and for a release the share given back of the cut's factor

    @property
    def reference(self) -> float:
        """The level the cut is judged against: before, or where a falling signal would have got to."""
        return self.before if self.expected is None else self.expected

    @property
    def gain(self) -> float:
        """What the cut bought: the level it is judged against (before, or where a falling signal would have
        got to without it) minus the level after; for a release, the level after minus that level (what
        releasing the cut cost)."""
        return self.after - self.reference if self.release else self.reference - self.after

    def passes(self) -> tuple[bool, bool]:
        """(the margin test, the ratio test): whether the gain passed each (a release also gives back at
        least GIVE_BACK of what the cut bought, by the same measure). The verdict is "helped" where either
        passed (module docstring)."""
        by_margin = self.gain > self.margin and (not self.release or (self.back or 0.0) >= GIVE_BACK)
        by_ratio = (self.log_gain is not None and self.log_margin is not None and self.log_gain > self.log_margin
                    and (not self.release or (self.log_back or 0.0) >= GIVE_BACK))
        return by_margin, by_ratio

    def cost(self) -> bool:
        """Whether the signal got worse after the move by more than the margin a gain must pass (or, by ratio,
        by more than the factor): what a move that takes nothing from BE is released for."""
        by_ratio = self.log_gain is not None and self.log_margin is not None and -self.log_gain > self.log_margin
        return -self.gain > self.margin or by_ratio

    def fields(self) -> dict:
        return {"lever": self.lever, "cgroup": self.key[0], "signal": self.key[1], "before": round(self.before, 3),
                "after": round(self.after, 3), "noise": round(self.noise, 3), "margin": round(self.margin, 3),
                "expected": None if self.expected is None else round(self.expected, 3),
                "n_before": self.n_before, "n_after": self.n_after, "test": "release" if self.release else "cut",
                "given_back": None if self.back is None else round(self.back, 3),
                "verdict": "helped" if self.helped else "bought nothing",
                "by_ratio": None if self.log_gain is None or self.log_margin is None else {
                    "factor": round(factor(self.log_gain), 3), "needed": round(factor(self.log_margin), 3),
                    "given_back": None if self.log_back is None else round(self.log_back, 3),
                    "passed": self.passes()[1]},
                "be_given_up_cores": round(self.be_given_up, 3), "be_cost_s": round(self.cost_s, 3)}

    def text(self) -> str:
        sig = self.key[1]
        falling = "" if self.expected is None else f"falling on its own to {show_value(sig, self.expected)}, "
        by_margin, by_ratio = self.passes()
        ratio = ""
        if by_ratio and not by_margin:       # say what decided: the margin alone would have said the opposite
            back = "" if self.log_back is None else f", {self.log_back:.0%} of the cut's factor back"
            ratio = (f"; by ratio x{factor(self.log_gain or 0.0):.2f} against x"
                     f"{factor(self.log_margin or 0.0):.2f} needed{back}")
        figures = (f"{sig} {show_value(sig, self.before)} -> {show_value(sig, self.after)} ({falling}noise "
                   f"{show_value(sig, self.noise)}, margin {show_value(sig, self.margin)}, "
                   f"{self.n_before}/{self.n_after} rounds{ratio})")
        if self.release:
            back = "" if self.back is None or ratio else f", {self.back:.0%} of what the cut bought"
            if self.helped:
                return f"release cost latency: {figures}{back}: the {self.lever} cut helps"
            if self.gain > self.margin:      # worse by more than the margin, but not back to the level before the cut
                return (f"release cost little: {figures}{back}, under {GIVE_BACK:.0%}: the {self.lever} cut "
                        "bought nothing after all")
            return f"release cost nothing: {figures}: the {self.lever} cut bought nothing after all"
        if self.lever == LEAVE:
            return f"{'recovered' if self.helped else 'did not recover'} with BE left alone: {figures}"
        what = "cut helped" if self.helped else "cut bought nothing"
        return f"{what}: {figures} for {self.be_given_up:.2f} BE cores"


def budget_rest(wasted_s: float, budget: float) -> float:
    """How long a lever whose cut bought nothing rests so that such cuts cost BE at most `budget` of its time:
    a cut that held all of BE's CPU for `wasted_s` seconds (its share of BE x its time) buys a rest of
    wasted_s x (1 / budget - 1); a cut that took nothing from BE (the wake lever), none."""
    return wasted_s * (1 / budget - 1) if budget > 0 else 0.0


def given_back(cut: Verdict, level: float) -> float:
    """The share of what `cut` bought (the level it was judged against minus its after) that a release whose
    signal came to `level` gave back: 1 where the signal is back where it was before the cut, 0 where it
    stayed at the cut's after (module docstring: A/B/A)."""
    bought = cut.gain
    return (level - cut.after) / bought if bought > 0 else 0.0


def log_given_back(cut: Verdict, level: float) -> float | None:
    """given_back() by factors: the share of the cut's factor (the level it was judged against over its
    after) that a release whose signal came to `level` gave back; None where a value is not above zero."""
    bought = cut.reference
    if min(bought, cut.after, level) <= 0 or bought <= cut.after:
        return None
    return math.log(level / cut.after) / math.log(bought / cut.after)


def factor(log_ratio: float) -> float:
    """The factor a logarithm stands for, bounded where exp() would overflow: a workload's histogram can
    name a bucket of 1e-300 s, and a fall from 1 s to it is a logarithm of 690."""
    return math.exp(min(log_ratio, 700.0))


def show_value(signal: str, value: float) -> str:
    """A signal's value as an operator reads it: latencies (…_us) in ms, others as they are."""
    return f"{value / 1000:.2f} ms" if signal.endswith("_us") else f"{value:.3g}"


@dataclass
class Record:
    """What a lever bought under one condition (or in total): verdicts, latency gained, BE cores given."""
    helped: int = 0
    nothing: int = 0
    retracted: int = 0           # of the helped: cuts whose release then did not confirm them (A/B/A)
    gain: float = 0.0            # sum of before - after over helped cuts not retracted, in the signal's unit
    be_given_up: float = 0.0     # sum of BE cores given up over the same cuts

    def add(self, v: Verdict) -> None:
        if v.helped:
            self.helped += 1
            self.gain += v.gain
            self.be_given_up += v.be_given_up
        else:
            self.nothing += 1

    def retract(self, v: Verdict) -> None:
        """A cut judged helped (`v`) whose release did not confirm it: it counts as helped no more. The counts only
        grow (they are counters: koordd_loop_lever_verdicts_total)."""
        self.retracted += 1
        self.gain -= v.gain
        self.be_given_up -= v.be_given_up

    @property
    def score(self) -> float:
        """The share of cuts that helped (those retracted not counted); 0.5 for a lever never judged."""
        n = self.helped + self.nothing
        return (self.helped - self.retracted) / n if n else 0.5

    def summary(self) -> dict:
        kept = self.helped - self.retracted
        return {"helped": self.helped, "bought_nothing": self.nothing, "retracted": self.retracted,
                "mean_gain": round(self.gain / kept, 3) if kept else None,
                "mean_be_cores_given_up": round(self.be_given_up / kept, 3) if kept else None}


CHANCE_COUNTS = 1000             # chance_better: a record of more verdicts counts as this many at its share


def chance_better(a: Record, b: Record) -> float:
    """The chance that `a` helps more often than `b`, from their verdicts alone: P(p_a > p_b) where each p
    follows Beta(1 + helped and kept, 1 + the rest), a uniform prior. 0.5 for two records never judged; 2/3
    for one help against nothing. Comparing the shares alone (`score`) calls 2 of 3 against 3 of 5 as sure as
    30 of 45 against 30 of 50; this says how far a handful of verdicts can be trusted.

    Exact for whole counts (Evan Miller's closed form: a sum over one record's helps, taken over the record
    with fewer). A long-lived koordd's counts grow without bound: a record of more than CHANCE_COUNTS verdicts
    counts as that many at the same share (its share is then known to within 3%, and the sum stays short and
    precise: lgamma of 10^12 keeps three digits)."""
    (a1, a2), (b1, b2) = _beta_params(a), _beta_params(b)
    if a1 > b1:
        return 1.0 - _beta_sum(b1, b2, a1, a2)
    return _beta_sum(a1, a2, b1, b2)


def _beta_params(r: Record) -> tuple[int, int]:
    n = r.helped + r.nothing
    kept = min(max(r.helped - r.retracted, 0), n)
    if n > CHANCE_COUNTS:
        kept, n = round(kept * CHANCE_COUNTS / n), CHANCE_COUNTS
    return 1 + kept, 1 + n - kept


def _beta_sum(a1: int, a2: int, b1: int, b2: int) -> float:
    """P(X > Y) for X ~ Beta(a1, a2), Y ~ Beta(b1, b2), whole parameters: a1 terms."""
    def log_beta(x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)
    base = log_beta(b1, b2)
    total = sum(math.exp(log_beta(b1 + i, b2 + a2) - math.log(a2 + i) - log_beta(1 + i, a2) - base)
                for i in range(a1))
    return min(max(total, 0.0), 1.0)


@dataclass
class Rest:
    until: float = 0.0
    misses: int = 0              # cuts in a row that bought nothing


@dataclass
class Lab:
    """The experiments of one loop: the signals' history, the running experiment (one at a time), the
    levers' rests and what each bought under which conditions."""
    window: float = 5.0
    settle: float = 2.0
    rest: float = 10.0
    rest_max: float = 320.0
    budget: float = 0.1              # the share of BE's time that cuts which bought nothing may cost (budget_rest)
    confirm: float | None = None     # seconds the signal must be over before a cut (None: half the window)
    history: History = field(default_factory=lambda: History(60.0))
    running: Experiment | None = None
    rests: dict[tuple[str, str], Rest] = field(default_factory=dict)          # (lever, signal) -> its rest
    memory: dict[tuple, dict[str, Record]] = field(default_factory=dict)      # conditions -> lever -> record
    totals: dict[str, dict[str, Record]] = field(default_factory=dict)        # lever -> signal -> record
    chosen: dict[str, int] = field(default_factory=dict)                      # lever -> times chosen
    last: dict[str, dict] = field(default_factory=dict)                       # lever -> its last verdict
    lags: dict[Key, float] = field(default_factory=dict)                      # key -> its value's reach back
    confirmed_at: dict[tuple, float] = field(default_factory=dict)   # (lever, conditions) -> when a release confirmed it
    now: float = 0.0                                                          # the latest round's time
    moved_at: float | None = None                                             # the last round a lever moved in
    _moved: bool = False                                                      # a lever moved this round

    def observe(self, now: float, values: Mapping[Key, float], be_cores: float | None,
                healthy: Iterable[Key] = (), lags: Mapping[Key, float] | None = None) -> Verdict | None:
        """One round: every signal's value, BE's CPU use, the keys back in health and how many seconds back
        each key's value reaches (a quantile over several rounds; absent: this round only). Returns the
        running experiment's verdict when it is due (the experiment then ends), else None."""
        if self._moved:
            self.moved_at = self.now
        self.now, just_moved, self._moved = now, self._moved, False
        self.lags = dict(lags or {})
        self.history.forget_stale(now)
        for k, v in values.items():
            # A value that reaches back past the last move (a windowed p99 in the seconds after a floor) mixes
            # the two states: a ramp between two levels, not noise.
            self.history.add(now, k, v, not just_moved and (self.moved_at is None
                                                            or now - self.moved_at > self.lags.get(k, 0.0)))
        e = self.running
        if e is None:
            return None
        value = values.get(e.key)
        if value is not None and now > e.started:
            e.seen += 1
        if value is not None and now > e.changed:
            e.after.append((now, value, e.seen))
            if be_cores is not None:
                e.be_after.append(be_cores)
        shown = [a for a in e.after if a[0] >= e.changed + self.settle and a[0] > e.changed + e.lag]
        if value is not None and shown and shown[-1][0] == now:
            e.calm = e.calm + 1 if e.key in set(healthy) else 0
        if e.calm >= CONFIRM_ROUNDS and e.release is None:
            v = self._verdict(e, shown, now, early=True)
            if v.helped:
                return self._end(now, v)
        if now >= self.due(e) and (shown or e.after):
            return self._end(now, self._verdict(e, shown or e.after, now))
        return None

    def settled(self, now: float) -> bool:
        """Whether the running experiment's signal can show its lever's last move by now: `settle` after it and
        past the signal's lag (what observe() judges by). Before that a value is the state before the move."""
        e = self.running
        return e is not None and now >= e.changed + self.settle and now > e.changed + e.lag

    def due(self, e: Experiment) -> float:
        """When `e` is judged: `window` after its lever last moved, later by the signal's lag (module
        docstring)."""
        return e.changed + max(self.window, e.lag + self.window - self.settle)

    def lapsed(self, now: float) -> Experiment | None:
        """The running experiment, ended without a verdict, where its signal gave no value from the cut to
        its due time (the LS work whose wait or latency it was went away or went idle: a run queue with no
        wait has no p99); else None. Nothing to judge it by, and no rest: the loop puts back what it moved."""
        e = self.running
        if e is None or e.after or now < self.due(e):
            return None
        return self.abandon()

    def _verdict(self, e: Experiment, after: list[tuple], now: float, early: bool = False) -> Verdict:
        level = median(v for _, v, _ in after)
        need = margin(e.before, e.noise, e.correlation, range(1 - e.n_before, 1), [k for _, _, k in after])
        given = e.be_before - fmean(e.be_after) if e.be_after else 0.0
        share = min(max(given / e.be_before, 0.0), 1.0) if e.be_before > 0 else 0.0
        expected = None
        if e.drift < 0:      # falling on its own: judged against where it would have got to (module docstring)
            elapsed = min(median(t for t, _, _ in after) - e.before_at, e.drift_span, self.window)
            expected = e.before * math.exp(e.drift * max(elapsed, 0.0))
        v = Verdict(e.lever, e.key, False, e.before, level, e.noise, need, given, early, e.n_before, len(after),
                    expected, release=e.release is not None, cost_s=(now - e.started) * share)
        if e.release is not None:
            v = replace(v, back=given_back(e.release, level), log_back=log_given_back(e.release, level))
        if e.log_noise is not None and v.reference > 0 and all(x > 0 for _, x, _ in after):
            log_level = median(math.log(x) for _, x, _ in after)
            log_gain = log_level - math.log(v.reference) if e.release else math.log(v.reference) - log_level
            log_need = max(NOISE_K * standard_error(e.log_noise, e.log_correlation, range(1 - e.n_before, 1),
                                                    [k for _, _, k in after]), -math.log(1 - MIN_GAIN))
            v = replace(v, log_gain=log_gain, log_margin=log_need)
        return replace(v, helped=any(v.passes()))

    def confirmed(self, key: Key, now: float, over: float) -> bool:
        """The signal has been at or over `over` in every round of the last `confirm` seconds (half the
        window unless set), and in at least CONFIRM_ROUNDS rounds (the last ones where the span holds fewer),
        and was first seen that long ago: a cut may be
        taken (module docstring). Without the last condition a fresh koordd (or a signal just appeared) cut on
        its first two rounds: a median and a noise of two values, a real 42 -> 15 ms gain judged "bought
        nothing" against a 29 ms margin in CI, and the lever rested for minutes."""
        span = self.confirm if self.confirm is not None else self.window / 2
        first = self.history.first.get(key)
        if first is None or first > now - span + 1e-9:
            return False
        recent = self.history.values(key, since=now - span - 1e-9)
        if len(recent) < CONFIRM_ROUNDS:
            # Rounds further apart than the span holds (an interval over half the window): the last
            # CONFIRM_ROUNDS rounds, however old. Before, be_suppress at interval = "3s" (window 5 s) never
            # confirmed a risk, so it never cut, however late LS was.
            recent = self.history.values(key)[-CONFIRM_ROUNDS:]
        return len(recent) >= CONFIRM_ROUNDS and all(v >= over for v in recent)

    def _end(self, now: float, v: Verdict) -> Verdict:
        e, self.running = self.running, None
        self.memory[e.conditions] = self.memory.pop(e.conditions, {})       # the newest goes last
        while len(self.memory) > MAX_CONDITIONS:
            del self.memory[next(iter(self.memory))]
        records = (self.memory[e.conditions].setdefault(v.lever, Record()),
                   self.totals.setdefault(v.lever, {}).setdefault(v.key[1], Record()))
        for record in records:
            if e.release is None:
                record.add(v)
            elif not v.helped:               # the release did not confirm it: the cut's "helped" was not
                record.retract(e.release)
        if e.release is not None and v.helped:
            self.confirmed_at = {k: t for k, t in self.confirmed_at.items() if now - t <= self.rest_max}
            self.confirmed_at[(v.lever, e.conditions)] = now
        self.last[v.lever] = {**v.fields(), "time": now}
        rest = self.rests.setdefault((v.lever, v.key[1]), Rest())
        if v.helped:
            rest.misses, rest.until = 0, 0.0
        else:
            rest.misses += 1
            # what BE gave up for nothing: this cut's time, or for a release that cost nothing the kept cut's
            wasted = e.release.cost_s if e.release is not None else v.cost_s
            rest.until = now + min(max(self.rest * 2 ** (rest.misses - 1), budget_rest(wasted, self.budget)),
                                   self.rest_max)
        return v

    def start(self, now: float, lever: str, key: Key, be_cores: float, cond: tuple, undo: Any = None,
              bound: float | None = None, release: Verdict | None = None) -> Experiment:
        """The loop moved `lever` for signal `key` this round: judge it from here, against the median of the
        signal over the confirmation span up to now (half the window: the rounds that showed the state that
        prompted the cut; over the whole window a windowed p99 that was still climbing towards the level
        that prompted the cut was judged by its healthy start, and a cut that bought 53 -> 14 ms was
        "bought nothing" against a before of 15.6 ms)."""
        past, before = self._before(key, now)
        sigma, r = self.history.spread(key, until=now)
        log_noise, log_r = self.history.log_spread(key, until=now) or (None, 0.0)
        seen = [(t, v) for t, v in self.history.points.get(key, ()) if now - self.window - 1e-9 < t <= now]
        fall = drift(seen, log_noise)
        if fall is not None:     # its noise about the fall, not with it (Fall.noise)
            (sigma, r), (log_noise, log_r) = fall.noise(seen), fall.noise(seen, log=True)
        self.running = Experiment(lever, key, now, now, before, sigma, be_cores, cond, undo, bound,
                                  n_before=max(len(past), 1), correlation=r,
                                  drift=fall.rate if fall else 0.0, drift_span=fall.span if fall else 0.0,
                                  lag=self.lags.get(key, 0.0),
                                  before_at=median(t for t, _ in past) if past else now, release=release,
                                  log_noise=log_noise, log_correlation=log_r)
        self._moved = True
        if release is None:
            self.chosen[lever] = self.chosen.get(lever, 0) + 1
        return self.running

    def _before(self, key: Key, now: float) -> tuple[list[tuple[float, float]], float]:
        """The signal's values over the confirmation span up to now, and their median: a cut's level before."""
        span = self.confirm if self.confirm is not None else self.window / 2
        past = [(t, v) for t, v in self.history.points.get(key, ()) if now - span - 1e-9 < t <= now]
        return past, median(v for _, v in past) if past else 0.0

    def can_show(self, key: Key, now: float) -> tuple[bool, float, float]:
        """Whether a cut started now on `key` could ever be judged to have helped, and (the level before, the
        least margin its verdict could ask). A signal cannot fall below zero, so a cut whose margin is at least
        its level before can never pass: on the 2-CPU host a stall (a p99 of 0.9 s) left an SLO's
        noise at 132 ms for the next minute, and a floor taken at 21.85 ms was judged against a 420.61 ms margin
        and undone, BE's CPU gone for its whole window. The least margin: the after window as full as the
        experiment's due time allows (the round interval the signal's own history shows) right after the
        cut, where it moves most with the values before, or any shorter such window, whichever asks least:
        every verdict asks at least that much. Where that window cannot be sized (no round interval yet) or
        would hold more than MAX_AFTER_ROUNDS values (the sum costs their square each), a cut is let through:
        the check only ever holds BE where it has the bound, and a round never pays more than that. The bound
        is the margin test's: the ratio test has none (a signal above zero can fall by any factor), and where
        the margin cannot pass the last minute held a stall, whose logarithms are as wild, so BE is not bet
        on a fall of many times."""
        past, before = self._before(key, now)
        times = [t for t, _ in self.history.points.get(key, ())]
        interval = median(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else 0.0
        reach = self.window + self.lags.get(key, 0.0) - self.settle
        if interval <= 0 or reach / interval + 1 > MAX_AFTER_ROUNDS:
            return True, before, 0.0
        n_after = max(int(reach / interval) + 1, 1)
        sigma, r = self.history.spread(key, until=now)
        at_before = range(1 - max(len(past), 1), 1)
        need = min(margin(before, sigma, r, at_before, range(1, n + 1)) for n in range(1, n_after + 1))
        return before > need, before, need

    def retest(self, lever: str, cond: tuple, now: float) -> bool:
        """Whether a cut of `lever` judged helped under `cond` should be released once to test it (module
        docstring: A/B/A): not where a release confirmed it under the same conditions within `rest_max`."""
        at = self.confirmed_at.get((lever, cond))
        return at is None or now - at > self.rest_max

    def moved(self) -> None:
        """The loop moved a lever this round (any step, not only a cut): the next round's values are no
        measure of the signal's noise."""
        self._moved = True

    def chose(self, lever: str) -> None:
        """Count a lever chosen that is no experiment (leaving BE alone)."""
        self.chosen[lever] = self.chosen.get(lever, 0) + 1

    def deepen(self, now: float) -> None:
        """The running experiment's lever moved further: its after window starts again."""
        if self.running is not None:
            self.running.changed, self.running.after, self.running.be_after = now, [], []
        self._moved = True

    def abandon(self) -> Experiment | None:
        """End the running experiment without a verdict (its signal no longer decides)."""
        e, self.running = self.running, None
        return e

    def rest_for(self, lever: str, signal: str, until: float) -> None:
        """Rest `lever` for `signal` until `until` whatever it bought (a bounded cut that ran its time)."""
        r = self.rests.setdefault((lever, signal), Rest())
        r.until = max(r.until, until)

    def resting(self, lever: str, signal: str, now: float) -> float:
        """Seconds `lever` still rests for `signal` (0: free)."""
        r = self.rests.get((lever, signal))
        return max(r.until - now, 0.0) if r is not None else 0.0

    def order(self, levers: Sequence[str], cond: tuple, now: float) -> list[str]:
        """The levers free to try for `cond`'s signal, best first: by the share of cuts that helped under
        the same conditions, else under the same load band and signal, else untried; ties in the given
        order."""
        free = [lv for lv in levers if self.resting(lv, cond[2], now) == 0]
        return sorted(free, key=lambda lv: (-self.record(lv, cond).score, levers.index(lv)))

    def record(self, lever: str, cond: tuple) -> Record:
        """What `lever` bought under `cond`, else under the same load band and signal summed (an empty Record
        where it was never judged there)."""
        exact = self.memory.get(cond, {}).get(lever)
        if exact is not None:
            return exact
        band, _, signal = cond
        near = Record()
        for c, records in self.memory.items():
            if c[0] == band and c[2] == signal and lever in records:
                r = records[lever]
                near.helped, near.nothing, near.retracted = (near.helped + r.helped, near.nothing + r.nothing,
                                                             near.retracted + r.retracted)
        return near

    def status(self, now: float, levers: Iterable[str] = ()) -> dict:
        """Per lever: times chosen, verdicts and mean gain per signal, rests, the last verdict; and the
        running experiment."""
        names = sorted(set(levers) | set(self.chosen) | set(self.totals))
        out = {}
        for lv in names:
            resting = {sig: round(r.until - now, 1) for (lev, sig), r in sorted(self.rests.items())
                       if lev == lv and r.until > now}
            out[lv] = {"chosen": self.chosen.get(lv, 0),
                       "by_signal": {sig: r.summary() for sig, r in sorted(self.totals.get(lv, {}).items())},
                       "resting_s": resting, "last": self.last.get(lv)}
        return {"levers": out, "running": self.running.fields() if self.running else None}
