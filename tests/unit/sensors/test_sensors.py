"""Sensors on literal kernel text: PSI, /proc + /sys for the node, fake cgroup trees for cgroups."""
from __future__ import annotations

import dataclasses
import fnmatch
import logging
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from koordtest.needs import reads_only_what_it_needs
from koordtest.fakes.cgroup import FakeCgroups, psi, rules
from koordd.core.cgroup_text import match_pattern
from koordd.core.config import parse_config
from koordd.core.health import DEFAULT_HEALTH
from koordd.core.loop import Action, Loop
from koordd.core.snapshot import CGROUP_FIELDS, CgroupSample, CpuTopology, NodeSample, Pressure, PressureStat, Snapshot, Throttling
from koordd.sensors import collect
from koordd.sensors.cgroup_stats import CgroupSensor, flat_keyed, make_sample
from koordd.sensors.collect import Sensors, find_classified
from koordd.sensors.contract import OptionalSensor
from koordd.sensors.lifecycle import SensorManager
from koordd.sensors.node import CLOCK_TICKS, NodeSensor, parse_meminfo, parse_proc_stat_cpu, parse_proc_stat_steal
from koordd.sensors.psi import parse_psi, with_growth

JOB = "be.slice/job"

# --- PSI ------------------------------------------------------------------------------

GOOD = "some avg10=1.13 avg60=1.12 avg300=0.32 total=1327965\nfull avg10=0.00 avg60=0.01 avg300=0.00 total=42\n"


def test_parse_psi():
    assert parse_psi(GOOD) == PressureStat(Pressure(1.13, 1.12, 0.32, 1327965), Pressure(0.0, 0.01, 0.0, 42))
    assert parse_psi("some avg10=0.50 avg60=0.00 avg300=0.00 total=7\n") == PressureStat(
        Pressure(0.5, 0.0, 0.0, 7), None)                                   # system cpu before 5.13


@pytest.mark.parametrize("text", [
    "", "\n", "half avg10=0.00 avg60=0.00 avg300=0.00 total=0",
    "some avg10=0.00 avg60=0.00 total=0", "some avg10=x avg60=0.00 avg300=0.00 total=0",
    "some avg10=0.00 avg60=0.00 avg300=0.00 total=1.5", "some avg10 avg60=0.00 avg300=0.00 total=0",
])
def test_parse_psi_malformed(text):
    with pytest.raises(ValueError):
        parse_psi(text)


def test_with_growth():
    old, new = parse_psi(psi(1000, 100)), parse_psi(psi(3000, 100))
    grown = with_growth(new, old, 2.0)
    assert (grown.some.growth, grown.full.growth) == (1000.0, 0.0)
    assert with_growth(new, None, 2.0) is new and with_growth(new, old, 0.0) is new
    assert with_growth(old, new, 1.0).some.growth is None               # counter went back: no rate
    assert with_growth(parse_psi(psi(5, None)), old, 1.0).full is None


# --- node -----------------------------------------------------------------------------

MEMINFO = """MemTotal:       16000000 kB
MemFree:         1000000 kB
MemAvailable:    8000000 kB
AnonPages:       4000000 kB
Unevictable:        1000 kB
HugePages_Total:       0
"""


def stat(user, system, idle, iowait=0, steal=0):
    return (f"cpu  {user} 0 {system} {idle} {iowait} 0 0 {steal} 0 0\n"
            f"cpu0 {user} 0 {system} {idle} {iowait} 0 0 {steal} 0 0\nintr 1 2 3\nctxt 99\n")


@pytest.fixture
def host(tmp_path):
    """A 4-CPU host: SMT pairs (0,2) and (1,3), NUMA node 0 = 0-1, node 1 = 2-3."""
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    files = {proc / "stat": stat(100, 50, 800, 50), proc / "meminfo": MEMINFO,
             sys / "devices/system/cpu/online": "0-3\n",
             sys / "devices/system/node/node0/cpulist": "0-1\n", sys / "devices/system/node/node1/cpulist": "2-3\n",
             sys / "devices/system/node/possible": "0-1\n"}
    for res in ("cpu", "memory", "io"):
        files[proc / "pressure" / res] = psi(1000, 500)
    for cpu, sib in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")):
        files[sys / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"] = sib + "\n"
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return SimpleNamespace(proc=proc, sys=sys)


def test_node_sensor_over_two_samples(host):
    sensor = NodeSensor(host.proc, host.sys)
    first = sensor.sample(10.0)
    assert (first.cpu_count, first.cpu_used) == (4, None)
    assert (first.memory_total, first.memory_available, first.memory_anon) == (
        16000000 * 1024, 8000000 * 1024, 4001000 * 1024)
    assert first.memory_pressure.some == Pressure(0.0, 0.0, 0.0, 1000)
    assert first.topology == (CpuTopology(0, 0, 0), CpuTopology(1, 1, 0), CpuTopology(2, 0, 1),
                              CpuTopology(3, 1, 1))
    # +300 busy (user 200, system 100) of +400 jiffies: 3 of 4 cores busy
    (host.proc / "stat").write_text(stat(300, 150, 850, 100))
    (host.proc / "pressure" / "memory").write_text(psi(3000, 500))
    second = sensor.sample(12.0)
    assert second.cpu_used == pytest.approx(3.0)
    assert (second.memory_pressure.some.growth, second.memory_pressure.full.growth) == (1000.0, 0.0)
    assert second.cpu_pressure.some.growth == 0.0


def test_node_sensor_tolerates_missing_and_broken_files(host, tmp_path):
    (host.proc / "meminfo").unlink()
    (host.proc / "pressure" / "io").write_text("garbage\n")
    sensor = NodeSensor(host.proc, host.sys)
    s = sensor.sample(1.0)
    assert (s.memory_total, s.memory_anon, s.io_pressure) == (None, None, None)
    (host.proc / "stat").write_text("intr 1\n")
    assert sensor.sample(2.0).cpu_used is None
    bare = NodeSensor(tmp_path / "nothing", tmp_path / "nothing")
    assert bare.topology == () and bare.cpu_count >= 1 and bare.sample(1.0).cpu_used is None


def per_cpu_steal(*ticks):
    lines = "".join(f"cpu{i} 10 0 5 80 0 0 0 {t} 0 0\n" for i, t in enumerate(ticks))
    return f"cpu  10 0 5 80 0 0 0 {sum(ticks)} 0 0\n" + lines + "intr 1\n"


def test_node_sensor_names_the_steal_of_the_vcpu_that_lost_the_most_in_the_round(host):
    """A hypervisor that holds one vCPU off for 100 ms shows on that vCPU's line only; the node's average
    would dilute it by the number of CPUs."""
    (host.proc / "stat").write_text(per_cpu_steal(5, 5, 5, 5))
    sensor = NodeSensor(host.proc, host.sys)
    assert sensor.sample(1.0).steal_worst is None                  # nothing to compare with yet
    (host.proc / "stat").write_text(per_cpu_steal(5, 5 + CLOCK_TICKS // 10, 6, 5))
    assert sensor.sample(2.0).steal_worst == pytest.approx(0.1)
    (host.proc / "stat").write_text(per_cpu_steal(5, 5 + CLOCK_TICKS // 10, 6, 5))
    assert sensor.sample(3.0).steal_worst == 0.0                     # bare metal, or a quiet host
    (host.proc / "stat").write_text(per_cpu_steal(9, 9, 9))            # a CPU went offline: not comparable
    assert sensor.sample(4.0).steal_worst is None
    (host.proc / "stat").write_text(per_cpu_steal(1, 1, 1))            # a counter that went back adds nothing
    assert sensor.sample(5.0).steal_worst == 0.0
    assert parse_proc_stat_steal("cpu  1 2 3 4\ncpu0 1 2 3 4\n") == (0,)   # old kernels: no steal column


@pytest.mark.parametrize("text, driver", [("haltpoll\n", "haltpoll"), ("none\n", "none"), (None, None), ("", None),
                                          ("x" * 65, None), ("bad\x01name", None), (b"\xff\xfe", None)])
def test_node_sensor_reads_the_cpuidle_driver_once_and_nothing_odd_passes_for_a_name(host, text, driver):
    """be_suppress's wake lever is tried only where a cpuidle driver governs how CPUs idle ("none": not)."""
    path = host.sys / "devices/system/cpu/cpuidle/current_driver"
    if text is not None:
        path.parent.mkdir(parents=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    sensor = NodeSensor(host.proc, host.sys)
    assert sensor.sample(1.0).cpuidle_driver == driver
    if text is not None:
        path.write_text("acpi_idle\n")                    # read at start only
        assert sensor.sample(2.0).cpuidle_driver == driver


def test_proc_parsers():
    assert parse_proc_stat_cpu(stat(10, 5, 80, 5, steal=2)) == (15, 102)   # steal is not our busy time
    assert parse_proc_stat_cpu("cpu  1 2 3 4\n") == (6, 10)      # old kernels: fewer columns
    with pytest.raises(ValueError):
        parse_proc_stat_cpu("cpu0 1 2 3 4\n")
    assert parse_meminfo(MEMINFO)["HugePages_Total"] == 0
    text = "usage_usec 12\nnr_periods 3\nbroken\nanon_thp 7\nanon 5\nlast 9"
    assert flat_keyed(text, "usage_usec", "nr_periods", "broken", "missing") == {"usage_usec": 12, "nr_periods": 3}
    assert flat_keyed(text, "anon", "last") == {"anon": 5, "last": 9}          # not anon_thp; no final newline


# --- cgroups ----------------------------------------------------------------------------

def test_cgroup_usage_and_throttling_from_two_samples(tree):
    sensor = CgroupSensor(tree.fs)
    tree.stat(JOB, usage_us=1_000_000, nr_periods=10, nr_throttled=2, throttled_us=5000, memory_current=4096)
    first = sensor.sample(JOB, "be", 100.0)
    assert (first.path, first.cls, first.cpu_usage) == (JOB, "be", None)
    assert first.throttling == Throttling(10, 2, 5000)
    tree.stat(JOB, usage_us=5_000_000, nr_periods=30, nr_throttled=7, throttled_us=9000, memory_current=8192)
    second = sensor.sample(JOB, "be", 102.0)
    assert second.cpu_usage == pytest.approx(2.0)
    assert second.throttling == Throttling(30, 7, 9000, 20, 5)
    assert second.memory_current == 8192


@given(st.lists(st.sampled_from(sorted(CGROUP_FIELDS)), unique=True),
       st.text(max_size=20), st.sampled_from(["", "BE", "LS"]))
def test_make_sample_is_the_dataclass_built_by_its_constructor(names, path, cls):
    """The sensor's fast constructor gives the very object CgroupSample(...) gives: equal, same hash and repr,
    every field set (a field added to CgroupSample with a default_factory would make it unsafe: fails here)."""
    values = {name: i for i, name in enumerate(names)}
    made, built = make_sample(path, cls, values), CgroupSample(path=path, cls=cls, **values)
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert {f.name: getattr(made, f.name) for f in dataclasses.fields(CgroupSample)} == built.__dict__
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.cpu_usage = 1.0


def test_a_listed_only_sample_is_one_object_until_its_cgroup_goes(tree):
    """A member listed but not read (a calm tick) costs a dictionary look-up, not a new sample; the sensor
    forgets it with the cgroup, and a sample that reads fields is a new one each time."""
    sensor = CgroupSensor(tree.fs)
    listed = sensor.sample(JOB, "be", 1.0, frozenset())
    assert listed == CgroupSample(path=JOB, cls="be")
    assert sensor.sample(JOB, "be", 2.0, frozenset()) is listed
    assert sensor.sample(JOB, "ls", 2.0, frozenset()) == CgroupSample(path=JOB, cls="ls")   # its class is its own
    assert sensor.sample(JOB, "be", 2.0, frozenset({"cpu_usage"})) is not listed
    sensor.forget_except(set())
    assert sensor.sample(JOB, "be", 3.0, frozenset()) is not listed


def test_cgroup_knob_values_and_pressure(tree):
    if tree.v1:
        tree.set(JOB, "cpu", "cpu.cfs_quota_us", "50000\n")
        tree.set(JOB, "memory", "memory.limit_in_bytes", "1073741824\n")
    else:
        tree.set(JOB, "cpu", "cpu.max", "50000 100000\n")
        tree.set(JOB, "memory", "memory.max", "1073741824\n")
    sensor = CgroupSensor(tree.fs)
    s = sensor.sample(JOB, "be", 1.0)
    assert (s.cpu_max, s.cpu_max_burst, s.memory_max) == ("50000 100000", "0", "1073741824")
    assert s.cpuset_cpus == ("0-7" if tree.v1 else "")
    if tree.mode in ("v2", "hybrid"):
        assert s.cpu_pressure.some.total_us == 0
        tree.set(JOB, None, "io.pressure", psi(500_000, 0))
        assert sensor.sample(JOB, "be", 3.0).io_pressure.some.growth == 250_000.0
    else:
        assert (s.cpu_pressure, s.memory_pressure, s.io_pressure) == (None, None, None)


def test_missing_files_give_none(tree):
    sensor = CgroupSensor(tree.fs)
    sensor.sample(JOB, "be", 1.0)
    for controller, name in (("cpu", "cpu.stat"), ("cpuacct", "cpuacct.usage"), (None, "cpu.stat"),
                             ("cpu", "cpu.max"), ("cpu", "cpu.cfs_quota_us")):
        try:
            (tree.dir(JOB, controller) / name).unlink(missing_ok=True)
        except ValueError:
            pass                                      # pure v1 has no v2 tree
    s = sensor.sample(JOB, "be", 2.0)
    assert (s.cpu_usage, s.throttling, s.cpu_max) == (None, None, None)
    assert s.cpu_max_burst == "0"


def test_v2_cpu_stat_without_the_cpu_controller_has_no_throttling(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add(JOB, usage_us=1000)
    tree.set(JOB, None, "cpu.stat", "usage_usec 1000\nuser_usec 500\nsystem_usec 500\n")
    s = CgroupSensor(tree.fs).sample(JOB, "be", 1.0)
    assert s.throttling is None


def test_counter_going_back_gives_no_rate(tree):
    sensor = CgroupSensor(tree.fs)
    tree.stat(JOB, usage_us=5_000_000)
    sensor.sample(JOB, "be", 1.0)
    tree.stat(JOB, usage_us=1_000)
    assert sensor.sample(JOB, "be", 2.0).cpu_usage is None


def test_vanished_cgroup_gives_none_not_errors(tree):
    sensor = CgroupSensor(tree.fs)
    sensor.sample(JOB, "be", 1.0)
    tree.remove(JOB)
    s = sensor.sample(JOB, "be", 2.0)
    assert (s.cpu_usage, s.throttling, s.cpu_max, s.cpu_max_burst, s.cpuset_cpus, s.memory_current,
            s.memory_max, s.cpu_pressure, s.memory_pressure, s.io_pressure) == (None,) * 10


def test_forget_except_starts_a_recreated_cgroup_fresh(tree):
    sensor = CgroupSensor(tree.fs)
    tree.stat(JOB, usage_us=1_000_000)
    sensor.sample(JOB, "be", 1.0)
    sensor.forget_except(set())
    tree.stat(JOB, usage_us=3_000_000)
    assert sensor.sample(JOB, "be", 2.0).cpu_usage is None


# --- finding and snapshots -----------------------------------------------------------------

PATTERNS = {"kubepods.slice/kubepods-besteffort.slice": "BE", "kubepods.slice/kubepods-burstable.slice/*": "LS",
            "system.slice": "SYSTEM", "kubepods.slice/kubepods-besteffort.slice/*": "BE"}


def classify(cg):
    return next((cls for p, cls in PATTERNS.items() if match_pattern(p, cg)), None)


def k8s_tree(tmp_path, mode):
    tree = FakeCgroups(tmp_path, mode)
    for cg in ("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-a.scope",
               "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2.slice",
               "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3.slice",
               "system.slice/sshd.service", "user.slice"):
        tree.add(cg)
    return tree


@pytest.mark.parametrize("mode", ["v2", "v1", "hybrid", "v1-comount"])
def test_find_classified_stops_at_class_roots(tmp_path, mode):
    tree = k8s_tree(tmp_path, mode)
    assert find_classified(tree.fs, classify, 4) == {
        "kubepods.slice/kubepods-besteffort.slice": "BE",        # its pods are not listed again
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2.slice": "LS",
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3.slice": "LS",
        "system.slice": "SYSTEM"}
    assert find_classified(tree.fs, classify, 1) == {"system.slice": "SYSTEM"}


@pytest.mark.parametrize("mode", ["v2", "v1", "hybrid", "v1-comount"])
def test_snapshot_end_to_end(tmp_path, host, monkeypatch, mode):
    tree = k8s_tree(tmp_path, mode)
    clock = iter([50.0, 51.0])
    monkeypatch.setattr(collect, "time", SimpleNamespace(monotonic=lambda: next(clock), time=time.time))
    be = "kubepods.slice/kubepods-besteffort.slice"
    ls2 = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2.slice"
    sensors = Sensors(tree.fs, rules(PATTERNS), proc_root=host.proc, sys_root=host.sys)
    assert sensors.max_depth == 3
    tree.stat(be, usage_us=1_000_000)
    first = sensors.snapshot()
    assert set(first.cgroups) == {be, ls2, ls2.replace("pod2", "pod3"), "system.slice"}
    tree.stat(be, usage_us=2_500_000, nr_throttled=4)
    tree.stat(ls2, usage_us=500_000)
    (host.proc / "stat").write_text(stat(300, 150, 850, 100))
    tree.remove(ls2.replace("pod2", "pod3"))
    second = sensors.snapshot()
    assert second.time == 51.0 and second.node.cpu_used == pytest.approx(3.0)
    assert set(second.cgroups) == {be, ls2, "system.slice"}           # pod3 vanished: simply absent
    assert second.cgroups[be].cpu_usage == pytest.approx(1.5) and second.cgroups[be].cls == "BE"
    assert second.cgroups[ls2].cpu_usage == pytest.approx(0.5)
    assert [c.path for c in second.of_class("LS")] == [ls2]


def test_memory_anon_oom_kills_and_frozen(tree):
    tree.stat("be.slice/job", memory_current=300, memory_anon=200)
    if tree.mode == "v2":
        tree.set("be.slice/job", "memory", "memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
        tree.set("be.slice/job", None, "cgroup.freeze", "1\n")
    else:
        tree.set("be.slice/job", "memory", "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
        tree.set("be.slice/job", "freezer", "freezer.state", "FROZEN\n")
    s = CgroupSensor(tree.fs).sample("be.slice/job", "BE", 1.0)
    assert (s.memory_current, s.memory_anon, s.oom_kills, s.frozen) == (300, 200, 2, True)


def test_watched_cgroups_are_sampled_without_a_class_and_held_originals_pass_through(tmp_path, host):
    tree = FakeCgroups(tmp_path, "v2").add("scope/be").add("other")
    sensors = Sensors(tree.fs, rules({"scope/be": "BE"}), proc_root=host.proc, sys_root=host.sys)
    snap = sensors.snapshot(watch={"scope", "gone"}, held={("scope/be", "cpu.max"): "max 100000"})
    assert {p: c.cls for p, c in snap.cgroups.items()} == {"scope/be": "BE", "scope": ""}
    assert snap.of_class("BE")[0].path == "scope/be" and snap.held == {("scope/be", "cpu.max"): "max 100000"}
    assert {"cpu.max", "memory.reclaim", "cgroup.kill"} <= snap.supported
    v1 = Sensors(FakeCgroups(tmp_path / "v1", "v1").fs, (), proc_root=host.proc, sys_root=host.sys)
    assert "memory.reclaim" not in v1.supported and "cgroup.freeze" in v1.supported


def test_members_of_requested_classes_are_sampled_apart_from_the_class_roots(tmp_path, host):
    tree = FakeCgroups(tmp_path, "v1").add("be.slice/job1", memory_current=10).add("be.slice/job2")
    tree.add("ls.slice/web")
    sensors = Sensors(tree.fs, rules({"be.slice": "BE", "ls.slice": "LS"}), proc_root=host.proc, sys_root=host.sys)
    snap = sensors.snapshot(member_classes={"BE"})
    assert set(snap.cgroups) == {"be.slice", "ls.slice"}                 # class sums stay per root
    assert [m.path for m in snap.units("BE")] == ["be.slice/job1", "be.slice/job2"]
    assert [m.path for m in snap.units("LS")] == ["ls.slice"]            # not asked for: the root itself
    assert snap.find("be.slice/job1").memory_current == 10 and snap.find("be.slice/nope") is None
    assert snap.find("ls.slice").cls == "LS"


def test_the_snapshot_carries_the_health_targets_each_ls_rule_declares(tmp_path, host):
    tree = FakeCgroups(tmp_path, "v2").add("api.slice").add("cache.slice").add("be.slice")
    conf = parse_config('[[classes]]\nname = "LS"\ncgroups = ["api.slice"]\nhealth = { runq_p99 = "10ms" }\n'
                        '[[classes]]\nname = "LS"\ncgroups = ["cache.slice"]\n'
                        '[[classes]]\nname = "BE"\ncgroups = ["be.slice"]\n', "koordd.toml", {})
    sensors = Sensors(tree.fs, conf.classes, proc_root=host.proc, sys_root=host.sys)
    snap = sensors.snapshot()
    assert set(snap.health) == {"api.slice"} and snap.health_of("api.slice").runq_p99_us == 10_000.0
    assert snap.health_of("cache.slice") == DEFAULT_HEALTH
    # A reload with other targets reaches the next snapshot.
    conf = parse_config('[[classes]]\nname = "LS"\ncgroups = ["*.slice"]\nhealth = { cpu_pressure = 5 }\n',
                        "koordd.toml", {})
    sensors.set_classes(conf.classes)
    assert {p: t.cpu_pressure for p, t in sensors.snapshot().health.items()} == \
        {"api.slice": 5.0, "cache.slice": 5.0, "be.slice": 5.0}


def test_a_round_matches_each_cgroup_against_the_rules_once(tmp_path, host, monkeypatch):
    """One walk gives each cgroup its rule and says whether any pattern reaches below it, and the class
    roots' SLOs and health targets come from the rules that walk found: no cgroup name is matched against
    a pattern twice in a round (before, the class, the reach of the patterns and each root's SLO and
    health targets each matched it again)."""
    tree = k8s_tree(tmp_path, "v2")
    conf = parse_config('[[classes]]\nname = "LS"\ncgroups = ["kubepods.slice/kubepods-burstable.slice/*"]\n'
                        'slo = { latency_p99 = "5ms" }\nhealth = { runq_p99 = "1ms" }\n'
                        '[[classes]]\nname = "BE"\ncgroups = ["kubepods.slice/kubepods-besteffort.slice", '
                        '"kubepods.slice/kubepods-besteffort.slice/*"]\n'
                        '[[classes]]\nname = "SYSTEM"\ncgroups = ["system.slice"]\n', "koordd.toml", {})
    sensors = Sensors(tree.fs, conf.classes, proc_root=host.proc, sys_root=host.sys)
    walked = []
    for _ in tree.fs.walk(None, sensors.max_depth, prune=lambda cg: walked.append(cg)):
        pass
    matched, real = [], fnmatch.fnmatchcase
    monkeypatch.setattr(fnmatch, "fnmatchcase", lambda name, glob: matched.append(name) or real(name, glob))
    snap = sensors.snapshot(fields=frozenset())
    monkeypatch.undo()
    ls = [f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{n}.slice" for n in (2, 3)]
    assert set(snap.slo) == set(snap.health) == set(ls)
    assert snap.slo_of(ls[0]).latency_p99_us == 5000.0 and snap.health_of(ls[1]).runq_p99_us == 1000.0
    assert {p: c.cls for p, c in snap.cgroups.items()} == find_classified(tree.fs, conf.classify, 3)
    assert len(matched) <= len(walked) * len(sensors.patterns), (len(matched), len(walked))


def test_only_the_fields_the_loops_need_are_read(tmp_path, host, monkeypatch):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice/job1").add("be.slice/job2").add("ls.slice")
    contexts = []

    class Gpu(OptionalSensor):
        name = "gpus"

        def sample(self, context):
            contexts.append(context)
            return ()

    optional = SensorManager({"gpus": Gpu})
    sensors = Sensors(tree.fs, rules({"be.slice": "BE", "ls.slice": "LS"}), proc_root=host.proc, sys_root=host.sys,
                      optional=optional)
    read = []
    real_read = sensors.fs.read
    monkeypatch.setattr(sensors.fs, "read", lambda c, cg, name: read.append((cg, name)) or real_read(c, cg, name))
    snap = sensors.snapshot(member_classes={"BE"}, fields=frozenset({"cpu_usage", "cpu_max"}),
                            member_fields=frozenset({"frozen"}))
    assert sorted(read) == [("be.slice", "cpu.max"), ("be.slice", "cpu.stat"),
                            ("be.slice/job1", "cgroup.freeze"), ("be.slice/job2", "cgroup.freeze"),
                            ("ls.slice", "cpu.max"), ("ls.slice", "cpu.stat")]
    be = snap.cgroups["be.slice"]
    assert be.cpu_max == "max 100000" and be.memory_current is None and be.cpu_pressure is None
    assert snap.find("be.slice/job1").frozen is False and snap.find("be.slice/job1").cpu_max is None
    assert contexts == [] and snap.sections == {}          # no loop named "gpus"
    optional.require({"gpus": ["gpu_share"]})
    snap = sensors.snapshot(member_classes={"BE"}, fields=frozenset({"gpus"}))
    assert snap.sections == {"gpus": ()}
    # The sensor learns which cgroups were sampled, members with their root's class.
    assert contexts[0].now == snap.time and contexts[0].cgroups == {
        "be.slice": "BE", "ls.slice": "LS", "be.slice/job1": "BE", "be.slice/job2": "BE"}


def test_v2_cpu_stat_is_read_once_for_usage_and_throttling(tmp_path, host, monkeypatch):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    sensors = Sensors(tree.fs, rules({"be.slice": "BE"}), proc_root=host.proc, sys_root=host.sys)
    read = []
    real_read = sensors.fs.read
    monkeypatch.setattr(sensors.fs, "read", lambda c, cg, name: read.append(name) or real_read(c, cg, name))
    tree.stat("be.slice", usage_us=5_000_000, nr_periods=10, nr_throttled=3)
    be = sensors.snapshot(fields=frozenset({"cpu_usage", "throttling"})).cgroups["be.slice"]
    assert read == ["cpu.stat"] and be.throttling.nr_throttled == 3


def test_members_are_listed_first_and_read_only_when_filled(tmp_path, host, monkeypatch):
    """The daemon lists members (a directory listing) and reads them only as far as the due loops ask
    this tick (Loop.member_fields): idle pods cost no file reads."""
    tree = FakeCgroups(tmp_path, "v2").add("be.slice/job1", memory_current=10).add("be.slice/job2")
    sensors = Sensors(tree.fs, rules({"be.slice": "BE"}), proc_root=host.proc, sys_root=host.sys)
    read = []
    real_read = sensors.fs.read
    monkeypatch.setattr(sensors.fs, "read", lambda c, cg, name: read.append((cg, name)) or real_read(c, cg, name))
    listed = sensors.snapshot(member_classes={"BE"}, fields=frozenset({"memory_current"}), member_fields=frozenset())
    assert read == [("be.slice", "memory.current")]
    assert [(m.path, m.memory_current) for m in listed.units("BE")] == [("be.slice/job1", None), ("be.slice/job2", None)]
    assert sensors.fill_members(listed, frozenset()) is listed and len(read) == 1
    filled = sensors.fill_members(listed, frozenset({"memory_current"}))
    assert [(m.path, m.memory_current) for m in filled.units("BE")] == [("be.slice/job1", 10), ("be.slice/job2", 0)]
    assert filled.time == listed.time and filled.cgroups == listed.cgroups


def test_a_listing_keeps_the_counters_of_the_last_read(tmp_path, host):
    """A member listed but not read between two reads still gets its rate, over the whole gap."""
    tree = FakeCgroups(tmp_path, "v2").add("be.slice/job1")
    sensors = Sensors(tree.fs, rules({"be.slice": "BE"}), proc_root=host.proc, sys_root=host.sys)
    usage = frozenset({"cpu_usage"})
    tree.stat("be.slice/job1", usage_us=0)
    sensors.fill_members(sensors.snapshot(member_classes={"BE"}, fields=frozenset(), member_fields=frozenset()), usage)
    sensors.snapshot(member_classes={"BE"}, fields=frozenset(), member_fields=frozenset())
    tree.stat("be.slice/job1", usage_us=1_000_000)
    snap = sensors.snapshot(member_classes={"BE"}, fields=frozenset(), member_fields=frozenset())
    [job] = sensors.fill_members(snap, usage).units("BE")
    assert job.cpu_usage is not None and job.cpu_usage > 0


def test_sections_hold_what_optional_sensors_produced_and_gpus_is_one_of_them():
    node = NodeSample(2, None)
    bare = Snapshot(1.0, 0.0, node)
    assert bare.gpus == () and bare.section("gpus") is None and bare.section("rdt", {}) == {}
    gpu = object()
    snap = Snapshot(1.0, 0.0, node, sections={"gpus": (gpu,), "rdt": {"be.slice": 3}})
    assert snap.gpus == (gpu,) and snap.section("rdt") == {"be.slice": 3}


class ReadsGpus(Loop):
    """Reads the GPU section although its needs() name only a cgroup field."""
    name = "reads_gpus"

    @staticmethod
    def needs(settings):
        return frozenset({"cpu_usage"})

    @staticmethod
    def decide(snapshot, settings, state):
        return [Action("gpu.slice", "cpu.max", None)] * len(snapshot.gpus)


class NamesGpus(ReadsGpus):
    @staticmethod
    def needs(settings):
        return frozenset({"gpus"})


def test_a_decide_reading_a_section_its_needs_do_not_name_fails_under_the_spy():
    snap = Snapshot(1.0, 0.0, NodeSample(2, None), sections={"gpus": ()})
    with pytest.raises(AssertionError, match=r"read the section \['gpus'\]"):
        reads_only_what_it_needs(ReadsGpus).__func__(snap, None, None)
    assert reads_only_what_it_needs(NamesGpus).__func__(snap, None, None) == []


# --- memory.stat's refault counters (proactive_reclaim) -------------------------------------------------

STAT = "anon 4096\nfile 8192\nworkingset_refault_anon {anon}\nworkingset_refault_file {file}\nworkingset_restore_file 1\n"


def test_refaults_are_memory_stat_s_page_counts_in_bytes_read_with_memory_anon_in_one_read(tmp_path, monkeypatch):
    from koordd.backends.cgroup_knobs import PAGE_SIZE
    from koordd.core.snapshot import Refaults
    tree = FakeCgroups(tmp_path, "v2").add(JOB)
    tree.set(JOB, "memory", "memory.stat", STAT.format(anon=3, file=250))
    sensor = CgroupSensor(tree.fs)
    read = []
    real_read = sensor.fs.read
    monkeypatch.setattr(sensor.fs, "read", lambda c, cg, name: read.append(name) or real_read(c, cg, name))
    s = sensor.sample(JOB, "BE", 1.0, frozenset({"memory_anon", "memory_refaults"}))
    assert s.memory_refaults == Refaults(250 * PAGE_SIZE, 3 * PAGE_SIZE) and s.memory_refaults.total == 253 * PAGE_SIZE
    assert s.memory_anon == 4096 and read == ["memory.stat"]
    # Not asked for: not read.
    read.clear()
    assert sensor.sample(JOB, "BE", 2.0, frozenset({"memory_current"})).memory_refaults is None
    assert read == ["memory.current"]


@pytest.mark.parametrize("text", [
    STAT.format(anon=0, file="12x"), STAT.format(anon=-1, file=0), STAT.format(anon=0, file=1 << 64),
    STAT.format(anon=0, file="9" * 5000), STAT.format(anon=0, file=""), "workingset_refault_file 1.5\n",
], ids=["word", "negative", "past-u64", "huge", "empty", "float"])
def test_garbled_refault_counters_read_as_unknown_with_one_warning(tmp_path, text, caplog):
    tree = FakeCgroups(tmp_path, "v2").add(JOB).add("be.slice/other")
    for cg in (JOB, "be.slice/other"):
        tree.set(cg, "memory", "memory.stat", text)
    sensor = CgroupSensor(tree.fs)
    fields = frozenset({"memory_refaults", "memory_current"})
    with caplog.at_level(logging.WARNING, logger="koordd.sensors"):
        samples = [sensor.sample(cg, "BE", t, fields) for t in (1.0, 2.0) for cg in (JOB, "be.slice/other")]
    assert all(s.memory_refaults is None and s.memory_current == 0 for s in samples)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "memory_refaults of be.slice/job does not parse" in warned[0]


def test_refaults_missing_on_old_kernels_and_never_read_on_v1_or_hybrid(tmp_path, caplog, monkeypatch):
    tree = FakeCgroups(tmp_path, "v2").add(JOB)
    tree.set(JOB, "memory", "memory.stat", "anon 0\nfile 0\nworkingset_refault 7\n")     # before 5.9
    with caplog.at_level(logging.WARNING, logger="koordd.sensors"):
        assert CgroupSensor(tree.fs).sample(JOB, "BE", 1.0, frozenset({"memory_refaults"})).memory_refaults is None
    assert caplog.records == []
    for mode in ("v1", "hybrid"):
        sensor = CgroupSensor(FakeCgroups(tmp_path / mode, mode).add(JOB).fs)
        read = []
        real_read = sensor.fs.read
        monkeypatch.setattr(sensor.fs, "read", lambda c, cg, name, real_read=real_read: read.append(name) or
                            real_read(c, cg, name))
        assert sensor.sample(JOB, "BE", 1.0, frozenset({"memory_refaults"})).memory_refaults is None
        assert read == [], mode


def test_class_fields_are_read_of_that_class_s_roots_and_members_alone(tmp_path, host, monkeypatch):
    """Loop.class_needs: memory.stat for proactive_reclaim's BE roots and pods, never for every LS pod."""
    tree = FakeCgroups(tmp_path, "v2").add("be.slice/job1").add("be.slice/job2").add("ls.slice").add("solo.slice")
    sensors = Sensors(tree.fs, rules({"be.slice": "BE", "solo.slice": "BE", "ls.slice": "LS"}), proc_root=host.proc,
                      sys_root=host.sys)
    read = []
    real_read = sensors.fs.read
    monkeypatch.setattr(sensors.fs, "read", lambda c, cg, name: read.append((cg, name)) or real_read(c, cg, name))
    snap = sensors.snapshot(member_classes={"BE"}, fields=frozenset({"memory_current"}), member_fields=frozenset(),
                            class_fields={"BE": frozenset({"memory_refaults"})})
    assert sorted(cg for cg, name in read if name == "memory.stat") == ["be.slice", "solo.slice"]
    assert snap.cgroups["solo.slice"].memory_refaults is not None and snap.cgroups["ls.slice"].memory_refaults is None
    assert [u.path for u in snap.units("BE")] == ["be.slice/job1", "be.slice/job2", "solo.slice"]


class ReadsRefaults(Loop):
    """Reads memory_refaults of every class root; class_needs() names it for BE's alone."""
    name = "reads_refaults"

    @staticmethod
    def members_of(settings):
        return frozenset({"BE"})

    @staticmethod
    def needs(settings):
        return frozenset({"memory_current"})

    @staticmethod
    def class_needs(settings):
        return frozenset({"memory_refaults"})

    @staticmethod
    def decide(snapshot, settings, state):
        return [Action(c.path, "memory.reclaim", "1") for c in snapshot.cgroups.values() if c.memory_refaults]


def test_class_needs_cover_the_loop_s_own_class_roots_only_under_the_spy():
    from koordd.core.snapshot import CgroupSample
    from koordtest.needs import reads_only_what_it_needs as spied
    be, ls = CgroupSample("be.slice", "BE"), CgroupSample("ls.slice", "LS")
    assert spied(ReadsRefaults).__func__(Snapshot(1.0, 0.0, NodeSample(2, None), {"be.slice": be}), None, None) == []
    with pytest.raises(AssertionError, match=r"read \['memory_refaults'\], which its needs\(\) does not name"):
        spied(ReadsRefaults).__func__(Snapshot(1.0, 0.0, NodeSample(2, None), {"be.slice": be, "ls.slice": ls}),
                                      None, None)
