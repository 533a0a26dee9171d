"""The PM QoS backend (koordd/backends/pm_qos.py) on a stand-in device (a regular file: a write lands at its
start, a read gives it back): a held knob, in force while koordd holds the fd; skip-if-equal on what koordd
holds; the actuator's pipeline around it (journal before the write, decisions, dry-run writes nothing,
restore closes the fd, a new koordd after a crash holds nothing and drops the entry); a missing or refused
device is one reason for the knob and doctor's row. The real device: tests/kernel/test_pm_qos_kernel.py."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends import pm_qos
from koordd.backends.pm_qos import KNOB, NONE, PmQosBackend, probe_pm_qos
from koordd.core.backend import Backends, InvalidValue, Unsupported
from koordd.core.decisions import APPLIED, DRY_RUN, REFUSED, RESTORED
from koordd.core.loop import Action, restore
from koordd.core.targets import PM_QOS_TARGET
from koordd.kernel.host_probe import Host
from koordd.kernel.pm_qos import NO_CONSTRAINT, TEST_ENV

NODE = PM_QOS_TARGET


@pytest.fixture
def device(tmp_path) -> Path:
    d = tmp_path / "cpu_dma_latency"
    d.write_bytes(struct.pack("i", NO_CONSTRAINT))
    return d


def device_value(device: Path) -> int:
    return struct.unpack("i", device.read_bytes()[:4])[0]


def fds_on(path: Path) -> int:
    """How many of this process's fds are open on `path`."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass
    return n


def actuator(tmp_path, backend, dry_run=False):
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    return Actuator(Backends([backend]), journal, DecisionLog(state, send=lambda message, **f: None),
                    dry_run=dry_run, unsupported=backend.probe()), journal


def test_holds_the_request_while_it_holds_the_fd_and_reads_what_it_holds(device):
    b = PmQosBackend(device)
    assert b.read(NODE, KNOB) == NONE and fds_on(device) == 0
    b.write(NODE, KNOB, "0")
    assert b.read(NODE, KNOB) == "0" and device_value(device) == 0 and fds_on(device) == 1
    fd = b.request.fd
    b.write(NODE, KNOB, "0")                         # the value it holds: nothing touched, the same fd
    assert b.request.fd == fd and fds_on(device) == 1
    b.write(NODE, KNOB, "20")                        # another value: written into the same request
    assert b.request.fd == fd and device_value(device) == 20 and b.read(NODE, KNOB) == "20"
    b.write(NODE, KNOB, NONE)                        # released: the fd is closed
    assert b.read(NODE, KNOB) == NONE and fds_on(device) == 0
    b.write(NODE, KNOB, "0")
    b.close()                                        # the daemon's last resort at exit
    assert fds_on(device) == 0 and b.request is None


def test_values_and_target_are_checked(device):
    b = PmQosBackend(device)
    assert b.validate(NODE, KNOB, " 0 ") == "0" and b.validate(NODE, KNOB, "none") == NONE
    for bad in ("-1", "ten", "", "1_0", "²", str(2**31)):
        with pytest.raises(InvalidValue, match=KNOB):
            b.validate(NODE, KNOB, bad)
    with pytest.raises(InvalidValue, match="knob of the node"):
        b.read("be.slice", KNOB)
    with pytest.raises(InvalidValue, match="knob of the node"):
        b.write("be.slice", KNOB, "0")
    assert fds_on(device) == 0


def test_the_actuator_journals_holds_and_releases_it(device, tmp_path):
    b = PmQosBackend(device)
    act, journal = actuator(tmp_path, b)
    [d] = act.apply("be_suppress", [Action(NODE, KNOB, "0", {"lever": "wake"}, "wake-ups")])
    assert (d.outcome, d.old, d.new, d.kind) == (APPLIED, NONE, "0", "pm_qos")
    assert [(h.target, h.knob, h.original, h.owner) for h in journal.entries()] == [(NODE, KNOB, NONE, "be_suppress")]
    assert fds_on(device) == 1 and device_value(device) == 0
    assert act.apply("be_suppress", [Action(NODE, KNOB, "0", {}, "holds")]) == []     # skip if equal
    [d] = act.apply("be_suppress", [restore(NODE, KNOB, "LS healthy")])
    assert (d.outcome, d.old, d.new) == (RESTORED, "0", NONE)
    assert fds_on(device) == 0 and journal.entries() == []


def test_stop_releases_it(device, tmp_path):
    b = PmQosBackend(device)
    act, journal = actuator(tmp_path, b)
    act.apply("be_suppress", [Action(NODE, KNOB, "0", {}, "")])
    [d] = act.restore_all("koordd stops")
    assert d.outcome == RESTORED and fds_on(device) == 0 and journal.entries() == []


def test_dry_run_holds_nothing(device, tmp_path):
    b = PmQosBackend(device)
    act, journal = actuator(tmp_path, b, dry_run=True)
    [d] = act.apply("be_suppress", [Action(NODE, KNOB, "0", {}, "")])
    assert d.outcome == DRY_RUN and fds_on(device) == 0 and b.request is None and journal.entries() == []
    assert device_value(device) == NO_CONSTRAINT


def test_after_a_crash_the_new_koordd_holds_nothing_and_drops_the_entry(device, tmp_path):
    b = PmQosBackend(device)
    act, journal = actuator(tmp_path, b)
    act.apply("be_suppress", [Action(NODE, KNOB, "0", {}, "")])
    b.request.close()        # what the kernel does to a killed koordd's fds (tests/kernel: the real kill -9)
    act2, journal2 = actuator(tmp_path, PmQosBackend(device))
    assert [(h.knob, h.original) for h in journal2.entries()] == [(KNOB, NONE)]
    assert act2.restore_all("restart") == [] and journal2.entries() == []


def test_a_missing_device_is_one_reason_and_a_refusal(tmp_path):
    b = PmQosBackend(tmp_path / "nothing")
    [(knob, why)] = b.probe().items()
    assert knob == KNOB and "no " in why and "nothing" in why
    with pytest.raises(Unsupported):
        b.read(NODE, KNOB)
    act, _ = actuator(tmp_path, b)
    [d] = act.apply("be_suppress", [Action(NODE, KNOB, "0", {}, "")])
    assert d.outcome == REFUSED and d.error == why


def test_a_device_it_may_not_open_is_one_reason(device, monkeypatch):
    real = os.open

    def denied(path, flags, *a):
        if str(path) == str(device) and flags & os.O_WRONLY:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, flags, *a)
    monkeypatch.setattr(pm_qos.os, "open", denied)
    assert "EACCES" in PmQosBackend(device).probe()[KNOB]


def test_doctor_row_says_the_target_and_the_cpuidle_driver(device, tmp_path, monkeypatch):
    idle = tmp_path / "sys/devices/system/cpu/cpuidle"
    idle.mkdir(parents=True)
    (idle / "current_driver").write_text("haltpoll\n")
    (idle / "current_governor_ro").write_text("haltpoll\n")
    monkeypatch.setenv(TEST_ENV, str(device))
    ok, detail = probe_pm_qos(Host(sys=tmp_path / "sys"))
    assert ok and "2000000000 µs (no request)" in detail and "cpuidle driver haltpoll" in detail
    device.write_bytes(struct.pack("i", 0))
    assert "0 µs requested" in probe_pm_qos(Host(sys=tmp_path / "sys"))[1]
    (idle / "current_driver").write_text("none\n")
    assert "no cpuidle driver: a request cannot change how CPUs idle here" in probe_pm_qos(Host(sys=tmp_path / "sys"))[1]
    monkeypatch.setenv(TEST_ENV, str(tmp_path / "nothing"))
    ok, detail = probe_pm_qos(Host(sys=tmp_path / "sys"))
    assert not ok and "no " in detail


def test_unit_tests_never_reach_the_hosts_device():
    """tests/conftest.py: the backend koordd builds in a unit test finds a device of the test's own."""
    assert PmQosBackend().device != Path("/dev/cpu_dma_latency")
    assert os.environ[TEST_ENV]
