"""The avx sensor over a fake cgroup tree, /proc and sysfs: who used AVX-512, on which CPUs, who shares
them (SMT siblings included), threads gone mid-round, and why it is unavailable."""
from __future__ import annotations

import pytest

from fakecgroup import FakeCgroups
from koordd.sensors import registry
from koordd.sensors.avx import AvxSensor, AvxUse
from koordd.sensors.contract import SensorContext, SensorUnavailable
from test_avx import stat_line, write_thread

AVX_NOW, AVX_OLD, NO_AVX = "AVX512_elapsed_ms:\t4\n", "AVX512_elapsed_ms:\t5000\n", "AVX512_elapsed_ms:\t-1\n"


class Host:
    """A v2 tree, /proc and sysfs of a 4-CPU host with SMT pairs {0,1} and {2,3}."""

    def __init__(self, tmp_path, mode="v2"):
        self.tree = FakeCgroups(tmp_path, mode)
        self.proc, self.sys = tmp_path / "proc", tmp_path / "sys"
        (self.proc / "self").mkdir(parents=True)
        (self.proc / "self/arch_status").write_text(NO_AVX)
        (self.proc / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n")
        for cpu, siblings in {0: "0-1", 1: "0-1", 2: "2,3", 3: "2,3"}.items():
            (self.sys / f"devices/system/cpu/cpu{cpu}/topology").mkdir(parents=True)
            (self.sys / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").write_text(siblings + "\n")

    def cgroup(self, path: str, tids) -> None:
        self.tree.add(path)
        self.put(path, tids)

    def put(self, path: str, tids) -> None:
        controller, name = ("cpu", "tasks") if self.tree.v1 else (None, "cgroup.threads")
        self.tree.set(path, controller, name, "".join(f"{t}\n" for t in tids))

    def thread(self, tid: int, arch_status: str, cpu: int, state: str = "S", ticks: int = 0) -> None:
        write_thread(self.proc, tid, arch_status, stat_line(tid, comm="w (x)", state=state, utime=ticks, cpu=cpu))

    def sensor(self, **kw) -> AvxSensor:
        s = AvxSensor(self.tree.root, self.proc, self.sys, **kw)
        s.start()
        return s


def context(*cgroups: str) -> SensorContext:
    return SensorContext(0.0, {c: "LS" for c in cgroups})


@pytest.fixture(params=["v2", "v1"])
def host(request, tmp_path):
    h = Host(tmp_path, request.param)
    h.cgroup("be", [10, 11])
    h.cgroup("ls", [20, 21])
    h.cgroup("ls2", [30])
    h.cgroup("idle", [40])
    h.thread(10, AVX_NOW, cpu=0, state="R")           # BE's AVX-512 thread on core {0,1}
    h.thread(11, AVX_OLD, cpu=2)                       # used it long ago
    h.thread(20, NO_AVX, cpu=1, state="R")            # LS on 0's SMT sibling: a victim
    h.thread(21, NO_AVX, cpu=3, state="R")            # LS on the other core: not slowed
    h.thread(30, NO_AVX, cpu=0, ticks=7)              # sleeping now; shared CPU 0 if it ran since last round
    h.thread(40, NO_AVX, cpu=0, ticks=9)              # asleep throughout: not a victim
    return h


def test_avx512_threads_their_cpus_and_the_victims_on_shared_cores(host):
    s = host.sensor()
    got = s.sample(context("be", "ls", "ls2", "idle"))
    assert got.cgroups["be"] == AvxUse(threads=2, avx512_threads=1, min_elapsed_ms=4, cpus=frozenset({0}))
    assert got.cgroups["ls"] == AvxUse(2, 0, None, frozenset())
    assert got.cpus == {0, 1}                          # CPU 0 and its SMT sibling
    assert got.victims == {"ls": {1}}                 # 30 and 40 are asleep, BE's own AVX thread is no victim

    host.thread(30, NO_AVX, cpu=0, ticks=8)           # ran since: now a victim on CPU 0
    got = s.sample(context("be", "ls", "ls2", "idle"))
    assert got.victims == {"ls": {1}, "ls2": {0}}


def test_the_recency_threshold_is_the_constructors(host):
    got = host.sensor(recent_ms=10_000).sample(context("be", "ls"))
    assert got.cgroups["be"].avx512_threads == 2 and got.cgroups["be"].cpus == {0, 2}
    assert got.cpus == {0, 1, 2, 3} and got.victims == {"ls": {1, 3}}
    assert host.sensor(recent_ms=1).sample(context("be", "ls")).cpus == frozenset()


def test_a_parent_counts_its_childrens_threads_each_read_once(host):
    host.cgroup("ls/pod", [22])
    host.thread(22, AVX_NOW, cpu=2)
    got = host.sensor().sample(context("ls", "ls/pod"))
    assert got.cgroups["ls"] == AvxUse(3, 1, 4, frozenset({2}))
    assert got.cgroups["ls/pod"] == AvxUse(1, 1, 4, frozenset({2}))
    assert got.victims == {"ls": {3}}                  # 21 on CPU 3, 22's sibling; 20 on CPU 1 is not shared


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


def test_registered_as_avx():
    assert registry.BUILTIN["avx"] is AvxSensor
