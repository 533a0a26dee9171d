"""Every parser of kernel text, on arbitrary and mangled input: it parses, or raises its documented error,
or returns its documented "unknown" value; never an IndexError, KeyError, OverflowError or a ValueError
from int() where another error is promised. Sensors that read such files go on with what they can read.

Examples per property: tests/fuzzing.py (a few dozen here; scripts/fuzz runs many more)."""
from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.fakes.netlink import Msg
from koordtest.fakes.resctrl import FakeResctrl
from koordtest.fuzzing import ODD_NUMBERS, PROFILE, counted, kernel_text, text_from
from koordd.backends.cgroup_knobs import KNOBS
from koordd.core.backend import InvalidValue
from koordd.core.cgroup_text import MAX_CPUS, parse_cpu_max, parse_cpulist
from koordd.core.feeds import MAX_INTERVAL, MIN_INTERVAL, TopRequest, parse_request
from koordd.core.options import parse_duration
from koordd.core.snapshot import CgroupSample, NodeSample, PressureStat, SchedExtStatus
from koordd.core.units import parse_rate
from koordd.kernel.avx import TaskStat, parse_arch_status, parse_cpuinfo, parse_stat, read_thread
from koordd.kernel.netclass import tc_handle
from koordd.kernel.netlink import BE_CLASS, LINK, LS_CLASS, OTHER_CLASS, ROOT, TC_ROOT_PARENT, htb_rates
from koordd.kernel.perf import GroupReading, parse_group
from koordd.kernel.resctrl import ResctrlError, cpu_vendor, parse_schemata, read_info
from koordd.kernel.sched_ext import read_sched_ext
from koordd.sensors.cgroup_stats import CgroupSensor, flat_keyed
from koordd.sensors.contract import SensorContext
from koordd.sensors.gpu import parse_proc_cgroup
from koordd.sensors.net import NetSample, NetSensor
from koordd.sensors.node import NodeSensor, parse_meminfo, parse_proc_stat_cpu, parse_proc_stat_steal
from koordd.sensors.psi import parse_psi
from koordd.sensors.resctrl import ResctrlSensor
from koordd.sensors.runq import SchedstatSource, read_schedstat

pytestmark = pytest.mark.filterwarnings("ignore")


def put(path: Path, text: str) -> None:
    """The text as the kernel's bytes (a surrogate escape stands for a byte that is not UTF-8)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """One directory for a module's file trees: the properties rewrite their files on every example."""
    return tmp_path_factory.mktemp("fuzz")


# --- PSI, /proc/stat, meminfo, flat-keyed cgroup files ---------------------------------------------------

PSI = ("some avg10=1.13 avg60=1.12 avg300=0.32 total=1327965\nfull avg10=0.00 avg60=0.01 avg300=0.00 total=42\n",
       "some avg10=0.50 avg60=0.00 avg300=0.00 total=7\n")


@PROFILE
@given(text_from(PSI))
@counted
def test_psi(text):
    try:
        stat = parse_psi(text)
    except ValueError:
        return
    assert isinstance(stat, PressureStat) and (stat.some or stat.full)
    for p in (stat.some, stat.full):
        # What a loop compares with its threshold: a number, never NaN or infinite.
        assert p is None or all(math.isfinite(v) for v in (p.avg10, p.avg60, p.avg300))


PROC_STAT = ("cpu  4705 356 584 3699 23 23 0 0 0 0\ncpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0\n"
             "intr 1462898\nctxt 1739128\nbtime 1700000000\n",
             "cpu 1 2 3 4\n")


@PROFILE
@given(text_from(PROC_STAT))
@counted
def test_proc_stat(text):
    try:
        steal = parse_proc_stat_steal(text)
        assert all(isinstance(t, int) for t in steal)
    except ValueError:
        pass
    try:
        busy, total = parse_proc_stat_cpu(text)
    except ValueError:
        return
    assert isinstance(busy, int) and isinstance(total, int)


MEMINFO = ("MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\n"
           "AnonPages:       2000000 kB\nUnevictable:        1000 kB\nHugePages_Total:       0\n",)


@PROFILE
@given(text_from(MEMINFO))
@counted
def test_meminfo(text):
    try:
        fields = parse_meminfo(text)
    except ValueError:
        return
    assert all(isinstance(v, int) for v in fields.values())


CPU_STAT = ("usage_usec 5000000\nuser_usec 4000000\nsystem_usec 1000000\nnr_periods 10\nnr_throttled 3\n"
            "throttled_usec 2000\nnr_bursts 0\nburst_usec 0\n",
            "anon 4096\nfile 0\nunevictable 8192\n", "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n")


@PROFILE
@given(text_from(CPU_STAT), st.lists(st.sampled_from(("usage_usec", "nr_periods", "anon", "oom_kill", "max", "")),
                                     max_size=4))
@counted
def test_flat_keyed(text, keys):
    out = flat_keyed(text, *keys)           # never raises: a garbled value is a key it did not find
    assert set(out) <= set(keys) and all(isinstance(v, int) for v in out.values())


# --- cpulists, cpu.max, the knobs' own checks ---------------------------------------------------------------

CPULISTS = ("0-3,8,10-11\n", "0\n", "\n", "0-127\n", "1,3,5-7")


@PROFILE
@given(text_from(CPULISTS))
@counted
def test_cpulist(text):
    try:
        cpus = parse_cpulist(text)
    except ValueError:
        return
    assert all(0 <= c < MAX_CPUS for c in cpus)


def test_a_cpulist_far_beyond_any_machine_is_refused_before_it_is_built():
    # "0-4294967295" would otherwise be a set of four billion ints: the daemon's memory, then its life.
    with pytest.raises(ValueError, match="beyond"):
        parse_cpulist("0-4294967295")
    with pytest.raises(ValueError, match="beyond"):
        parse_cpulist(str(MAX_CPUS))
    assert parse_cpulist(f"0,{MAX_CPUS - 1}") == {0, MAX_CPUS - 1}


@PROFILE
@given(text_from(("max 100000\n", "50000 100000\n", "max 1000", "1000 1000000")))
@counted
def test_cpu_max(text):
    try:
        quota, period = parse_cpu_max(text)
    except InvalidValue:
        return
    assert quota is None or isinstance(quota, int)
    assert isinstance(period, int)


KNOB_VALUES = ("max 100000", "50000 100000", "0-3,8", "100", "1", "0", "max", "1048576", "none", "mixed",
               "idle", "batch", "other", "htb 1000000000", "edt", "fifo 5")


@PROFILE
@given(st.sampled_from(sorted(KNOBS)), text_from(KNOB_VALUES))
@counted
def test_knob_values(knob, text):
    # What a loop or koordctl hands a knob passes its check or is InvalidValue, the actuator's refusal.
    try:
        value = KNOBS[knob].normalize(text)
    except InvalidValue:
        return
    assert isinstance(value, str)


# --- resctrl ----------------------------------------------------------------------------------------------

SCHEMATA = ("    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n", "L3:0=fff\n", "L3CODE:0=ff;1=ff\nL3DATA:0=ff;1=ff\n",
            "    MB:0=2048;1=2048\n")


@PROFILE
@given(text_from(SCHEMATA))
@counted
def test_schemata(text):
    try:
        lines = parse_schemata(text)
    except ResctrlError:
        return
    assert all(isinstance(d, int) and isinstance(v, str) for doms in lines.values() for d, v in doms.items())


INFO_FILES = {"L3/cbm_mask": "7ff\n", "L3/min_cbm_bits": "1\n", "L3/num_closids": "16\n",
              "L3/shareable_bits": "0\n", "MB/min_bandwidth": "10\n", "MB/bandwidth_gran": "10\n",
              "MB/num_closids": "8\n"}


@PROFILE
@given(st.dictionaries(st.sampled_from(sorted(INFO_FILES)), st.one_of(st.sampled_from(ODD_NUMBERS), kernel_text()),
                       max_size=3),
       text_from(SCHEMATA), st.sampled_from(("intel", "amd", "")))
@counted
def test_resctrl_info(scratch, garbled, schemata, vendor):
    fs = FakeResctrl(scratch / "resctrl-info", mounted=False)
    for rel, text in {**INFO_FILES, **garbled}.items():
        put(fs.root / "info" / rel, text)
    put(fs.root / "schemata", schemata)
    try:
        info = read_info(fs, vendor)
    except (ResctrlError, UnicodeDecodeError):
        return          # UnicodeDecodeError: a ValueError, as ResctrlSensor reports it
    assert info.l3 is not None and info.mb is not None


@PROFILE
@given(text_from(("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nflags\t\t: fpu avx512f\n\n"
                  "processor\t: 1\n", "vendor_id : AuthenticAMD\n")))
@counted
def test_cpuinfo(text):
    assert cpu_vendor(text) in ("intel", "amd", "")
    cpu = parse_cpuinfo(text)
    assert cpu is None or (isinstance(cpu.family, int) and isinstance(cpu.model, int))


@PROFILE
@given(text_from(SCHEMATA))
@counted
def test_resctrl_sensor_garbled_group(scratch, schemata):
    # A group whose schemata does not parse costs the section that round, with the file named (the
    # manager logs it); the groups and info around it are not at fault.
    proc = scratch / "proc-resctrl"
    put(proc / "cpuinfo", "vendor_id : GenuineIntel\nflags : rdt_a cat_l3 mba\n")
    root = scratch / "resctrl-sensor"
    if root.exists():
        import shutil
        shutil.rmtree(root)
    fs = FakeResctrl(root)
    fs.mkdir("be")
    put(root / "be" / "schemata", schemata)
    sensor = ResctrlSensor(fs, proc)
    try:
        section = sensor.sample()
    except ResctrlError as e:
        assert "be/schemata" in str(e)
        return
    assert set(section.groups) == {"default", "be"}


# --- threads: arch_status, stat, schedstat, /proc/<pid>/cgroup ---------------------------------------------

@PROFILE
@given(text_from(("x86_64_AVX512_elapsed_ms: 23\n", "AVX512_elapsed_ms:\t-1\n", "AVX512_elapsed_ms: 0")))
@counted
def test_arch_status(text):
    value = parse_arch_status(text)
    assert value is None or isinstance(value, int)


STAT = ("4242 (my (odd) prog) S 1 4242 4242 0 -1 4194304 120 0 0 0 7 3 0 0 20 0 1 0 100 1000000 100 "
        "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 5 0 0 0 0 0 0 0 0 0 0 0 0 0\n",)


@PROFILE
@given(text_from(STAT))
@counted
def test_task_stat(text):
    stat = parse_stat(text)
    assert stat is None or isinstance(stat, TaskStat)


@PROFILE
@given(text_from(("x86_64_AVX512_elapsed_ms: 23\n", "AVX512_elapsed_ms: -1\n")), text_from(STAT))
@counted
def test_read_thread(scratch, arch_status, stat):
    base = scratch / "proc-avx" / "7" / "task" / "7"
    put(base / "arch_status", arch_status)
    put(base / "stat", stat)
    thread = read_thread(scratch / "proc-avx", 7)
    assert thread is None or isinstance(thread.stat, TaskStat)


@PROFILE
@given(text_from(("1234567 89 12\n", "0 0 0\n")))
@counted
def test_schedstat(scratch, text):
    put(scratch / "proc-sched" / "9" / "schedstat", text)
    got = read_schedstat(scratch / "proc-sched", 9)
    assert got is None or all(isinstance(v, int) for v in got)


@PROFILE
@given(text_from(("12\n13\n", "", "4242\n")), text_from(("1234567 89 12\n",)))
@counted
def test_schedstat_source(scratch, threads, schedstat):
    # A garbled cgroup.threads or schedstat leaves that cgroup (or thread) out of the round, nothing more.
    tree, proc = scratch / "runq-tree", scratch / "runq-proc"
    put(tree / "ls" / "cgroup.threads", threads)
    put(tree / "ok" / "cgroup.threads", "5\n")
    put(proc / "5" / "schedstat", "1000 10 10\n")
    for tid in ("12", "13", "4242"):
        put(proc / tid / "schedstat", schedstat)
    source = SchedstatSource(tree, "cgroup.threads", proc)
    source.read(["ls", "ok"])
    put(proc / "5" / "schedstat", "3000 20 20\n")
    assert "ok" in source.read(["ls", "ok"])


@PROFILE
@given(text_from(("0::/kubepods.slice/pod1\n", "12:cpu,cpuacct:/be.slice/job\n11:memory:/be.slice\n0::/\n")))
@counted
def test_proc_cgroup(text):
    assert parse_proc_cgroup(text) is None or isinstance(parse_proc_cgroup(text), str)


# --- perf, sched_ext ----------------------------------------------------------------------------------------

@PROFILE
@given(st.one_of(st.binary(max_size=80),
                 st.builds(lambda nr, vals, cut: struct.pack(f"QQQ{len(vals)}Q", nr, 10, 5, *vals)[:cut],
                           st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**64 - 1), max_size=5),
                           st.integers(0, 80))),
       st.integers(1, 4))
@counted
def test_perf_group_read(data, count):
    try:
        reading = parse_group(data, count)
    except ValueError:
        return
    assert isinstance(reading, GroupReading) and len(reading.values) == count


SCHED_EXT_FILES = {"state": "enabled\n", "root/ops": "koordd\n", "enable_seq": "2\n", "nr_rejected": "0\n",
                   "switch_all": "0\n", "hotplug_seq": "0\n"}


@PROFILE
@given(st.dictionaries(st.sampled_from(sorted(SCHED_EXT_FILES)),
                       st.one_of(st.sampled_from(ODD_NUMBERS), kernel_text()), max_size=3))
@counted
def test_sched_ext_status(scratch, garbled):
    base = scratch / "sys-scx" / "kernel" / "sched_ext"
    for rel, text in {**SCHED_EXT_FILES, **garbled}.items():
        put(base / rel, text)
    status = read_sched_ext(scratch / "sys-scx")
    assert status is None or isinstance(status, SchedExtStatus)


# --- tc and netlink replies ---------------------------------------------------------------------------------

@PROFILE
@given(text_from(("1gbit", "250mbit", "1000000", "12.5 kbit", "8bit")))
@counted
def test_rate(text):
    try:
        rate = parse_rate(text)
    except InvalidValue:
        return
    assert isinstance(rate, int) and rate >= 8


@PROFILE
@given(text_from(("1:20", "c0dd:", ":1", "ffff:ffff")))
@counted
def test_tc_handle(text):
    try:
        assert isinstance(tc_handle(text), int)
    except ValueError:
        pass


def stats(nbytes):
    return Msg({"TCA_STATS_BASIC": {"bytes": nbytes}} if nbytes is not None else {})


U64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from((0, 1, 2**32 - 1, 2**64 - 1)))


@st.composite
def htb_class(draw, handle):
    """An HTB class as the kernel answers a dump: parms with 32-bit rates, 64-bit ones where they
    overflow; any of them missing, and the stats too."""
    parms = {k: draw(st.integers(0, 2**32 - 1)) for k in ("rate", "ceil")}
    opts = {"TCA_HTB_PARMS": parms} if draw(st.booleans()) else {}
    for k in ("TCA_HTB_RATE64", "TCA_HTB_CEIL64"):
        if draw(st.booleans()):
            opts[k] = draw(U64)
    attrs = {"TCA_KIND": draw(st.sampled_from(("htb", "fq_codel", None)))}
    if draw(st.booleans()):
        attrs["TCA_OPTIONS"] = Msg(opts)
    if draw(st.booleans()):
        attrs["TCA_STATS2"] = stats(draw(st.one_of(st.none(), U64)))
    return Msg(attrs, handle=handle, parent=LINK, index=2)


class FakeIpr:
    def __init__(self, qdiscs, classes, name):
        self.qdiscs, self.classes, self.name = qdiscs, classes, name

    def get_qdiscs(self, index=None):
        return self.qdiscs

    def get_classes(self, index):
        return self.classes

    def get_links(self, index):
        return [Msg({"IFLA_IFNAME": self.name})] if self.name is not None else []


@PROFILE
@given(st.lists(st.one_of(st.sampled_from((LINK, LS_CLASS, BE_CLASS, OTHER_CLASS)), U64.map(lambda v: v & 0xFFFFFFFF)),
                max_size=6).flatmap(lambda handles: st.tuples(*(htb_class(h) for h in handles))),
       st.sampled_from((ROOT, 0, 0xC0DD0000, 0x50000)), st.sampled_from(("htb", "fq", "mq", "noqueue", None)),
       st.sampled_from(("eth0", None)), st.lists(U64, min_size=3, max_size=3))
@counted
def test_net_sensor_on_netlink_dumps(classes, handle, kind, name, sent):
    # Whatever shape the dump has, the round gives a sample per device or none: htb_rates and the byte
    # counts take what is there.
    for m in classes:
        rates = htb_rates(m)
        assert rates is None or all(isinstance(r, int) for r in rates)
    root = Msg({"TCA_KIND": kind, "TCA_STATS2": stats(sent[0])}, parent=TC_ROOT_PARENT, handle=handle, index=2)
    sensor = NetSensor(ipr=FakeIpr([root], list(classes), name), classifier=None)
    for now in (1.0, 2.0):
        out = sensor.sample(SensorContext(now, {}))
        assert all(isinstance(s, NetSample) for s in out.values())


# --- koordd's own small inputs: durations, the top request ----------------------------------------------------

@PROFILE
@given(text_from(("500us", "500ms", "2s", "1m30s", "1.5h", "5", "µs")))
@counted
def test_duration(text):
    try:
        seconds = parse_duration(text)
    except ValueError:
        return
    assert isinstance(seconds, float)


@PROFILE
@given(st.one_of(text_from(('{"interval": 2.0, "members": true}\n', '{"interval": 1e999}', '{}', "[]")),
                 st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
                              lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                                  st.sampled_from(("interval", "members", "x")), inner, max_size=3),
                              max_leaves=6).map(lambda v: __import__("json").dumps(v))))
@counted
def test_top_request(text):
    request = parse_request(text)
    assert isinstance(request, TopRequest) and MIN_INTERVAL <= request.interval <= MAX_INTERVAL


# --- the core sensors on a fake tree: garbled files are None fields, the snapshot goes on -------------------------

CGROUP_FILES = {"cpu.stat": CPU_STAT[0], "cpu.max": "max 100000\n", "cpu.max.burst": "0\n", "cpu.weight": "100\n",
                "cpuset.cpus": "0-3\n", "memory.max": "max\n", "memory.current": "4096\n",
                "memory.stat": CPU_STAT[1], "memory.events": CPU_STAT[2], "cpu.pressure": PSI[0],
                "memory.pressure": PSI[0], "io.pressure": PSI[0], "cgroup.freeze": "0\n"}


@pytest.fixture(scope="module")
def fake_v2(tmp_path_factory) -> FakeCgroups:
    return FakeCgroups(tmp_path_factory.mktemp("fuzz-cgroup"), "v2").add("ls.slice")


@PROFILE
@given(st.dictionaries(st.sampled_from(sorted(CGROUP_FILES)),
                       st.one_of(text_from(tuple(CGROUP_FILES.values())), st.sampled_from(ODD_NUMBERS)), min_size=1, max_size=4))
@counted
def test_cgroup_sensor_on_garbled_files(fake_v2, garbled):
    d = fake_v2.dir("ls.slice", None)
    for name, text in CGROUP_FILES.items():
        put(d / name, garbled.get(name, text))
    sensor = CgroupSensor(fake_v2.fs)
    for now in (1.0, 2.0):
        sample = sensor.sample("ls.slice", "LS", now)
        assert isinstance(sample, CgroupSample) and sample.path == "ls.slice"
    if "memory.current" not in garbled:
        assert sample.memory_current == 4096        # one bad file costs its own fields only


NODE_FILES = {"proc/stat": PROC_STAT[0], "proc/meminfo": MEMINFO[0], "proc/pressure/cpu": PSI[0],
              "proc/pressure/memory": PSI[0], "proc/pressure/io": PSI[0],
              "sys/devices/system/cpu/online": "0-3\n", "sys/devices/system/node/node0/cpulist": "0-3\n",
              "sys/devices/system/cpu/cpu0/topology/thread_siblings_list": "0,2\n"}


@PROFILE
@given(st.dictionaries(st.sampled_from(sorted(NODE_FILES)),
                       st.one_of(text_from(tuple(NODE_FILES.values())), st.sampled_from(ODD_NUMBERS)),
                       min_size=1, max_size=4))
@counted
def test_node_sensor_on_garbled_files(scratch, garbled):
    base = scratch / "node"
    for rel, text in NODE_FILES.items():
        put(base / rel, garbled.get(rel, text))
    sensor = NodeSensor(base / "proc", base / "sys")
    for now in (1.0, 2.0):
        sample = sensor.sample(now)
        assert isinstance(sample, NodeSample) and sample.cpu_count >= 1
    if "proc/meminfo" not in garbled:
        assert sample.memory_total == 16000000 * 1024


@pytest.mark.parametrize("avg", ["nan", "inf", "-inf", "1e999"])
def test_psi_averages_that_are_not_numbers_are_malformed(avg):
    # float() takes them; a loop comparing NaN with its threshold would never act, and never say why.
    with pytest.raises(ValueError, match="not finite"):
        parse_psi(f"some avg10={avg} avg60=0.00 avg300=0.00 total=0\n")


def test_a_top_request_with_an_interval_past_a_float_is_the_default_request():
    # json.loads gives an int of any size; float() of it was an OverflowError in koordd's loop.
    assert parse_request('{"interval": 1' + "0" * 400 + ', "members": true}') == TopRequest()
