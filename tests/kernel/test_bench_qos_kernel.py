"""scripts/bench-qos end to end on this host, as short as it goes: it runs the probe against the cpu
antagonist under a few setups (koordd among them), writes its report, and leaves no cgroup of its own
behind, also when it is stopped with SIGTERM in the middle of a koordd run.

Needs root and a hybrid (v1 cpu + cpuacct + unified tree) or a cgroup v2 host; skipped otherwise. It
installs nothing (--no-install): without matplotlib the report simply has no plot. No timing is
checked: the numbers are the benchmark's business, not a test's.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from koordtest.kernel import CGROUP_ROOT, detect_host, wait_for

pytestmark = pytest.mark.kernel

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench-qos"
SHORT = ["--ls", "probe", "--antagonist", "cpu", "--loads", "30", "--reps", "1", "--seconds", "1", "--warmup", "1",
         "--drain", "0.5", "--no-install"]


def leftovers(pid: int) -> list[str]:
    """Our cgroups still present in any hierarchy (bench-qos names them koordd-qos-<its pid>)."""
    return [str(d) for d in CGROUP_ROOT.glob(f"*/koordd-qos-{pid}")] + \
        [str(d) for d in CGROUP_ROOT.glob(f"koordd-qos-{pid}")]


def test_a_short_run_reports_every_setup_and_cleans_up(tmp_path):
    detect_host()
    setups = ["ls-alone", "be-alone", "be-quota-half", "be-thread-idle", "koordd"]
    p = subprocess.Popen([sys.executable, str(SCRIPT), *SHORT, "--setups", ",".join(setups), "--out", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:          # SIGTERM: it cleans up as on Ctrl-C
            p.terminate()
            p.communicate(timeout=60)
    assert p.returncode == 0, err[-3000:]
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert sorted(r["setup"] for r in runs) == sorted(setups)
    for r in runs:
        if r["ls"]:
            assert r["ls"]["answered"] > 0 and r["ls"]["errors"] == 0, r
        if r["setup"] != "ls-alone":
            assert r["be_work"] > 0, r
    policies = {r["setup"]: r["be_policy"] for r in runs if r["setup"] != "ls-alone"}
    assert policies["be-thread-idle"] == ["idle"] and policies["be-quota-half"] == ["normal"], policies
    quota = next(r for r in runs if r["setup"] == "be-quota-half")["be_cpu_max"]
    assert quota.split()[0] != "max"             # the static setup's knob was in place during its window
    report = (tmp_path / "report.md").read_text()
    assert "scripts/bench-qos" in report and all(f"| {s} |" in report for s in setups)
    assert not leftovers(p.pid), "cgroups left behind"


def test_sigterm_during_a_koordd_run_removes_everything(tmp_path):
    mode, roles = detect_host()
    p = subprocess.Popen([sys.executable, str(SCRIPT), *SHORT, "--setups", "koordd", "--seconds", "30",
                          "--out", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        be = roles["cpu"] / f"koordd-qos-{p.pid}" / "be"
        # The koordd run has started once koordd has changed BE (calibration comes first, without BE): as
        # shipped it makes BE idle at once (qos_baseline) and caps it only when LS's slack is short, which
        # a healthy LS may never be.
        assert wait_for(lambda: be.exists() and _koordd_changed(be, mode), timeout=60), "koordd never changed BE"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, err[-3000:]
    assert "interrupted; cleaned up" in err
    assert not leftovers(p.pid)


def _koordd_changed(be: Path, mode: str) -> bool:
    """BE idle (cpu.idle 1) or capped: what koordd as shipped does to BE first."""
    try:
        if (be / "cpu.idle").read_text().strip() == "1":
            return True
    except OSError:
        pass
    return _quota_set(be, mode)


def _quota_set(be: Path, mode: str) -> bool:
    try:
        if mode == "hybrid":
            return (be / "cpu.cfs_quota_us").read_text().strip() != "-1"
        return not (be / "cpu.max").read_text().startswith("max")
    except OSError:
        return False


def test_the_wake_setting_holds_cpus_out_of_deep_idle_in_its_window_only_and_settles_when_named(tmp_path):
    """be-idle-wake holds a 0 µs request on /dev/cpu_dma_latency for its run and drops it after; --settle-also
    gives a static setting koordd's settling time. Every run records the CPU latency target at its window's start
    and end: be-idle's must read no request (nothing of ours left one behind)."""
    from koordd.kernel.pm_qos import DEVICE, NO_CONSTRAINT, read_target
    detect_host()
    if not DEVICE.exists():
        pytest.skip(f"{DEVICE}: this kernel has no CPU idle PM QoS")
    setups = ["be-idle", "be-idle-wake", "koordd"]
    p = subprocess.run([sys.executable, str(SCRIPT), *SHORT, "--setups", ",".join(setups), "--koordd-settle", "1",
                        "--settle-also", "be-idle-wake", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = {r["setup"]: r for r in json.loads((tmp_path / "results.json").read_text())["runs"]}
    assert runs["be-idle-wake"]["cpu_latency_us"] == [0, 0]
    assert runs["be-idle"]["cpu_latency_us"] == [NO_CONSTRAINT, NO_CONSTRAINT]
    assert [runs[s]["settled"] for s in setups] == [0.0, 1.0, 1.0]
    assert read_target() == NO_CONSTRAINT            # the request went with the run
