"""The avx sensor over a fake cgroup tree, /proc, sysfs and perf (koordtest/fakes/perf.py): who used AVX-512 and
on which CPUs, where each cgroup's threads ran, threads gone mid-round, why it is unavailable; and the PMU's
licence counters: the shares and the level they make, multiplexing, a cgroup gone, and why there are none."""
from __future__ import annotations

import errno
import logging

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.fakes.perf import FakePerf
from koordd.core.avx import AVX256, AVX512, Licence, SCALAR
from koordd.sensors import optional_sensors
from koordd.sensors.avx import AvxSensor, AvxUse
from koordd.sensors.contract import SensorContext, SensorUnavailable
from unit.kernel.test_avx import stat_line, write_thread

AVX_NOW, AVX_OLD, NO_AVX = "AVX512_elapsed_ms:\t4\n", "AVX512_elapsed_ms:\t5000\n", "AVX512_elapsed_ms:\t-1\n"
SKYLAKE_SP, ROCKET_LAKE = ("GenuineIntel", 6, 85), ("GenuineIntel", 6, 167)


def cpuinfo(vendor: str, family: int, model: int) -> str:
    """Two CPUs' blocks of /proc/cpuinfo, as x86 kernels print them."""
    block = (f"processor\t: {{n}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
             f"model name\t: Intel(R) Xeon(R) CPU\nstepping\t: 7\nflags\t\t: fpu sse avx2 avx512f\n\n")
    return block.format(n=0) + block.format(n=1)


class Host:
    """A cgroup tree, /proc and sysfs of a 4-CPU host with AVX-512; a Skylake-SP unless `cpu` says other."""

    def __init__(self, tmp_path, mode="v2", cpu=SKYLAKE_SP):
        self.tree = FakeCgroups(tmp_path, mode)
        self.proc, self.sys = tmp_path / "proc", tmp_path / "sys"
        (self.proc / "self").mkdir(parents=True)
        (self.proc / "self/arch_status").write_text(NO_AVX)
        (self.proc / "cpuinfo").write_text(cpuinfo(*cpu))
        (self.sys / "devices/system/cpu").mkdir(parents=True)
        (self.sys / "devices/system/cpu/online").write_text("0-3\n")
        self.perf = FakePerf(self.tree.root / "unified" if mode == "hybrid" else self.tree.root)

    def cgroup(self, path: str, tids) -> None:
        self.tree.add(path)
        self.put(path, tids)

    def put(self, path: str, tids) -> None:
        controller, name = ("cpu", "tasks") if self.tree.v1 else (None, "cgroup.threads")
        self.tree.set(path, controller, name, "".join(f"{t}\n" for t in tids))

    def thread(self, tid: int, arch_status: str, cpu: int, state: str = "S", ticks: int = 0) -> None:
        write_thread(self.proc, tid, arch_status, stat_line(tid, comm="w (x)", state=state, utime=ticks, cpu=cpu))

    def sensor(self, **kw) -> AvxSensor:
        s = AvxSensor(self.tree.root, self.proc, self.sys, open_group=self.perf, **kw)
        s.start()
        return s


def context(*cgroups: str) -> SensorContext:
    return SensorContext(0.0, {c: "LS" for c in cgroups})


def populated(h: Host) -> Host:
    h.cgroup("be", [10, 11])
    h.cgroup("ls", [20, 21])
    h.cgroup("ls2", [30])
    h.cgroup("idle", [40])
    h.thread(10, AVX_NOW, cpu=0, state="R")           # BE's AVX-512 thread on core {0,1}
    h.thread(11, AVX_OLD, cpu=2)                       # used it long ago
    h.thread(20, NO_AVX, cpu=1, state="R")            # LS on 0's SMT sibling
    h.thread(21, NO_AVX, cpu=3, state="R")            # LS on the other core
    h.thread(30, NO_AVX, cpu=0, ticks=7)              # sleeping now; ran if its ticks grow by the next round
    h.thread(40, NO_AVX, cpu=0, ticks=9)              # asleep throughout
    return h


@pytest.fixture(params=["v2", "v1"])
def host(request, tmp_path):
    """arch_status alone: a CPU without the licence events."""
    return populated(Host(tmp_path, request.param, ROCKET_LAKE))


@pytest.fixture(params=["v2", "hybrid"])
def pmu_host(request, tmp_path):
    """A Skylake-SP whose PMU counts: cgroups of the v2 tree (the unified one on hybrid)."""
    return populated(Host(tmp_path, request.param))


def test_avx512_threads_their_cpus_and_where_each_cgroups_threads_ran(host):
    s = host.sensor()
    got = s.sample(context("be", "ls", "ls2", "idle"))
    assert got.cgroups["be"] == AvxUse(threads=2, avx512_threads=1, min_elapsed_ms=4, cpus=frozenset({0}),
                                       ran_cpus=frozenset({0}))
    assert got.cgroups["ls"] == AvxUse(2, 0, None, frozenset(), frozenset({1, 3}))
    assert got.cgroups["ls2"].ran_cpus == got.cgroups["idle"].ran_cpus == frozenset()  # asleep, no ticks before

    host.thread(30, NO_AVX, cpu=0, ticks=8)           # ran since: counted on CPU 0
    got = s.sample(context("be", "ls", "ls2", "idle"))
    assert got.cgroups["ls2"].ran_cpus == {0} and got.cgroups["idle"].ran_cpus == frozenset()


def test_the_recency_threshold_is_the_constructors(host):
    got = host.sensor(recent_ms=10_000).sample(context("be", "ls"))
    assert got.cgroups["be"].avx512_threads == 2 and got.cgroups["be"].cpus == {0, 2}
    assert got.cgroups["be"].ran_cpus == {0}           # 11 used AVX-512 long ago and sleeps
    got = host.sensor(recent_ms=1).sample(context("be", "ls"))
    assert got.cgroups["be"].avx512_threads == 0 and got.cgroups["be"].cpus == frozenset()


def test_a_parent_counts_its_childrens_threads_each_read_once(host):
    host.cgroup("ls/pod", [22])
    host.thread(22, AVX_NOW, cpu=2)
    got = host.sensor().sample(context("ls", "ls/pod"))
    assert got.cgroups["ls"] == AvxUse(3, 1, 4, frozenset({2}), frozenset({1, 3}))
    assert got.cgroups["ls/pod"] == AvxUse(1, 1, 4, frozenset({2}), frozenset())


def test_threads_gone_mid_round_and_cgroups_gone_are_skipped(host):
    host.put("ls", [20, 21, 99])                       # 99 exited between the listing and the reads
    host.put("ls2", [30, 98])
    write_thread(host.proc, 98, AVX_NOW, None)         # and 98 between its two files
    got = host.sensor().sample(context("ls", "ls2", "vanished"))
    assert got.cgroups["ls"].threads == 2 and got.cgroups["ls2"].threads == 1
    assert "vanished" not in got.cgroups


def test_unavailable_without_arch_status(tmp_path):
    h = Host(tmp_path)
    (h.proc / "self/arch_status").unlink()
    with pytest.raises(SensorUnavailable, match="no .*/self/arch_status: .*x86 only"):
        h.sensor()


def test_unavailable_on_a_cpu_without_avx512(tmp_path):
    h = Host(tmp_path)
    (h.proc / "self/arch_status").write_text("")       # what an x86 kernel prints there without AVX-512
    (h.proc / "cpuinfo").write_text("flags\t\t: fpu sse avx2\n")
    with pytest.raises(SensorUnavailable, match="no AVX-512 .*avx512f"):
        h.sensor()


# --- the PMU's licence counters ---------------------------------------------------------------------

def counted(h: Host, *cgroups: str) -> AvxSensor:
    """A started sensor after the round that opens the cgroups' counters (a first round has no licence)."""
    s = h.sensor()
    first = s.sample(context(*cgroups))
    assert [(first.cgroups[c].counted, first.cgroups[c].licence) for c in cgroups] == [(True, None)] * len(cgroups)
    assert [h.perf.open_for(c) for c in cgroups] == [[0, 1, 2, 3]] * len(cgroups)
    return s


def test_licence_2_cycles_make_avx512_licence_1_alone_avx2_and_ordinary_code_nothing(pmu_host):
    s = counted(pmu_host, "be", "ls", "ls2")
    assert s.detail == "arch_status and the PMU's licence counters"
    pmu_host.perf.set("be", 0, 1_000, 1_000, 10_000, 500, 6_000)        # cycles, at licence 1, at licence 2
    pmu_host.perf.set("ls2", 2, 1_000, 1_000, 10_000, 4_000, 0)
    pmu_host.perf.set("ls", 1, 1_000, 1_000, 10_000, 0, 0)
    got = s.sample(context("be", "ls", "ls2")).cgroups
    assert got["be"].licence == Licence(10_000, 0.05, 0.6, AVX512)
    assert got["ls2"].licence == Licence(10_000, 0.4, 0.0, AVX256)      # AVX2: arch_status never saw it
    assert got["ls"].licence == Licence(10_000, 0.0, 0.0, SCALAR)
    pmu_host.perf.set("be", 0, 2_000, 2_000, 20_000, 500, 6_000)        # the next round: only what grew
    assert s.sample(context("be")).cgroups["be"].licence == Licence(10_000, 0.0, 0.0, SCALAR)


def test_counts_taken_in_turns_are_scaled_by_enabled_over_running(pmu_host):
    s = counted(pmu_host, "be", "ls", "ls2")
    pmu_host.perf.set("be", 0, 2_000, 1_000, 5_000, 0, 2_500)          # on the PMU half its time: x 2
    pmu_host.perf.set("be", 1, 1_000, 1_000, 10_000, 0, 0)
    pmu_host.perf.set("ls", 1, 1_000, 0, 0, 0, 0)                      # enabled, never on the PMU: no telling
    got = s.sample(context("be", "ls", "ls2")).cgroups
    assert got["be"].licence == Licence(20_000, 0.0, 0.25, AVX512)      # unscaled it would be 2_500 / 15_000
    assert got["ls"].licence is None
    assert got["ls2"].licence == Licence(0, 0.0, 0.0, SCALAR)           # did not run: slowed no one


def test_licence_2_in_a_cgroup_never_seen_with_avx512_state_is_a_neighbours(pmu_host):
    s = counted(pmu_host, "ls", "ls2")
    pmu_host.perf.set("ls", 1, 1_000, 1_000, 10_000, 0, 9_000)         # on BE's core while BE ran AVX-512
    pmu_host.perf.set("ls2", 0, 1_000, 1_000, 10_000, 3_000, 6_000)
    got = s.sample(context("ls", "ls2")).cgroups
    assert got["ls"].licence == Licence(10_000, 0.0, 0.9, SCALAR)
    assert got["ls2"].licence == Licence(10_000, 0.3, 0.6, AVX256)      # its licence 1 may be its own


def test_a_cgroup_gone_between_rounds_closes_its_counters_and_has_no_licence(pmu_host):
    s = counted(pmu_host, "be", "ls")
    pmu_host.tree.remove("be")
    pmu_host.perf.set("ls", 1, 1_000, 1_000, 10_000, 0, 0)
    got = s.sample(context("be", "ls")).cgroups
    assert "be" not in got and pmu_host.perf.open_for("be") == []
    assert got["ls"].licence == Licence(10_000, 0.0, 0.0, SCALAR)
    s.stop()
    s.stop()
    assert pmu_host.perf.groups == []


def test_a_cgroup_past_the_fd_budget_is_not_counted(pmu_host):
    pmu_host.perf.limit = 3 * 4                                         # one cgroup's group on each of 4 CPUs
    s = counted(pmu_host, "be")
    pmu_host.perf.set("be", 0, 1_000, 1_000, 10_000, 0, 6_000)
    got = s.sample(context("be", "ls")).cgroups
    assert got["be"].counted and got["be"].licence.level == AVX512
    assert not got["ls"].counted and got["ls"].licence is None         # the loop takes arch_status for it


@pytest.mark.parametrize("refuse, why", [
    ({"cycles": errno.ENOENT}, "no hardware PMU (cycles: ENOENT) — a VM without a virtual PMU?"),
    ({"cycles": errno.EOPNOTSUPP}, "no hardware PMU (cycles: EOPNOTSUPP) — a VM without a virtual PMU?"),
    ({"core_power.lvl2_turbo_license": errno.ENOENT},
     "the PMU does not offer this event (core_power.lvl2_turbo_license: ENOENT) — another CPU model, or a "
     "virtual PMU that offers only the generic events?"),
])
def test_without_the_pmu_it_says_why_once_and_goes_on_with_arch_status(tmp_path, caplog, refuse, why):
    h = populated(Host(tmp_path))
    h.perf.refuse = refuse
    with caplog.at_level(logging.INFO, logger="koordd.sensors.avx"):
        s = h.sensor()
        for _ in range(2):
            got = s.sample(context("be", "ls")).cgroups
    assert [r.getMessage() for r in caplog.records] == [
        f"avx sensor: AVX-512 from arch_status alone, AVX2 unseen: no PMU licence counters: {why}"]
    assert s.detail == f"arch_status alone (AVX2 unseen): no PMU licence counters: {why}"
    assert got["be"].avx512_threads == 1 and not got["be"].counted and got["be"].licence is None
    assert h.perf.groups == []


@pytest.mark.parametrize("mode, cpu, why", [
    ("v2", ROCKET_LAKE, "GenuineIntel family 6 model 0xa7 has no CORE_POWER licence events koordd knows of "
                        "(Intel family 6 models 0x55, 0x6a, 0x6c, 0x7d, 0x7e have them)"),
    ("v2", ("AuthenticAMD", 25, 17), "AuthenticAMD family 25 model 0x11 has no CORE_POWER licence events"),
    ("v1", SKYLAKE_SP, "no cgroup v2 tree under "),
])
def test_a_cpu_without_the_events_or_a_host_without_a_v2_tree_is_not_counted(tmp_path, mode, cpu, why):
    h = populated(Host(tmp_path, mode, cpu))
    s = h.sensor()
    assert why in s.detail and h.perf.tries == []
    s.sample(context("be"))
    got = s.sample(context("be")).cgroups["be"]
    assert (got.counted, got.licence, h.perf.tries) == (False, None, [])


def test_registered_as_avx():
    assert optional_sensors.builtin_sensors()["avx"] is AvxSensor
