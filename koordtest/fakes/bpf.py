"""A fake of koordd's BPF loader (koordd/kernel/libbpf.py BpfObject) for a histogram program
(koordd/sensors/cgroup_hist.py's layout: `watched`, `resolved`, and a map of watched cgroup -> hist), so
unit tests drive a sensor without loading anything (tests/conftest.py refuses the real loader there).

`FakeHistObject(histograms)` is the loader: called with the object's path it returns itself, and `count`
stands for the program counting events for a watched cgroup (in `histograms`, or another of its maps of
that kind, `more`).
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from koordd.kernel.libbpf import BpfError


class FakeMap(dict):
    """A loaded map as the loader gives it: ctypes keys and values, items() as (key with .value, value);
    kept here by plain int key."""

    def update(self, k, v, flags=0):
        self[k.value] = v

    def delete(self, k) -> bool:
        return self.pop(k.value, None) is not None

    def items(self):
        return [(SimpleNamespace(value=k), v) for k, v in super().items()]


class FakeHistObject:
    def __init__(self, histograms: str, slots: int, attach_error: str | None = None, more: tuple[str, ...] = ()):
        self.histograms, self.slots, self.attach_error = histograms, slots, attach_error
        self.maps = {"watched": FakeMap(), "resolved": FakeMap(), histograms: FakeMap(),
                     **{name: FakeMap() for name in more}}
        self.path: Path | None = None
        self.attached = self.closed = False

    def __call__(self, path: Path) -> "FakeHistObject":
        self.path = Path(path)
        return self

    def attach_all(self) -> None:
        if self.attach_error:
            raise BpfError(self.attach_error)
        self.attached = True

    def map(self, name: str, key_type, value_type) -> FakeMap:
        return self.maps[name]

    def stats(self) -> list:
        return []

    def close(self) -> None:
        self.closed = True

    def count(self, cgroup_id: int, slot: int, n: int, total_ns: int, table: str | None = None) -> None:
        """The program counting n events of `total_ns` in all, in `slot`, for a watched cgroup (in map
        `table`: the histograms' unless named)."""
        table = self.maps[table or self.histograms]
        h = dict.get(table, cgroup_id) or SimpleNamespace(slots=[0] * self.slots, wait_ns=0)
        h.slots[slot] += n
        h.wait_ns += total_ns
        dict.__setitem__(table, cgroup_id, h)
