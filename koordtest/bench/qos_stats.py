"""The numbers of scripts/bench-qos, from its per-run records: latency percentiles, the ratios to the
runs alone, BE's share of the CPU that LS left idle, and median with spread over repetitions.

A run record is a dict (as stored in results.json):
    {"setup": "no-control", "load": 50, "rep": 0,
     "ls": {"p50": s, "p99": s, "p999": s, "count": n, ...} or None (no LS in this setup),
     "cpu": {"ls": cores, "be": cores, "other": cores, ...}, "be_work": units/s or None}
with `load` None for the setup without LS (be-alone): it is the BE baseline of every load.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

from koordd.core.experiment import LEAVE

LS_ALONE, BE_ALONE = "ls-alone", "be-alone"
PERCENTILES = (("p50", 50.0), ("p99", 99.0), ("p999", 99.9))


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest rank: the smallest sample with at least p% of the samples at or below it (no
    interpolation, so p99.9 of 500 samples is honestly the maximum, not a value nobody saw)."""
    if not sorted_values:
        raise ValueError("percentile of no samples")
    if not 0 < p <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {p}")
    rank = math.ceil(p / 100 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


def latency_summary(samples: Iterable[float]) -> dict:
    """count, p50, p99, p999 of latency samples (seconds); percentiles None without samples."""
    ordered = sorted(samples)
    out: dict = {"count": len(ordered)}
    for name, p in PERCENTILES:
        out[name] = percentile(ordered, p) if ordered else None
    return out


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, None when either is unknown or the baseline is not positive."""
    if value is None or baseline is None or baseline <= 0:
        return None
    return value / baseline


def be_share_of_idle(be_cpu: float, ls_cpu: float, ncpu: int) -> float | None:
    """BE CPU over the CPU that LS left idle (node CPUs - LS CPU), both in cores over the same window:
    1.0 means BE used everything LS did not. None when LS left nothing."""
    return ratio(be_cpu, ncpu - ls_cpu)


@dataclass(frozen=True)
class Spread:
    """Median and range of one quantity over repetitions."""
    median: float
    low: float
    high: float
    n: int


def median_spread(values: Iterable[float | None]) -> Spread | None:
    """Median, min and max of the known values; None when there are none."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return Spread(statistics.median(known), min(known), max(known), len(known))


@dataclass(frozen=True)
class Row:
    """One line of the report: a setup at one LS load (load None: the setup has no LS)."""
    load: int | None
    setup: str
    reps: int
    latency: dict[str, Spread | None]        # "p50", "p99", "p999": ratio to LS alone at this load
    latency_ms: dict[str, Spread | None]     # the same percentiles in ms
    be_work: Spread | None                   # BE work done / BE alone
    be_idle_share: Spread | None             # BE CPU / CPU left idle by LS
    other_cpu: Spread | None                 # cores used outside LS, BE and the client (other work)
    client_cpu: Spread | None                # the load generator's own CPU, cores


def baselines(runs: Sequence[dict]) -> tuple[dict[int, dict[str, float]], float | None]:
    """({load: {percentile: median seconds}} of LS alone, median BE work of BE alone)."""
    ls: dict[int, dict[str, float]] = {}
    for load in sorted({r["load"] for r in runs if r["setup"] == LS_ALONE}):
        alone = [r["ls"] for r in runs if r["setup"] == LS_ALONE and r["load"] == load and r["ls"]]
        ls[load] = {}
        for name, _ in PERCENTILES:
            s = median_spread(a[name] for a in alone)
            if s is not None:
                ls[load][name] = s.median
    be = median_spread(r["be_work"] for r in runs if r["setup"] == BE_ALONE)
    return ls, None if be is None else be.median


def summarise(runs: Sequence[dict], ncpu: int, setup_order: Sequence[str]) -> list[Row]:
    """One Row per (load, setup) in `runs`, loads ascending, setups in `setup_order`. Each run is
    compared with the median of its baseline's repetitions, then median and range are taken over
    the repetitions of the setup."""
    ls_base, be_base = baselines(runs)
    rank = {name: i for i, name in enumerate(setup_order)}
    keys = sorted({(r["load"], r["setup"]) for r in runs},
                  key=lambda k: (-1 if k[0] is None else k[0], rank.get(k[1], len(rank))))
    rows = []
    for load, setup in keys:
        group = [r for r in runs if r["load"] == load and r["setup"] == setup]
        base = ls_base.get(load, {})
        latency, latency_ms = {}, {}
        for name, _ in PERCENTILES:
            values = [r["ls"][name] for r in group if r["ls"]]
            latency[name] = median_spread(ratio(v, base.get(name)) for v in values)
            latency_ms[name] = median_spread(None if v is None else v * 1000 for v in values)
        rows.append(Row(
            load=load, setup=setup, reps=len(group), latency=latency, latency_ms=latency_ms,
            be_work=median_spread(ratio(r["be_work"], be_base) for r in group),
            be_idle_share=median_spread(be_share_of_idle(r["cpu"]["be"], r["cpu"]["ls"], ncpu)
                                        for r in group if r["be_work"] is not None),
            other_cpu=median_spread(r["cpu"].get("other") for r in group),
            client_cpu=median_spread(r["ls"].get("client_cpu") for r in group if r["ls"]),
        ))
    return rows


# --- the SLO and the static oracle (--slo-factor) ---------------------------------------------------

WINDOWS_MET = 0.95       # share of a run's windows whose p99 must meet the target


def be_work_ratio(run: dict, alone: dict | None) -> float | None:
    """BE work of a run over BE alone's: one ratio, or with the antagonist switching half way, the mean of
    each half's ratio to BE alone's same half (the kinds count different units)."""
    if alone is None:
        return None
    if run.get("be_work_halves") and alone.get("be_work_halves"):
        halves = [ratio(w, a) for w, a in zip(run["be_work_halves"], alone["be_work_halves"])]
        return None if None in halves else sum(halves) / len(halves)
    return ratio(run.get("be_work"), alone.get("be_work"))


def rep_alone(alones: Sequence[dict]) -> dict | None:
    """One repetition's BE alone: its run, or with several, the median of their work (each half's alike)."""
    if len(alones) <= 1:
        return alones[0] if alones else None
    works = [a["be_work"] for a in alones if a.get("be_work") is not None]
    out = {"be_work": statistics.median(works) if works else None}
    if all(a.get("be_work_halves") for a in alones):
        out["be_work_halves"] = [statistics.median(h) for h in zip(*(a["be_work_halves"] for a in alones))]
    return out


@dataclass(frozen=True)
class SloVerdict:
    """How one run did against the SLO's p99 target."""
    setup: str
    p99: float                      # over the whole window, seconds
    windows_met: float              # share of the windows with p99 <= target
    windows: int
    be_work: float | None           # over BE alone (of the same repetition where it ran)
    meets: bool                     # windows_met >= WINDOWS_MET and p99 <= target
    rep: int = 0


def slo_verdicts(runs: Sequence[dict], load: int | None, target: float) -> list[SloVerdict]:
    """Every run with LS and BE at `load` judged against `target` (seconds). BE work is over the BE-alone
    runs of the same repetition (their median where it has two: --frontier brackets it), or the first
    repetition's where it has none: each repetition is an experiment of its own, so drift on the host between
    repetitions does not enter the ratio."""
    alones = [r for r in runs if r["setup"] == BE_ALONE]
    out = []
    for r in runs:
        if r["load"] != load or not r["ls"] or r["setup"] == LS_ALONE:
            continue
        alone = rep_alone([a for a in alones if a.get("rep", 0) == r.get("rep", 0)] or alones[:1])
        windows = [w for w in r["ls"].get("windows", []) if w["count"]]
        met = sum(1 for w in windows if w["p99"] <= target) / len(windows) if windows else 0.0
        p99 = r["ls"]["p99"]
        out.append(SloVerdict(r["setup"], p99, met, len(windows), be_work_ratio(r, alone),
                              met >= WINDOWS_MET and p99 is not None and p99 <= target, r.get("rep", 0)))
    return out


def oracle(verdicts: Sequence[SloVerdict], candidates: Sequence[str]) -> SloVerdict | None:
    """The static setting with the most BE work among the `candidates` that meet the SLO; None if none does."""
    meeting = [v for v in verdicts if v.setup in candidates and v.meets and v.be_work is not None]
    return max(meeting, key=lambda v: v.be_work, default=None)


def lever_verdicts(runs: Sequence[dict]) -> str:
    """be_suppress's verdicts summed over `runs` per lever (their status.json report, from koordd's start), the
    control arm's in its own words: a trial in which LS recovered with BE left alone writes nothing, so the
    window's writes cannot count it. "" where no run has a report or no lever was judged."""
    totals: dict[str, list[int]] = {}
    for r in runs:
        levers = r.get("koordd_levers")
        for name, lever in (levers.items() if isinstance(levers, dict) else ()):
            signals = lever.get("by_signal") if isinstance(lever, dict) else None
            for record in (signals.values() if isinstance(signals, dict) else ()):
                counts = totals.setdefault(str(name), [0, 0, 0])
                for i, key in enumerate(("helped", "bought_nothing", "retracted")):
                    n = record.get(key) if isinstance(record, dict) else None
                    counts[i] += n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
    parts = []
    for name, (helped, nothing, retracted) in sorted(totals.items()):
        if not helped and not nothing:
            continue
        if name == LEAVE:
            parts.append(f"BE left alone as a control {helped + nothing} times, LS recovered in {helped}")
        else:
            undone = f" ({retracted} retracted by their release)" if retracted else ""
            parts.append(f"{name} {helped} helped{undone}, {nothing} bought nothing")
    return "; ".join(parts)
