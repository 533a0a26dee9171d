"""perf_event_open(2) through ctypes: counting groups, their reads, and why an open failed.

A group is a leader and its members, opened on one CPU for one task or one
cgroup: the kernel puts them on the PMU together, so one read of the leader
gives every value over the same time, with the time the group was enabled and
the time it really ran (less when the PMU is shared and events take turns).
koordd counts cgroups: pid is an open fd of the cgroup's directory in the v2
tree with PERF_FLAG_PID_CGROUP, one group per online CPU. Nothing is sampled;
counters only count.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from koordd.core.cgroup_text import parse_cpulist

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PERF_TYPE_RAW = 0, 1, 4
PERF_FLAG_PID_CGROUP, PERF_FLAG_FD_CLOEXEC = 1 << 2, 1 << 3
PERF_FORMAT_TOTAL_TIME_ENABLED, PERF_FORMAT_TOTAL_TIME_RUNNING, PERF_FORMAT_GROUP = 1 << 0, 1 << 1, 1 << 3
GROUP_FORMAT = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
CGROUP_FLAGS = PERF_FLAG_PID_CGROUP | PERF_FLAG_FD_CLOEXEC
ATTR_SIZE = 128             # PERF_ATTR_SIZE_VER7: every kernel since 5.x takes it; zero fields are the defaults
_SYSCALL = {"x86_64": 298, "aarch64": 241}
# The errors of an event the hardware (or the hypervisor) does not offer.
NO_PMU = frozenset((errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV))


@dataclass(frozen=True)
class Event:
    name: str               # perf's own name, as `perf stat -e` spells it
    type: int
    config: int

    @property
    def hardware(self) -> bool:
        """Counted by the PMU: a generic hardware event, or a model's own (raw)."""
        return self.type in (PERF_TYPE_HARDWARE, PERF_TYPE_RAW)


def raw_event(name: str, event: int, umask: int) -> Event:
    """A model-specific event of Intel's core PMU: config is the event select with the unit mask above it."""
    return Event(name, PERF_TYPE_RAW, event | umask << 8)


CYCLES = Event("cycles", PERF_TYPE_HARDWARE, 0)
INSTRUCTIONS = Event("instructions", PERF_TYPE_HARDWARE, 1)
# Software events count without a PMU (VMs too): the same cgroup-mode plumbing, testable everywhere.
TASK_CLOCK = Event("task-clock", PERF_TYPE_SOFTWARE, 1)            # ns the tasks ran
CONTEXT_SWITCHES = Event("context-switches", PERF_TYPE_SOFTWARE, 3)


class PerfOpenError(OSError):
    """perf_event_open failed for `event`; errno is the kernel's."""

    def __init__(self, err: int, event: Event, detail: str | None = None):
        super().__init__(err, detail or os.strerror(err))
        self.event = event

    def __str__(self) -> str:
        return f"perf_event_open({self.event.name}): {self.strerror}"


@dataclass(frozen=True)
class GroupReading:
    """One read of a group: cumulative since it was opened."""
    enabled: int                # ns the group was enabled (for a cgroup: while its tasks ran on that CPU)
    running: int                # ns it was on the PMU: under `enabled` when multiplexed
    values: tuple[int, ...]     # one per event, in the group's order


def attr_bytes(event: Event, read_format: int = 0) -> ctypes.Array:
    """struct perf_event_attr for a counting (not sampling) event, enabled at once, user and kernel counted."""
    attr = ctypes.create_string_buffer(ATTR_SIZE)
    struct.pack_into("IIQ", attr, 0, event.type, ATTR_SIZE, event.config)
    struct.pack_into("Q", attr, 32, read_format)
    return attr


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def perf_event_open(event: Event, pid: int, cpu: int, group_fd: int = -1, flags: int = PERF_FLAG_FD_CLOEXEC,
                    read_format: int = 0) -> int:
    """A new perf fd, or PerfOpenError."""
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise PerfOpenError(errno.ENOSYS, event, f"no perf_event_open syscall number for {platform.machine()}")
    fd = _libc().syscall(ctypes.c_long(nr), attr_bytes(event, read_format), ctypes.c_long(pid),
                         ctypes.c_long(cpu), ctypes.c_long(group_fd), ctypes.c_ulong(flags))
    if fd < 0:
        raise PerfOpenError(ctypes.get_errno(), event)
    return fd


def parse_group(data: bytes, count: int) -> GroupReading:
    """A GROUP_FORMAT read: nr, time_enabled, time_running, then nr values."""
    if len(data) < 24:
        raise ValueError(f"perf group read: {len(data)} bytes, short of its 24-byte header")
    nr, enabled, running = struct.unpack_from("QQQ", data)
    if nr != count or len(data) < 8 * (3 + nr):
        raise ValueError(f"perf group read: {nr} values in {len(data)} bytes, expected {count}")
    return GroupReading(enabled, running, struct.unpack_from(f"{nr}Q", data, 24))


class CounterGroup:
    """`events` counted as one group on one CPU; open() or open_cgroup() make one."""

    def __init__(self, fds: Sequence[int]):
        self.fds = list(fds)        # the leader first

    @classmethod
    def open(cls, events: Sequence[Event], pid: int, cpu: int, flags: int = PERF_FLAG_FD_CLOEXEC) -> CounterGroup:
        """Leader and members, or PerfOpenError naming the event that failed (nothing left open)."""
        group = cls([])
        try:
            for event in events:
                leader = group.fds[0] if group.fds else -1
                group.fds.append(perf_event_open(event, pid, cpu, leader, flags, GROUP_FORMAT))
        except OSError:
            group.close()
            raise
        return group

    @classmethod
    def open_cgroup(cls, events: Sequence[Event], cgroup_fd: int, cpu: int) -> CounterGroup:
        """Count the tasks of the cgroup whose v2 directory `cgroup_fd` is open, and its descendants, on `cpu`."""
        return cls.open(events, cgroup_fd, cpu, CGROUP_FLAGS)

    def read(self) -> GroupReading:
        return parse_group(os.read(self.fds[0], 8 * (3 + len(self.fds))), len(self.fds))

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.pop())


def probe_cgroup_mode(events: Sequence[Event], cgroup_dir: Path | str, cpu: int,
                      open_group=CounterGroup.open_cgroup) -> OSError | None:
    """Open `events` as a group on `cgroup_dir` (a v2 directory) and close them again: None, or the error.
    `open_group`: how (CounterGroup.open_cgroup, or a fake in tests)."""
    try:
        dirfd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        return e
    try:
        open_group(events, dirfd, cpu).close()
    except OSError as e:
        return e
    finally:
        os.close(dirfd)
    return None


def explain(error: OSError, paranoid: str | None = None) -> str:
    """Why a cgroup-mode open failed, for one log line: the event and errno, then what it likely means.
    `paranoid`: the text of /proc/sys/kernel/perf_event_paranoid, when known."""
    err = error.errno or 0
    event = getattr(error, "event", None)
    # Linux's ENOTSUP is EOPNOTSUPP; perf_event_open(2) names it so.
    code = "EOPNOTSUPP" if err == errno.EOPNOTSUPP else errno.errorcode.get(err, str(err))
    subject = event.name if event is not None else error.filename
    what = f"{subject}: {code}" if subject else code
    if event is not None and err in NO_PMU:
        if event.type == PERF_TYPE_RAW:
            return f"the PMU does not offer this event ({what}) — another CPU model, or a virtual PMU that " \
                   f"offers only the generic events?"
        if event.hardware:
            return f"no hardware PMU ({what}) — a VM without a virtual PMU?"
        # A software event always exists: the cgroup is what the kernel did not find (its perf_event css).
        return f"cgroups of the v2 tree cannot be counted ({what}) — perf_event bound to a v1 hierarchy?"
    if err in (errno.EACCES, errno.EPERM):
        return (f"not permitted ({what}): kernel.perf_event_paranoid={paranoid or 'unknown'}; counting a cgroup "
                f"on each CPU needs CAP_PERFMON (or root), or perf_event_paranoid <= 0")
    if err == errno.ENOSYS:
        return f"no perf_event_open ({what}): {error.strerror}"
    return f"{what} — {error.strerror or os.strerror(err)}"


def online_cpus(sys_root: Path | str = "/sys") -> list[int]:
    """The online CPUs, from <sys>/devices/system/cpu/online; OSError when unreadable."""
    return sorted(parse_cpulist((Path(sys_root) / "devices/system/cpu/online").read_text()))
