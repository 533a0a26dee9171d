"""koordd/kernel/perf.py: the perf_event_attr it builds, group reads as literal bytes, partial opens, and the reasons."""
from __future__ import annotations

import errno
import os
import struct

import pytest

from koordd.kernel import perf
from koordd.kernel.perf import (CONTEXT_SWITCHES, CYCLES, CounterGroup, GROUP_FORMAT, GroupReading, INSTRUCTIONS,
    PerfOpenError, TASK_CLOCK, explain, raw_event)


def test_attr_counts_user_and_kernel_from_the_start():
    raw = perf.attr_bytes(INSTRUCTIONS, GROUP_FORMAT).raw
    assert len(raw) == perf.ATTR_SIZE == 128
    assert struct.unpack_from("IIQ", raw, 0) == (perf.PERF_TYPE_HARDWARE, 128, 1)
    assert struct.unpack_from("QQQ", raw, 16) == (0, 0, 0b1011)    # no sampling; group | enabled | running
    assert struct.unpack_from("Q", raw, 40) == (0,)                 # not disabled, nothing excluded
    assert raw[48:] == bytes(80)


def test_the_events_are_perfs_own():
    assert [(e.name, e.type, e.config, e.hardware) for e in (CYCLES, INSTRUCTIONS, TASK_CLOCK, CONTEXT_SWITCHES)] == [
        ("cycles", 0, 0, True), ("instructions", 0, 1, True),
        ("task-clock", 1, 1, False), ("context-switches", 1, 3, False)]
    assert perf.CGROUP_FLAGS == 4 | 8


def test_a_raw_event_is_the_pmus_with_the_unit_mask_above_the_event_select():
    lvl2 = raw_event("core_power.lvl2_turbo_license", 0x28, 0x20)
    assert (lvl2.type, lvl2.config, lvl2.hardware) == (perf.PERF_TYPE_RAW, 0x2028, True)
    assert struct.unpack_from("IIQ", perf.attr_bytes(lvl2).raw, 0) == (4, 128, 0x2028)


def test_parse_group():
    data = struct.pack("6Q", 3, 2_000, 1_000, 7, 11, 13)
    assert perf.parse_group(data, 3) == GroupReading(2_000, 1_000, (7, 11, 13))
    with pytest.raises(ValueError, match="2 values"):
        perf.parse_group(struct.pack("5Q", 2, 1, 1, 7, 11), 3)
    with pytest.raises(ValueError):
        perf.parse_group(struct.pack("5Q", 3, 1, 1, 7, 11), 3)      # short


def test_a_group_opens_leader_then_members_and_reads_through_the_leader(monkeypatch):
    calls = []
    r, w = os.pipe()

    def fake_open(event, pid, cpu, group_fd, flags, read_format):
        calls.append((event.name, pid, cpu, group_fd, flags, read_format))
        return {CYCLES: r, INSTRUCTIONS: os.dup(w)}[event]
    monkeypatch.setattr(perf, "perf_event_open", fake_open)
    group = CounterGroup.open_cgroup((CYCLES, INSTRUCTIONS), 42, 3)
    assert calls == [("cycles", 42, 3, -1, 12, GROUP_FORMAT), ("instructions", 42, 3, r, 12, GROUP_FORMAT)]
    os.write(w, struct.pack("5Q", 2, 10, 5, 100, 50))
    os.close(w)
    assert group.read() == GroupReading(10, 5, (100, 50))
    group.close()
    group.close()
    assert group.fds == []
    with pytest.raises(OSError):
        os.fstat(r)


def test_a_member_that_fails_leaves_nothing_open(monkeypatch):
    opened = []

    def fake_open(event, pid, cpu, group_fd, flags, read_format):
        if event is INSTRUCTIONS:
            raise PerfOpenError(errno.ENOENT, event)
        opened.append(os.open(os.devnull, os.O_RDONLY))
        return opened[-1]
    monkeypatch.setattr(perf, "perf_event_open", fake_open)
    with pytest.raises(PerfOpenError) as e:
        CounterGroup.open_cgroup((CYCLES, INSTRUCTIONS), 42, 0)
    assert e.value.event is INSTRUCTIONS and e.value.errno == errno.ENOENT
    assert str(e.value) == "perf_event_open(instructions): No such file or directory"
    with pytest.raises(OSError):
        os.fstat(opened[0])


@pytest.mark.parametrize("error, paranoid, text", [
    (PerfOpenError(errno.ENOENT, CYCLES), None, "no hardware PMU (cycles: ENOENT) — a VM without a virtual PMU?"),
    (PerfOpenError(errno.EOPNOTSUPP, INSTRUCTIONS), None, "no hardware PMU (instructions: EOPNOTSUPP) — "),
    (PerfOpenError(errno.ENODEV, CYCLES), None, "no hardware PMU (cycles: ENODEV)"),
    (PerfOpenError(errno.ENOENT, raw_event("core_power.lvl1_turbo_license", 0x28, 0x18)), None,
     "the PMU does not offer this event (core_power.lvl1_turbo_license: ENOENT) — another CPU model"),
    (PerfOpenError(errno.ENOENT, TASK_CLOCK), None,
     "cgroups of the v2 tree cannot be counted (task-clock: ENOENT) — perf_event bound to a v1 hierarchy?"),
    (PerfOpenError(errno.EACCES, CYCLES), "2", "not permitted (cycles: EACCES): kernel.perf_event_paranoid=2; "
                                               "counting a cgroup on each CPU needs CAP_PERFMON"),
    (PerfOpenError(errno.EPERM, TASK_CLOCK), None,
     "not permitted (task-clock: EPERM): kernel.perf_event_paranoid=unknown;"),
    (PerfOpenError(errno.ENOSYS, CYCLES, "no perf_event_open syscall number for mips"), None,
     "no perf_event_open (cycles: ENOSYS): no perf_event_open syscall number for mips"),
    (PerfOpenError(errno.EINVAL, CYCLES), None, "cycles: EINVAL — Invalid argument"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/sys/fs/cgroup/x"), None,
     "/sys/fs/cgroup/x: ENOENT — No such file or directory"),
])
def test_explain(error, paranoid, text):
    assert explain(error, paranoid).startswith(text)


def test_online_cpus(tmp_path):
    (tmp_path / "devices/system/cpu").mkdir(parents=True)
    (tmp_path / "devices/system/cpu/online").write_text("0-2,5\n")
    assert perf.online_cpus(tmp_path) == [0, 1, 2, 5]
    with pytest.raises(OSError):
        perf.online_cpus(tmp_path / "nowhere")


def test_the_real_syscall_answers_with_an_fd_or_an_error():
    # This host's kernel, PMU or not, root or not: the software event in this process opens or says why.
    try:
        group = CounterGroup.open((TASK_CLOCK,), 0, -1)
    except PerfOpenError as e:
        assert e.event is TASK_CLOCK and e.errno
        return
    try:
        assert group.read().values[0] >= 0
    finally:
        group.close()
