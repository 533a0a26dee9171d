"""A fake of koordd.kernel.perf's CounterGroup.open_cgroup, over a temporary v2 tree of plain directories.

It finds the cgroup the way the kernel does, from the directory fd it is given;
the test sets what each (cgroup, CPU) group reads, cumulative as the kernel's,
and which opens fail with which errno: per (cgroup, CPU), or per event wherever
it is asked for (a PMU without it). `limit` stands for RLIMIT_NOFILE: past that
many open events, an open fails with EMFILE.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

from koordd.kernel.perf import GroupReading, PerfOpenError


class FakeGroup:
    def __init__(self, perf: "FakePerf", cgroup: str, cpu: int, events):
        self.perf, self.cgroup, self.cpu, self.events = perf, cgroup, cpu, tuple(events)
        self.closed = False

    def read(self) -> GroupReading:
        got = self.perf.readings.get((self.cgroup, self.cpu), GroupReading(0, 0, (0,) * len(self.events)))
        if isinstance(got, Exception):
            raise got
        return got

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.perf.groups.remove(self)


class FakePerf:
    def __init__(self, root: Path, limit: int | None = None):
        self.root = Path(root).resolve()
        self.limit = limit
        self.groups: list[FakeGroup] = []                   # open now
        self.tries: list[tuple[str, int]] = []              # every open asked for: (cgroup, cpu)
        self.readings: dict[tuple[str, int], GroupReading | Exception] = {}
        self.fail: dict[tuple[str, int], int] = {}          # (cgroup, cpu) -> errno of its open
        self.refuse: dict[str, int] = {}                    # event name -> errno of every open that holds it

    def __call__(self, events, cgroup_fd: int, cpu: int) -> FakeGroup:
        path = Path(os.readlink(f"/proc/self/fd/{cgroup_fd}"))
        cgroup = "" if path == self.root else str(path.relative_to(self.root))
        self.tries.append((cgroup, cpu))
        refused = [e for e in events if e.name in self.refuse]     # the first of them fails, as in the kernel
        if refused:
            raise PerfOpenError(self.refuse[refused[0].name], refused[0])
        err = self.fail.get((cgroup, cpu))
        if err is None and self.limit is not None and self.fds + len(events) > self.limit:
            err = errno.EMFILE
        if err is not None:
            raise PerfOpenError(err, events[0])
        group = FakeGroup(self, cgroup, cpu, events)
        self.groups.append(group)
        return group

    @property
    def fds(self) -> int:
        return sum(len(g.events) for g in self.groups)

    def open_for(self, cgroup: str) -> list[int]:
        """The CPUs on which `cgroup` has an open group."""
        return sorted(g.cpu for g in self.groups if g.cgroup == cgroup)

    def set(self, cgroup: str, cpu: int, enabled: int, running: int, *values: int) -> None:
        self.readings[(cgroup, cpu)] = GroupReading(enabled, running, values)
