"""One frozen picture of the node per tick, built by the sensors and read by the loops.

Every value a sensor could not read is None ("unknown"): loops decide what
unknown means for them. A cgroup that vanished is simply absent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from koordd.core.health import DEFAULT_HEALTH, HealthTargets
from koordd.core.slo import SloTarget


@dataclass(frozen=True)
class Pressure:
    """One PSI line (some or full). avg* in percent; total in µs; growth in µs of stall per second."""
    avg10: float
    avg60: float
    avg300: float
    total_us: int
    growth: float | None = None


@dataclass(frozen=True)
class PressureStat:
    some: Pressure | None
    full: Pressure | None


@dataclass(frozen=True)
class Throttling:
    """Cumulative cpu.stat throttling counters, and their growth since the previous sample."""
    nr_periods: int
    nr_throttled: int
    throttled_us: int
    periods_delta: int | None = None
    throttled_delta: int | None = None


@dataclass(frozen=True)
class Refaults:
    """memory.stat's cumulative workingset_refault_file and _anon, in bytes: pages read back (file) or
    swapped back in (anon) soon after reclaim evicted them. Growing right after a reclaim, they say it
    took memory the cgroup still uses, even where the refaults stall too little to show in PSI."""
    file: int
    anon: int

    @property
    def total(self) -> int:
        return self.file + self.anon


@dataclass(frozen=True)
class CpuTopology:
    cpu: int
    core: int        # first CPU of its SMT sibling group: equal for siblings
    numa_node: int


@dataclass(frozen=True)
class NodeSample:
    cpu_count: int
    cpu_used: float | None                 # cores busy, averaged since the previous sample
    # Steal since the previous sample: the seconds the hypervisor held off the vCPU that lost the most while it had
    # work (0.0 on bare metal; None on the first sample). The guest sees such a stall nowhere else: a request in
    # flight just takes longer (docs/be-control.md, "When the hypervisor takes a vCPU")
    steal_worst: float | None = None
    memory_total: int | None = None
    memory_available: int | None = None
    memory_anon: int | None = None         # anon + unevictable: what page-cache reclaim cannot free
    cpu_pressure: PressureStat | None = None
    memory_pressure: PressureStat | None = None
    io_pressure: PressureStat | None = None
    topology: tuple[CpuTopology, ...] = ()
    # /sys/devices/system/cpu/cpuidle/current_driver, read at start: "none" where the kernel has no cpuidle
    # driver (CPUs idle by the architecture's halt, which no CPU latency request governs); None: unknown
    cpuidle_driver: str | None = None


@dataclass(frozen=True)
class CgroupSample:
    path: str
    cls: str                                # "" for a cgroup a loop watches without a class (a scope)
    cpu_usage: float | None = None          # cores, averaged since the previous sample
    throttling: Throttling | None = None
    cpu_max: str | None = None              # canonical knob values, as the actuator reads them
    cpu_max_burst: str | None = None
    cpuset_cpus: str | None = None
    cpu_weight: str | None = None           # 1..10000; v1's cpu.shares converted, as the actuator reads it
    memory_current: int | None = None
    memory_anon: int | None = None          # anon + unevictable: what reclaiming page cache cannot free
    memory_max: str | None = None
    oom_kills: int | None = None            # cumulative kernel OOM kills inside this cgroup
    memory_refaults: Refaults | None = None # v2 memory.stat; a loop naming it costs a memory.stat read per cgroup
    frozen: bool | None = None
    cpu_pressure: PressureStat | None = None
    memory_pressure: PressureStat | None = None
    io_pressure: PressureStat | None = None


# What a sensor can read for a cgroup; a loop names those it reads (Loop.needs) and only those are read.
CGROUP_FIELDS = frozenset(("cpu_usage", "throttling", "cpu_max", "cpu_max_burst", "cpuset_cpus", "cpu_weight",
                           "memory_current", "memory_anon", "memory_max", "oom_kills", "frozen", "cpu_pressure",
                           "memory_pressure", "io_pressure", "memory_refaults"))
GPUS = "gpus"          # the GPU sensor's section (NVML): polled only for a loop whose needs() name it
RUNQ_LATENCY = "runq_latency"   # section: cgroup path -> RunqLatency, for the round since the last
CPI = "cpi"                     # section: cgroup path -> CpiSample, for the round since the last
RESCTRL = "resctrl"             # section: sensors.resctrl.ResctrlSection (info/ and every group's schemata)
NET = "net"                     # section: device -> sensors.net.NetSample, on devices koordd shapes
AVX = "avx"                     # section: sensors.avx.AvxSection (per cgroup: AVX-512 use, where it ran, licence)
SCHED_EXT = "sched_ext"         # section: sched_ext.SchedExtStatus (the kernel's sched_ext state)
APP_LATENCY = "app_latency"     # section: cgroup path -> AppLatency, for the round since the last (core/slo.py's
                                # SOURCES["measured"]: the sensor runs where a class declares an SLO)


@dataclass(frozen=True)
class RunqLatency:
    """How long a cgroup's threads waited on a run queue, runnable but not running, this round.
    `source` "ebpf": a log2 histogram of every wait (quantiles interpolated within their bucket, max its upper bound);
    "schedstat": Δrun_delay / Δtimeslices of its threads, a mean only (p50/p99/max None)."""
    source: str
    count: int                              # waits (ebpf) or timeslices (schedstat) this round
    mean_us: float | None
    p50_us: float | None = None
    p99_us: float | None = None
    max_us: float | None = None
    slots: tuple[int, ...] = ()             # ebpf: the round's histogram (koordd.core.histogram), to merge rounds


@dataclass(frozen=True)
class AppLatency:
    """The server-side response time of a latency-sensitive cgroup's request/response traffic this round
    (TCP and UNIX stream sockets: from the oldest bytes of a request the server read to the answer on its socket); count,
    mean and max from a log2 histogram of every response, the quantiles from one weighted by connection (each
    connection the same weight per window, so a flood on one cannot hide another's tail), interpolated within their bucket, max its upper
    bound); docs/app-latency.md says where it is wrong."""
    count: int                              # responses this round (at least one: else no AppLatency)
    mean_us: float
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float
    slots: tuple[int, ...] = ()             # the round's histogram (koordd.core.histogram), to merge rounds
    # Of `count`, those sent while their socket was crowded (near its limit, until the server emptied it):
    # its clients held back, their wait not counted (the kernel sensor's; None where a source cannot tell).
    crowded: int | None = None


@dataclass(frozen=True)
class CpiSample:
    """Cycles per instruction of a cgroup's threads this round, from its perf counters, each scaled by
    time enabled / running (counters share the PMU)."""
    cycles: float
    instructions: float
    running_fraction: float                 # time running / enabled: under 1 when multiplexed

    @property
    def cpi(self) -> float | None:
        return self.cycles / self.instructions if self.instructions > 0 else None


@dataclass(frozen=True)
class Snapshot:
    time: float                             # time.monotonic() of the sample
    wall: float                             # time.time(), for records
    node: NodeSample
    cgroups: Mapping[str, CgroupSample] = field(default_factory=dict)
    # What the optional sensors the enabled loops need produced this round, by sensor name ("gpus").
    # A sensor that is unavailable or failed this round has no section: loops treat that as unknown.
    sections: Mapping[str, Any] = field(default_factory=dict)
    members: Mapping[str, tuple[CgroupSample, ...]] = field(default_factory=dict)  # class root -> its children
    held: Mapping[tuple[str, str], str] = field(default_factory=dict)   # (cgroup, knob) -> koordd's original
    supported: frozenset[str] = frozenset()                             # knobs this host has
    health: Mapping[str, HealthTargets] = field(default_factory=dict)   # class root -> its rule's targets
    slo: Mapping[str, SloTarget] = field(default_factory=dict)          # class root -> its rule's SLO, if any

    def section(self, name: str, default: Any = None) -> Any:
        """The section optional sensor `name` produced this round, or `default` when there is none."""
        return self.sections.get(name, default)

    @property
    def gpus(self) -> tuple:
        """The GPU sensor's devices (sensors.gpu.GpuSample); () without NVML or when no loop needs it."""
        return self.section(GPUS, ())

    def of_class(self, *classes: str) -> tuple[CgroupSample, ...]:
        """The class roots: the cgroups a rule matched. A root may hold another of another class (an LS
        job in be.slice): own_usage() sums their usage counting each cgroup once."""
        return tuple(c for c in self.cgroups.values() if c.cls and c.cls in classes)

    def units(self, *classes: str) -> tuple[CgroupSample, ...]:
        """What a loop acts on one by one (pods, jobs): each class root's children where a loop asked
        for them (Loop.members_of), else the root itself."""
        return tuple(m for c in self.of_class(*classes) for m in (self.members.get(c.path) or (c,)))

    def health_of(self, path: str) -> HealthTargets:
        """The health targets of class root `path`: its rule's, or the defaults."""
        return self.health.get(path, DEFAULT_HEALTH)

    def slo_of(self, path: str) -> SloTarget | None:
        """The SLO of class root `path`: its rule's, or None where it declares none."""
        return self.slo.get(path)

    def slo_sections(self) -> frozenset[str]:
        """The sections the class roots' SLOs are measured by: the daemon runs their sensors whatever the
        loops need (runtime/service.py), so any loop may read them for the roots with an SLO."""
        return frozenset(t.section for t in self.slo.values())

    def find(self, path: str) -> CgroupSample | None:
        if path in self.cgroups:
            return self.cgroups[path]
        # A member is a root's child: its parent names the root (a prefix may name a root nested above it).
        return next((m for m in self.members.get(path.rpartition("/")[0], ()) if m.path == path), None)

    def nested(self) -> dict[str, list[str]]:
        """Class root -> the class roots right inside it (none of them inside another inside it)."""
        roots = {p for p, c in self.cgroups.items() if c.cls}
        out: dict[str, list[str]] = {}
        for path in sorted(roots):
            up = path
            while "/" in up:
                up = up.rpartition("/")[0]
                if up in roots:
                    out.setdefault(up, []).append(path)
                    break
        return out


def own_usage(snapshot: Snapshot, roots, field: str = "cpu_usage") -> float | None:
    """Sum of `field` (cpu_usage, memory_current, memory_anon) over class roots `roots`, each less the
    class roots nested right inside it: their usage lies inside its own and is theirs. So the sums of
    every class count each cgroup once, and a class's sum is what its cgroups use. None when any part
    is unknown."""
    nested, total = snapshot.nested(), 0.0
    for root in roots:
        parts = [root] + [snapshot.cgroups[n] for n in nested.get(root.path, ())]
        values = [getattr(p, field) for p in parts]
        if any(v is None for v in values):
            return None
        # Two files read one after the other: a nested root may read a little more than its parent.
        total += max(values[0] - sum(values[1:]), 0)
    return total


def total_usage(samples) -> float | None:
    """Sum of CPU usage in cores; None when any part is unknown."""
    total = 0.0
    for s in samples:
        if s.cpu_usage is None:
            return None
        total += s.cpu_usage
    return total


@dataclass(frozen=True)
class SchedExtStatus:
    state: str                      # "disabled", "enabling", "enabled", "disabling"
    ops: str = ""                   # the loaded BPF scheduler's name; "" while none is
    enable_seq: int | None = None
    nr_rejected: int | None = None
    switch_all: int | None = None
    hotplug_seq: int | None = None

    def describe(self) -> str:
        """One line for `koordctl doctor`: the state, the scheduler and the counters the kernel has."""
        facts = [f"state={self.state}"] + ([f"root/ops={self.ops}"] if self.ops else [])
        facts += [f"{name}={value}" for name, value in (("enable_seq", self.enable_seq),
                                                        ("nr_rejected", self.nr_rejected),
                                                        ("switch_all", self.switch_all)) if value is not None]
        return ", ".join(facts)
