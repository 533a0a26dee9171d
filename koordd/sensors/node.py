"""Node-wide CPU, memory, PSI and CPU topology from /proc and /sys (roots injectable)."""
from __future__ import annotations

import os
from pathlib import Path

from koordd.core.cgroup_text import parse_cpulist
from koordd.core.snapshot import CpuTopology, NodeSample, PressureStat
from koordd.kernel.host_probe import cpuidle_driver
from koordd.kernel.kfiles import read_small
from koordd.sensors.psi import parse_psi, with_growth

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")        # /proc/stat's unit (USER_HZ), per second


def parse_proc_stat_cpu(text: str) -> tuple[int, int]:
    """(busy, total) jiffies from the aggregate "cpu" line; guest time is already inside user/nice,
    and steal (time the hypervisor gave to someone else) is not busy here."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:]]
            v += [0] * (8 - len(v))
            total = sum(v[:8])                 # user nice system idle iowait irq softirq steal
            return total - v[3] - v[4] - v[7], total
    raise ValueError("/proc/stat has no aggregate cpu line")


def parse_proc_stat_steal(text: str) -> tuple[int, ...]:
    """Each CPU's steal jiffies from the "cpuN" lines, in CPU order: time the hypervisor ran something else
    while that vCPU had work to do (0 on bare metal, and on a kernel whose lines stop before steal)."""
    out = []
    for line in text.splitlines():
        if line.startswith("cpu") and not line.startswith("cpu "):
            fields = line.split()
            out.append(int(fields[8]) if len(fields) > 8 else 0)
    return tuple(out)


def parse_meminfo(text: str) -> dict[str, int]:
    """Bytes per field ("MemTotal: 100 kB" -> {"MemTotal": 102400})."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


class NodeSensor:
    def __init__(self, proc_root: Path | str = "/proc", sys_root: Path | str = "/sys"):
        self.proc, self.sys = Path(proc_root), Path(sys_root)
        self._cpu_prev: tuple[int, int] | None = None
        self._steal_prev: tuple[int, ...] | None = None
        self._psi_prev: dict[str, tuple[float, PressureStat]] = {}
        # The files read every round, their paths joined once.
        self._meminfo, self._stat = str(self.proc / "meminfo"), str(self.proc / "stat")
        self._pressure = {r: str(self.proc / "pressure" / r) for r in ("cpu", "memory", "io")}
        self.cpu_count = self._online_cpus()
        self.topology = self._topology()
        self.cpuidle_driver = cpuidle_driver(self.sys)   # read once: a driver comes with the kernel or at boot

    def sample(self, now: float) -> NodeSample:
        mem = self._read(lambda: parse_meminfo(read_small(self._meminfo)))
        stat = self._read(lambda: read_small(self._stat))
        return NodeSample(
            cpu_count=self.cpu_count,
            cpu_used=self._cpu_used(stat),
            steal_worst=self._steal_worst(stat),
            memory_total=mem.get("MemTotal") if mem else None,
            memory_available=mem.get("MemAvailable") if mem else None,
            memory_anon=(mem["AnonPages"] + mem.get("Unevictable", 0)) if mem and "AnonPages" in mem else None,
            cpu_pressure=self._psi("cpu", now),
            memory_pressure=self._psi("memory", now),
            io_pressure=self._psi("io", now),
            topology=self.topology,
            cpuidle_driver=self.cpuidle_driver,
        )

    def _cpu_used(self, stat: str | None) -> float | None:
        cur = None if stat is None else self._read(lambda: parse_proc_stat_cpu(stat))
        prev, self._cpu_prev = self._cpu_prev, cur
        if cur is None or prev is None or cur[1] <= prev[1]:
            return None
        return self.cpu_count * (cur[0] - prev[0]) / (cur[1] - prev[1])

    def _steal_worst(self, stat: str | None) -> float | None:
        """Seconds of steal of the vCPU that lost the most since the previous sample; None on the first one,
        or where the CPUs listed changed (a CPU went offline: its counter is not comparable)."""
        cur = None if stat is None else self._read(lambda: parse_proc_stat_steal(stat))
        prev, self._steal_prev = self._steal_prev, cur
        if not cur or prev is None or len(cur) != len(prev):
            return None
        return max(max(b - a, 0) for a, b in zip(prev, cur)) / CLOCK_TICKS

    def _psi(self, resource: str, now: float) -> PressureStat | None:
        stat = self._read(lambda: parse_psi(read_small(self._pressure[resource])))
        if stat is None:
            return None
        prev = self._psi_prev.get(resource)
        self._psi_prev[resource] = (now, stat)
        return with_growth(stat, prev[1], now - prev[0]) if prev else stat

    def _online_cpus(self) -> int:
        cpus = self._read(lambda: parse_cpulist((self.sys / "devices/system/cpu/online").read_text()))
        return len(cpus) if cpus else (os.cpu_count() or 1)

    def _topology(self) -> tuple[CpuTopology, ...]:
        cpus = self._read(lambda: parse_cpulist((self.sys / "devices/system/cpu/online").read_text()))
        if not cpus:
            return ()
        numa = {}
        for node_dir in sorted((self.sys / "devices/system/node").glob("node[0-9]*")):
            for c in self._read(lambda: parse_cpulist((node_dir / "cpulist").read_text())) or ():
                numa[c] = int(node_dir.name[4:])
        out = []
        for c in sorted(cpus):
            sib = self._read(lambda: parse_cpulist(
                (self.sys / f"devices/system/cpu/cpu{c}/topology/thread_siblings_list").read_text()))
            out.append(CpuTopology(c, min(sib) if sib else c, numa.get(c, 0)))
        return tuple(out)

    @staticmethod
    def _read(fn):
        try:
            return fn()
        except (OSError, ValueError):
            return None
