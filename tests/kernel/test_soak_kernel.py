"""scripts/soak, short: koordd with every loop the host supports and the run-queue sensor, two minutes
under cgroup churn (300 pods a minute below its class roots). What it holds stays bounded: the files
and BPF map entries it kept for pods are gone once the pods are, its RSS grows by little after a
warm-up, its restore journal stays compacted; it stops cleanly with nothing held. Resource bounds
only, no timing. Needs root and a hybrid or v2 cgroup host; skipped otherwise. The long run
(`scripts/soak`, an hour by default) is for a person to read.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from koordtest.kernel import detect_host

pytestmark = pytest.mark.kernel

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak"
MINUTES, WARMUP = 2.0, 45.0
FD_SLACK = 4              # files koordd may open for good meanwhile (a netlink socket opened at first use)
RSS_GROWTH_KIB = 16 << 10  # after the warm-up: Python's allocator keeps what it once used; a leak per pod
                          # (600 of them) or per tick (240) of a few KiB would show well above this
CGROUP_MAPS = ("watched", "waits")     # the run-queue sensor's maps keyed by the cgroups it samples


def test_two_minutes_of_churn_leave_koordd_where_it_started(tmp_path, capsys):
    detect_host()
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--minutes", str(MINUTES), "--every", "5",
                          "--warmup", str(WARMUP), "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert out.exists(), f"soak wrote no summary (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    result = json.loads(out.read_text())
    metrics, without = result["metrics"], result["without_pods"]
    with capsys.disabled():
        print(f"\n[kernel] soak {result['minutes']} min, {result['pods_made']} pods made and removed "
              f"({result['pods_per_minute']}/min), loops {', '.join(result['loops'])}: "
              + "; ".join(f"{m} {v['after_warmup']} -> {v['end']} (peak {v['peak']})" for m, v in metrics.items())
              + f"; without pods before/after: fds {without['fds']['before_churn']}/{without['fds']['after_churn']}, "
              f"BPF entries {without['bpf_entries']['before_churn']}/{without['bpf_entries']['after_churn']}")
    assert run.returncode == 0 and result["exit_status"] == 0, run.stderr[-3000:]
    assert result["held_after_stop"] == 0 and result["cleanup_problems"] == [] and result["churn_errors"] == []
    assert result["loop_failures"] == {}, result["loop_failures"]
    assert result["pods_made"] >= 100, "the churn did not run"
    assert without["fds"]["after_churn"] <= without["fds"]["before_churn"] + FD_SLACK, without["fds"]
    if result["sensors"].get("runq_latency") == "running" and without["bpf_by_map"]["before_churn"]:
        for name in CGROUP_MAPS:
            before, after = (without["bpf_by_map"][when].get(name) for when in ("before_churn", "after_churn"))
            assert after is not None and after <= before, f"BPF map {name}: {before} entries before, {after} after"
    assert metrics["rss_kib"]["end"] - metrics["rss_kib"]["after_warmup"] <= RSS_GROWTH_KIB, metrics["rss_kib"]
    held = max(1, max(s["held"] or 0 for s in result["samples"]))
    assert metrics["journal_lines"]["peak"] <= max(64, 4 * held) + 2, metrics["journal_lines"]   # compacted
    assert metrics["threads"]["end"] == metrics["threads"]["after_warmup"], metrics["threads"]
