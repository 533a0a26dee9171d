"""The report of scripts/bench-qos: a Markdown table (one row per setup and LS load) and a PNG plot of LS
p99 against BE work, one point per setup and repetition."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from koordtest.bench.common import cell, page
from koordtest.bench.qos_stats import (BE_ALONE, LS_ALONE, WINDOWS_MET, Row, SloVerdict, Spread, baselines,
    be_work_ratio, lever_verdicts, median_spread, oracle, ratio, slo_verdicts)

COLUMNS = ("LS load", "setup", "LS p50", "LS p99", "LS p99.9", "BE work", "BE share of LS-idle CPU",
           "LS p99 (ms)", "other CPU", "client CPU")


def times(s: Spread | None) -> str:
    """A ratio: "1.23x (1.10-1.40)"; one repetition: "1.23x"."""
    return cell(s, 2, "x")


def percent(s: Spread | None) -> str:
    return cell(s, 0, "%", scale=100)


def plain(s: Spread | None, digits: int = 2) -> str:
    return cell(s, digits)


def table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = ["-" if r.load is None else f"{r.load}%", r.setup,
                 times(r.latency["p50"]), times(r.latency["p99"]), times(r.latency["p999"]),
                 times(r.be_work), percent(r.be_idle_share), plain(r.latency_ms["p99"]),
                 plain(r.other_cpu), plain(r.client_cpu, 3)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(rows: Sequence[Row], command: str, about: Sequence[str], notes: Sequence[str] = ()) -> str:
    """The whole report: the command, what was measured (`about`, one bullet each), the table and how
    to read it, then `notes` (one bullet each)."""
    reps = max((r.reps for r in rows), default=0)
    return page("koordd QoS benchmark", command, about, [
        table(rows), "",
        f"Each cell: median (min-max) over the repetitions (up to {reps}). LS p50/p99/p99.9: latency over "
        f"{LS_ALONE} at the same LS load (the median of its repetitions), counted from each request's "
        f"intended send time. BE work: work done over {BE_ALONE}'s. BE share of LS-idle CPU: BE's CPU over "
        "(node CPUs - LS CPU). other CPU: cores busy outside LS, BE and the client (koordd, the benchmark "
        "itself, anything else on the host). client CPU: the load generator's own cores."], notes)


def slo_table(runs: Sequence[dict], targets: dict, candidates: Sequence[str]) -> str:
    """Per load: each run against the SLO's target, the static oracle (the candidate with the most BE work
    that meets the SLO) marked, and koordd's BE work as a share of the oracle's."""
    out = []
    for load, target in sorted(targets.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        verdicts = slo_verdicts(runs, load, target)
        reps = sorted({v.rep for v in verdicts})
        # The oracle is chosen in each repetition among that repetition's runs: the best of several
        # repetitions would be a static setting's luckiest run, not what it gives.
        best = {rep: oracle([v for v in verdicts if v.rep == rep], candidates) for rep in reps}
        out += [f"LS load {'sine' if load is None else f'{load}%'}: SLO p99 <= {target * 1000:.2f} ms",
                "", "| rep | setup | LS p99 (ms) | 10 s windows meeting the SLO | meets the SLO | BE work | "
                "BE work / oracle |", "|---|---|---|---|---|---|---|"]
        for v in sorted(verdicts, key=lambda v: (v.rep, _rank(v.setup, candidates))):
            top = best[v.rep]
            mark = " **(oracle)**" if top is not None and v is top else ""
            share = "-" if top is None or v.be_work is None else f"{100 * v.be_work / top.be_work:.0f}%"
            out.append(f"| {v.rep + 1} | {v.setup}{mark} | {v.p99 * 1000:.2f} | {100 * v.windows_met:.0f}% of "
                       f"{v.windows} | {'yes' if v.meets else 'no'} | {_pct(v.be_work)} | {share} |")
        for rep in reps:
            if best[rep] is None:
                met = [v.setup for v in verdicts if v.rep == rep and v.setup in candidates and v.meets]
                out += ["", f"No static setting met the SLO at this load in repetition {rep + 1}." if not met else
                        f"Repetition {rep + 1}: {', '.join(met)} met the SLO, but without a {BE_ALONE} run there "
                        "is no BE work to rank them by: no oracle."]
        out.append("")
    out.append(f"Meets the SLO: p99 over the whole run at or under the target and in at least "
               f"{100 * WINDOWS_MET:.0f}% of its 10 s windows. BE work: over {BE_ALONE}'s (with the antagonist "
               "switching half way, the mean of the halves' ratios).")
    return "\n".join(out)


def ab_table(runs: Sequence[dict], targets: dict, a: str, b: str) -> str:
    """An A/B of two programs (bench-qos --koordd-b) pair by pair: the runs of `a` and `b` at one repetition and
    load had the same arrival times, LS alone and BE alone, so each pair compares the programs and nothing
    else. Per pair each side's LS p99, whether it met the SLO (where one was given), its BE work over the
    repetition's BE alone, koordd's writes in the window and which side ran first; then b over a as medians,
    the pairs where b had the lower p99 and the more BE work (a sign count: which way the pairs lean, not a
    size), and how often the later run of a pair had the lower p99. A host that drifts during a repetition
    favours the later run: in issue 36's A/B over minutes (3 repetitions, the third a fresh shuffle) the later
    run won every pair on both axes and b ran later in two of three."""
    loads = sorted({r["load"] for r in runs if r["setup"] in (a, b)}, key=lambda x: (x is None, x or 0))
    out = []
    for load in loads:
        target = targets.get(load)
        verdicts = {(v.rep, v.setup): v for v in slo_verdicts(runs, load, target if target else float("inf"))}
        writes = {(r.get("rep", 0), r["setup"]): _writes(r) for r in runs if r["load"] == load}
        ran = {(r.get("rep", 0), r["setup"]): i for i, r in enumerate(runs) if r["load"] == load}   # runs: in order
        pairs = [(rep, verdicts[(rep, a)], verdicts[(rep, b)]) for rep in sorted({rep for rep, _ in verdicts})
                 if (rep, a) in verdicts and (rep, b) in verdicts]
        if not pairs:
            continue
        out += [f"LS load {'sine' if load is None else f'{load}%'}"
                + (f": SLO p99 <= {target * 1000:.2f} ms" if target else ": no SLO given"), "",
                f"| rep | {a} p99 (ms) | {b} p99 (ms) | {a} meets | {b} meets | {a} BE work | {b} BE work | "
                "writes in the window (a / b) | ran first |", "|---|---|---|---|---|---|---|---|---|"]
        for rep, va, vb in pairs:
            met = (lambda v: "yes" if v.meets else "no") if target else (lambda v: "-")
            out.append(f"| {rep + 1} | {va.p99 * 1000:.2f} | {vb.p99 * 1000:.2f} | {met(va)} | {met(vb)} | "
                       f"{_pct(va.be_work)} | {_pct(vb.be_work)} | {writes[(rep, a)]} / {writes[(rep, b)]} | "
                       f"{a if ran[(rep, a)] < ran[(rep, b)] else b} |")
        p99s = [ratio(vb.p99, va.p99) for _, va, vb in pairs]
        works = [ratio(vb.be_work, va.be_work) for _, va, vb in pairs]
        lower = sum(1 for _, va, vb in pairs if vb.p99 < va.p99)
        more = sum(1 for _, va, vb in pairs if None not in (va.be_work, vb.be_work) and vb.be_work > va.be_work)
        out += ["", f"{b} over {a}, median (min-max) of {len(pairs)} pairs: LS p99 {times(median_spread(p99s))}, "
                f"BE work {times(median_spread(works))}; {b} had the lower p99 in {lower} and the more BE work in "
                f"{more} of {len(pairs)} pairs"
                + (f"; met the SLO in {sum(v.meets for _, _, v in pairs)} against {a}'s "
                   f"{sum(v.meets for _, v, _ in pairs)}" if target else "") + ".", "", _order_line(pairs, ran, a, b), ""]
        for side in (a, b):
            mine = [r for r in runs if r["setup"] == side and r["load"] == load]
            verdicts = lever_verdicts(mine)
            if verdicts:
                out += [f"{side}'s levers' verdicts over its {len(mine)} runs, counted from koordd's start: "
                        f"{verdicts}.", ""]
    return "\n".join(out)


def _order_line(pairs: Sequence[tuple], ran: dict, a: str, b: str) -> str:
    """Which side ran later in each pair, and how often the later run had the lower p99: where that is most
    pairs and one side was mostly later, the host's drift may be the difference."""
    later_b = sum(1 for rep, _, _ in pairs if ran[(rep, b)] > ran[(rep, a)])
    later_won = sum(1 for rep, va, vb in pairs
                    if (vb.p99 < va.p99) == (ran[(rep, b)] > ran[(rep, a)]) and vb.p99 != va.p99)
    balanced = 2 * later_b == len(pairs)
    return (f"Order: {b} ran later in {later_b} of {len(pairs)} pairs; the later run had the lower p99 in "
            f"{later_won}. " + ("Balanced: each side ran later equally often." if balanced else
                               "Not balanced: a host that drifts during a repetition favours the side that ran "
                               "later more often (an even number of repetitions balances it: every second one "
                               "runs in the reverse order)."))


def _writes(run: dict) -> str:
    window = run.get("koordd_window")
    return "-" if window is None else str(sum(1 for d in window if d.get("outcome") == "applied"))


def _rank(setup: str, candidates: Sequence[str]) -> tuple:
    if setup in candidates:
        return (0, candidates.index(setup))
    return (1, setup)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def plot(runs: Sequence[dict], setup_order: Sequence[str], path: Path, title: str) -> None:
    """One panel per LS load: LS p99 (ms, log scale) against BE work over BE alone."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    alone = next((r for r in runs if r["setup"] == BE_ALONE), None)
    loads = sorted({r["load"] for r in runs if r["load"] is not None})
    setups = [s for s in setup_order if any(r["setup"] == s and r["ls"] for r in runs)]
    colors = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(setups)}
    panels = max(len(loads), 1)
    width = 4.2 * panels + 2.0                     # the legend gets 2 inches on the right
    fig, axes = plt.subplots(1, panels, figsize=(width, 4.2), squeeze=False, sharey=True)
    ms = FuncFormatter(lambda v, _: f"{v:g}")
    ms_2_5 = FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else "")   # between decades: 2 and 5
    for ax, load in zip(axes[0], loads):
        for s in setups:
            points = [(be_work_ratio(r, alone) or 0.0, r["ls"]["p99"] * 1000)
                      for r in runs if r["setup"] == s and r["load"] == load and r["ls"] and r["ls"]["p99"]]
            if points:
                ax.scatter(*zip(*points), label=s, color=colors[s], s=28, alpha=0.85)
        ax.set_title(f"LS load {load}% of the node")
        ax.set_xlabel(f"BE work / {BE_ALONE}")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ms)
        ax.yaxis.set_minor_formatter(ms_2_5)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("LS p99 latency (ms)")
    legend = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="center right", frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1 - 2.0 / width, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def window_plot(runs: Sequence[dict], targets: dict, path: Path, title: str,
                setups: Sequence[str] = (LS_ALONE, "be-idle", "koordd")) -> None:
    """One panel per load: each 10 s window's LS p99 (ms, log scale) of `setups`, and the SLO's target."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted(targets)
    fig, axes = plt.subplots(1, len(loads), figsize=(6.0 * len(loads), 4.0), squeeze=False)
    for ax, load in zip(axes[0], loads):
        for s in setups:
            for r in runs:
                if r["setup"] == s and r["load"] == load and r["ls"] and r["ls"].get("windows"):
                    p99 = [w["p99"] * 1000 if w["p99"] is not None else float("nan") for w in r["ls"]["windows"]]
                    ax.plot(range(1, len(p99) + 1), p99, marker="o", label=s)
                    break
        ax.axhline(targets[load] * 1000, color="black", linestyle="--", label="SLO")
        ax.set_yscale("log")
        ax.set_xlabel("10 s window")
        ax.set_ylabel("LS p99 (ms)")
        ax.set_title(f"LS load {load}%")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
