"""koordctl slo and the history it reads: the node report's History (one point per 10 s, bounded in
points and workloads, old points dropped), status.json's slo_history, and the command's text and JSON
on a state_dir written here (status.json, decisions.jsonl): the chart, its ASCII fallback, hostile cgroup
names, be_suppress's steps, no koordd and no SLO."""
from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

from koordctl import slo as ctl_slo
from koordctl.cli import main
from koordd.core.config import make_settings
from koordd.core.feeds import STATUS_FILE
from koordd.core.report import (HISTORY_FIELDS, HISTORY_POINTS, REPORT_OPTIONS, History, ReportWindow, Workload,
                                build)
from koordd.core.slo import SloTarget
from koordd.core.snapshot import APP_LATENCY, AppLatency, CgroupSample, NodeSample, Snapshot
from koordd.runtime.result import RoundResult
from koordd.runtime.statusfile import StatusFile

GIB = 1 << 30
HOSTILE = "evil\n\x1b[2Jx.slice"      # a newline (a forged line) and an escape (clears the terminal)


def wl(cgroup="web.slice", tail=1500.0, target=2000.0, requests=500) -> Workload:
    return Workload(cgroup, "LS", requests, 0.99, tail, tail * 2, target, 0.0, 0.004, 0.01)


# --- the history ------------------------------------------------------------------------------------------

def test_history_takes_one_point_per_10s():
    h = History()
    for t in range(0, 61):                       # a round a second for a minute
        h.observe(float(t), 1000.0 + t, [wl()], ["web.slice"])
    d = h.as_dict()
    points = d["workloads"]["web.slice"]
    assert [p[0] for p in points] == [1000.0, 1010.0, 1020.0, 1030.0, 1040.0, 1050.0, 1060.0]
    assert d["fields"] == list(HISTORY_FIELDS) and d["step_seconds"] == 10.0 and d["seconds"] == 600.0
    p = dict(zip(HISTORY_FIELDS, points[-1]))
    assert p == {"time": 1060.0, "latency_us": 1500.0, "latency_p999_us": 3000.0, "violation_rate": 0.004,
                 "slack": 0.25, "requests": 500}
    assert d["slos"]["web.slice"] == {"class": "LS", "target_us": 2000.0, "target_p999_us": None,
                                      "violation_target": 0.01}


def test_history_is_bounded_and_drops_old_points():
    h = History()
    for t in range(0, 2000, 5):
        h.observe(float(t), float(t), [wl()], ["web.slice"])
    points = h.as_dict()["workloads"]["web.slice"]
    assert len(points) == HISTORY_POINTS == 60
    assert points[-1][0] - points[0][0] <= 600 and points[-1][0] == 1990.0
    # a workload that stops answering keeps its points until they are 10 minutes old, then goes
    for t in range(2000, 2600, 10):
        h.observe(float(t), float(t), [], ["web.slice"])
    assert 0 < len(h.as_dict()["workloads"]["web.slice"]) < 60
    h.observe(2700.0, 2700.0, [], ["web.slice"])
    assert h.as_dict()["workloads"] == {} and h.as_dict()["slos"] == {}


def test_history_bounds_the_workloads_and_forgets_roots_without_an_slo():
    h = History(most=2)
    names = ["a.slice", "b.slice", "c.slice"]
    h.observe(0.0, 0.0, [wl(n) for n in names], names)
    d = h.as_dict()
    assert sorted(d["workloads"]) == ["a.slice", "b.slice"] and d["left_out"] == 1
    h.observe(10.0, 10.0, [wl(n) for n in names], ["b.slice", "c.slice"])    # a.slice's SLO went away
    d = h.as_dict()
    assert sorted(d["workloads"]) == ["b.slice", "c.slice"] and d["left_out"] == 0


def node() -> NodeSample:
    return NodeSample(cpu_count=4, cpu_used=2.0, memory_total=8 * GIB, memory_available=5 * GIB)


def snap(t: float, slots, root: str = "web.slice") -> Snapshot:
    roots = (CgroupSample(root, "LS", cpu_usage=1.0, memory_current=GIB),
             CgroupSample("be.slice", "BE", cpu_usage=0.6, memory_current=0))
    return Snapshot(time=t, wall=time.time() - 120 + t, node=node(), cgroups={c.path: c for c in roots},
                    sections={APP_LATENCY: {root: AppLatency(sum(slots), 0, 0, 0, 0, 0, slots=slots)}},
                    slo={root: SloTarget(1000.0, 5000.0)})


def hist(**slots) -> tuple[int, ...]:
    out = [0] * 20
    for k, n in slots.items():
        out[int(k[1:])] = n
    return tuple(out)


def daemon_state(tmp_path: Path, root: str = "web.slice", rounds: int = 121) -> Path:
    """status.json as koordd writes it after `rounds` rounds a second apart, the last ones late."""
    sd = tmp_path / "state"
    sd.mkdir()
    window, settings = ReportWindow(), make_settings(REPORT_OPTIONS, {})
    report = None
    for t in range(rounds):
        slots = hist(s6=100) if t < rounds - 30 else hist(s11=100)     # 256-512 µs, then 1-2 ms: late
        report = build(snap(float(t), slots, root), settings, window, node="n1")
    StatusFile(sd, time.time() - 200, "/etc/koordd/koordd.toml", False, "v2", lambda: None).write(
        RoundResult(snap(float(rounds), hist(s11=100), root), report=report))
    return sd


def decision(t, step, target="be.slice", new="50000 100000", worst="web.slice", signal="app_p99_us", **kw):
    return {"time": t, "loop": "be_suppress", "kind": "cgroup", "target": target, "cgroup": target,
            "knob": "cpu.max", "old": "max 100000", "new": new, "outcome": "applied", "message": "",
            "reason": {"rule": "slack", "step": step, "slack": -0.4,
                       "worst": {"cgroup": worst, "signal": signal, "value": 1400.0, "target": 1000.0}},
            "error": None, **kw}


def write_decisions(sd: Path, worst: str = "web.slice") -> None:
    now = time.time()
    records = [decision(now - 3600, "floor", worst=worst),                        # older than the history
               decision(now - 50, "grow", worst=worst),
               decision(now - 40, "shrink (below zero)", worst=worst),
               decision(now - 40, "shrink (below zero)", target="be2.slice", worst=worst),   # same round
               decision(now - 30, "floor", worst=worst),
               decision(now - 20, "floor", worst=worst, signal="runq_p99_us"),          # not the SLO's signal
               decision(now - 15, "grow", worst="other.slice"),                          # another workload
               {**decision(now - 12, "floor", new="1000 100000", worst=worst)},
               {**decision(now - 12, "floor", target="be2.slice", new="1000 100000", worst=worst)},
               {"time": now - 5, "loop": "qos_baseline", "knob": "cpu.idle", "reason": {}}]
    (sd / "decisions.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n{damaged\n")


# --- status.json --------------------------------------------------------------------------------------------

def test_status_json_carries_the_history_small(tmp_path):
    sd = daemon_state(tmp_path)
    text = (sd / STATUS_FILE).read_text()
    status = json.loads(text)
    h = status["slo_history"]
    assert len(h["workloads"]["web.slice"]) == 13            # 121 s of rounds: one point per 10 s
    assert "history" not in status["report"]                 # the pushed report is unchanged
    assert len(text.splitlines()) < 120                      # one line a point, not one a number
    assert all(isinstance(p, list) and len(p) == len(HISTORY_FIELDS) for p in h["workloads"]["web.slice"])


def test_status_json_writes_held_knobs_workloads_and_tenants_one_a_line_and_reads_back_the_same():
    """statusfile.dumps: the long lists (hundreds of pods' workloads) one compact object a line, the rest
    indented; what koordctl reads back is the document, hostile names included."""
    from koordd.runtime.statusfile import dumps
    workloads = [{"cgroup": f"be.slice/pod-{i}" if i else HOSTILE + '"]},', "class": "BE", "latency_us": None}
                 for i in range(300)]
    status = {"pid": 1, "held": [{"target": "be.slice", "knob": "cpu.max", "original": "max 100000"}],
              "report": {"workloads": workloads, "tenants": [{"name": "t", "cgroups": ["a", "b"]}], "node": "n"},
              "loops": {"be_suppress": {"report": {"levers": {}}}}}
    history = {"workloads": {"web.slice": [[1, 2], [3, 4]], HOSTILE: []}}
    text = dumps(status, history)
    assert json.loads(text) == {**status, "slo_history": history}
    lines = text.splitlines()
    assert len(lines) < 300 + 40                              # a line a workload, not a line a field
    assert sum(line.strip().startswith('{"cgroup":"be.slice/pod-') for line in lines) == 299
    assert dumps({"held": [], "report": None}, None) == '{\n "held": [],\n "report": null,\n "slo_history": null\n}'


# --- koordctl slo ---------------------------------------------------------------------------------------------

def test_slo_text(tmp_path, capsys):
    sd = daemon_state(tmp_path)
    write_decisions(sd)
    assert main(["slo", "--state-dir", str(sd)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "web.slice (LS): target p99 1.00ms, p99.9 5.00ms, 1.0% allowed over"
    assert "latest  p99 " in lines[1] and "slack -" in lines[1] and "1100 requests" in lines[1]
    chart = next(line for line in lines if line.startswith("  10m p99 |"))
    bars = chart.split("|")[1]
    assert len(bars) == 60 and bars.rstrip().endswith("█") and "▁" in bars     # early under target, late over
    assert "13 points of 10s" in out
    assert "be_suppress on BE in the last 10m: 2 floor, 1 shrink, 1 grow" in out
    latest = next(line for line in lines if line.startswith("    latest "))
    assert "floor at slack -40.0%" in latest
    assert "be.slice cpu.max 1000 100000; be2.slice cpu.max 1000 100000" in latest


def test_slo_json(tmp_path, capsys):
    sd = daemon_state(tmp_path)
    write_decisions(sd)
    assert main(["slo", "--json", "--state-dir", str(sd)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["running"] is True and doc["seconds"] == 600.0
    (w,) = doc["workloads"]
    assert w["cgroup"] == "web.slice" and w["class"] == "LS" and w["target_us"] == 1000.0
    assert w["target_p999_us"] == 5000.0 and w["violation_target"] == 0.01
    assert len(w["history"]) == 13 and set(w["history"][0]) == set(HISTORY_FIELDS)
    assert w["latest"]["slack"] < 0 and w["latest"]["requests"] == 1100
    b = w["be_suppress"]
    assert b["steps"] == {"floor": 2, "shrink": 1, "grow": 1, "other": 0} and b["decisions"] == 6
    assert b["latest"]["step"] == "floor" and b["latest"]["knobs"] == {
        "be.slice cpu.max": "1000 100000", "be2.slice cpu.max": "1000 100000"}


def test_slo_ascii_fallback(tmp_path, monkeypatch):
    sd = daemon_state(tmp_path)
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["slo", "--state-dir", str(sd)]) == 0        # a block character would raise here
    out.flush()
    text = out.buffer.getvalue().decode("ascii")
    bars = next(line for line in text.splitlines() if line.startswith("  10m p99 |")).split("|")[1]
    assert bars.rstrip().endswith("#") and "_" in bars and set(bars) <= set(ctl_slo.ASCII_LEVELS + " ")
    assert "be_suppress: no step on BE" in text


def test_slo_ascii_flag_and_chart():
    assert ctl_slo.unicode_ok(io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
    assert not ctl_slo.unicode_ok(io.TextIOWrapper(io.BytesIO(), encoding="latin-1"))
    points = [{"time": 1000.0 - 10 * i, "latency_us": v} for i, v in enumerate([3000, 1000, 999, 0])]
    assert ctl_slo.chart(points, 1000.0, 1000.0, 60.0, 10.0) == "  ▁▄▅█"
    assert ctl_slo.chart(points, 1000.0, 1000.0, 60.0, 10.0, ascii_only=True) == "  _:=#"
    assert ctl_slo.chart(points, None, 1000.0, 60.0, 10.0) == " " * 6


def test_slo_escapes_hostile_names(tmp_path, capsys):
    sd = daemon_state(tmp_path, root=HOSTILE)
    write_decisions(sd, worst=HOSTILE)
    assert main(["slo", "--state-dir", str(sd)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "evil\\n\\x1b[2Jx.slice (LS)" in out
    assert not any(line.startswith("\x1b") or line.startswith("[2J") for line in out.splitlines())
    assert main(["slo", "--json", "--state-dir", str(sd)]) == 0      # JSON keeps the exact name
    assert json.loads(capsys.readouterr().out)["workloads"][0]["cgroup"] == HOSTILE


def test_slo_without_koordd(tmp_path, capsys):
    assert main(["slo", "--state-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out == f"koordd has not run with state_dir {tmp_path}\n"
    sd = daemon_state(tmp_path)
    status = json.loads((sd / STATUS_FILE).read_text())
    (sd / STATUS_FILE).write_text(json.dumps({**status, "pid": 2 ** 22 + 1}))     # above pid_max
    assert main(["slo", "--state-dir", str(sd)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"koordd is not running (state_dir {sd}") and out.count("\n") == 1
    assert main(["slo", "--json", "--state-dir", str(sd)]) == 1
    assert json.loads(capsys.readouterr().out)["running"] is False


def test_slo_without_an_slo(tmp_path, capsys):
    (tmp_path / STATUS_FILE).write_text(json.dumps({"pid": os.getpid(), "updated": time.time(),
                                                    "report": {"workloads": []}, "slo_history": None}))
    assert main(["slo", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no class declares an SLO") and out.count("\n") == 1
    (tmp_path / STATUS_FILE).write_text(json.dumps({
        "pid": os.getpid(), "report": None,
        "sensors": {"app_latency": {"state": "running", "loops": ["the SLO of class LS"]}}}))
    assert main(["slo", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ("no SLO workload answered requests in the last minutes "
                                       "(classes with an SLO: LS)\n")
    assert main(["slo", "--json", "--state-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["workloads"] == []
