"""Perf counters per cgroup, kept open between rounds: what each cgroup counted since the last round.

For every cgroup it is asked about, `CgroupCounters` opens one group of its
events per online CPU in cgroup mode (koordd/kernel/perf.py), keeps the fds, and at
each update() reads them: per CPU the growth since the previous read, scaled by
Δenabled / Δrunning (the share of the time the group was really on the PMU),
summed over the CPUs. A cgroup costs CPUs × events fds.

A cgroup's counters are closed when it is no longer asked about, when its
directory is gone, and when a new directory took its name (another inode): a
perf event holds its cgroup, so an open one would keep a removed cgroup alive in
the kernel, counting nothing. When its fds would pass `max_fds`, or the fds run
out (EMFILE/ENFILE), it adds no more cgroups until one of those it counts goes,
and says so once.
"""
from __future__ import annotations

import errno
import logging
import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from koordd.kernel.cgroupfs import LayoutError, detect_layout
from koordd.kernel.perf import (CONTEXT_SWITCHES, CounterGroup, Event, GroupReading, TASK_CLOCK, explain, online_cpus,
    probe_cgroup_mode)
from koordd.sensors.contract import SensorUnavailable

log = logging.getLogger(__name__)
OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)
# Of the open-files limit, what perf may not take: the cgroup files koordd keeps open, its journal and
# logs, and every knob write (an EMFILE there refuses a write). Half the limit when that is smaller.
RESERVED_FDS = 16384


def fd_budget() -> int:
    """The perf fds this process may hold: its soft RLIMIT_NOFILE (koordd raises it to the hard one) less
    what its other files need."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft - min(soft // 2, RESERVED_FDS)


class Group(Protocol):
    def read(self) -> GroupReading: ...

    def close(self) -> None: ...


OpenGroup = Callable[[Sequence[Event], int, int], Group]     # (events, fd of the cgroup's directory, cpu)
PLUMBING = (TASK_CLOCK, CONTEXT_SWITCHES)   # any kernel with perf has them: tells the PMU from the rest


@dataclass(frozen=True)
class Counts:
    """What a cgroup counted since the previous update(), over every CPU."""
    values: Mapping[str, float]     # event name -> count, scaled by enabled/running per CPU
    enabled_ns: int                 # summed over CPUs: 0 when no task of the cgroup ran
    running_ns: int

    @property
    def running_fraction(self) -> float | None:
        """Time on the PMU / time enabled: under 1 when the counters took turns with others."""
        return self.running_ns / self.enabled_ns if self.enabled_ns > 0 else None


def scaled_growth(before: GroupReading, after: GroupReading) -> tuple[tuple[float, ...], int, int] | None:
    """(each value's growth scaled by Δenabled / Δrunning, Δenabled, Δrunning); None if the reads disagree."""
    enabled, running = after.enabled - before.enabled, after.running - before.running
    if enabled < 0 or running < 0 or len(before.values) != len(after.values):
        return None
    # Never on the PMU: nothing counted, and nothing to scale up from.
    scale = enabled / running if running > 0 else 0.0
    return tuple((a - b) * scale for a, b in zip(after.values, before.values)), enabled, running


@dataclass
class _Counted:
    """One cgroup's open groups and their last readings."""
    inode: int
    groups: dict[int, Group] = field(default_factory=dict)              # cpu -> group
    last: dict[int, GroupReading] = field(default_factory=dict)         # cpu -> previous read


class CgroupCounters:
    """`events` counted per cgroup of the v2 tree under `v2_root`, one group per CPU in `cpus`."""

    def __init__(self, events: Sequence[Event], v2_root: Path | str, cpus: Sequence[int],
                 open_group: OpenGroup = CounterGroup.open_cgroup, max_fds: int | None = None):
        self.events, self.v2_root, self.cpus = tuple(events), str(v2_root), tuple(cpus)
        self._open_group, self.max_fds = open_group, max_fds
        self._counted: dict[str, _Counted] = {}
        self._room = True           # False from an EMFILE or the budget's end until a counted cgroup goes
        self._said: set[str] = set()

    @property
    def fds(self) -> int:
        return len(self._counted) * len(self.cpus) * len(self.events)

    def update(self, cgroups: Iterable[str]) -> dict[str, Counts]:
        """cgroup -> its Counts since the previous update, for the `cgroups` (paths relative to the v2
        root) counted then too; those seen the first time are opened and count from now on."""
        wanted = list(dict.fromkeys(cgroups))
        for cgroup in set(self._counted) - set(wanted):
            self._close(cgroup)
        out = {}
        for cgroup in wanted:
            path = f"{self.v2_root}/{cgroup}" if cgroup else self.v2_root
            try:
                inode = os.stat(path).st_ino
            except OSError:
                inode = None            # gone (or not in the v2 tree): nothing to count
            counted = self._counted.get(cgroup)
            if counted is not None and counted.inode != inode:
                self._close(cgroup)
                counted = None
            if inode is None:
                continue
            if counted is None:
                if self._room and self._within_budget():
                    self._open(cgroup, path, inode)
                continue
            counts = self._read(cgroup, counted)
            if counts is not None:
                out[cgroup] = counts
        return out

    def counting(self, cgroup: str) -> bool:
        """Whether `cgroup`'s counters are open (from the update() that first saw it): not when it is gone,
        past the fd budget, or its open failed."""
        return cgroup in self._counted

    def close(self) -> None:
        for cgroup in list(self._counted):
            self._close(cgroup)

    def _open(self, cgroup: str, path: str, inode: int) -> None:
        counted = _Counted(inode)
        try:
            # The directory fd only names the cgroup: each perf event takes its own reference.
            dirfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                for cpu in self.cpus:
                    counted.groups[cpu] = self._open_group(self.events, dirfd, cpu)
            finally:
                os.close(dirfd)
        except OSError as e:
            for group in counted.groups.values():
                group.close()
            self._open_failed(cgroup, e)
            return
        self._counted[cgroup] = counted
        self._read(cgroup, counted)     # the baseline: counts start from here

    def _within_budget(self) -> bool:
        if self.max_fds is None or self.fds + len(self.cpus) * len(self.events) <= self.max_fds:
            return True
        self._room = False
        self._say("fds", "perf counters: %d cgroups counted hold %d fds, and the next would pass the %d they may "
                  "(RLIMIT_NOFILE %d less koordd's other files): cgroups beyond these go without until one goes; "
                  "raise LimitNOFILE", len(self._counted), self.fds, self.max_fds,
                  resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        return False

    def _open_failed(self, cgroup: str, e: OSError) -> None:
        if e.errno in OUT_OF_FDS:
            self._room = False
            self._say("fds", "perf counters: out of file descriptors (%s) with %d cgroups counted (%d perf fds, "
                      "RLIMIT_NOFILE %d): cgroups beyond these go without until one goes; raise LimitNOFILE",
                      errno.errorcode[e.errno], len(self._counted), self.fds,
                      resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        elif e.errno != errno.ENOENT:   # ENOENT: the cgroup went while being opened, normal churn
            self._say(f"open {e.errno}", "perf counters cannot be opened for %s (and maybe others): %s",
                      cgroup, e)

    def _read(self, cgroup: str, counted: _Counted) -> Counts | None:
        """The growth since the last read (None on the first), which becomes the new last read."""
        values = [0.0] * len(self.events)
        enabled = running = 0
        first = not counted.last
        for cpu, group in counted.groups.items():
            try:
                now = group.read()
            except (OSError, ValueError) as e:
                self._say(f"read {type(e).__name__}", "perf counters of %s on CPU %d unreadable (and maybe "
                          "others'), left out of their sums: %s", cgroup, cpu, e)
                continue
            before, counted.last[cpu] = counted.last.get(cpu), now
            growth = scaled_growth(before, now) if before is not None else None
            if growth is None:
                continue
            scaled, de, dr = growth
            values = [v + s for v, s in zip(values, scaled)]
            enabled, running = enabled + de, running + dr
        if first:
            return None
        return Counts({e.name: v for e, v in zip(self.events, values)}, enabled, running)

    def _close(self, cgroup: str) -> None:
        for group in self._counted.pop(cgroup).groups.values():
            group.close()
        self._room = True

    def _say(self, key: str, msg: str, *args) -> None:
        """Log once per kind of trouble: these repeat every round while the cause stays."""
        if key not in self._said:
            self._said.add(key)
            log.warning(msg, *args)


def start_counters(events: Sequence[Event], cgroup_root: Path, sys_root: Path, proc_root: Path,
                   open_group: OpenGroup = CounterGroup.open_cgroup) -> CgroupCounters:
    """CgroupCounters of `events` on every online CPU, in the v2 tree under `cgroup_root` (the unified tree
    on hybrid hosts). First software events on the tree's root (does cgroup-mode counting work at all?),
    then `events`: SensorUnavailable saying which failed and what that likely means (perf.explain)."""
    try:
        v2_root = detect_layout(cgroup_root).unified
    except LayoutError as e:
        raise SensorUnavailable(str(e)) from None
    if v2_root is None:
        raise SensorUnavailable(f"no cgroup v2 tree under {cgroup_root}: perf counts cgroups of the v2 tree")
    try:
        cpus = online_cpus(sys_root)
    except (OSError, ValueError) as e:
        raise SensorUnavailable(f"online CPUs unknown: {e}") from None
    if not cpus:
        raise SensorUnavailable(f"no online CPU in {sys_root}/devices/system/cpu/online")
    for probe in (PLUMBING, events):
        error = probe_cgroup_mode(probe, v2_root, cpus[0], open_group)
        if error is not None:
            raise SensorUnavailable(explain(error, _paranoid(proc_root)))
    return CgroupCounters(events, v2_root, cpus, open_group, max_fds=fd_budget())


def _paranoid(proc_root: Path) -> str | None:
    try:
        return (proc_root / "sys/kernel/perf_event_paranoid").read_text().strip()
    except OSError:
        return None
