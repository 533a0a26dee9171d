"""AVX sensor: which sampled cgroups run wide vector code, how wide, and on which CPUs.

An optional sensor (sensors/contract.py), the snapshot's "avx" section: an AvxSection, one AvxUse per
sampled cgroup. Two sources:

- arch_status, always: each round it lists the threads of every sampled cgroup and below
  (threads.cgroup_threads) and reads two small files of each, `arch_status` and `stat` (koordd/kernel/avx.py),
  each thread once however many sampled cgroups hold it. A thread counts as an AVX-512 thread when the
  kernel saw its AVX-512 state in use within `recent_ms` (100 ms); `cpus` are where such threads last
  ran, `ran_cpus` where any of the cgroup's threads that ran this round last ran. A thread "ran" when it
  is runnable now or its CPU time grew since the previous round (in the first round: runnable only), so
  a thread asleep for an hour is not counted on the CPU it last used.
- the PMU's licence counters, where the CPU is a model known to have them (koordd/kernel/avx.py's
  LICENCE_MODELS) and they open: cycles, CORE_POWER.LVL1_TURBO_LICENSE and LVL2_TURBO_LICENSE counted per
  cgroup of the v2 tree as sensors/cpi.py counts cycles (sensors/cgroup_counters.py). A counted cgroup's
  `licence` holds the shares of its cycles at licence 1 and 2 over the round and the level they make
  (avx.licence_of); None in its first round (its counters open then) or when its group never got on the
  PMU. It is the better evidence: it sees AVX2, and tells heavy AVX-512 use from glibc's EVEX string
  functions. A cgroup the PMU does not count (past the fd budget, or not in the v2 tree) has arch_status.
  Where the counters cannot be had (no PMU, as in most VMs; another CPU model; no v2 tree) the sensor says
  why once, in the log and in `detail` (koordctl doctor), and goes on with arch_status alone.

What it cannot see: tasks outside the sampled cgroups (their wide code slows neighbours unseen), and,
without the PMU, AVX2 and a thread using AVX-512 without a context switch (its elapsed time is measured
from its last one). Unavailable where the kernel has no arch_status (not x86, before 5.3) or it has no
AVX512_elapsed_ms line (a CPU without AVX-512). The licence counters cost cgroups x CPUs x 3 fds.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from koordd.backends.threads import cgroup_threads
from koordd.core.avx import LICENCE_SHARE, Licence, licence_of, recent
from koordd.core.backend import TargetGone
from koordd.core.snapshot import AVX
from koordd.kernel.avx import (LICENCE_EVENTS, LVL1_TURBO_LICENSE, LVL2_TURBO_LICENSE, ThreadAvx,
    licence_events_missing, parse_arch_status, parse_cpuinfo, read_thread)
from koordd.kernel.cgroupfs import CgroupFS, DEFAULT_ROOT, LayoutError, detect_layout
from koordd.kernel.perf import CYCLES, CounterGroup
from koordd.sensors.cgroup_counters import CgroupCounters, Counts, OpenGroup, start_counters
from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable

log = logging.getLogger(__name__)
RECENT_MS = 100


@dataclass(frozen=True)
class AvxUse:
    threads: int                        # threads of the cgroup and below read this round
    avx512_threads: int                 # of them, seen using AVX-512 within recent_ms
    min_elapsed_ms: int | None          # the latest AVX-512 use of any of them, ms ago; None: never any
    cpus: frozenset[int]                # where the AVX-512 threads last ran
    ran_cpus: frozenset[int] = frozenset()  # where its threads that ran this round last ran
    counted: bool = False               # the PMU counts it (its counters are open)
    licence: Licence | None = None      # the PMU's count of the round and its level; None: none (yet)


@dataclass(frozen=True)
class AvxSection:
    cgroups: Mapping[str, AvxUse] = field(default_factory=dict)


class AvxSensor(OptionalSensor):
    name = AVX

    def __init__(self, cgroup_root: Path | str = DEFAULT_ROOT, proc_root: Path | str = "/proc",
                 sys_root: Path | str = "/sys", recent_ms: float = RECENT_MS, licence_share: float = LICENCE_SHARE,
                 open_group: OpenGroup = CounterGroup.open_cgroup):
        self.cgroup_root, self.proc, self.sys = Path(cgroup_root), Path(proc_root), Path(sys_root)
        self.recent_ms, self.licence_share = recent_ms, licence_share
        self._open_group = open_group       # perf, or a fake in tests
        self.fs: CgroupFS | None = None
        self.ticks: dict[int, int] = {}     # tid -> its CPU ticks at the previous round
        self.counters: CgroupCounters | None = None
        self.why_no_pmu: str | None = None

    def start(self) -> None:
        why = self._why_unavailable()
        if why:
            raise SensorUnavailable(why)
        try:
            self.fs = CgroupFS(detect_layout(self.cgroup_root))
        except LayoutError as e:
            raise SensorUnavailable(str(e)) from None
        self.why_no_pmu = licence_events_missing(parse_cpuinfo(self._cpuinfo()))
        if self.why_no_pmu is None:
            try:
                self.counters = start_counters(LICENCE_EVENTS, self.cgroup_root, self.sys, self.proc,
                                               self._open_group)
            except SensorUnavailable as e:
                self.why_no_pmu = str(e)
        if self.why_no_pmu:
            log.info("avx sensor: AVX-512 from arch_status alone, AVX2 unseen: no PMU licence counters: %s",
                     self.why_no_pmu)

    @property
    def detail(self) -> str | None:
        """For koordctl doctor: its sources, and why not the PMU."""
        if self.fs is None:
            return None
        if self.counters is not None:
            return "arch_status and the PMU's licence counters"
        return f"arch_status alone (AVX2 unseen): no PMU licence counters: {self.why_no_pmu}"

    def _cpuinfo(self) -> str:
        try:
            return (self.proc / "cpuinfo").read_text()
        except OSError:
            return ""

    def _why_unavailable(self) -> str | None:
        try:
            status = (self.proc / "self/arch_status").read_text()
        except OSError:
            return f"no {self.proc}/self/arch_status: the kernel reports no AVX use (x86 only, 5.3+)"
        if parse_arch_status(status) is not None:
            return None
        if "avx512f" not in self._cpuinfo().split():
            return "the CPU has no AVX-512 (no avx512f in cpuinfo): arch_status reports AVX-512 use only"
        return f"{self.proc}/self/arch_status has no AVX512_elapsed_ms line"

    def sample(self, context: SensorContext) -> AvxSection:
        if self.fs is None:
            return AvxSection()
        threads, members = self._read_threads(context.cgroups)
        avx = {tid for tid, t in threads.items() if recent(t.elapsed_ms, self.recent_ms)}
        ran = {tid for tid, t in threads.items() if self._ran(tid, t)}
        self.ticks = {tid: t.stat.cpu_ticks for tid, t in threads.items()}
        counts = self.counters.update(context.cgroups) if self.counters is not None else {}
        uses = {}
        for cgroup, tids in members.items():
            ever = [threads[tid].elapsed_ms for tid in tids if threads[tid].elapsed_ms >= 0]
            seen = min(ever, default=None)
            uses[cgroup] = AvxUse(len(tids), sum(tid in avx for tid in tids), seen,
                                  frozenset(threads[tid].stat.cpu for tid in tids if tid in avx),
                                  frozenset(threads[tid].stat.cpu for tid in tids if tid in ran),
                                  self.counters is not None and self.counters.counting(cgroup),
                                  self._licence(counts.get(cgroup), seen is not None))
        return AvxSection(uses)

    def _read_threads(self, cgroups) -> tuple[dict[int, ThreadAvx], dict[str, list[int]]]:
        """Every thread of the cgroups read once -> what it showed; cgroup -> its threads still there."""
        seen: dict[int, ThreadAvx | None] = {}
        members: dict[str, list[int]] = {}
        for cgroup in cgroups:
            try:
                tids = cgroup_threads(self.fs, cgroup)
            except TargetGone:
                continue
            for tid in tids:
                if tid not in seen:
                    seen[tid] = read_thread(self.proc, tid)     # None: exited since the listing
            members[cgroup] = [tid for tid in tids if seen[tid] is not None]
        return {tid: t for tid, t in seen.items() if t is not None}, members

    def _licence(self, counts: Counts | None, avx512_seen: bool) -> Licence | None:
        """The cgroup's licence over the round: None where not counted, or never on the PMU (no telling)."""
        if counts is None or (counts.enabled_ns > 0 and counts.running_ns == 0):
            return None
        values = counts.values
        return licence_of(values[CYCLES.name], values[LVL1_TURBO_LICENSE.name], values[LVL2_TURBO_LICENSE.name],
                          avx512_seen, self.licence_share)

    def _ran(self, tid: int, thread: ThreadAvx) -> bool:
        before = self.ticks.get(tid)
        return thread.stat.state == "R" or (before is not None and thread.stat.cpu_ticks > before)

    def stop(self) -> None:
        if self.counters is not None:
            self.counters.close()
            self.counters = None
        self.fs = None
        self.ticks = {}
