"""Per-cgroup CPU usage, throttling, memory, PSI and the current values of the knobs loops reason about.

Rates are computed against the previous sample of the same cgroup, so the first
sample of a cgroup has cpu_usage None. A file that is missing (controller not
enabled, cgroup vanished, kernel too old) yields None, never an exception. So does a file that is
there but does not parse, with one warning per field saying which cgroup's file and why: a kernel
whose format koordd does not know should not look like a cgroup that merely lacks a controller.
"""
from __future__ import annotations

import dataclasses
import logging

from koordd.backends.cgroup_knobs import KNOBS, PAGE_SIZE
from koordd.core.snapshot import CGROUP_FIELDS, CgroupSample, PressureStat, Refaults, Throttling
from koordd.kernel.cgroupfs import CgroupFS, CgroupGone
from koordd.sensors.psi import parse_psi, with_growth

log = logging.getLogger("koordd.sensors")


# Sample fields that are a knob's current value, as the actuator reads it.
KNOB_FIELDS = (("cpu_max", "cpu.max"), ("cpu_max_burst", "cpu.max.burst"), ("cpuset_cpus", "cpuset.cpus"),
               ("cpu_weight", "cpu.weight"), ("memory_max", "memory.max"))


def flat_keyed(text: str, *keys: str, strict: bool = False) -> dict[str, int]:
    """The named keys of a flat-keyed file ("usage_usec 12\\nnr_periods 3"), found by search rather than
    by parsing every line: memory.stat has some 40 lines of which a loop wants two. A key whose value is
    not an integer is left out, or with `strict` a ValueError naming it."""
    out = {}
    for key in keys:
        needle = key + " "
        if text.startswith(needle):
            start = len(needle)
        else:
            i = text.find("\n" + needle)
            if i < 0:
                continue
            start = i + 1 + len(needle)
        end = text.find("\n", start)
        try:
            out[key] = int(text[start:end] if end >= 0 else text[start:])
        except ValueError:
            if strict:
                raise ValueError(f"{key} is not an integer: {text[start:end][:40]!r}") from None
    return out


# The fields each step of sample() reads: a step whose fields were not asked for costs one set test.
_PRESSURE_FIELDS = frozenset(f"{res}_pressure" for res in ("cpu", "memory", "io"))
_KNOB_FIELD_NAMES = frozenset(field for field, _ in KNOB_FIELDS)
_MEMORY_FIELDS = frozenset(("frozen", "memory_current", "memory_anon", "memory_refaults", "oom_kills"))
# CgroupSample's fields as its constructor sets them: make_sample() fills an instance's __dict__ from these.
_SAMPLE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CgroupSample) if f.name not in ("path", "cls")}


def make_sample(path: str, cls: str, values: dict) -> CgroupSample:
    """CgroupSample(path=path, cls=cls, **values), the same object (equal, same hash and repr), built without
    the frozen dataclass's __init__ (one object.__setattr__ per field, 17 of them): 4 µs of CPU on the 2-CPU
    development host, paid for every cgroup sampled (500 pods: 2 ms a round). `values` holds field names
    only (the sensor's own keys)."""
    sample = object.__new__(CgroupSample)
    attrs = sample.__dict__
    attrs.update(_SAMPLE_DEFAULTS)
    attrs["path"], attrs["cls"] = path, cls
    attrs.update(values)
    return sample


class CgroupSensor:
    def __init__(self, fs: CgroupFS):
        self.fs = fs
        self._prev: dict[str, dict] = {}   # cgroup -> previous counters and their time
        self._garbled: set[str] = set()     # fields already warned about: one warning each, not one a tick
        # Listed-only samples (no field read): immutable, so one object per (cgroup, class) serves every round.
        self._listed: dict[tuple[str, str], CgroupSample] = {}

    def sample(self, cgroup: str, cls: str, now: float, fields: frozenset[str] = CGROUP_FIELDS) -> CgroupSample:
        """The fields asked for; the others stay None (never read)."""
        if not fields:          # listed only (members on a calm tick): no work
            listed = self._listed.get((cgroup, cls))
            if listed is None:
                listed = self._listed[cgroup, cls] = make_sample(cgroup, cls, {})
            return listed
        prev = self._prev.get(cgroup, {})
        cur: dict = {"time": now}
        dt = now - prev["time"] if prev else 0.0
        out: dict = {}
        cpu_stat = _Once(lambda controller: self.fs.read(controller, cgroup, "cpu.stat"))   # v2: one file, two fields
        if "cpu_usage" in fields:
            usage_ns = cur["usage_ns"] = self._try("cpu_usage", cgroup, lambda: self._usage_ns(cgroup, cpu_stat))
            if usage_ns is not None and prev.get("usage_ns") is not None and dt > 0 and usage_ns >= prev["usage_ns"]:
                out["cpu_usage"] = (usage_ns - prev["usage_ns"]) / 1e9 / dt
        if "throttling" in fields:
            thr = self._try("throttling", cgroup, lambda: self._throttling(cgroup, cpu_stat))
            p = prev.get("thr")
            if thr is not None and p is not None and thr.nr_periods >= p.nr_periods:   # else: re-created
                thr = Throttling(thr.nr_periods, thr.nr_throttled, thr.throttled_us,
                                 thr.nr_periods - p.nr_periods, thr.nr_throttled - p.nr_throttled)
            out["throttling"] = cur["thr"] = thr
        if not fields.isdisjoint(_PRESSURE_FIELDS):
            for res in ("cpu", "memory", "io"):
                if f"{res}_pressure" in fields:
                    stat = self._try(f"{res}_pressure", cgroup,
                                     lambda: parse_psi(self.fs.read(None, cgroup, f"{res}.pressure")))
                    out[f"{res}_pressure"] = with_growth(stat, prev.get(res), dt) if stat is not None else None
                    cur[res] = stat
        if not fields.isdisjoint(_KNOB_FIELD_NAMES):
            for field, knob in KNOB_FIELDS:
                if field in fields:
                    out[field] = self._knob(knob, cgroup)
        if len(cur) > 1:
            self._prev[cgroup] = cur    # a sample that read no counter keeps the last one that did
        if fields.isdisjoint(_MEMORY_FIELDS):
            return make_sample(cgroup, cls, out)
        # The kernel flushes its per-CPU statistics to write memory.stat: costly, so read once for every field.
        memory_stat = _Once(lambda controller: self.fs.read(controller, cgroup, "memory.stat"))
        if "frozen" in fields:
            out["frozen"] = _flag(self._knob("cgroup.freeze", cgroup))
        if "memory_current" in fields:
            out["memory_current"] = self._try("memory_current", cgroup, lambda: self._memory_current(cgroup))
        if "memory_anon" in fields:
            out["memory_anon"] = self._try("memory_anon", cgroup, lambda: self._memory_anon(memory_stat))
        if "memory_refaults" in fields:
            out["memory_refaults"] = self._try("memory_refaults", cgroup, lambda: self._refaults(memory_stat))
        if "oom_kills" in fields:
            out["oom_kills"] = self._try("oom_kills", cgroup, lambda: self._oom_kills(cgroup))
        return make_sample(cgroup, cls, out)

    def forget_except(self, alive: set[str]) -> None:
        """Drop history of cgroups that are gone, so a re-created one starts fresh."""
        for cg in set(self._prev) - alive:
            del self._prev[cg]
        for key in [key for key in self._listed if key[0] not in alive]:
            del self._listed[key]

    # --- v1/v2 sources -----------------------------------------------------

    def _v2(self, controller: str) -> bool:
        return controller in self.fs.layout.v2_controllers

    def _usage_ns(self, cgroup: str, cpu_stat: "_Once") -> int:
        if not self._v2("cpu") and "cpuacct" in self.fs.layout.v1:
            return int(self.fs.read("cpuacct", cgroup, "cpuacct.usage"))
        # v2's cpu.stat has usage_usec even without the cpu controller enabled.
        stat = flat_keyed(cpu_stat(None if not self._v2("cpu") else "cpu"), "usage_usec", strict=True)
        return stat["usage_usec"] * 1000

    def _throttling(self, cgroup: str, cpu_stat: "_Once") -> Throttling:
        stat = flat_keyed(cpu_stat("cpu"), "nr_periods", "nr_throttled", "throttled_usec", "throttled_time",
                          strict=True)
        throttled_us = stat["throttled_usec"] if "throttled_usec" in stat else stat["throttled_time"] // 1000
        return Throttling(stat["nr_periods"], stat["nr_throttled"], throttled_us)

    def _memory_current(self, cgroup: str) -> int:
        if self._v2("memory"):
            return int(self.fs.read("memory", cgroup, "memory.current"))
        return int(self.fs.read("memory", cgroup, "memory.usage_in_bytes"))

    def _memory_anon(self, memory_stat: "_Once") -> int:
        text = memory_stat("memory")
        if self._v2("memory"):
            stat = flat_keyed(text, "anon", "unevictable", strict=True)
            return stat["anon"] + stat.get("unevictable", 0)
        stat = flat_keyed(text, "total_rss", "total_unevictable", strict=True)
        return stat["total_rss"] + stat.get("total_unevictable", 0)

    def _refaults(self, memory_stat: "_Once") -> Refaults | None:
        # v1's memory.stat has no workingset counters (and v1 no memory.reclaim, the one use of them):
        # not read at all there.
        if not self._v2("memory"):
            return None
        stat = flat_keyed(memory_stat("memory"), "workingset_refault_file", "workingset_refault_anon", strict=True)
        if "workingset_refault_file" not in stat:
            return None                 # before Linux 5.9 (one workingset_refault): no memory.reclaim either
        pages = (stat["workingset_refault_file"], stat.get("workingset_refault_anon", 0))
        # Counters are u64 page counts: anything else is not what the kernel writes, and an unbounded int
        # would reach a loop's float arithmetic (OverflowError there, not here).
        if not all(0 <= n < 1 << 64 for n in pages):
            raise ValueError(f"workingset_refault_* out of a counter's range: {pages}")
        return Refaults(pages[0] * PAGE_SIZE, pages[1] * PAGE_SIZE)

    def _oom_kills(self, cgroup: str) -> int:
        name = "memory.events" if self._v2("memory") else "memory.oom_control"
        return flat_keyed(self.fs.read("memory", cgroup, name), "oom_kill", strict=True)["oom_kill"]

    def _knob(self, name: str, cgroup: str) -> str | None:
        knob = KNOBS[name]
        return self._try(name, cgroup, lambda: knob.read(self.fs, cgroup)) if knob.supported(self.fs) else None

    def _try(self, field: str, cgroup: str, fn):
        try:
            return fn()
        except (OSError, KeyError, CgroupGone):     # not there: no controller, no such key, gone
            return None
        except ValueError as e:                     # there, but not as the kernel writes it
            if field not in self._garbled:
                self._garbled.add(field)
                log.warning("cgroup sensor: %s of %s does not parse (%s); it reads as unknown wherever it "
                            "does not parse, without another warning", field, cgroup, e)
            return None


class _Once:
    """A file read at most once per sample, whichever field asks first (its errors are re-raised)."""

    def __init__(self, read):
        self.read, self.got = read, {}

    def __call__(self, controller):
        if controller not in self.got:
            try:
                self.got[controller] = (self.read(controller), None)
            except Exception as e:  # noqa: BLE001 - re-raised to each caller, who handles it
                self.got[controller] = (None, e)
        text, error = self.got[controller]
        if error is not None:
            raise error
        return text


def _flag(value: str | None) -> bool | None:
    return None if value is None else value == "1"
