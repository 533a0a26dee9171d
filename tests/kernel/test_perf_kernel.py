"""On the real kernel: perf counters in cgroup mode on cgroups of the v2 tree (the unified tree on
hybrid hosts), through koordd/kernel/perf.py and the CPI sensor's CgroupCounters.

Software events need no PMU, so they prove the plumbing anywhere: a busy loop in `ls` is counted
(task-clock = the CPU time the kernel accounts to the cgroup over the same window) while a sleeping
task in `be` counts ~0, and the parent counts both, since the kernel counts a task in every ancestor
with events. The "cpi" sensor then either counts cycles and instructions of the busy loop (a host
with a PMU) or refuses to start naming the missing PMU (most VMs, and the development machines).

Needs root and a v2 tree; skipped only where the kernel has no perf events at all.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from koordd.kernel import perf
from koordd.kernel.perf import CONTEXT_SWITCHES, CYCLES, CounterGroup, PerfOpenError, TASK_CLOCK
from koordd.sensors.cgroup_counters import CgroupCounters
from koordd.sensors.contract import SensorContext, SensorUnavailable
from koordd.sensors.cpi import CpiSensor

from koordtest.kernel import CGROUP_ROOT, wait_for

pytestmark = pytest.mark.kernel

WINDOW = 2.0            # seconds counted
SLEEPER = ["sleep", "600"]


@pytest.fixture
def v2(cgroups) -> Path:
    if not Path("/proc/sys/kernel/perf_event_paranoid").exists():
        pytest.skip("kernel without perf events (no /proc/sys/kernel/perf_event_paranoid)")
    return cgroups.roles["unified"]


def asleep(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "S"


def busy_and_sleeping(cgroups) -> None:
    """A busy loop in ls, a sleeping task in be, the sleeper already asleep."""
    cgroups.spawn_hog("ls")
    sleeper = cgroups.spawn("be", SLEEPER)
    assert wait_for(lambda: asleep(sleeper.pid), timeout=10), "the sleeper never slept"


def test_software_events_count_a_busy_cgroup_not_its_sleeping_sibling(cgroups, v2, capsys):
    busy_and_sleeping(cgroups)
    ls, be, parent = cgroups.cgroup("ls"), cgroups.cgroup("be"), cgroups.name
    cpus = perf.online_cpus()
    counters = CgroupCounters((TASK_CLOCK, CONTEXT_SWITCHES), v2, cpus)
    try:
        assert counters.update([ls, be, parent]) == {}          # opened: counting from here
        assert counters.fds == 3 * len(cpus) * 2
        used = {c: cgroups.usage_ns(c) for c in ("ls", "be")}
        time.sleep(WINDOW)
        got = counters.update([ls, be, parent])
        used = {c: cgroups.usage_ns(c) - used[c] for c in used}
    finally:
        counters.close()
    assert counters.fds == 0
    seconds = {cg: got[cg].values["task-clock"] / 1e9 for cg in (ls, be, parent)}
    with capsys.disabled():
        print(f"\n{len(cpus)} CPUs, {WINDOW} s: task-clock ls {seconds[ls]:.3f} s (cgroup CPU time "
              f"{used['ls'] / 1e9:.3f} s), be {seconds[be]:.6f} s, parent {seconds[parent]:.3f} s; "
              f"context-switches ls {got[ls].values['context-switches']:.0f}, "
              f"be {got[be].values['context-switches']:.0f}")
    assert used["ls"] > 0.2e9, f"the busy loop hardly ran ({used['ls'] / 1e9:.3f} s of CPU): node too busy?"
    # The kernel's own accounting brackets the counted window (its reads come just before and after).
    assert seconds[ls] == pytest.approx(used["ls"] / 1e9, rel=0.1, abs=0.05)
    assert seconds[be] < 0.01 and seconds[be] < seconds[ls] / 100
    assert seconds[parent] == pytest.approx(seconds[ls] + seconds[be], rel=0.05)
    # Software events are never multiplexed; each group was enabled exactly while it ran.
    assert got[ls].running_fraction == 1.0
    assert got[ls].enabled_ns == pytest.approx(got[ls].values["task-clock"], rel=0.01)


def test_a_removed_cgroup_has_its_counters_closed_and_is_freed(cgroups, v2):
    """An open perf event keeps its cgroup: removed, it would linger as a dying cgroup until closed."""
    parent = cgroups.dir("unified")
    gone = parent / "gone"
    gone.mkdir()
    counters = CgroupCounters((TASK_CLOCK,), v2, perf.online_cpus())
    try:
        counters.update([f"{cgroups.name}/gone"])
        assert counters.fds == len(counters.cpus)
        gone.rmdir()
        assert wait_for(lambda: dying(parent) == 1, timeout=5), "the counted cgroup did not linger"
        assert counters.update([f"{cgroups.name}/gone"]) == {}
        assert counters.fds == 0
        assert wait_for(lambda: dying(parent) == 0, timeout=10), "closing its counters did not free the cgroup"
    finally:
        counters.close()
        if gone.exists():
            gone.rmdir()


def dying(cgroup_dir: Path) -> int:
    for line in (cgroup_dir / "cgroup.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "nr_dying_descendants":
            return int(value)
    raise AssertionError(f"{cgroup_dir}/cgroup.stat has no nr_dying_descendants")


def test_the_cpi_sensor_counts_cycles_or_names_the_missing_pmu(cgroups, v2, capsys):
    # Whether this host has a PMU, asked independently of the sensor: a cycles counter on this process.
    try:
        CounterGroup.open((CYCLES,), 0, -1).close()
        no_pmu = None
    except PerfOpenError as e:
        no_pmu = e
    sensor = CpiSensor(CGROUP_ROOT)
    if no_pmu is not None:
        with pytest.raises(SensorUnavailable) as refused:
            sensor.start()
        sensor.stop()
        with capsys.disabled():
            print(f"\ncpi sensor unavailable: {refused.value}")
        assert no_pmu.errno in perf.NO_PMU, f"cycles on this process failed otherwise: {no_pmu}"
        code = "EOPNOTSUPP" if no_pmu.errno == errno.EOPNOTSUPP else errno.errorcode[no_pmu.errno]
        assert str(refused.value) == f"no hardware PMU (cycles: {code}) — a VM without a virtual PMU?"
        return
    busy_and_sleeping(cgroups)
    context = SensorContext(time.monotonic(), {cgroups.cgroup("ls"): "LS", cgroups.cgroup("be"): "BE"})
    sensor.start()
    try:
        assert sensor.sample(context) == {}
        time.sleep(WINDOW)
        got = sensor.sample(context)
    finally:
        sensor.stop()
    busy = got[cgroups.cgroup("ls")]
    with capsys.disabled():
        print(f"\ncpi of a shell busy loop: {busy}, cpi {busy.cpi:.3f}; sleeping be: {got.get(cgroups.cgroup('be'))}")
    assert busy.cycles > 1e8 and busy.instructions > 1e8 and 0 < busy.running_fraction <= 1
    assert 0.1 < busy.cpi < 10


def test_no_fd_is_left_behind(v2):
    before = set(os.listdir("/proc/self/fd"))
    counters = CgroupCounters((TASK_CLOCK,), v2, perf.online_cpus())
    counters.update([""])
    counters.close()
    assert set(os.listdir("/proc/self/fd")) <= before
