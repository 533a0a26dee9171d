"""The "cpi" sensor over fake cgroup trees and a fake perf (koordtest/fakes/perf.py)."""
from __future__ import annotations

import errno

import pytest

from koordtest.fakes.perf import FakePerf
from koordd.core.snapshot import CPI, CpiSample
from koordd.sensors import lifecycle, optional_sensors
from koordd.sensors.contract import SensorContext, SensorUnavailable
from koordd.sensors.cpi import CpiSensor


@pytest.fixture
def host(tmp_path):
    """A hybrid host: v1 cpu and cpuacct, the v2 tree at unified/, 2 CPUs online, paranoid 2."""
    cg = tmp_path / "cgroup"
    for c in ("cpu", "cpuacct"):
        (cg / c).mkdir(parents=True)
        (cg / c / "cgroup.procs").write_text("")
    (cg / "unified/be.slice/job1").mkdir(parents=True)
    (cg / "unified/ls.slice").mkdir(parents=True)
    (cg / "unified/cgroup.controllers").write_text("\n")
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-1\n")
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/perf_event_paranoid").write_text("2\n")
    return tmp_path


def sensor(host, perf=None):
    perf = perf or FakePerf(host / "cgroup/unified")
    return CpiSensor(host / "cgroup", host / "sys", host / "proc", open_group=perf), perf


def context(*cgroups):
    return SensorContext(1.0, {cg: "LS" for cg in cgroups})


def test_start_tries_software_then_hardware_events_on_the_v2_root_and_closes_them(host):
    s, perf = sensor(host)
    s.start()
    assert perf.tries == [("", 0), ("", 0)] and perf.groups == []
    s.stop()


@pytest.mark.parametrize("fails, reason", [
    ({"cycles": errno.ENOENT}, "no hardware PMU (cycles: ENOENT) — a VM without a virtual PMU?"),
    ({"cycles": errno.EOPNOTSUPP}, "no hardware PMU (cycles: EOPNOTSUPP) — a VM without a virtual PMU?"),
    ({"cycles": errno.EACCES, "task-clock": errno.EACCES},
     "not permitted (task-clock: EACCES): kernel.perf_event_paranoid=2; counting a cgroup on each CPU needs "
     "CAP_PERFMON (or root), or perf_event_paranoid <= 0"),
    ({"task-clock": errno.ENOENT}, "cgroups of the v2 tree cannot be counted (task-clock: ENOENT) — "
                                   "perf_event bound to a v1 hierarchy?"),
])
def test_start_says_why_it_cannot_count(host, fails, reason):
    perf = FakePerf(host / "cgroup/unified")
    perf.refuse = fails
    started, why = lifecycle.start_sensor(lambda: sensor(host, perf)[0])
    assert started is None and why == reason
    assert perf.groups == []


def test_start_without_a_v2_tree_or_online_cpus(host, tmp_path):
    (host / "cgroup/unified/cgroup.controllers").unlink()
    with pytest.raises(SensorUnavailable, match="no cgroup v2 tree under .*: perf counts cgroups of the v2 tree"):
        sensor(host)[0].start()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SensorUnavailable, match="no cgroup hierarchy found"):
        CpiSensor(tmp_path / "empty", host / "sys").start()
    (host / "cgroup/unified/cgroup.controllers").write_text("\n")
    (host / "sys/devices/system/cpu/online").unlink()
    with pytest.raises(SensorUnavailable, match="online CPUs unknown"):
        sensor(host)[0].start()


def test_sample_is_cpi_per_cgroup_from_its_second_round_on_when_it_ran(host):
    s, perf = sensor(host)
    s.start()
    assert s.sample(context("ls.slice", "be.slice/job1")) == {}          # counting starts
    assert perf.open_for("ls.slice") == [0, 1] and perf.open_for("be.slice/job1") == [0, 1]
    perf.set("ls.slice", 0, 1_000, 1_000, 3_000, 2_000)
    perf.set("ls.slice", 1, 1_000, 500, 1_000, 500)                      # multiplexed on CPU 1
    got = s.sample(context("ls.slice", "be.slice/job1"))
    assert got == {"ls.slice": CpiSample(cycles=5_000.0, instructions=3_000.0, running_fraction=0.75)}
    assert got["ls.slice"].cpi == pytest.approx(5 / 3)
    # be.slice/job1 did not run: no CPI rather than one made of zeros.


def test_a_cgroup_that_goes_closes_its_fds_and_stop_closes_the_rest(host):
    s, perf = sensor(host)
    s.start()
    s.sample(context("ls.slice", "be.slice/job1"))
    (host / "cgroup/unified/be.slice/job1").rmdir()
    s.sample(context("ls.slice", "be.slice/job1"))
    assert perf.open_for("be.slice/job1") == [] and perf.open_for("ls.slice") == [0, 1]
    s.stop()
    s.stop()
    assert perf.groups == [] and s.sample(context("ls.slice")) == {}


def test_cpi_is_a_built_in_sensor_that_acquires_nothing_until_started(monkeypatch):
    assert optional_sensors.builtin_sensors()[CPI] is CpiSensor and CpiSensor.name == "cpi"
    monkeypatch.setattr("koordd.sensors.cgroup_counters.probe_cgroup_mode", lambda *a: pytest.fail("opened by the constructor"))
    CpiSensor().stop()
