"""Run-queue latency per cgroup: how long its threads waited runnable before they ran.

Two sources, the better one the host allows, chosen at start():
- "ebpf": koordd/bpf/runq_latency.bpf.o, a CO-RE object loaded by koordd's loader (libbpf); every wait
  goes into a log2 histogram of the deepest sampled cgroup at or above the thread's own (read by
  sensors/cgroup_hist.py, as the application latency's), so a round has p50/p99/max and an exact mean.
  Needs libbpf1 and a kernel with BTF (/sys/kernel/btf/vmlinux); no compiler, no headers.
- "schedstat": Δrun_delay / Δtimeslices from /proc/<tid>/schedstat of every thread of the cgroup and
  below: a mean wait per timeslice only, and from the kernel's books, which miss the time between a wake-up
  that preempts and the switch (the run queue's clock is left alone until then: 0.01 µs against the eBPF
  program's 7.7 µs for one sleeper, docs/benchmarks.md). One file read per thread per round, so only for the cgroups of
  the latency-sensitive classes, whose waits the loops read; BE's and SYSTEM's stay out of the section.

Cgroups are those of the v2 tree (the unified tree on hybrid hosts), where an id is the inode number
of the cgroup's directory; a pure v1 host falls back to the cpu hierarchy's `tasks` for schedstat.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Iterable, Mapping

from koordd.core.classes import LATENCY_SENSITIVE
from koordd.core.histogram import quantile_us, slot_upper_us
from koordd.core.snapshot import RUNQ_LATENCY, RunqLatency
from koordd.kernel import bpf_objects
from koordd.kernel.bpf_shared import RUNQ_SLOTS
from koordd.kernel.cgroupfs import DEFAULT_ROOT, Layout, LayoutError, detect_layout, thread_ids
from koordd.kernel.host_probe import Host, yes
from koordd.kernel.kfiles import read_small
from koordd.kernel.libbpf import BpfError, BpfObject, libbpf
from koordd.sensors.cgroup_hist import KERNEL_BTF, CgroupHistograms, below, enclosing  # enclosing: still runq's too
from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable

log = logging.getLogger(__name__)
PROGRAM = bpf_objects.RUNQ_LATENCY
SLOTS = RUNQ_SLOTS              # koordd_shared.h's: slot k holds waits of [2^(k-1), 2^k) µs
EBPF, SCHEDSTAT = "ebpf", "schedstat"
DEFAULT_SOURCES = (EBPF, SCHEDSTAT)     # in the order tried


# --- histograms -------------------------------------------------------------------------------

def summarize(slots: list[int], wait_ns: int) -> RunqLatency | None:
    count = sum(slots)
    if count <= 0:
        return None
    top = max(i for i, n in enumerate(slots) if n)
    return RunqLatency(EBPF, count, wait_ns / 1000 / count, quantile_us(slots, 0.50), quantile_us(slots, 0.99),
                       slot_upper_us(top), tuple(slots[:top + 1]))


def outermost(paths: Iterable[str]) -> list[str]:
    """The paths no other of them encloses."""
    given = set(paths)
    return sorted(p for p in given if p == "" or not any(
        "/".join(p.split("/")[:n]) in given for n in range(0 if "" in given else 1, p.count("/") + 1)))


# --- the eBPF source ---------------------------------------------------------------------------

class EbpfSource(CgroupHistograms):
    """The run-queue program's histograms of waits (its map `waits`), per sampled cgroup and round."""

    def __init__(self, tree: Path, program: Path = PROGRAM, load: Callable[[Path], BpfObject] = BpfObject,
                 kernel_btf: Path = KERNEL_BTF):
        super().__init__(tree, program, "waits", SLOTS, load, kernel_btf)

    def read(self, paths: Iterable[str]) -> dict[str, RunqLatency]:
        return {path: summarize(slots, wait_ns) for path, (slots, wait_ns) in self.deltas(paths).items()}


# --- the schedstat source ----------------------------------------------------------------------

def descendants(cgroup_dir: str) -> int | None:
    """nr_descendants of a v2 cgroup (its live cgroups below, at any depth); None where there is no
    cgroup.stat (v1) or it cannot be read."""
    try:
        for line in read_small(f"{cgroup_dir}/cgroup.stat").splitlines():
            name, _, value = line.partition(" ")
            if name == "nr_descendants" and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None


def read_schedstat(proc: Path, tid: int) -> tuple[int, int] | None:
    """(run_delay ns, timeslices) of a thread; None once it has exited."""
    try:
        fd = os.open(f"{proc}/{tid}/schedstat", os.O_RDONLY)
        try:
            fields = os.read(fd, 128).split()
        finally:
            os.close(fd)
        return int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


class SchedstatSource:
    """Mean wait per timeslice from the threads' schedstat, summed over each cgroup's subtree."""

    def __init__(self, tree: Path, threads_file: str, proc: Path):
        self.tree, self.threads_file, self.proc = tree, threads_file, proc
        self.prev: dict[int, tuple[int, int]] = {}    # tid -> (run_delay, timeslices) at the last read

    def _threads_by_dir(self, tops: Iterable[str]) -> dict[str, list[int]]:
        """Each directory at or below `tops` -> its threads: one read of its threads file each, at the
        descriptor level. Listing a cgroup's directory costs about three such reads (kernfs makes an entry
        per file), so a directory whose children are all leaves (its cgroup.stat's nr_descendants equals
        the children listed: a class root of pods) spares the listing of each child."""
        out: dict[str, list[int]] = {}
        root = str(self.tree)
        todo = [(top, True) for top in tops]
        while todo:
            rel, may_have_children = todo.pop()
            d = f"{root}/{rel}" if rel else root
            try:
                if may_have_children:
                    with os.scandir(d) as entries:
                        kids = [f"{rel}/{e.name}" if rel else e.name for e in entries if e.is_dir(follow_symlinks=False)]
                    leaves = bool(kids) and descendants(d) == len(kids)
                    todo += [(k, not leaves) for k in kids]
                out[rel] = thread_ids(read_small(f"{d}/{self.threads_file}"), d)
            except OSError:     # gone, or a listing that is not thread ids (GarbledFile): left out
                continue
        return out

    def read(self, paths: Iterable[str]) -> dict[str, RunqLatency]:
        paths = list(paths)
        now: dict[int, tuple[int, int]] = {}
        per_dir: dict[str, tuple[int, int]] = {}
        for d, tids in self._threads_by_dir(outermost(paths)).items():
            delay = slices = 0
            for tid in tids:
                cur = read_schedstat(self.proc, tid)
                if cur is None:
                    continue
                now[tid] = cur
                old = self.prev.get(tid)
                if old is not None and cur[1] >= old[1]:     # a new thread starts counting next round
                    delay += cur[0] - old[0]
                    slices += cur[1] - old[1]
            per_dir[d] = (delay, slices)
        self.prev = now
        out = {}
        dirs = sorted(per_dir)
        for path in paths:
            delay = slices = 0
            for d in below(dirs, path):
                delay, slices = delay + per_dir[d][0], slices + per_dir[d][1]
            if slices > 0:
                out[path] = RunqLatency(SCHEDSTAT, slices, delay / 1000 / slices)
        return out


# --- the sensor --------------------------------------------------------------------------------

def v2_tree(layout: Layout) -> tuple[Path, str] | None:
    """Where threads and cgroup ids are looked up: (directory, the file listing a cgroup's threads)."""
    if layout.unified is not None:
        return layout.unified, "cgroup.threads"
    if "cpu" in layout.v1:
        return layout.v1["cpu"], "tasks"
    return None


def probe_bpf(host: Host) -> tuple[bool, str]:
    """What the eBPF source needs: libbpf (koordd's loader) and the kernel's BTF to relocate the CO-RE
    program against. Whether the program really loads is the sensor's start to say (koordctl doctor's
    sensors line)."""
    try:
        libbpf()
        why = None
    except BpfError as e:
        why = str(e)
    btf = host.sys / "kernel/btf/vmlinux"
    facts = [f"libbpf: {why or 'installed'}", f"BTF {btf}: {yes(btf.exists())}"]
    return why is None and btf.exists(), "; ".join(facts)


class RunqLatencySensor(OptionalSensor):
    """Section RUNQ_LATENCY: cgroup path -> RunqLatency of the round, for every sampled cgroup whose
    threads waited at all."""
    name = RUNQ_LATENCY
    features = {"bpf": probe_bpf}

    def __init__(self, cgroup_root: Path | str = DEFAULT_ROOT, proc_root: Path | str = "/proc",
                 sources: tuple[str, ...] | None = None, program: Path = PROGRAM):
        self.cgroup_root, self.proc = Path(cgroup_root), Path(proc_root)
        self.sources = DEFAULT_SOURCES if sources is None else sources
        self.program = program
        self.source: EbpfSource | SchedstatSource | None = None
        self.why_not_ebpf: str | None = None

    def start(self) -> None:
        try:
            found = v2_tree(detect_layout(self.cgroup_root))
        except LayoutError as e:
            raise SensorUnavailable(str(e)) from None
        if found is None:
            raise SensorUnavailable("no v2 tree and no v1 cpu hierarchy to find a cgroup's threads in")
        tree, threads_file = found
        if EBPF in self.sources and threads_file == "cgroup.threads":
            ebpf = EbpfSource(tree, self.program)
            try:
                ebpf.open()
                self.source = ebpf
                return
            except SensorUnavailable as e:
                self.why_not_ebpf = str(e)
        if SCHEDSTAT not in self.sources:
            raise SensorUnavailable(f"eBPF: {self.why_not_ebpf}")
        if read_schedstat(self.proc, os.getpid()) is None:
            raise SensorUnavailable(f"no {self.proc}/<tid>/schedstat (CONFIG_SCHED_INFO)"
                                    + (f", and eBPF: {self.why_not_ebpf}" if self.why_not_ebpf else ""))
        if self.why_not_ebpf:
            log.info("run-queue latency from schedstat (a mean wait per timeslice, no quantiles): eBPF "
                     "unavailable: %s", self.why_not_ebpf)
        self.source = SchedstatSource(tree, threads_file, self.proc)

    @property
    def detail(self) -> str | None:
        """For koordctl doctor: the source it started with, and why not eBPF."""
        if self.kind == SCHEDSTAT and self.why_not_ebpf:
            return f"schedstat, a mean only: eBPF unavailable: {self.why_not_ebpf}"
        return self.kind

    @property
    def kind(self) -> str | None:
        return EBPF if isinstance(self.source, EbpfSource) else SCHEDSTAT if self.source else None

    def sample(self, context: SensorContext) -> Mapping[str, RunqLatency]:
        if isinstance(self.source, SchedstatSource):
            # A file per thread and a listing per cgroup, every round: only the waits loops read (the slack
            # and the antagonist's victims, core/health.py: the latency-sensitive classes), not BE's pods.
            return self.source.read(p for p, cls in context.cgroups.items() if cls in LATENCY_SENSITIVE)
        return self.source.read(context.cgroups)

    def stop(self) -> None:
        if isinstance(self.source, EbpfSource):
            self.source.close()
        self.source = None
