"""One koordd per host, under systemd (issue 25, defect 2): with koordd.service running and capping
be.slice, `koordd --once` (docs/install.md's command) and a second instance with a state_dir of its own,
started as a systemd unit, both refuse, naming the service's koordd (exit 75), and write nothing: be.slice
keeps the service's cap, its journal stays as it was, and the second state_dir is never made. The lock
is the host's own, /run/koordd/owner.lock (RuntimeDirectory= of the unit, kept after a stop), which
the service holds while it runs and nobody holds after it stopped.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from . import vm

pytestmark = vm.only_in_vm

KOORDD = "/opt/koordd/bin/koordd"
LOCK = Path("/run/koordd/owner.lock")
OTHER_CONFIG = vm.CONFIG.with_name("other.toml")
OTHER_STATE = Path("/var/lib/koordd-other")
SECOND = "koordd-second"
EX_TEMPFAIL = 75


def logged_by(pid: int) -> str:
    """What process `pid` logged (koordd logs to journald where it runs)."""
    vm.sh("journalctl", "--sync", check=False)
    return vm.sh("journalctl", f"_PID={pid}", "-o", "cat", "--no-pager", check=False).stdout


def decisions_since(cursor: int) -> list[dict]:
    """Every koordd's decision records since `cursor`, whichever unit (or none) the process ran in."""
    vm.sh("journalctl", "--sync", check=False)
    out = vm.sh("journalctl", "-o", "json", "--no-pager", f"--since=@{cursor // 1_000_000 - 1}",
                "SYSLOG_IDENTIFIER=koordd", "KOORDD_KNOB=cpu.max", check=False).stdout
    entries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [e for e in entries if int(e.get("__REALTIME_TIMESTAMP", 0)) > cursor]


@pytest.fixture
def service(hogs):
    # current_holder() here and the koordd started here use the host's own lock (tests/conftest.py gives
    # system tests no lock file of their own).
    vm.write_config(vm.threshold_config())
    yield
    vm.stop_units(SECOND)
    OTHER_CONFIG.unlink(missing_ok=True)
    if OTHER_STATE.exists():
        subprocess.run(["rm", "-rf", str(OTHER_STATE)], check=False)


def test_once_and_a_second_instance_beside_the_service_refuse_naming_it(service):
    from koordd.act.owner import current_holder
    vm.systemctl("start", vm.UNIT)
    assert vm.wait_for(vm.quota, 60), f"koordd did not cap {vm.BE}: {vm.journal_text()}"
    pid = vm.main_pid()
    holder = current_holder()
    assert holder is not None and (holder.pid, holder.config, holder.state_dir) == \
        (pid, str(vm.CONFIG), str(vm.STATE_DIR)), holder
    vm.wait_ticks("be_suppress", 3)
    cursor = vm.journal_cursor()
    originals = lambda: sorted((h["target"], h["knob"], h["original"], h["owner"]) for h in vm.held())
    held = originals()
    assert (vm.BE, "cpu.max", vm.MAX, "be_suppress") in held, held

    # koordd --once beside the service, on its config.
    once = subprocess.Popen([KOORDD, "--config", str(vm.CONFIG), "--once"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = once.communicate(timeout=120)[0]
    assert once.returncode == EX_TEMPFAIL, out
    said = vm.wait_journal(lambda: (t := logged_by(once.pid) + out) and f"koordd pid {pid}" in t and t)
    assert said and f"config {vm.CONFIG}" in said and f"state_dir {vm.STATE_DIR}" in said, said

    # A second instance, a unit of its own, with another state_dir.
    OTHER_CONFIG.write_text(vm.threshold_config().replace(f'state_dir = "{vm.STATE_DIR}"',
                                                          f'state_dir = "{OTHER_STATE}"'))
    OTHER_CONFIG.chmod(0o644)
    vm.sh("systemd-run", f"--unit={SECOND}", "--property=Type=exec", KOORDD, "--config", str(OTHER_CONFIG))
    assert vm.wait_for(lambda: vm.is_active(SECOND) in ("failed", "inactive"), 120), vm.is_active(SECOND)
    assert vm.show("ExecMainStatus", SECOND) == str(EX_TEMPFAIL)
    text = vm.wait_journal(lambda: (t := vm.journal_text(unit=SECOND)) and f"koordd pid {pid}" in t and t)
    assert text and "owns this host's knobs" in text, vm.journal_text(unit=SECOND)

    assert not OTHER_STATE.exists()
    assert vm.main_pid() == pid and originals() == held
    # be.slice's cap moves with the load: every change since came from the service's koordd.
    vm.wait_ticks("be_suppress", 1)
    writers = {e.get("_PID") for e in decisions_since(cursor)}
    assert writers <= {str(pid)}, writers

    # Stopped: restored, the lock free, its file kept (never removed while someone could hold it).
    vm.systemctl("stop", vm.UNIT)
    assert vm.cpu_max(vm.BE) == vm.MAX and vm.held() == []
    assert LOCK.is_file() and current_holder() is None
