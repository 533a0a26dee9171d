import errno
import json
import os
import sys
import types

import pytest

import koordd.kernel.host_probe
from koordtest.fakes.nvml import calls as nvml_calls, fake_pynvml
from koordd.backends.host_backends import builtin_classes
from koordd.backends.tc import probe_netlink
from koordd.kernel import perf
from koordd.kernel.libbpf import BpfError
from koordd.runtime import capabilities
from koordd.runtime.capabilities import Capability, format_report, probe_all, report_json
from koordd.sensors import runq
from koordd.sensors.optional_sensors import builtin_sensors

NAMES = ["cgroup", "cpu.max.burst", "cpu.idle", "knobs", "memory.oom.group", "memory.reclaim", "sysctl", "pm_qos",
         "io", "psi", "perf", "bpf", "resctrl", "sched_ext", "core_sched", "netlink", "nvml", "sensors", "journald", "systemd"]
PSI_TEXT = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def write(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def host(tmp_path):
    """Empty fake roots; tests fill in what the host they describe has. probe() runs them all."""
    roots = {k: tmp_path / k for k in ("cgroup", "sys", "proc", "run")}
    for p in roots.values():
        p.mkdir()

    def probe():
        return {c.name: c for c in probe_all(roots["cgroup"], roots["sys"], roots["proc"], roots["run"])}
    return types.SimpleNamespace(probe=probe, **roots)


def make_v2(root, subtree="cpu memory", child_files=("cpu.max.burst", "cpu.idle", "cpu.pressure")):
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    write(root / "cgroup.subtree_control", subtree + "\n")
    write(root / "cpu.pressure", PSI_TEXT)
    for f in child_files:
        write(root / "system.slice" / f, "0\n")


def make_hybrid(root, cpu_files=("cpu.cfs_burst_us", "cpu.idle")):
    for c in ("cpu", "cpuacct"):
        write(root / c / "cgroup.procs")
    for f in cpu_files:
        write(root / "cpu" / f, "0\n")
    write(root / "unified/cgroup.controllers", "\n")
    write(root / "unified/cpu.pressure", PSI_TEXT)


def test_all_names_in_order_and_json_parses(host):
    caps = probe_all(host.cgroup, host.sys, host.proc, host.run)
    assert [c.name for c in caps] == NAMES
    assert all(isinstance(c, Capability) for c in caps)
    parsed = json.loads(report_json(caps))
    assert [d["name"] for d in parsed] == NAMES
    assert all(set(d) == {"name", "available", "detail"} and isinstance(d["available"], bool) for d in parsed)


def test_each_row_has_one_probe_kept_by_the_backend_or_sensor_that_uses_the_feature():
    owned = [(name, owner) for owner in (*builtin_classes(), *builtin_sensors().values()) for name in owner.features]
    names = [name for name, _ in owned] + list(capabilities.HOST)
    assert sorted(names) == sorted(NAMES), owned         # none probed twice, none without a row
    assert dict(owned)["netlink"].__name__ == "TcBackend" and dict(owned)["perf"].__name__ == "CpiSensor"


def test_format_report_aligns_columns():
    caps = [Capability("cgroup", True, "mode=v2"), Capability("cpu.max.burst", False, "why")]
    lines = format_report(caps).splitlines()
    assert lines == ["cgroup         yes  mode=v2", "cpu.max.burst  no   why"]


def test_v2_tree(host):
    make_v2(host.cgroup)
    caps = host.probe()
    assert caps["cgroup"].available and "mode=v2" in caps["cgroup"].detail
    assert "cpu" in caps["cgroup"].detail and "memory" in caps["cgroup"].detail
    assert caps["cpu.max.burst"].available
    assert caps["cpu.max.burst"].detail.endswith("system.slice/cpu.max.burst")
    assert caps["cpu.idle"].available and caps["cpu.idle"].detail.endswith("system.slice/cpu.idle")


def test_v2_cpu_not_delegated(host):
    make_v2(host.cgroup, subtree="memory")
    caps = host.probe()
    assert not caps["cpu.max.burst"].available
    assert "cgroup.subtree_control" in caps["cpu.max.burst"].detail


def test_v2_old_kernel_lacks_burst(host):
    make_v2(host.cgroup, child_files=("cpu.max",))
    caps = host.probe()
    assert not caps["cpu.max.burst"].available
    assert "5.14" in caps["cpu.max.burst"].detail
    assert not caps["cpu.idle"].available and "5.15" in caps["cpu.idle"].detail


def test_hybrid_tree(host):
    make_hybrid(host.cgroup)
    caps = host.probe()
    detail = caps["cgroup"].detail
    assert "mode=hybrid" in detail and "v1=cpu,cpuacct" in detail and "no controllers" in detail
    assert caps["cpu.max.burst"].available and caps["cpu.max.burst"].detail.endswith("cpu/cpu.cfs_burst_us")
    assert caps["cpu.idle"].available and caps["cpu.idle"].detail.endswith("cpu/cpu.idle")


def test_hybrid_without_burst(host):
    make_hybrid(host.cgroup, cpu_files=())
    caps = host.probe()
    assert not caps["cpu.max.burst"].available and "cpu.cfs_burst_us" in caps["cpu.max.burst"].detail


def test_no_cgroup_hierarchy_degrades(host):
    caps = host.probe()
    assert not caps["cgroup"].available and "no cgroup hierarchy" in caps["cgroup"].detail
    assert not caps["cpu.max.burst"].available and "LayoutError" in caps["cpu.max.burst"].detail


def test_psi_system_and_per_cgroup(host):
    make_hybrid(host.cgroup)
    for res in ("cpu", "memory", "io"):
        write(host.proc / "pressure" / res, PSI_TEXT)
    psi = host.probe()["psi"]
    assert psi.available
    assert "cpu,memory,io readable" in psi.detail and "per-cgroup: yes" in psi.detail


def test_psi_partial_and_missing(host):
    write(host.proc / "pressure/cpu", PSI_TEXT)
    psi = host.probe()["psi"]
    assert not psi.available and "io,memory not" in psi.detail and "per-cgroup: no" in psi.detail
    (host.proc / "pressure/cpu").unlink()
    (host.proc / "pressure").rmdir()
    assert "CONFIG_PSI or psi=0" in host.probe()["psi"].detail


def open_errors(software=None, hardware=None):
    """A fake perf.probe_cgroup_mode: the errno each kind of event fails with (None: it opens)."""
    calls = []

    def probe(events, cgroup_dir, cpu, open_group=None):
        calls.append((tuple(e.name for e in events), str(cgroup_dir), cpu))
        err, event = (hardware, events[0]) if events[0].hardware else (software, events[0])
        return None if err is None else perf.PerfOpenError(err, event)
    return probe, calls


@pytest.mark.parametrize("sw, hw, available, words", [
    (None, None, True, ["context-switches on {v2}, CPU 1): works", "hardware CPI (cycles, instructions): available"]),
    (None, errno.ENOENT, False, ["): works", "unavailable: no hardware PMU (cycles: ENOENT) — a VM without"]),
    (None, errno.EOPNOTSUPP, False, ["): works", "no hardware PMU (cycles: EOPNOTSUPP)"]),
    (errno.ENOENT, errno.ENOENT, False, ["fails: cgroups of the v2 tree cannot be counted (task-clock: ENOENT)",
                                         "hardware CPI: untested"]),
    (errno.EACCES, errno.EACCES, False, ["fails: not permitted (task-clock: EACCES): "
                                         "kernel.perf_event_paranoid=3", "needs CAP_PERFMON", "CPI: untested"]),
])
def test_perf_counts_a_v2_cgroup_with_software_then_hardware_events(host, monkeypatch, sw, hw, available, words):
    make_hybrid(host.cgroup)
    write(host.sys / "devices/system/cpu/online", "1-3\n")
    write(host.proc / "sys/kernel/perf_event_paranoid", "3\n")
    probe, calls = open_errors(sw, hw)
    monkeypatch.setattr(perf, "probe_cgroup_mode", probe)
    got = host.probe()["perf"]
    assert got.available is available
    for w in words:
        assert w.format(v2=host.cgroup / "unified") in got.detail
    # The v2 tree (unified on hybrid hosts), on the first online CPU; hardware only once software works.
    assert calls == [(("task-clock", "context-switches"), str(host.cgroup / "unified"), 1),
                     (("cycles", "instructions"), str(host.cgroup / "unified"), 1)][:1 if sw else 2]


def test_perf_without_a_v2_tree(host, monkeypatch):
    for c in ("cpu", "cpuacct"):
        write(host.cgroup / c / "cgroup.procs")
    probe, calls = open_errors()
    monkeypatch.setattr(perf, "probe_cgroup_mode", probe)
    assert host.probe()["perf"] == Capability(
        "perf", False, "cgroup-mode counting: no (no cgroup v2 tree); hardware CPI: no")
    assert calls == []


def test_perf_on_the_real_kernel_answers(host):
    # This host's real syscall, PMU or not, on a directory that is no cgroup: an answer, never an exception.
    make_v2(host.cgroup)
    assert "cgroup-mode counting" in host.probe()["perf"].detail


def test_bpf_needs_libbpf_and_the_kernels_btf(host, monkeypatch):
    def no_libbpf():
        raise BpfError("libbpf.so.1 is not installed (apt-get install libbpf1)")
    monkeypatch.setattr(runq, "libbpf", no_libbpf)
    write(host.sys / "kernel/btf/vmlinux")
    bpf = host.probe()["bpf"]
    assert not bpf.available
    assert "libbpf: libbpf.so.1 is not installed" in bpf.detail and "vmlinux: yes" in bpf.detail
    monkeypatch.setattr(runq, "libbpf", lambda: None)
    assert host.probe()["bpf"].available
    (host.sys / "kernel/btf/vmlinux").unlink()
    bpf = host.probe()["bpf"]
    assert not bpf.available and "vmlinux: no" in bpf.detail


def test_resctrl(host):
    write(host.proc / "filesystems", "nodev\tcgroup2\n")
    assert "not in" in host.probe()["resctrl"].detail
    write(host.proc / "filesystems", "nodev\tcgroup2\nnodev\tresctrl\n")
    r = host.probe()["resctrl"]
    assert not r.available and "not mounted" in r.detail
    (host.sys / "fs/resctrl/info").mkdir(parents=True)
    r = host.probe()["resctrl"]
    assert r.available and "mounted at" in r.detail


def test_sched_ext(host):
    s = host.probe()["sched_ext"]
    assert not s.available and "CONFIG_SCHED_CLASS_EXT" in s.detail
    write(host.sys / "kernel/sched_ext/state", "disabled\n")
    s = host.probe()["sched_ext"]
    assert s.available and s.detail == "state=disabled"         # an older kernel: no counters
    for name, value in (("state", "enabled"), ("root/ops", "flatcg_1.0.5"), ("enable_seq", "3"),
                        ("nr_rejected", "0"), ("switch_all", "1"), ("hotplug_seq", "0")):
        write(host.sys / "kernel/sched_ext" / name, value + "\n")
    assert host.probe()["sched_ext"].detail == \
        "state=enabled, root/ops=flatcg_1.0.5, enable_seq=3, nr_rejected=0, switch_all=1"


def test_netlink_with_and_without_pyroute2_which_is_not_imported(host, monkeypatch):
    import importlib.util
    monkeypatch.delitem(sys.modules, "pyroute2", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "pyroute2" else None)
    n = host.probe()["netlink"]
    assert n.available and n.detail == "pyroute2 installed; a raw NETLINK_ROUTE socket opens; whether there is " \
        "an fq qdisc (for edt) is in no module list or config"
    (host.proc / "config.gz").write_bytes(__import__("gzip").compress(b"# CONFIG_NET_SCH_FQ is not set\n"))
    assert "no fq qdisc (CONFIG_NET_SCH_FQ): net_shaping's enforce = \"edt\" is refused" in host.probe()["netlink"].detail
    # The daemon probes at every start: 16 MB of RSS not paid there (doctor's sensors line may import it).
    monkeypatch.delitem(sys.modules, "pyroute2", raising=False)
    assert probe_netlink(types.SimpleNamespace(proc=host.proc))[0] and "pyroute2" not in sys.modules
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    n = host.probe()["netlink"]
    assert not n.available and "pyroute2 not installed" in n.detail and "NETLINK_ROUTE" in n.detail


def test_nvml(host, monkeypatch, tmp_path):
    """The nvml row from a child process (koordd/sensors/gpu.py: NVML stays out of koordd); the sensors
    line starts the GPU sensor itself, in this process (koordctl doctor's, which exits)."""
    d = tmp_path / "nvml"
    monkeypatch.syspath_prepend(str(d))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    fake_pynvml(d)
    caps = host.probe()
    assert caps["nvml"].available and caps["nvml"].detail == "2 GPU(s)"
    assert "gpus: starts" in caps["sensors"].detail.split("; ")
    assert [(what, pid == os.getpid()) for what, pid in nvml_calls(d)] == [
        ("init", False), ("count", False), ("shutdown", False), ("init", True), ("shutdown", True)]
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    fake_pynvml(d, init_error="Driver Not Loaded")
    caps = host.probe()
    assert not caps["nvml"].available and caps["nvml"].detail == "nvmlInit: Driver Not Loaded"
    assert "gpus: nvmlInit: Driver Not Loaded" in caps["sensors"].detail.split("; ")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert host.probe()["nvml"].detail == "pynvml not installed"


def test_journald_and_systemd(host, monkeypatch):
    monkeypatch.setitem(sys.modules, "systemd.journal", types.ModuleType("systemd.journal"))
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    caps = host.probe()
    assert not caps["journald"].available and "socket: no" in caps["journald"].detail
    assert not caps["systemd"].available and "not PID 1" in caps["systemd"].detail
    write(host.run / "systemd/journal/socket")
    (host.run / "systemd/system").mkdir()
    caps = host.probe()
    assert caps["journald"].available and "journal: imports" in caps["journald"].detail
    assert caps["systemd"].available and "NOTIFY_SOCKET=/run/systemd/notify" in caps["systemd"].detail
    monkeypatch.delenv("NOTIFY_SOCKET")
    monkeypatch.setitem(sys.modules, "systemd.journal", None)
    caps = host.probe()
    assert not caps["journald"].available and "systemd.journal not installed" in caps["journald"].detail
    assert "NOTIFY_SOCKET not set" in caps["systemd"].detail


def test_sensors_are_started_and_stopped_again_to_say_which_work(host, monkeypatch):
    from koordd.sensors.contract import OptionalSensor, SensorUnavailable
    calls = []

    class Works(OptionalSensor):
        name = "works"

        def start(self):
            calls.append("start")

        def stop(self):
            calls.append("stop")

    class Missing(OptionalSensor):
        name = "missing"

        def start(self):
            raise SensorUnavailable("no such hardware")

    monkeypatch.setattr(capabilities, "load_sensor_registry", lambda: {"works": Works, "missing": Missing})
    sensors = host.probe()["sensors"]
    assert not sensors.available and sensors.detail == "missing: no such hardware; works: starts"
    assert calls == ["start", "stop"]
    monkeypatch.setattr(capabilities, "load_sensor_registry", lambda: {"works": Works})
    assert host.probe()["sensors"] == Capability("sensors", True, "works: starts")


def test_skipped_probes_do_not_run(host, monkeypatch):
    monkeypatch.setattr(capabilities, "load_sensor_registry", lambda: 1 / 0)
    caps = probe_all(host.cgroup, host.sys, host.proc, host.run, skip=("sensors",))
    assert [c.name for c in caps] == [n for n in NAMES if n != "sensors"]


def test_a_raising_probe_is_contained(host, monkeypatch):
    def boom(roots):
        raise RuntimeError("kaboom")
    probes = [(n, boom if n == "perf" else f) for n, f in capabilities.PROBES]
    monkeypatch.setattr(capabilities, "PROBES", probes)
    caps = host.probe()
    assert list(caps) == NAMES
    assert not caps["perf"].available and caps["perf"].detail == "probe failed: RuntimeError: kaboom"


def test_a_raising_helper_is_contained(host, monkeypatch):
    def boom(root):
        raise PermissionError("denied")
    monkeypatch.setattr(koordd.kernel.host_probe, "detect_layout", boom)
    write(host.proc / "pressure/cpu", PSI_TEXT)
    caps = host.probe()
    assert list(caps) == NAMES
    for name in ("cgroup", "cpu.max.burst", "cpu.idle"):
        assert not caps[name].available and "PermissionError: denied" in caps[name].detail
    # psi still reports the system-wide files and says why per-cgroup PSI is unknown.
    assert "cpu readable" in caps["psi"].detail and "per-cgroup: no (denied)" in caps["psi"].detail


def test_real_host():
    caps = probe_all()
    assert [c.name for c in caps] == NAMES
    assert format_report(caps).count("\n") == len(NAMES) - 1
    json.loads(report_json(caps))
