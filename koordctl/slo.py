"""koordctl slo: per latency-sensitive workload with an SLO, its target, what it measured over the last
minutes (a chart of its latency against the target) and what be_suppress did about it.

It reads the running koordd's status.json (`report` for the latest figures, `slo_history` for the points
of koordd/core/report.py's History) and its decision log: be_suppress's decisions of rule slack whose
worst signal was this workload's own (`app_p99_us`, `app_p999_us`, `app_socket_full`) over the history's minutes.
Every name a workload chose goes through printable() before it reaches the terminal.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Iterable

from koordctl.common import ago, local_time, pid_alive
from koordctl.running import trusted_state_dir
from koordctl.shapes import STATUS
from koordctl.statefiles import escaped, read_document, read_records
from koordd.core.experiment import LEAVE
from koordd.core.feeds import STATUS_FILE
from koordd.core.health import SLO_SIGNALS
from koordd.core.printable import printable
from koordd.core.report import HISTORY_WORKLOADS

BLOCKS = "▁▂▃▄▅▆▇█"      # the chart's levels, 0 to 2x the target: the upper half is over it
ASCII_LEVELS = "_.-:=+*#"
STEPS = ("floor", "shrink", "grow")
FIELDS = ("time", "latency_us", "latency_p999_us", "violation_rate", "slack", "requests")
DEFAULT_SECONDS = 600.0


def cmd_slo(args: argparse.Namespace) -> int:
    sd = trusted_state_dir(args)
    status = read_document(sd / STATUS_FILE, STATUS)
    if not isinstance(status, dict):
        return _none(args, sd, False, f"koordd has not run with state_dir {sd}")
    running = pid_alive(status.get("pid"))
    if not running:
        return _none(args, sd, False, f"koordd is not running (state_dir {sd}, status updated "
                                      f"{ago(status.get('updated'), time.time())})")
    now = time.time()
    if not args.json:
        status = escaped(status)        # every name a workload chose, before it reaches the terminal
    workloads = gather(status)
    if not workloads:
        return _none(args, sd, True, no_slo_text(status, sd), 0)
    history = status.get("slo_history") if isinstance(status.get("slo_history"), dict) else {}
    seconds = _number(history.get("seconds")) or DEFAULT_SECONDS
    records = [r for r in read_records(sd) if r.get("loop") == "be_suppress"
               and isinstance(r.get("time"), (int, float)) and r["time"] >= now - seconds]
    if not args.json:
        records = escaped(records)
    for w in workloads:
        w["be_suppress"] = be_suppress(records, w["cgroup"])
    if args.json:
        print(json.dumps({"running": True, "state_dir": str(sd), "updated": status.get("updated"),
                          "seconds": seconds, "step_seconds": _number(history.get("step_seconds")),
                          "left_out": history.get("left_out") or 0, "workloads": workloads,
                          "levers": levers(status), "headroom": headroom(status)},
                         indent=1, sort_keys=True))
        return 0
    ascii_only = args.ascii or not unicode_ok(sys.stdout)
    step = _number(history.get("step_seconds")) or 10.0
    out = []
    for w in workloads:
        out += workload_lines(w, now, seconds, step, ascii_only)
        out.append("")
    out += lever_lines(status)
    if history.get("left_out"):
        out.append(f"{printable(history['left_out'])} more workloads have no history (koordd keeps one for "
                   f"{HISTORY_WORKLOADS} at most)")
    print("\n".join(out).rstrip("\n"))
    return 0


def _none(args, sd, running: bool, message: str, code: int = 1) -> int:
    if args.json:
        print(json.dumps({"running": running, "state_dir": str(sd), "message": message, "workloads": []},
                         indent=1, sort_keys=True))
    else:
        print(message)
    return code


def no_slo_text(status: dict, sd) -> str:
    users = ((status.get("sensors") or {}).get("app_latency") or {}).get("loops") or []
    slos = [u for u in users if isinstance(u, str) and u.startswith("the SLO of class ")]
    if slos:
        classes = ", ".join(printable(u.removeprefix("the SLO of class ")) for u in slos)
        return f"no SLO workload answered requests in the last minutes (classes with an SLO: {classes})"
    return f"no class declares an SLO ([classes.slo]) in the running koordd's config (state_dir {sd})"


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def gather(status: dict) -> list[dict]:
    """Each SLO workload of the report or of the history, by cgroup: its class and targets, its latest
    figures (the report's, else the history's last point) and its history's points."""
    report = status.get("report") if isinstance(status.get("report"), dict) else {}
    history = status.get("slo_history") if isinstance(status.get("slo_history"), dict) else {}
    latest = {w["cgroup"]: w for w in report.get("workloads") or [] if isinstance(w, dict)
              and isinstance(w.get("cgroup"), str)}
    series = {k: v for k, v in (history.get("workloads") if isinstance(history.get("workloads"), dict) else {}).items()
              if isinstance(v, list)}
    slos = history.get("slos") if isinstance(history.get("slos"), dict) else {}
    fields = history.get("fields") if isinstance(history.get("fields"), list) else list(FIELDS)
    out = []
    for cgroup in sorted(set(latest) | set(series)):
        w = latest.get(cgroup) or {}
        slo = slos.get(cgroup) if isinstance(slos.get(cgroup), dict) else {}
        points = [dict(zip(fields, p)) for p in series.get(cgroup, []) if isinstance(p, list)]
        target = w.get("target_us", slo.get("target_us"))
        now = {"time": report.get("time"), "latency_us": w.get("latency_us"),
               "latency_p999_us": w.get("latency_p999_us"), "violation_rate": w.get("violation_rate"),
               "slack": None, "requests": w.get("requests")} if w else (points[-1] if points else {})
        if w and _number(target) and _number(w.get("latency_us")) is not None:
            now["slack"] = round(1 - w["latency_us"] / target, 4)
        out.append({"cgroup": cgroup, "class": w.get("class", slo.get("class")), "target_us": target,
                    "target_p999_us": w.get("target_p999_us", slo.get("target_p999_us")),
                    "violation_target": w.get("violation_target", slo.get("violation_target")),
                    "latest": now, "history": points})
    return out


def step_kind(step: Any) -> str:
    """be_suppress's step ("floor (LS recovering)", "shrink (below zero)", "grow", "hold", ...) as floor,
    shrink, grow or other."""
    text = step if isinstance(step, str) else ""
    return next((k for k in STEPS if text.startswith(k)), "other")


def be_suppress(records: Iterable[dict], cgroup: str) -> dict:
    """be_suppress's decisions (rule slack) whose worst signal was `cgroup`'s latency: its steps by kind
    (one per round, whatever the number of BE cgroups it wrote), and the latest round's."""
    rounds: dict[tuple[int, str], list[dict]] = {}
    for r in records:
        reason = r.get("reason") if isinstance(r.get("reason"), dict) else {}
        worst = reason.get("worst") if isinstance(reason.get("worst"), dict) else {}
        if reason.get("rule") != "slack" or worst.get("cgroup") != cgroup or worst.get("signal") not in SLO_SIGNALS:
            continue
        rounds.setdefault((int(r["time"]), str(reason.get("step"))), []).append(r)
    steps = dict.fromkeys((*STEPS, "other"), 0)
    for _, step in rounds:
        steps[step_kind(step)] += 1
    latest = None
    if rounds:
        key = max(rounds, key=lambda k: max(r["time"] for r in rounds[k]))
        last = rounds[key]
        reason = last[-1].get("reason") or {}
        latest = {"time": max(r["time"] for r in last), "step": reason.get("step"), "slack": reason.get("slack"),
                  "signal": (reason.get("worst") or {}).get("signal"), "outcome": last[-1].get("outcome"),
                  "knobs": {f"{r.get('target', r.get('cgroup'))} {r.get('knob')}": r.get("new") for r in last}}
    return {"decisions": sum(len(v) for v in rounds.values()), "steps": steps, "latest": latest}


# --- text -------------------------------------------------------------------------------------------------

def unicode_ok(stream) -> bool:
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    return encoding.startswith("utf")


def chart(points: list[dict], target: float | None, now: float, seconds: float, step: float,
          ascii_only: bool = False) -> str:
    """One character per `step` seconds of the last `seconds`, oldest first: the latency of the point in
    that slot from 0 (lowest level) to twice the target (highest; more is clipped there), so that the upper
    half of the levels is over the target; a space where there is no point."""
    levels = ASCII_LEVELS if ascii_only else BLOCKS
    slots = max(1, int(seconds / step))
    cells = [" "] * slots
    if not target or target <= 0:
        return "".join(cells)
    for p in points:
        t, v = _number(p.get("time")), _number(p.get("latency_us"))
        if t is None or v is None:
            continue
        i = slots - 1 - int(round((now - t) / step))
        if 0 <= i < slots:
            # as a float first: a latency of 1e19 us against a target of 1e-300 us is an infinite level
            cells[i] = levels[int(min(len(levels) - 1.0, max(0.0, v / (2 * target) * len(levels))))]
    return "".join(cells)


def ms(us: Any) -> str:
    return "?" if _number(us) is None else f"{us / 1000:.2f}ms"


def pct(x: Any) -> str:
    return "?" if _number(x) is None else f"{100 * x:.1f}%"


def workload_lines(w: dict, now: float, seconds: float, step: float, ascii_only: bool) -> list[str]:
    t999 = f", p99.9 {ms(w['target_p999_us'])}" if w.get("target_p999_us") else ""
    out = [f"{printable(w['cgroup'])} ({printable(w.get('class') or '?')}): target p99 {ms(w.get('target_us'))}"
           f"{t999}, {pct(w.get('violation_target'))} allowed over"]
    n = w.get("latest") or {}
    if n:
        out.append(f"  latest  p99 {ms(n.get('latency_us'))}  p99.9 {ms(n.get('latency_p999_us'))}  "
                   f"over target {pct(n.get('violation_rate'))}  slack {pct(n.get('slack'))}  "
                   f"{n.get('requests') if n.get('requests') is not None else '?'} requests"
                   + (f"  ({ago(n['time'], now)})" if _number(n.get("time")) else ""))
    points = w.get("history") or []
    line = chart(points, _number(w.get("target_us")), now, seconds, step, ascii_only)
    over = sum(1 for p in points if _number(p.get("slack")) is not None and p["slack"] < 0)
    mid = ASCII_LEVELS[4] if ascii_only else BLOCKS[4]
    out.append(f"  {seconds / 60:g}m p99 |{line}| now")
    out.append(f"  ({len(points)} points of {step:g}s, {over} over target; 0 to 2x target, {mid} and above: over)")
    b = w.get("be_suppress") or {}
    s = b.get("steps") or {}
    counts = ", ".join(f"{s.get(k, 0)} {k}" for k in STEPS) + (f", {s['other']} other" if s.get("other") else "")
    latest = b.get("latest")
    if not latest:
        out.append(f"  be_suppress: no step on BE for this workload's latency in the last {seconds / 60:g}m")
    else:
        knobs = "; ".join(f"{printable(k)} {printable(v if v is not None else '-')}"
                          for k, v in sorted((latest.get("knobs") or {}).items())[:3])
        more = len(latest.get("knobs") or {}) - 3
        out.append(f"  be_suppress on BE in the last {seconds / 60:g}m: {counts}")
        out.append(f"    latest {local_time(latest['time'])} ({ago(latest['time'], now)}): "
                   f"{printable(latest.get('step') or '?')} at slack {pct(latest.get('slack'))}, {knobs}"
                   + (f" (and {more} more)" if more > 0 else ""))
    return out


# --- what each of be_suppress's levers bought (its report in status.json, core/experiment.py) ------------

def _be_suppress_report(status: dict, key: str) -> Any:
    """`key` of be_suppress's report in status.json; None where there is none (another rule, an older koordd,
    a malformed file)."""
    loop = ((status.get("loops") or {}) if isinstance(status.get("loops"), dict) else {}).get("be_suppress")
    report = loop.get("report") if isinstance(loop, dict) else None
    return report.get(key) if isinstance(report, dict) else None


def levers(status: dict) -> dict:
    """be_suppress's levers as its report in status.json has them (lever -> chosen, by_signal, resting_s,
    last); {} where it has none (another rule, an older koordd, a malformed file)."""
    found = _be_suppress_report(status, "levers")
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, dict)} \
        if isinstance(found, dict) else {}


def headroom(status: dict) -> dict:
    """be_suppress's standing headroom as its report has it (phase, ceiling, before, during, last); {} where
    there is none or it is malformed."""
    found = _be_suppress_report(status, "headroom")
    return found if isinstance(found, dict) and isinstance(found.get("phase"), str) else {}


def headroom_line(status: dict) -> list[str]:
    """The standing headroom's phase and last verdict, where it was ever tried (docs/be-control.md)."""
    h = headroom(status)
    if not h or (h["phase"] == "watching" and not h.get("last")):
        return []
    ceiling = f", BE at most {h['ceiling']:.2f} CPUs" if _number(h.get("ceiling")) is not None else ""
    last = f"; last: {printable(h['last'])}" if isinstance(h.get("last"), str) else ""
    return [f"  headroom (host steals busy vCPUs): {printable(h['phase'])}{ceiling}{last}"]


def _gain(signal: str, x: Any) -> str:
    return "?" if _number(x) is None else (ms(x) if signal.endswith("_us") else f"{x:.3g}")


def _count(x: Any) -> int:
    """A verdict count from status.json: the number where it is a non-negative integer, else 0."""
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else 0


def lever_lines(status: dict) -> list[str]:
    """One line per lever: times chosen, and per signal how many cuts helped or bought nothing, the mean
    latency bought and the BE cores it cost; whether it rests."""
    found = levers(status)
    if not found:
        return []
    out = ["be_suppress's levers (every cut judged by what it bought):"] + headroom_line(status)
    for name, lv in sorted(found.items()):
        parts = []
        for signal, r in sorted((lv.get("by_signal") or {}).items()):
            if not isinstance(r, dict):
                continue
            if name == LEAVE:          # its verdicts are control trials: did LS recover with BE left alone?
                recovered = _count(r.get("helped"))
                trials = recovered + _count(r.get("bought_nothing"))
                if trials:
                    parts.append(f"{printable(signal)} LS recovered in {recovered} of {trials} control trials")
                continue
            bought = (f", {_gain(signal, r.get('mean_gain'))} bought for {r.get('mean_be_cores_given_up'):.2f} BE cores"
                      if _number(r.get("mean_gain")) is not None and _number(r.get("mean_be_cores_given_up")) is not None
                      else "")
            retracted = (f" ({r['retracted']} of them not: their release did not confirm them)"
                         if isinstance(r.get("retracted"), int) and r["retracted"] > 0 else "")
            parts.append(f"{printable(signal)} {r.get('helped', 0)} helped{retracted}, {r.get('bought_nothing', 0)} "
                         f"bought nothing{bought}")
        rests = lv.get("resting_s") if isinstance(lv.get("resting_s"), dict) else {}
        rest = "; rests " + ", ".join(f"{_number(v) or 0:g}s for {printable(k)}" for k, v in sorted(rests.items())) \
            if rests else ""
        what = " (control trials, and rounds where every cut rested)" if name == LEAVE else ""
        out.append(f"  {printable(name)}: chosen {lv.get('chosen', 0)}{what}" + (": " + "; ".join(parts) if parts else "")
                   + rest)
    return out
