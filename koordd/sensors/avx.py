"""AVX sensor: which sampled cgroups' threads used AVX-512 recently, on which CPUs, and who shares them.

An optional sensor (sensors/contract.py), the snapshot's "avx" section: an AvxSection. Each round it lists
the threads of every sampled cgroup and below (threads.cgroup_threads) and reads two small files of each,
`arch_status` and `stat` (koordd/avx.py), each thread once however many sampled cgroups hold it. A thread
counts as an AVX-512 thread when the kernel saw it using AVX-512 within `recent_ms` (100 ms); the CPUs
such threads last ran on, with their SMT siblings, run at a lowered frequency, and the cgroups whose
other threads ran on them are the victims. A thread "ran" when it is runnable now or its CPU time grew
since the previous round (in the first round: runnable only), so a thread asleep for an hour is not a
victim of the CPU it last used.

What it cannot see: AVX2 (arch_status reports AVX-512 state only), tasks outside the sampled cgroups
(their AVX-512 use slows victims unseen), and a thread using AVX-512 without a context switch (its
elapsed time is measured from its last one). Unavailable where the kernel has no arch_status (not x86,
before 5.3) or it has no AVX512_elapsed_ms line (a CPU without AVX-512).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..avx import ThreadAvx, parse_arch_status, read_siblings, read_thread, recent, with_siblings
from ..backend import TargetGone
from ..cgroups import DEFAULT_ROOT, CgroupFS, LayoutError, detect_layout
from ..snapshot import AVX
from ..threads import cgroup_threads
from .contract import OptionalSensor, SensorContext, SensorUnavailable

RECENT_MS = 100


@dataclass(frozen=True)
class AvxUse:
    threads: int                        # threads of the cgroup and below read this round
    avx512_threads: int                 # of them, seen using AVX-512 within recent_ms
    min_elapsed_ms: int | None          # the latest AVX-512 use of any of them, ms ago; None: never any
    cpus: frozenset[int]                # where the AVX-512 threads last ran


@dataclass(frozen=True)
class AvxSection:
    cgroups: Mapping[str, AvxUse] = field(default_factory=dict)
    cpus: frozenset[int] = frozenset()  # CPUs an AVX-512 thread last ran on, and their SMT siblings
    # cgroup -> the CPUs of `cpus` where its threads that are not AVX-512 threads ran: the victims
    victims: Mapping[str, frozenset[int]] = field(default_factory=dict)


class AvxSensor(OptionalSensor):
    name = AVX

    def __init__(self, cgroup_root: Path | str = DEFAULT_ROOT, proc_root: Path | str = "/proc",
                 sys_root: Path | str = "/sys", recent_ms: float = RECENT_MS):
        self.cgroup_root, self.proc, self.sys = Path(cgroup_root), Path(proc_root), Path(sys_root)
        self.recent_ms = recent_ms
        self.fs: CgroupFS | None = None
        self.siblings: dict[int, frozenset[int]] = {}
        self.ticks: dict[int, int] = {}     # tid -> its CPU ticks at the previous round

    def start(self) -> None:
        why = self._why_unavailable()
        if why:
            raise SensorUnavailable(why)
        try:
            self.fs = CgroupFS(detect_layout(self.cgroup_root))
        except LayoutError as e:
            raise SensorUnavailable(str(e)) from None
        self.siblings = read_siblings(self.sys)

    def _why_unavailable(self) -> str | None:
        try:
            status = (self.proc / "self/arch_status").read_text()
        except OSError:
            return f"no {self.proc}/self/arch_status: the kernel reports no AVX use (x86 only, 5.3+)"
        if parse_arch_status(status) is not None:
            return None
        try:
            flags = (self.proc / "cpuinfo").read_text().split()
        except OSError:
            flags = []
        if "avx512f" not in flags:
            return "the CPU has no AVX-512 (no avx512f in cpuinfo): arch_status reports AVX-512 use only"
        return f"{self.proc}/self/arch_status has no AVX512_elapsed_ms line"

    def sample(self, context: SensorContext) -> AvxSection:
        if self.fs is None:
            return AvxSection()
        seen: dict[int, ThreadAvx | None] = {}
        members: dict[str, list[int]] = {}          # cgroup -> its threads still there when read
        for cgroup in context.cgroups:
            try:
                tids = cgroup_threads(self.fs, cgroup)
            except TargetGone:
                continue
            for tid in tids:
                if tid not in seen:
                    seen[tid] = read_thread(self.proc, tid)     # None: exited since the listing
            members[cgroup] = [tid for tid in tids if seen[tid] is not None]
        threads = {tid: t for tid, t in seen.items() if t is not None}
        avx = {tid for tid, t in threads.items() if recent(t.elapsed_ms, self.recent_ms)}
        ran = {tid for tid, t in threads.items() if self._ran(tid, t)}
        self.ticks = {tid: t.stat.cpu_ticks for tid, t in threads.items()}

        uses = {}
        for cgroup, tids in members.items():
            ever = [threads[tid].elapsed_ms for tid in tids if threads[tid].elapsed_ms >= 0]
            uses[cgroup] = AvxUse(len(tids), sum(tid in avx for tid in tids), min(ever, default=None),
                                  frozenset(threads[tid].stat.cpu for tid in tids if tid in avx))
        slowed = with_siblings((threads[tid].stat.cpu for tid in avx), self.siblings)
        victims = {}
        for cgroup, tids in members.items():
            shared = frozenset(threads[tid].stat.cpu for tid in tids
                               if tid in ran and tid not in avx and threads[tid].stat.cpu in slowed)
            if shared:
                victims[cgroup] = shared
        return AvxSection(uses, slowed, victims)

    def _ran(self, tid: int, thread: ThreadAvx) -> bool:
        before = self.ticks.get(tid)
        return thread.stat.state == "R" or (before is not None and thread.stat.cpu_ticks > before)

    def stop(self) -> None:
        self.fs = None
        self.ticks = {}
