"""Static knob settings of a benchmark setup, written through koordd's own knob table (koordd.backends.cgroup_knobs on
the detected layout, so `cpu.weight` lands in v1 `cpu.shares` on hybrid hosts and `cpu.max` in
`cpu.cfs_quota_us`), checked by the same kernel rules koordd checks, and put back afterwards.
"""
from __future__ import annotations

from koordd.backends.cgroup_knobs import KNOBS, validate
from koordd.kernel.cgroupfs import CgroupFS


def read_knobs(fs: CgroupFS, cgroup: str, names: list[str]) -> dict[str, str]:
    """Current values (canonical v2 text) of the knobs this host has."""
    return {n: KNOBS[n].read(fs, cgroup) for n in names if KNOBS[n].supported(fs)}


class StaticKnobs:
    """with StaticKnobs(fs, "bench/be", {"cpu.idle": "1"}): ... — written on entry, restored on exit.

    Originals are read before the first write, a knob the kernel rewrites as a side effect (cpu.idle
    resets cpu.weight) before the knob that does it; restoring goes in reverse, so cpu.idle is back
    to 0 before cpu.weight gets its value back. The restore is read back and must match."""

    def __init__(self, fs: CgroupFS, cgroup: str, values: dict[str, str]):
        self.fs, self.cgroup, self.values = fs, cgroup, values
        self.saved: list[tuple[str, str]] = []

    def __enter__(self) -> "StaticKnobs":
        order = []
        for name in self.values:
            for knob in KNOBS[name].resets + (name,):
                if knob not in order and KNOBS[knob].supported(self.fs):
                    order.append(knob)
        self.saved = [(knob, KNOBS[knob].read(self.fs, self.cgroup)) for knob in order]
        try:
            for name, value in self.values.items():
                KNOBS[name].write(self.fs, self.cgroup, validate(self.fs, self.cgroup, name, value))
        except BaseException:
            self.restore()
            raise
        return self

    def restore(self) -> None:
        for knob, original in reversed(self.saved):
            KNOBS[knob].write(self.fs, self.cgroup, original)
        now = read_knobs(self.fs, self.cgroup, [k for k, _ in self.saved])
        wrong = {k: (v, now[k]) for k, v in self.saved if now[k] != v}
        if wrong:
            raise RuntimeError(f"{self.cgroup}: knobs not restored (original, now): {wrong}")

    def __exit__(self, *exc) -> None:
        self.restore()
