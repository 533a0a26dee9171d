"""Restore only what koordd wrote, on the same object (issue 25, defect 3), under systemd on pure cgroup v2.

koordd caps be.slice and is killed (-9, no restart: a drop-in says Restart=no); meanwhile systemd makes
be.slice anew with an operator's CPUQuota=50%. The next koordd must not write its old original
("max 100000") over the new slice's own quota: the journal's hold names another cgroup (its inode), so
the hold starts over from the operator's value (the journal says so), and the final stop leaves 50%.
"""
from __future__ import annotations

import os
import signal

from . import vm

pytestmark = vm.only_in_vm

OPERATORS = "50000 100000"      # CPUQuota=50%


def test_a_slice_made_anew_after_a_kill_9_keeps_its_own_quota_and_a_decision_says_so(hogs):
    vm.write_config(vm.threshold_config())
    vm.DROPIN_DIR.mkdir(parents=True, exist_ok=True)
    vm.DROPIN.write_text("[Service]\nRestart=no\n")       # the conftest removes it afterwards
    vm.systemctl("daemon-reload")
    vm.systemctl("start", vm.UNIT)
    assert vm.wait_for(lambda: vm.quota() is not None, 60), f"be.slice not capped: {vm.cpu_max()}"
    inode = os.stat(vm.CGROUP / vm.BE).st_ino
    pid = vm.main_pid()
    os.kill(pid, signal.SIGKILL)
    assert vm.wait_for(lambda: not vm.pid_alive(pid), 10)
    assert any(h["target"] == vm.BE and h["original"] == vm.MAX for h in vm.held()), vm.held()

    # be.slice goes away with its last unit and comes back with the operator's quota.
    vm.stop_units("behog")
    vm.systemctl("stop", vm.BE, check=False)
    assert vm.wait_for(lambda: not (vm.CGROUP / vm.BE).exists(), 30), "be.slice was not removed"
    vm.systemctl("set-property", "--runtime", vm.BE, "CPUQuota=50%")
    vm.sh("systemd-run", f"--slice={vm.BE}", "--unit=besleep", "sleep", "infinity")
    try:
        assert vm.wait_for(lambda: vm.cpu_max() == OPERATORS, 30), vm.cpu_max()
        assert os.stat(vm.CGROUP / vm.BE).st_ino != inode

        cursor = vm.journal_cursor()
        vm.systemctl("start", vm.UNIT)
        # be_suppress runs again: it finds its hold on another cgroup and starts it over from the new
        # slice's own value (a loop not enabled any more would leave it with a decision, `left`).
        said = vm.wait_journal(lambda: vm.decisions(cursor, "left") or "made anew" in vm.journal_text(cursor))
        assert said, vm.journal_text(cursor)
        vm.systemctl("stop", vm.UNIT)
        assert vm.cpu_max() == OPERATORS, f"the stop wrote over the operator's quota: {vm.cpu_max()}"
        assert vm.held() == []
    finally:
        vm.stop_units("besleep")
        vm.systemctl("set-property", "--runtime", vm.BE, "CPUQuota=", check=False)
