"""The picture of the frontier proof (scripts/proof-frontier, scripts/bench-qos --frontier): every static
setting as a point (its BE work against its LS p99, medians over repetitions), the static frontier (the
settings no other static setting beats on both), where koordd's points lie against it, an SLO sweep (the
static oracle and koordd at each SLO of 1.1 ... 3 x LS alone's p99), and whether the instrument could see
the margin at all (LS alone's spread and the client's own send lag, both against the margin).

Issue 36 asks that no static setting give "both lower p99 and more BE work beyond the measured spread": a
median that is lower by less than the runs' own spread is no evidence. So a static point beats koordd's
beyond the spread (clearly_dominates) only where it is no worse in either within the spread and better in
one by more than it, the spread being the larger of LS alone's p99 and BE alone's work over their repetitions
and the typical (median) spread of each static setting's own p99 and BE work over its repetitions (max - min
over the median; Resolution). LS alone and BE alone miss what moves only with both running: on the 2-CPU
host the CPU one LS request costs varied by a third from run to run, and BE's work with it, while BE alone's
work did not (a run of redis against the cpu antagonist in which koordd wrote nothing: be-idle's BE work
over 3 repetitions 52-72% of BE alone's, koordd's 36-83% over its 9 runs). The report says both: who beats koordd on medians, and who
beyond the spread; and how often koordd acted in its measured windows at all.

Pure functions of run records (the dicts of results.json; koordtest.bench.qos_stats describes them).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from koordtest.bench.power import exp_or_inf, paired_ratio, pooled_log_sd, runs_needed
from koordtest.bench.steal import steal_line
from koordtest.bench.qos_stats import (BE_ALONE, LS_ALONE, WINDOWS_MET, Spread, lever_verdicts, median_spread,
                                      slo_verdicts)
from koordd.kernel.pm_qos import NO_CONSTRAINT

SWEEP_FACTORS = (1.1, 1.25, 1.5, 2.0, 3.0)
KOORDD_PREFIX = "koordd"
ORACLE_SHARE = 0.95      # at an SLO some static setting meets, koordd must meet it with this share of its BE work
UNBOUND = 0.01           # a cap that throttled BE in fewer of its periods than this held nothing back


@dataclass(frozen=True)
class Point:
    """One setting at one load: medians over its repetitions."""
    setup: str
    be_work: float           # over BE alone
    p99: float               # seconds
    windows_met: float = 1.0  # share of windows meeting the target it was judged against (1.0: not judged)
    reps: int = 1


@dataclass(frozen=True)
class Resolution:
    """The smallest differences the runs can show, each relative: LS alone's p99 and BE alone's work, (max - min)
    / median over their repetitions (0 with one repetition: then every difference counts), and the static
    settings' own scatter where some setting ran twice with the same knobs (`settings_measured`)."""
    p99: float = 0.0
    be_work: float = 0.0
    settings_measured: bool = True


def clearly_dominates(a: Point, b: Point, res: Resolution) -> bool:
    """a beats b beyond the measured spread: no worse in either within `res` (a difference inside the spread is
    a tie) and better in one by more than it. With a zero resolution, dominates() again."""
    no_less_work = a.be_work * (1 + res.be_work) >= b.be_work
    no_more_p99 = a.p99 <= b.p99 * (1 + res.p99)
    more_work = a.be_work > b.be_work * (1 + res.be_work)
    less_p99 = a.p99 * (1 + res.p99) < b.p99
    return no_less_work and no_more_p99 and (more_work or less_p99)


def dominates(a: Point, b: Point) -> bool:
    """a at least as much BE work at no more p99, and better in one of them (on medians: no spread)."""
    return clearly_dominates(a, b, Resolution())


def frontier(points: Sequence[Point]) -> list[Point]:
    """The points no other point dominates, by BE work ascending (so p99 ascending too)."""
    front = [p for p in points if not any(dominates(q, p) for q in points)]
    return sorted(front, key=lambda p: (p.be_work, p.p99))


def best_work_within(points: Sequence[Point], p99: float) -> Point | None:
    """The point with the most BE work at or under `p99`."""
    within = [p for p in points if p.p99 <= p99]
    return max(within, key=lambda p: (p.be_work, -p.p99), default=None)


def best_p99_with(points: Sequence[Point], be_work: float) -> Point | None:
    """The point with the lowest p99 among those doing at least `be_work`."""
    enough = [p for p in points if p.be_work >= be_work]
    return min(enough, key=lambda p: (p.p99, -p.be_work), default=None)


@dataclass(frozen=True)
class Standing:
    """Where one of koordd's points lies against the static points."""
    point: Point
    dominated_by: tuple[str, ...]     # static settings with at least its BE work at no more p99
    dominates: tuple[str, ...]        # static settings it beats on both
    work_vs_frontier: float | None    # its BE work over the most a static setting does within its p99
    p99_vs_frontier: float | None     # its p99 over the least a static setting has with its BE work
    beaten_beyond_spread: tuple[str, ...] = ()   # static settings that beat it beyond the measured spread
    settings_measured: bool = True    # the spread held the static settings' own scatter (Resolution)

    def describe(self) -> str:
        """The report's cell: who beats it, and whether beyond the measured spread."""
        beyond = self.beaten_beyond_spread
        ties = [s for s in self.dominated_by if s not in beyond]
        if beyond:
            spread = "the measured spread" if self.settings_measured else \
                "LS and BE alone's spread (the static settings' own scatter not measured)"
            out = f"dominated beyond {spread} by " + ", ".join(beyond)
            return out + (f"; within it by {', '.join(ties)}" if ties else "")
        if ties:
            return "on the frontier within the measured spread (dominated on medians by " + ", ".join(ties) + ")"
        return "not dominated" + (f"; beats {', '.join(self.dominates)}" if self.dominates else "")


def standing(k: Point, statics: Sequence[Point], res: Resolution = Resolution()) -> Standing:
    same_p99, same_work = best_work_within(statics, k.p99), best_p99_with(statics, k.be_work)
    return Standing(k, tuple(s.setup for s in statics if dominates(s, k)),
                    tuple(s.setup for s in statics if dominates(k, s)),
                    k.be_work / same_p99.be_work if same_p99 and same_p99.be_work > 0 else None,
                    k.p99 / same_work.p99 if same_work and same_work.p99 > 0 else None,
                    tuple(s.setup for s in statics if clearly_dominates(s, k, res)), res.settings_measured)


def points(runs: Sequence[dict], load, setups: Sequence[str], target: float | None = None) -> list[Point]:
    """A Point per setup in `setups` that ran with LS and BE at `load`: BE work over BE alone of the same
    repetition, p99 and (with `target`) the share of windows meeting it, medians over repetitions."""
    verdicts = slo_verdicts(runs, load, target if target is not None else float("inf"))
    out = []
    for s in setups:
        mine = [v for v in verdicts if v.setup == s and v.be_work is not None]
        if mine:
            out.append(Point(s, statistics.median(v.be_work for v in mine), statistics.median(v.p99 for v in mine),
                             statistics.median(v.windows_met for v in mine) if target is not None else 1.0,
                             len(mine)))
    return out


def meets(p: Point, target: float) -> bool:
    """The SLO rule of bench-qos (qos_stats.slo_verdicts), on medians: p99 at or under the target and in
    WINDOWS_MET of the windows."""
    return p.p99 <= target and p.windows_met >= WINDOWS_MET


@dataclass(frozen=True)
class SweepRow:
    factor: float
    target: float                      # seconds
    oracle: Point | None               # the static setting with the most BE work meeting the target
    koordd: Point | None               # koordd told this target (None: not run at this factor)
    koordd_meets: bool | None

    @property
    def koordd_over_oracle(self) -> float | None:
        if self.koordd is None or self.oracle is None or self.oracle.be_work <= 0:
            return None
        return self.koordd.be_work / self.oracle.be_work

    @property
    def holds(self) -> bool | None:
        """Issue 36's rule at this SLO: where a static setting meets it, koordd meets it with at least
        ORACLE_SHARE of that oracle's BE work; None where no static setting meets it or koordd did not run."""
        if self.oracle is None or self.koordd is None:
            return None
        share = self.koordd_over_oracle
        return bool(self.koordd_meets) and share is not None and share >= ORACLE_SHARE

    def verdict(self, res: Resolution) -> str:
        """The report's cell: yes, no, or - (holds is None); a "no" where koordd met the SLO with a share of the
        oracle's work that the spread of BE work could account for says so. The rule stays the issue's: a no is a
        no; the note says how much it rests on."""
        if self.holds is None:
            return "-"
        if self.holds:
            return "yes"
        share = self.koordd_over_oracle
        if self.koordd_meets and share is not None and share * (1 + res.be_work) >= ORACLE_SHARE:
            return ("**no**, within the measured spread" if res.settings_measured else
                    "**no**, within LS and BE alone's spread (the settings' scatter not measured)")
        return "**no**"


def paired_lines(runs: Sequence[dict], load, rows: Sequence[SweepRow]) -> list[str]:
    """The 95% rule paired by repetition: at each factor with an oracle, koordd's run over the oracle setting's run
    of the same repetition (the same arrivals, LS alone and BE alone, and the host's hour), as a geometric mean
    with its 90% interval and whether it is at least ORACLE_SHARE with 95% confidence (power.PairedRatio), and
    how often each met the target. Medians of a few repetitions cannot say that; the pairs' drift cancels."""
    out = []
    for row in rows:
        if row.oracle is None or row.koordd is None:
            continue
        verdicts = slo_verdicts(runs, load, row.target)
        mine = {v.rep: v for v in verdicts if v.setup == row.koordd.setup}
        theirs = {v.rep: v for v in verdicts if v.setup == row.oracle.setup}
        reps = sorted(set(mine) & set(theirs))
        met = (f"met the target in {sum(mine[r].meets for r in reps)} of {len(reps)} repetitions, "
               f"{row.oracle.setup} in {sum(theirs[r].meets for r in reps)}")
        ratio = paired_ratio((theirs[r].be_work, mine[r].be_work) for r in reps)
        said = ("one pair: no interval" if ratio is None else
                f"{ratio.ratio:.2f} ({ratio.low:.2f}-{ratio.high:.2f}, 90% interval) over {ratio.pairs} pairs: "
                f"{ratio.against(ORACLE_SHARE)}")
        out.append(f"- {row.factor:g}x paired by repetition: {row.koordd.setup}'s BE work over {row.oracle.setup}'s "
                   f"{said}; {met}")
    return out


def koordd_setup(factor: float) -> str:
    """The name of setup koordd told an SLO of `factor` x LS alone's p99."""
    return f"{KOORDD_PREFIX}-slo-{factor:g}"


def sweep(runs: Sequence[dict], load, alone_p99: float, statics: Sequence[str],
          factors: Sequence[float] = SWEEP_FACTORS) -> list[SweepRow]:
    """At each factor: the target (factor x `alone_p99`), the static oracle judged on the same runs, and
    koordd's run told that target (setup koordd_setup(factor)), each judged with the windows rule."""
    rows = []
    for f in factors:
        target = f * alone_p99
        static_points = [p for p in points(runs, load, statics, target) if meets(p, target)]
        best = max(static_points, key=lambda p: p.be_work, default=None)
        k = points(runs, load, [koordd_setup(f)], target)
        rows.append(SweepRow(f, target, best, k[0] if k else None, meets(k[0], target) if k else None))
    return rows


@dataclass(frozen=True)
class Instrument:
    """Could the measurement see the margin? LS alone's p99 over its repetitions (run around every case)
    and the client's send lag p99, each against the smallest SLO margin."""
    alone: Spread                 # LS alone's p99, seconds
    spread: float                 # (max - min) / median of LS alone's p99
    send_lag_p99: float           # the highest send lag p99 of any run with LS, seconds
    lag_share: float              # that over LS alone's median p99
    margin: float                 # the smallest SLO margin (factor - 1)
    be_spread: float = 0.0        # (max - min) / median of BE alone's work
    settings_p99: float = 0.0     # the median over static settings of each one's (max - min) / median p99
    settings_be: float = 0.0      # ... and of its BE work
    settings_measured: bool = True    # some static setting ran twice or more with the same knobs
    pooled: tuple[str, ...] = ()  # caps that never bound, counted as runs of the setting without them

    @property
    def sees_margin(self) -> bool:
        return self.spread < self.margin and self.lag_share < self.margin

    @property
    def resolution(self) -> Resolution:
        return Resolution(max(self.spread, self.settings_p99), max(self.be_spread, self.settings_be),
                          self.settings_measured)


def relative(s: Spread | None) -> float:
    """(max - min) / median; 0 for no values or a median of 0 (one value: max = min, 0 too)."""
    return (s.high - s.low) / s.median if s is not None and s.median > 0 else 0.0


def relative_spread(values) -> float:
    """relative() of the known values."""
    return relative(median_spread(values))


def cap_base(setup: str) -> str | None:
    """The setting a static cap adds its cpu.max to (be-idle-cpu-max-N: be-idle; be-cpu-max-N: no-control)."""
    for prefix, base in (("be-idle-cpu-max-", "be-idle"), ("be-cpu-max-", "no-control")):
        if setup.startswith(prefix):
            return base
    return None


def never_bound(runs: Sequence[dict], load, setup: str) -> bool:
    """Whether `setup`'s cap throttled BE in under UNBOUND of its periods in every run at `load` (False where no
    period was counted: no cap, or runs recorded before the count)."""
    shares = [throttled_share(r) for r in runs if r["setup"] == setup and r["load"] == load]
    return bool(shares) and all(x is not None and x < UNBOUND for x in shares)


AGAIN = "-again"        # a setting run a second time in a repetition (bench-qos --be-idle-twice: be-idle-again)


def same_knobs(runs: Sequence[dict], load, setups: Sequence[str]) -> dict[str, str]:
    """Each of `setups`, and each setting run again beside one of them (be-idle-again), -> the setting whose knobs
    it held in effect at `load`: a cap that never bound held its base's, where the base is among `setups` too; a
    setting run again its own; every other setting its own."""
    out = {s: base if (base := cap_base(s)) in setups and never_bound(runs, load, s) else s for s in setups}
    for again in sorted({r["setup"] for r in runs if r["load"] == load and r["setup"].endswith(AGAIN)}):
        if (base := again.removesuffix(AGAIN)) in setups:
            out[again] = base
    return out


def settings_spreads(runs: Sequence[dict], load, setups: Sequence[str]) -> tuple[float, float, bool, tuple[str, ...]]:
    """The median over `setups` of each one's own relative spread of p99 and of BE work over BE alone (those
    with two or more runs at `load`): how far one setting's runs scatter with nothing changed; whether any had
    two; and the caps pooled with their base (same_knobs). A cap that never bound ran its base's knobs, so its
    runs are more runs of its base: on 16 CPUs, in one repetition, be-idle-cpu-max-60 never bound and read
    5.76 ms where be-idle read 30.99 ms, and with each setting's scatter taken as 0 a point between them was
    called dominated beyond the measured spread."""
    groups = knob_groups(runs, load, setups)
    repeated = [mine for mine in groups.values() if len(mine) > 1]
    p99s = [relative_spread(v.p99 for v in mine) for mine in repeated]
    works = [relative_spread(v.be_work for v in mine) for mine in repeated]
    knobs = same_knobs(runs, load, setups)
    ran = {v.setup for mine in groups.values() for v in mine}
    pooled = tuple(s for s in knobs if knobs[s] != s and s in ran)
    return (statistics.median(p99s) if p99s else 0.0, statistics.median(works) if works else 0.0, bool(p99s),
            pooled)


def knob_groups(runs: Sequence[dict], load, setups: Sequence[str]) -> dict[str, list]:
    """The runs at `load` of `setups` (and of a setting run again beside one) that have BE work, grouped by the
    knobs they held in effect (same_knobs): runs with nothing changed between them."""
    knobs = same_knobs(runs, load, setups)
    groups: dict[str, list] = {}
    for v in slo_verdicts(runs, load, float("inf")):
        if v.setup in knobs and v.be_work is not None:
            groups.setdefault(knobs[v.setup], []).append(v)
    return dict(sorted(groups.items()))


def power_line(runs: Sequence[dict], load, setups: Sequence[str], margin: float) -> str | None:
    """The report's line on how many repetitions the rules would need at the scatter this run measured (power.py):
    the 95% rule's 5% of BE work and a p99 difference of the smallest SLO margin. None where no setting ran twice."""
    groups = knob_groups(runs, load, setups).values()
    work = pooled_log_sd([v.be_work for v in mine] for mine in groups)
    p99 = pooled_log_sd([v.p99 for v in mine] for mine in groups)
    if work is None or p99 is None:
        return None
    reps = max((len({v.rep for v in mine}) for mine in groups), default=0)
    need = [f"telling {100 * ORACLE_SHARE:.0f}% of the oracle's BE work from 100% about "
            f"{runs_needed(work.log_sd, 1 / ORACLE_SHARE)} repetitions of each setting"]
    if margin > 0:
        need.append(f"a p99 {100 * margin:.0f}% apart about {runs_needed(p99.log_sd, 1 + margin)}")
    return (f"- repetitions the rules need at this scatter (one run of a static setting with nothing changed: BE work "
            f"×/÷ {exp_or_inf(work.log_sd):.2f}, p99 ×/÷ {exp_or_inf(p99.log_sd):.2f} as one standard deviation, "
            f"{work.freedom} degrees of freedom): {', '.join(need)} (two-sided 5%, power 80%); this run had {reps}")


def instrument(runs: Sequence[dict], load, margin: float, statics: Sequence[str] = ()) -> Instrument | None:
    alone = median_spread(r["ls"]["p99"] for r in runs if r["setup"] == LS_ALONE and r["load"] == load and r["ls"])
    lags = [r["ls"]["send_lag_p99"] for r in runs if r["load"] == load and r["ls"] and r["ls"].get("send_lag_p99")
            is not None]
    if alone is None or alone.median <= 0:
        return None
    lag = max(lags, default=0.0)
    be_spread = relative_spread(r["be_work"] for r in runs if r["setup"] == BE_ALONE)
    return Instrument(alone, relative(alone), lag, lag / alone.median, margin, be_spread,
                      *settings_spreads(runs, load, statics))


def koordd_setups(runs: Sequence[dict], load) -> list[str]:
    return sorted({r["setup"] for r in runs if r["setup"].startswith(KOORDD_PREFIX) and r["load"] == load})


def cpu_latency_held(run: dict) -> bool:
    """Whether a CPU latency request was in force at the run's window start or end (bench-qos reads
    /dev/cpu_dma_latency there): CPUs kept out of deep idle, which BE's knobs at the window's end do not show."""
    return any(isinstance(v, int) and 0 <= v < NO_CONSTRAINT for v in run.get("cpu_latency_us") or ())


def koordd_activity(runs: Sequence[dict], load) -> list[str]:
    """A report line per koordd setup at `load`: in how many of its measured windows it decided anything, and
    how many writes it made there and before them (settling: bench-qos --koordd-settle), with BE's cpu.max at
    the window's end. Where it decided nothing its runs held what its baseline holds (qos_baseline: BE under
    cpu.idle, as be-idle) and differ from be-idle by the runs' own scatter and koordd's own cost."""
    out = []
    for setup in koordd_setups(runs, load):
        mine = [r for r in runs if r["setup"] == setup and r["load"] == load]
        acted = sum(1 for r in mine if r.get("koordd_window"))
        writes = sum(1 for r in mine for d in r.get("koordd_window") or () if d.get("outcome") == "applied")
        before = sum(1 for r in mine for d in r.get("koordd_before") or () if d.get("outcome") == "applied")
        line = f"- {setup}: decided something in {acted} of {len(mine)} measured windows, {writes} writes"
        if any("koordd_before" in r for r in mine):
            ends = ", ".join(str(r.get("be_cpu_max")) for r in mine)
            line += f"; {before} writes before them (settling); BE's cpu.max at the windows' end: {ends}"
        held = [r for r in mine if cpu_latency_held(r)]
        if any("cpu_latency_us" in r for r in mine):
            line += (f"; CPUs held out of deep idle (a CPU latency request in force at the window's start or "
                     f"end: its wake lever) in {len(held)} of {len(mine)} windows")
        unshowable = [r["koordd_unshowable"] for r in mine if r.get("koordd_unshowable") is not None]
        if any(unshowable):
            line += (f"; held BE where no cut could show in {sum(unshowable)} rounds ({sum(1 for n in unshowable if n)} "
                     f"of {len(mine)} runs, counted from koordd's start: such rounds write nothing)")
        verdicts = lever_verdicts(mine)
        if verdicts:
            line += f"; its levers' verdicts, counted from koordd's start: {verdicts}"
        if acted == 0 and before == 0 and not held:
            line += ("; with none, its BE ran as under be-idle, and where their points differ that is the runs' "
                     "own scatter (and koordd's own CPU)")
        out.append(line)
    return out


def separates(runs: Sequence[dict], load, statics: Sequence[str], alone_p99: float,
              factors: Sequence[float]) -> str | None:
    """A report line where every static setting met the sweep's tightest SLO, and so all of them: then the
    factors of LS alone's p99 do not tell the settings apart. Under a sine on 2 CPUs LS alone's queue ran away
    (2.9 s, the VM wake-up effect: alone, a request cost a quarter more CPU), the targets were seconds, and the
    sweep said "holds" of a koordd that had been told 4.3 s."""
    target = min(factors) * alone_p99
    judged = points(runs, load, statics, target)
    if len(judged) < 2 or not all(meets(p, target) for p in judged):
        return None
    return (f"- every static setting met the sweep's tightest SLO ({min(factors):g} x LS alone's p99, "
            f"{target * 1000:.2f} ms), so every SLO of it: these targets do not tell the settings apart, and a "
            "\"holds\" below says nothing; one absolute target for all (bench-qos --slo-ms) can")


def throttled_share(run: dict) -> float | None:
    """The share of the window's cpu.stat periods in which BE's cap throttled it; None where no quota ran (no
    period counted: no cap, or a run recorded before the count)."""
    t = run.get("be_throttled")
    return t["throttled"] / t["periods"] if t and t.get("periods") else None


def throttle_line(runs: Sequence[dict], load, setups: Sequence[str]) -> str | None:
    """How often each setting's cap on BE held it back in its windows, and which caps never did. Such a cap held
    the knobs of no cap: memcached against cpu at 70% on 2 CPUs, BE used 0.59-0.84 CPUs under a 1.2-CPU cap
    (LS used the rest), and that cap's points differed from be-idle's by the runs' scatter alone, yet one of
    them was named the oracle."""
    parts, unbound = [], []
    for setup in setups:
        shares = median_spread(throttled_share(r) for r in runs if r["setup"] == setup and r["load"] == load)
        if shares is None:
            continue
        parts.append(f"{setup} {100 * shares.median:.1f}% ({100 * shares.low:.1f}-{100 * shares.high:.1f})")
        if never_bound(runs, load, setup):
            unbound.append(setup)
    if not parts:
        return None
    line = "- BE's cpu.max periods throttled by its cap (median and range over runs): " + ", ".join(parts)
    if unbound:
        line += (f"; {', '.join(unbound)} throttled BE in under {100 * UNBOUND:g}% of its periods in every run: in "
                 "effect the same knobs without the cap, and where their points differ that is the runs' own scatter")
    return line


def settings_line(inst: Instrument) -> str:
    """The report's line on the static settings' own scatter and the spread koordd is judged within."""
    judged = f"p99 {100 * inst.resolution.p99:.1f}%, BE work {100 * inst.resolution.be_work:.1f}%"
    if not inst.settings_measured:
        return ("- the static settings' own scatter: **not measured** (each ran once, no cap ran unbound "
                "beside the setting without it, and none ran again: bench-qos --be-idle-twice); a static setting must beat koordd by LS or BE alone's spread "
                f"only ({judged}), and runs of LS and BE together scatter more than either alone")
    caps = [s for s in inst.pooled if not s.endswith(AGAIN)]
    again = [s for s in inst.pooled if s.endswith(AGAIN)]
    said = [f"{', '.join(caps)} counted as runs of the setting without the cap: it never bound"] * bool(caps) + \
        [f"{', '.join(again)} counted as a second run of its setting"] * bool(again)
    pooled = f" ({'; '.join(said)})" if said else ""
    return (f"- the static settings' own repetitions{pooled}: p99 spread {100 * inst.settings_p99:.1f}%, BE work "
            f"spread {100 * inst.settings_be:.1f}% of their medians (the median over settings); the spread a static "
            f"setting must beat koordd by is the larger of each and LS or BE alone's: {judged}")


def report(runs: Sequence[dict], load, statics: Sequence[str], factors: Sequence[float] = SWEEP_FACTORS) -> str:
    """Markdown: the instrument, the static points with the frontier marked, koordd's standing, the sweep."""
    inst = instrument(runs, load, min(factors) - 1, statics)
    if inst is None:
        return f"LS load {load}%: no LS-alone run, no frontier.\n"
    static_points = points(runs, load, statics)
    front = {p.setup for p in frontier(static_points)}
    ms = lambda s: f"{s * 1000:.2f}"          # noqa: E731
    out = [f"#### LS load {load}%", "",
           f"- LS alone p99: median {ms(inst.alone.median)} ms, {ms(inst.alone.low)}-{ms(inst.alone.high)} ms over "
           f"{inst.alone.n} runs around the others: spread {100 * inst.spread:.1f}% of the median, against a "
           f"smallest SLO margin of {100 * inst.margin:.0f}%",
           f"- client send lag p99 (worst run): {inst.send_lag_p99 * 1e6:.0f} µs = {100 * inst.lag_share:.1f}% of LS "
           f"alone's p99",
           f"- so the instrument {'can' if inst.sees_margin else '**cannot**'} see a {100 * inst.margin:.0f}% margin "
           f"here" + ("" if inst.sees_margin else f"; it sees about {100 * max(inst.spread, inst.lag_share):.0f}%"),
           f"- BE alone's work: spread {100 * inst.be_spread:.1f}% of its median over its repetitions",
           settings_line(inst),
           *filter(None, [power_line(runs, load, statics, inst.margin), steal_line(runs, load, inst.alone.median)]),
           *koordd_activity(runs, load),
           *filter(None, [throttle_line(runs, load, [*statics, *koordd_setups(runs, load)]),
                          separates(runs, load, statics, inst.alone.median, factors)]),
           "", "| setting | BE work | LS p99 (ms) | p99 / alone | reps | on the static frontier |",
           "|---|---|---|---|---|---|"]
    for p in sorted(static_points, key=lambda p: p.be_work):
        out.append(f"| {p.setup} | {100 * p.be_work:.0f}% | {ms(p.p99)} | {p.p99 / inst.alone.median:.2f}x | "
                   f"{p.reps} | {'yes' if p.setup in front else ''} |")
    kpoints = points(runs, load, koordd_setups(runs, load))
    for k in kpoints:
        st = standing(k, static_points, inst.resolution)
        out.append(f"| **{k.setup}** | {100 * k.be_work:.0f}% | {ms(k.p99)} | {k.p99 / inst.alone.median:.2f}x | "
                   f"{k.reps} | {st.describe()} |")
    rows = sweep(runs, load, inst.alone.median, statics, factors)
    out += ["", "| SLO | target (ms) | static oracle | its BE work | koordd p99 (ms) | koordd meets | koordd BE work | "
            "koordd / oracle | holds |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        k = r.koordd
        out.append(f"| {r.factor:g}x | {ms(r.target)} | {r.oracle.setup if r.oracle else 'none'} | "
                   f"{f'{100 * r.oracle.be_work:.0f}%' if r.oracle else '-'} | {ms(k.p99) if k else 'not run'} | "
                   f"{'-' if k is None else ('yes' if r.koordd_meets else 'no')} | "
                   f"{f'{100 * k.be_work:.0f}%' if k else '-'} | "
                   f"{f'{100 * r.koordd_over_oracle:.0f}%' if r.koordd_over_oracle is not None else '-'} | "
                   f"{r.verdict(inst.resolution)} |")
    out += ["", *paired_lines(runs, load, rows)] if any(r.oracle and r.koordd for r in rows) else []
    out += ["", f"BE work over {BE_ALONE}'s of the same repetition; every cell a median over repetitions. A setting "
            f"meets an SLO when its p99 is at or under the target and {100 * WINDOWS_MET:.0f}% of its windows are. "
            "The static frontier: the static settings no other static setting beats on both BE work and p99. "
            f"holds: where a static setting meets the SLO, koordd meets it with at least {100 * ORACLE_SHARE:.0f}% of "
            "that oracle's BE work.", ""]
    return "\n".join(out)


def plot(runs: Sequence[dict], loads: Sequence, statics: Sequence[str], path, title: str,
         factors: Sequence[float] = SWEEP_FACTORS) -> None:
    """One panel per load: static points, the frontier as a step line, koordd's points, the SLO targets."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(len(loads), 1), figsize=(6.0 * max(len(loads), 1), 4.6), squeeze=False)
    for ax, load in zip(axes[0], loads):
        inst = instrument(runs, load, min(factors) - 1)
        static_points = points(runs, load, statics)
        ax.scatter([p.be_work for p in static_points], [p.p99 * 1000 for p in static_points], color="grey", s=22,
                   label="static settings")
        front = frontier(static_points)
        if front:
            xs, ys = [], []
            for p in front:
                xs += [p.be_work]
                ys += [p.p99 * 1000]
            ax.step(xs, ys, where="pre", color="black", label="static frontier")   # the least p99 with at least x of the work
        for k in points(runs, load, koordd_setups(runs, load)):
            ax.scatter([k.be_work], [k.p99 * 1000], marker="*", s=120, label=k.setup)
        if inst is not None:
            for f in factors:
                ax.axhline(f * inst.alone.median * 1000, color="tab:red", alpha=0.25, linestyle="--")
                ax.annotate(f"{f:g}x", (0, f * inst.alone.median * 1000), fontsize=7, color="tab:red")
        ax.set_yscale("log")
        ax.set_xlabel(f"BE work / {BE_ALONE}")
        ax.set_ylabel("LS p99 (ms)")
        ax.set_title(f"LS load {load}%")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
