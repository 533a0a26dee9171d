"""The sysctl backend on a fake /proc/sys: the allowlist, the kernel's ranges, the 10% bound on
vm.min_free_kbytes, probe/doctor, and the actuator's pipeline around it (journal, restore only what
koordd wrote, leave a value someone else set, restore after a crash from the journal)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.sysctl import SYSCTLS, SysctlBackend, probe_sysctl
from koordd.core.backend import Backends, InvalidValue, UnsafeValue, Unsupported
from koordd.core.decisions import APPLIED, LEFT, REFUSED, RESTORED
from koordd.core.loop import Action
from koordd.core.targets import SYSCTL_TARGET
from koordd.kernel.host_probe import Host
from koordtest.fakes.procfs import fake_proc

MIN_FREE, SCALE = "vm.min_free_kbytes", "vm.watermark_scale_factor"


@pytest.fixture
def proc(tmp_path) -> Path:
    return fake_proc(tmp_path)


def value(proc: Path, name: str) -> str:
    return (proc / "sys" / name.replace(".", "/")).read_text().strip()


def actuator(tmp_path, backend):
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    return Actuator(Backends([backend]), journal, DecisionLog(state, send=lambda message, **f: None)), journal


def test_reads_writes_and_checks_the_kernels_ranges(proc):
    b = SysctlBackend(proc)
    assert b.read(SYSCTL_TARGET, SCALE) == "10"
    assert b.read(SYSCTL_TARGET, MIN_FREE) == "67584"
    b.write(SYSCTL_TARGET, SCALE, "200")
    assert value(proc, SCALE) == "200"
    assert b.validate(SYSCTL_TARGET, SCALE, " 3000 ") == "3000"
    for bad in ("0", "3001", "-1", "1_0", "²", "ten", ""):
        with pytest.raises(InvalidValue, match="vm.watermark_scale_factor"):
            b.validate(SYSCTL_TARGET, SCALE, bad)
    with pytest.raises(InvalidValue, match="vm.min_free_kbytes"):
        b.validate(SYSCTL_TARGET, MIN_FREE, "-5")


def test_min_free_kbytes_above_a_tenth_of_memory_is_refused_to_writes_and_restores_alike(proc):
    b = SysctlBackend(proc)
    assert b.validate(SYSCTL_TARGET, MIN_FREE, "800000") == "800000"          # exactly 10% of 8000000 KiB
    with pytest.raises(UnsafeValue, match="above 10% of this node's memory"):
        b.validate(SYSCTL_TARGET, MIN_FREE, "800001")
    # No longer let through as an original (issue 35 item 5: tests/unit/test_trust_restore_rules.py).
    with pytest.raises(UnsafeValue, match="above 10% of this node's memory"):
        b.validate_original(SYSCTL_TARGET, MIN_FREE, "900000")


def test_only_the_allowlist_and_only_the_node(proc):
    b = SysctlBackend(proc)
    assert set(b.knobs) == set(SYSCTLS)
    with pytest.raises(InvalidValue, match="target must be 'node'"):
        b.validate("be.slice", SCALE, "10")
    with pytest.raises(Unsupported, match="not a sysctl koordd writes"):
        b.read(SYSCTL_TARGET, "kernel.core_pattern")
    # Through the actuator an unknown sysctl is no knob at all.
    act = Actuator(Backends([b]), RestoreJournal(proc.parent / "st"), DecisionLog(proc.parent / "st", send=None))
    [d] = act.apply("oom_shaping", [Action(SYSCTL_TARGET, "kernel.core_pattern", "|/bin/sh", {}, "")])
    assert d.outcome == REFUSED and "unknown knob" in d.error


def test_probe_says_what_is_missing_or_read_only(proc):
    b = SysctlBackend(proc)
    assert b.probe() == {}
    ok, detail = probe_sysctl(Host(sys=proc.parent, proc=proc))
    assert ok and "vm.watermark_scale_factor = 10 (writable)" in detail
    (proc / "sys" / "vm" / "watermark_boost_factor").unlink()
    assert "no " in b.probe()["vm.watermark_boost_factor"]
    ok, detail = probe_sysctl(Host(sys=proc.parent, proc=proc))
    assert not ok and "vm.watermark_boost_factor: no" in detail


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a mode-0444 file anyway")
def test_probe_names_a_file_it_cannot_write(proc):
    (proc / "sys" / "vm" / "watermark_scale_factor").chmod(0o444)
    assert "not writable" in SysctlBackend(proc).probe()[SCALE]


def test_journaled_written_and_restored(proc, tmp_path):
    act, journal = actuator(tmp_path, SysctlBackend(proc))
    want = Action(SYSCTL_TARGET, SCALE, "200", {}, "kswapd earlier")
    [d] = act.apply("oom_shaping", [want])
    assert (d.kind, d.target, d.old, d.new, d.outcome) == ("sysctl", "node", "10", "200", APPLIED)
    assert [(h.kind, h.target, h.knob, h.original) for h in journal.entries()] == [("sysctl", "node", SCALE, "10")]
    assert act.apply("oom_shaping", [want]) == []          # in place: nothing to write
    [d] = act.restore_all("stopping")
    assert (d.outcome, d.new) == (RESTORED, "10") and value(proc, SCALE) == "10" and journal.entries() == []


def test_a_value_changed_behind_koordds_back_is_left_with_a_decision(proc, tmp_path):
    act, journal = actuator(tmp_path, SysctlBackend(proc))
    act.apply("oom_shaping", [Action(SYSCTL_TARGET, MIN_FREE, "100000", {}, "")])
    (proc / "sys" / "vm" / "min_free_kbytes").write_text("90112\n")     # khugepaged's recommendation
    [d] = act.restore_all("stopping")
    assert d.outcome == LEFT and "changed by someone else" in d.error
    assert value(proc, MIN_FREE) == "90112" and journal.entries() == []


def test_a_refused_value_writes_nothing_and_journals_nothing(proc, tmp_path):
    act, journal = actuator(tmp_path, SysctlBackend(proc))
    [d] = act.apply("oom_shaping", [Action(SYSCTL_TARGET, MIN_FREE, "5000000", {}, "")])
    assert d.outcome == REFUSED and "above 10%" in d.error
    assert value(proc, MIN_FREE) == "67584" and journal.entries() == []


def test_restore_after_a_crash_from_the_journal(proc, tmp_path):
    act, journal = actuator(tmp_path, SysctlBackend(proc))
    act.apply("oom_shaping", [Action(SYSCTL_TARGET, SCALE, "300", {}, "")])
    # A new koordd (the old one killed -9): a fresh journal object reads the file.
    act2, journal2 = actuator(tmp_path, SysctlBackend(proc))
    assert [h.original for h in journal2.entries()] == ["10"]
    [d] = act2.restore_all("restart")
    assert d.outcome == RESTORED and value(proc, SCALE) == "10"
