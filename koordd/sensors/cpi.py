"""CPI sensor: cycles per instruction of each cgroup, from hardware perf counters.

An optional sensor (sensors/contract.py), the snapshot's "cpi" section: cgroup
path -> snapshot.CpiSample for the round since the previous one. It counts
cycles and instructions as one group per online CPU, in cgroup mode on the
cgroup's directory in the v2 tree (the unified tree on hybrid hosts), through
sensors/cgroup_counters.py. A cgroup's counts include its descendants' (the
kernel counts a task for every ancestor that has events), so a class root's CPI
covers its pods. A cgroup is counted from the round it first appears in, so it
has a value from its second round on; it has none for a round in which none of
its tasks ran, nor when the v2 tree lacks it (on hybrid hosts, a cgroup made in
the v1 hierarchies only). The tree is found under /sys/fs/cgroup (the
constructor the core calls takes no arguments).

start() opens software events on the v2 root first (does cgroup-mode counting
work at all?), then the hardware events (is there a PMU?), and raises
SensorUnavailable saying which failed: most VMs have no PMU ("no hardware PMU
(cycles: ENOENT)"), and without CAP_PERFMON kernel.perf_event_paranoid forbids
counting on every CPU. It needs cgroups × CPUs × 2 file descriptors.
"""
from __future__ import annotations

from pathlib import Path

from koordd.core.snapshot import CPI, CpiSample
from koordd.kernel.cgroupfs import DEFAULT_ROOT
from koordd.kernel import perf
from koordd.kernel.cgroupfs import LayoutError
from koordd.kernel.host_probe import Host, read
from koordd.kernel.perf import CYCLES, CounterGroup, INSTRUCTIONS
from koordd.sensors.cgroup_counters import CgroupCounters, OpenGroup, start_counters
from koordd.sensors.contract import OptionalSensor, SensorContext

EVENTS = (CYCLES, INSTRUCTIONS)


def probe_perf(host: Host) -> tuple[bool, str]:
    """What the sensor needs: counting a cgroup of the v2 tree on a CPU, software events first (does
    cgroup mode work at all?), then cycles and instructions (is there a PMU?). Available: both work."""
    try:
        v2_root, why = host.layout.unified, "no cgroup v2 tree"
    except (LayoutError, OSError) as e:
        v2_root, why = None, str(e)
    if v2_root is None:
        return False, f"cgroup-mode counting: no ({why}); hardware CPI: no"
    try:
        cpu = perf.online_cpus(host.sys)[0]
    except (OSError, ValueError, IndexError):
        cpu = 0
    paranoid = read(host.proc / "sys/kernel/perf_event_paranoid")
    text = f"cgroup-mode counting (task-clock, context-switches on {v2_root}, CPU {cpu}): "
    software = perf.probe_cgroup_mode((perf.TASK_CLOCK, perf.CONTEXT_SWITCHES), v2_root, cpu)
    if software is not None:
        # Then the hardware events' errors would say nothing of the PMU (ENOENT also means "no such cgroup").
        return False, text + f"fails: {perf.explain(software, paranoid)}; hardware CPI: untested"
    hardware = perf.probe_cgroup_mode((perf.CYCLES, perf.INSTRUCTIONS), v2_root, cpu)
    hw_text = "available" if hardware is None else f"unavailable: {perf.explain(hardware, paranoid)}"
    return hardware is None, text + f"works; hardware CPI (cycles, instructions): {hw_text}"


class CpiSensor(OptionalSensor):
    name = CPI
    features = {"perf": probe_perf}

    def __init__(self, cgroup_root: str | Path = DEFAULT_ROOT, sys_root: str | Path = "/sys",
                 proc_root: str | Path = "/proc", open_group: OpenGroup = CounterGroup.open_cgroup):
        self.cgroup_root, self.sys_root, self.proc_root = Path(cgroup_root), Path(sys_root), Path(proc_root)
        self._open_group = open_group       # perf, or a fake in tests
        self._counters: CgroupCounters | None = None

    def start(self) -> None:
        self._counters = start_counters(EVENTS, self.cgroup_root, self.sys_root, self.proc_root, self._open_group)

    def sample(self, context: SensorContext) -> dict[str, CpiSample]:
        if self._counters is None:
            return {}
        counts = self._counters.update(context.cgroups)
        # A cgroup none of whose tasks ran this round counted nothing: no CPI, rather than one from zeros.
        return {cgroup: CpiSample(c.values[CYCLES.name], c.values[INSTRUCTIONS.name], c.running_ns / c.enabled_ns)
                for cgroup, c in counts.items() if c.enabled_ns > 0}

    def stop(self) -> None:
        if self._counters is not None:
            self._counters.close()
            self._counters = None
