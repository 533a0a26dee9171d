"""Per-cgroup histograms a BPF program keeps in the kernel, read as deltas per sampled cgroup.

koordd's histogram programs (runq_latency: run-queue waits; app_latency: response times) share one
layout: a `watched` set of the v2 cgroup ids koordd samples, a `resolved` cache (cgroup id -> the deepest
watched cgroup at or above it) koordd empties whenever that set changes, and a hash of watched cgroup id
-> `struct hist {u64 slots[N]; u64 wait_ns;}` (log2 µs, koordd/core/histogram.py), each event counted
once, for the deepest watched cgroup at or above its own. The sum over a sampled cgroup's subtree is
koordd's to add (`enclosing`). A program may keep more maps of the same kind (app_latency: `weighted`,
the same responses with weights), read alongside (`all_deltas`).

Cgroups are those of the v2 tree (the unified tree on hybrid hosts), where an id is the inode number of
the cgroup's directory.
"""
from __future__ import annotations

import ctypes
import os
from bisect import bisect_left
from functools import cache
from pathlib import Path
from typing import Callable, Iterable, Mapping

from koordd.kernel.libbpf import BpfError, BpfObject, ProgramStats
from koordd.sensors.contract import SensorUnavailable

KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")
Counts = tuple[list[int], int]      # (slots, total ns) of a histogram


def below(ordered: list[str], path: str) -> list[str]:
    """Of the sorted `ordered`, `path` itself (if there) and the paths below it: two bisections, since
    "/" sorts right before "0", whatever else shares the prefix ("be-x" next to "be/pod1") is outside."""
    if not path:
        return ordered
    lo, hi = bisect_left(ordered, path + "/"), bisect_left(ordered, path + "0")
    own = [path] if (i := bisect_left(ordered, path)) < len(ordered) and ordered[i] == path else []
    return own + ordered[lo:hi]


def enclosing(paths: Iterable[str]) -> dict[str, list[str]]:
    """Each path -> itself and the paths below it, among `paths` (a class root and its pods)."""
    ordered = sorted(paths)
    return {p: below(ordered, p) for p in ordered}


@cache
def hist_type(slots: int) -> type[ctypes.Structure]:
    """The programs' `struct hist` with `slots` slots."""
    return type(f"Hist{slots}", (ctypes.Structure,),
                {"_fields_": [("slots", ctypes.c_uint64 * slots), ("wait_ns", ctypes.c_uint64)]})


class CgroupHistograms:
    """A histogram program's maps, read as deltas per sampled cgroup. `load` opens and loads the object
    (koordd's loader; unit tests give a fake); `histograms` names its map of watched cgroup -> hist, and
    `more` any further maps of watched cgroup -> hist, read alongside it."""

    def __init__(self, tree: Path, program: Path, histograms: str, slots: int,
                 load: Callable[[Path], BpfObject] = BpfObject, kernel_btf: Path = KERNEL_BTF,
                 more: tuple[str, ...] = ()):
        self.tree, self.program, self.histograms, self.slots = tree, program, histograms, slots
        self.names = (histograms,) + more
        self.load, self.kernel_btf = load, kernel_btf
        self.obj: BpfObject | None = None
        self.watched = self.resolved = self.waits = None    # the program's maps, once loaded
        self.more_maps: list = []                        # the maps of `more`, once loaded
        self.ids: dict[str, int] = {}                    # sampled path -> v2 cgroup id
        self.prev: list[dict[int, Counts]] = [{} for _ in self.names]   # per map: id -> cumulative counts

    def open(self) -> None:
        if not self.kernel_btf.exists():
            raise SensorUnavailable(f"the kernel has no BTF ({self.kernel_btf}: CONFIG_DEBUG_INFO_BTF), "
                                    "which the CO-RE program is relocated against")
        try:
            self.obj = self.load(self.program)
            self.obj.attach_all()
            self.watched = self.obj.map("watched", ctypes.c_uint64, ctypes.c_uint8)
            self.resolved = self.obj.map("resolved", ctypes.c_uint64, ctypes.c_uint64)
            self.waits, *self.more_maps = [self.obj.map(name, ctypes.c_uint64, hist_type(self.slots))
                                           for name in self.names]
        except BpfError as e:
            self.close()
            raise SensorUnavailable(f"the BPF program did not load: {e}") from None

    def close(self) -> None:
        if self.obj is not None:
            self.obj.close()
            self.obj = None

    def stats(self) -> list[ProgramStats]:
        return self.obj.stats() if self.obj is not None else []

    def _watch(self, paths: Iterable[str]) -> None:
        """Keep the program's `watched` set to the sampled cgroups; a change empties its cache of
        cgroup -> watched ancestor, and a cgroup that went away loses its histogram."""
        want: dict[str, int] = {}
        for p in paths:
            if p in self.ids:
                want[p] = self.ids[p]
                continue
            try:
                want[p] = os.stat(self.tree / p).st_ino
            except OSError:
                continue            # not in the v2 tree (a v1-only cgroup) or gone
        if want == self.ids:
            return
        for p, cid in self.ids.items():
            if want.get(p) != cid:
                for table in (self.watched, self.waits, *self.more_maps):
                    table.delete(ctypes.c_uint64(cid))
                for prev in self.prev:
                    prev.pop(cid, None)
        for p, cid in want.items():
            if self.ids.get(p) != cid:
                self.watched.update(ctypes.c_uint64(cid), ctypes.c_uint8(1))
        self.resolved.clear()
        self.ids = want

    def deltas(self, paths: Iterable[str]) -> dict[str, Counts]:
        """Each sampled path -> (slots, total ns) counted in its subtree since the last read (since it
        was first watched, the first time); a path whose subtree counted nothing is left out."""
        return {path: counts[0] for path, counts in self.all_deltas(paths).items()}

    def all_deltas(self, paths: Iterable[str]) -> dict[str, list[Counts]]:
        """As deltas, with each map's counts (in the order of self.names); a path is left out where the
        first map counted nothing in its subtree."""
        self._watch(list(paths))
        path_of = {cid: p for p, cid in self.ids.items()}
        per_map = [self._deltas(table, i, path_of) for i, table in enumerate([self.waits, *self.more_maps])]
        sums = [self._subtrees(delta, path_of) for delta in per_map]
        out = {}
        for path in sorted(sums[0]):        # the order enclosing(self.ids) gave
            first = sums[0][path]
            if sum(first[0]) > 0:
                out[path] = [first] + [more.get(path) or ([0] * self.slots, 0) for more in sums[1:]]
        return out

    def _subtrees(self, delta: dict[int, Counts], path_of: dict[int, str]) -> dict[str, Counts]:
        """Each sampled path -> the sum of `delta` over its subtree (itself and the sampled paths below it,
        as enclosing() groups them), for the paths whose subtree has an entry in `delta`. Each entry is added
        to its path's sampled ancestors: the map holds the cgroups whose threads waited, a few of hundreds
        of pods, where summing each sampled path's subtree cost a pass over every pod every round."""
        out: dict[str, Counts] = {}
        ids = self.ids
        for cid, (slots, total_ns) in delta.items():
            q = path_of.get(cid)
            while q is not None:
                if q in ids:
                    have = out.get(q)
                    out[q] = (list(slots), total_ns) if have is None else \
                        ([a + b for a, b in zip(have[0], slots)], have[1] + total_ns)
                q = q.rpartition("/")[0] if q else None
        return out

    def _deltas(self, table, i: int, watched: Mapping[int, str]) -> dict[int, Counts]:
        """Map `table` (self.names[i]'s): cgroup id -> its counts since the last read. An entry of a cgroup
        no longer watched is deleted: a wait stamped before its cgroup was unwatched (runq_latency keeps
        the cgroup in the stamp), or resolved from the cache just before _watch emptied it, counts after
        _watch deleted the histogram and makes it anew; left, such entries would fill the map for good.
        `watched`: the watched cgroups' ids (to their paths, as all_deltas has them)."""
        by_id = {}
        for k, v in table.items():
            if k.value in watched:
                by_id[k.value] = (list(v.slots), int(v.wait_ns))
            else:
                table.delete(k)
        delta: dict[int, Counts] = {}
        for cid, (slots, total_ns) in by_id.items():
            old = self.prev[i].get(cid)
            if old is None:
                delta[cid] = (slots, total_ns)      # counted since this cgroup was first watched
            else:
                delta[cid] = ([a - b for a, b in zip(slots, old[0])], total_ns - old[1])
        self.prev[i] = by_id
        return delta
