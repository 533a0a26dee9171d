"""be_suppress under systemd on pure cgroup v2: BE capped through cpu.max while LS keeps its CPU,
decisions in the journal, reload (good and broken config), restore on stop, re-adopt after kill -9.

On the VM's 2 CPUs: lshog (ls.slice) runs 1 busy worker, behog (be.slice) 2. The shipped config on
koordlet's threshold rule (65%; qos_baseline off, vm.threshold_config) leaves BE about 1.3 - 1.0 (LS) - system ≈ 0.2-0.3 CPUs; uncontrolled, the two
slices share the CPUs about evenly. Under TCG numbers are noisy, so the checks compare ratios.

Everything the tests run counts as LS/system usage for koordd (pytest runs in system.slice), and a
journalctl is expensive under TCG: while measuring or waiting for the quota the tests only read
cgroup files, and query the journal afterwards.
"""
from __future__ import annotations

import json
import os
import re
import signal
import statistics

import pytest

from . import vm

pytestmark = vm.only_in_vm

CAP_TIMEOUT = 60         # seconds until koordd has capped be.slice after start
SETTLE = 10              # rounds of be_suppress for the cap to settle (PSI guard, growth limit of 10%/tick)
FLOOR_BAND = 4000        # the 2000 µs floor, plus changes under 1% of the node (2000 µs) being skipped


@pytest.fixture(autouse=True)
def threshold_rule(koordd_stopped):
    vm.write_config(vm.threshold_config())


def start_koordd() -> None:
    # `start`, not `enable --now` (test_service covers that): enable/disable imply a daemon-reload,
    # which takes seconds under TCG and makes systemd rewrite be.slice's cpu.max.
    vm.systemctl("start", vm.UNIT)
    assert vm.is_active() == "active"


def wait_capped(timeout: float = CAP_TIMEOUT) -> int:
    q = vm.wait_for(vm.quota, timeout)
    assert q, f"koordd did not cap {vm.BE} within {timeout}s: cpu.max={vm.cpu_max()}\n{vm.journal_text()}"
    return q


def sample_quotas(rounds: int) -> list[int | None]:
    """be.slice's quota after each of the next `rounds` rounds of be_suppress."""
    out = []
    for _ in range(rounds):
        vm.wait_ticks("be_suppress", 1)
        out.append(vm.quota())
    return out


def reason(entry: dict) -> dict:
    return json.loads(entry["KOORDD_REASON"])


def brief(entries: list[dict]) -> str:
    return "\n".join(f"{e.get('KOORDD_OUTCOME')} {e.get('KOORDD_OLD')!r} -> {e.get('KOORDD_NEW')!r} "
                     f"{e.get('KOORDD_REASON')}" for e in entries)


def test_be_is_capped_through_cpu_max_and_ls_keeps_its_cpu(hogs):
    # Uncontrolled first: the same hogs, no koordd.
    before = vm.measure(6, vm.LS, vm.BE)
    assert vm.cpu_max(vm.BE) == vm.MAX

    cursor = vm.journal_cursor()
    start_koordd()
    wait_capped()
    vm.wait_ticks("be_suppress", SETTLE)
    after = vm.measure(6, vm.LS, vm.BE)
    assert vm.quota() is not None, f"be.slice cpu.max {vm.cpu_max()}"

    ratio_before = before[vm.LS] / max(before[vm.BE], 1e-3)
    ratio_after = after[vm.LS] / max(after[vm.BE], 1e-3)
    summary = (f"uncontrolled LS {before[vm.LS]:.2f} BE {before[vm.BE]:.2f} CPUs (LS/BE {ratio_before:.2f}); "
               f"with koordd LS {after[vm.LS]:.2f} BE {after[vm.BE]:.2f} CPUs (LS/BE {ratio_after:.2f}), "
               f"be.slice cpu.max {vm.cpu_max()}")
    print(summary)
    # BE loses most of its CPU; LS keeps (or gains) its share.
    assert after[vm.BE] < 0.6 * before[vm.BE], summary
    assert ratio_after > 2.0 * ratio_before and ratio_after > 2.0, summary
    assert after[vm.LS] > 0.8 * before[vm.LS], summary

    # The decisions, with their structured fields, in the journal (the README's query).
    def readme_query() -> list[dict]:
        out = vm.sh("journalctl", "-u", "koordd", "KOORDD_LOOP=be_suppress", "-o", "json", "--no-pager").stdout
        return [e for e in map(json.loads, out.splitlines()) if int(e["__REALTIME_TIMESTAMP"]) > cursor]

    entries = vm.wait_journal(lambda: [e for e in readme_query() if e.get("KOORDD_OLD") == vm.MAX])
    assert entries, f"no decision from {vm.MAX!r}:\n{brief(readme_query())}"
    entries = [e for e in readme_query() if e.get("KOORDD_OUTCOME") == "applied"]
    for e in entries:
        for key in ("KOORDD_LOOP", "KOORDD_CGROUP", "KOORDD_KNOB", "KOORDD_OLD", "KOORDD_NEW", "KOORDD_REASON"):
            assert key in e, (key, e)
        assert (e["KOORDD_LOOP"], e["KOORDD_CGROUP"], e["KOORDD_KNOB"]) == ("be_suppress", vm.BE, "cpu.max"), e
        assert re.fullmatch(r"\d+ 100000", e["KOORDD_NEW"]), e["KOORDD_NEW"]
        r = reason(e)
        assert r["capacity"] == 2 and r["threshold_percent"] == 65, r
        assert {"allowance", "non_be_usage", "system_usage", "demand_peak", "quota_us", "period_us"} <= set(r), r
    print(brief(entries))
    # The same records in decisions.jsonl.
    records = [json.loads(line) for line in (vm.STATE_DIR / "decisions.jsonl").read_text().splitlines()]
    assert any(r["cgroup"] == vm.BE and r["knob"] == "cpu.max" and r["old"] == vm.MAX and r["outcome"] == "applied"
               for r in records), records


def test_reload_changes_behaviour_and_a_broken_config_is_refused(hogs):
    # 85%, so BE's allowance (1.7 CPUs - the LS/system peak of 1.1-1.4 under TCG) stays well above
    # the floor; at the shipped 65% a spike of the guest's own daemons takes it to the floor for
    # the 3 s window, and under emulation those spikes are frequent.
    text = vm.threshold_config()
    assert "threshold_percent = 65" in text
    vm.write_config(text.replace("threshold_percent = 65", "threshold_percent = 85"))
    start_koordd()
    wait_capped()
    vm.wait_ticks("be_suppress", SETTLE)
    at_85 = [q for q in sample_quotas(10) if q is not None]
    assert at_85 and statistics.median(at_85) > FLOOR_BAND, \
        f"at 85% be.slice stays at the floor: {at_85}\n{vm.journal_text()}"

    # 85% -> 30%: LS alone uses more than 30% of the node, so BE stays at the floor.
    cursor = vm.journal_cursor()
    vm.write_config(text.replace("threshold_percent = 65", "threshold_percent = 30"))
    vm.systemctl("reload", vm.UNIT)
    # `systemctl reload` returns once SIGHUP is sent; koordd then reports RELOADING=1 ... READY=1.
    assert vm.wait_for(lambda: vm.is_active() == "active", 60), vm.is_active()
    assert vm.wait_for(lambda: (vm.quota() or 0) <= FLOOR_BAND, 30), vm.journal_text(cursor)
    vm.wait_ticks("be_suppress", 3)
    at_30 = [q for q in sample_quotas(10) if q is not None]
    summary = f"be.slice quota at 85%: {at_85}; at 30%: {at_30}"
    print(summary)
    assert at_30 and max(at_30) <= FLOOR_BAND and max(at_30) < statistics.median(at_85), summary
    text_after = lambda: vm.journal_text(cursor)
    assert vm.wait_journal(lambda: "reloaded /etc/koordd/koordd.toml" in text_after()
                           and re.search(r"be_suppress reconfigured: .*threshold_percent=30\b", text_after())), \
        text_after()
    # Every decision after the reload uses 30% (there may be none: the quota may have been at the floor
    # already when the reload came, after a short spike).
    reloaded_at = min(int(e["__REALTIME_TIMESTAMP"]) for e in vm.journal(cursor)
                      if "reloaded /etc/koordd/koordd.toml" in vm.messages([e])[0])
    late = [e for e in vm.decisions(reloaded_at, "applied") if reason(e)["threshold_percent"] != 30]
    assert not late, brief(late)

    # A broken config: refused, logged, the running config (30%) stays, still capping.
    pid = vm.main_pid()
    cursor = vm.journal_cursor()
    vm.write_config(text.replace("threshold_percent = 65", 'threshold_percent = "lots"'))
    assert vm.sh("koordctl", "validate", str(vm.CONFIG), check=False).returncode != 0
    vm.systemctl("reload", vm.UNIT)
    assert vm.wait_journal(lambda: "reload refused" in vm.journal_text(cursor)), vm.journal_text(cursor)
    vm.wait_ticks("be_suppress", 5)              # the same process keeps going on the config it had
    assert vm.wait_for(lambda: vm.is_active() == "active", 60) and vm.main_pid() == pid, vm.is_active()
    assert "reload refused" in vm.show("StatusText"), vm.show("StatusText")
    still = sample_quotas(4)
    assert all(q is not None and q <= FLOOR_BAND for q in still), f"after the refused reload: {still}"
    assert not [e for e in vm.decisions(cursor, "applied") if reason(e)["threshold_percent"] != 30]


def test_stop_restores_and_kill_9_readopts(hogs):
    start_koordd()
    wait_capped()
    entry = next((h for h in vm.held() if h["target"] == vm.BE), None)
    assert entry and (entry["knob"], entry["original"], entry["owner"]) == ("cpu.max", vm.MAX, "be_suppress"), \
        vm.held()

    # systemctl stop: every knob goes back.
    cursor = vm.journal_cursor()
    vm.systemctl("stop", vm.UNIT)
    assert vm.cpu_max(vm.BE) == vm.MAX
    assert vm.held() == []
    restored = vm.wait_journal(lambda: vm.decisions(cursor, "restored"))
    assert restored and restored[-1]["KOORDD_NEW"] == vm.MAX, vm.journal_text(cursor)

    # kill -9: the cap stays in the kernel and the original in the restore journal; systemd restarts
    # koordd (Restart=on-failure), which re-adopts the knob and keeps capping.
    vm.systemctl("start", vm.UNIT)
    wait_capped()
    pid, restarts = vm.main_pid(), vm.n_restarts()
    cursor = vm.journal_cursor()
    os.kill(pid, signal.SIGKILL)
    assert vm.wait_for(lambda: not vm.pid_alive(pid), 10)
    assert vm.quota() is not None, "the cap went away with the killed koordd"
    assert any(h["target"] == vm.BE and h["original"] == vm.MAX for h in vm.held()), vm.held()
    assert vm.wait_for(lambda: vm.is_active() == "active" and vm.main_pid() not in (0, pid)
                       and vm.n_restarts() > restarts, 60), vm.journal_text(cursor)
    readopted = re.compile(r"re-adopting be\.slice cpu\.max \(original 'max 100000'\)")
    assert vm.wait_journal(lambda: readopted.search(vm.journal_text(cursor))), vm.journal_text(cursor)
    vm.wait_ticks("be_suppress", 5)
    assert vm.quota() is not None, f"not capped after the restart: {vm.cpu_max()}\n{vm.journal_text(cursor)}"
    assert any(h["target"] == vm.BE and h["original"] == vm.MAX for h in vm.held()), vm.held()

    # The final stop puts the original back.
    vm.systemctl("stop", vm.UNIT)
    assert vm.cpu_max(vm.BE) == vm.MAX
    assert vm.held() == []
