"""GpuSensor against a fake NVML module and literal /proc/<pid>/cgroup text."""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace as NS

import pytest

from koordtest.fakes import nvml as nvml_fake
from koordd.sensors import gpu
from koordd.sensors.contract import SensorUnavailable
from koordd.sensors.gpu import GpuProcess, GpuSensor, parse_proc_cgroup, probe_nvml

V2 = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-a.scope\n"
V1 = """12:memory:/kubepods/burstable/pod2/b
11:cpuset:/kubepods/burstable/pod2/b
4:cpu,cpuacct:/kubepods/burstable/pod2/b
1:name=systemd:/kubepods/burstable/pod2/b
"""
HYBRID = """12:memory:/system.slice/train.service
4:cpu,cpuacct:/system.slice/train.service
1:name=systemd:/system.slice/train.service
0::/system.slice/train.service
"""


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    def __str__(self):
        return "Not Supported"


class NVMLError_NotFound(NVMLError):
    def __str__(self):
        return "Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    def __str__(self):
        return "Driver Not Loaded"


class FakeNvml:
    """The slice of pynvml the sensor uses; each device is a dict of canned answers or exceptions."""
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NotFound = NVMLError_NotFound

    def __init__(self, devices, init_error=None):
        self.devices = devices
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0
        self.util_queries = []   # (index, lastSeenTimeStamp)

    def _get(self, handle, key):
        value = self.devices[handle][key]
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self._get(h, "name")

    def nvmlDeviceGetUUID(self, h):
        return self._get(h, "uuid")

    def nvmlDeviceGetUtilizationRates(self, h):
        return NS(gpu=self._get(h, "util"), memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        used, total = self._get(h, "mem")
        return NS(used=used, total=total, free=total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [NS(pid=p, usedGpuMemory=m) for p, m in self._get(h, "compute")]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return [NS(pid=p, usedGpuMemory=m) for p, m in self._get(h, "graphics")]

    def nvmlDeviceGetProcessUtilization(self, h, last_seen):
        self.util_queries.append((h, last_seen))
        samples = [s for s in self._get(h, "putil") if s[1] > last_seen]
        if not samples:
            raise NVMLError_NotFound()
        return [NS(pid=p, timeStamp=t, smUtil=sm, memUtil=0, encUtil=0, decUtil=0) for p, t, sm in samples]


def device(**over):
    d = {"name": b"NVIDIA H100 80GB HBM3", "uuid": "GPU-1234", "util": 40, "mem": (1 << 30, 80 << 30),
         "compute": [], "graphics": [], "putil": []}
    d.update(over)
    return d


def started(proc_root="/proc", nvml=None) -> GpuSensor:
    sensor = GpuSensor(proc_root=proc_root, nvml=nvml)
    sensor.start()
    return sensor


@pytest.fixture
def proc(tmp_path):
    for pid, text in {100: V2, 200: V1, 300: HYBRID, 400: "0::/\n"}.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return tmp_path


@pytest.mark.parametrize("text,want", [
    (V2, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-a.scope"),
    (V1, "kubepods/burstable/pod2/b"),
    (HYBRID, "system.slice/train.service"),
    ("0::/\n", ""),
    ("3:cpuset:/x\n2:cpuacct:/y\n", None),   # v1 without a cpu hierarchy
    ("garbage\n", None),
    ("", None),
])
def test_parse_proc_cgroup(text, want):
    assert parse_proc_cgroup(text) == want


def test_pynvml_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # makes `import pynvml` raise ImportError
    s = GpuSensor()
    with pytest.raises(SensorUnavailable, match="^pynvml not installed$"):
        s.start()
    assert s.sample() == ()
    s.stop()


def test_init_error_is_the_reason():
    nvml = FakeNvml([device()], init_error=NVMLError_DriverNotLoaded())
    s = GpuSensor(nvml=nvml)
    with pytest.raises(SensorUnavailable, match="^nvmlInit: Driver Not Loaded$"):
        s.start()
    assert s.sample() == ()
    s.stop()
    assert nvml.shutdowns == 0


def test_nvml_is_initialised_by_start_not_by_the_constructor(proc):
    nvml = FakeNvml([device()])
    s = GpuSensor(proc_root=proc, nvml=nvml)
    assert nvml.inits == 0 and s.sample() == ()
    s.start()
    assert nvml.inits == 1 and len(s.sample()) == 1


def test_device_fields_and_bytes_decoded(proc):
    s = started(proc, FakeNvml([device()]))
    (g,) = s.sample()
    assert (g.index, g.uuid, g.name) == (0, "GPU-1234", "NVIDIA H100 80GB HBM3")
    assert (g.utilization_percent, g.memory_used, g.memory_total) == (40.0, 1 << 30, 80 << 30)
    assert g.processes == ()


def test_not_supported_fields_are_none(proc):
    nvml = FakeNvml([device(util=NVMLError_NotSupported(), mem=NVMLError_NotSupported(),
                            compute=NVMLError_NotSupported(), graphics=NVMLError_NotSupported(),
                            putil=NVMLError_NotSupported()),
                     device(uuid="GPU-2")])
    (a, b) = started(proc, nvml).sample()
    assert (a.utilization_percent, a.memory_used, a.memory_total, a.processes) == (None, None, None, ())
    assert b.uuid == "GPU-2" and b.utilization_percent == 40.0   # one bad device spoils nothing else


def test_processes_mapped_to_cgroups_and_merged(proc):
    nvml = FakeNvml([device(compute=[(100, 2 << 30), (200, 1 << 30), (300, None)],
                            graphics=[(300, 512 << 20), (400, 64 << 20)],
                            putil=[(100, 10, 50), (100, 20, 70), (200, 15, 5), (500, 18, 30), (0, 19, 1)])])
    (g,) = started(proc, nvml).sample()
    assert g.processes == (
        GpuProcess(100, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-a.scope",
                   2 << 30, 60.0),
        GpuProcess(200, "kubepods/burstable/pod2/b", 1 << 30, 5.0),
        GpuProcess(300, "system.slice/train.service", 512 << 20, None),   # in both lists: counted once
        GpuProcess(400, "", 64 << 20, None),
        GpuProcess(500, None, None, 30.0),                                # used the SMs, then vanished
    )


def test_vanished_pid(proc):
    nvml = FakeNvml([device(compute=[(999, 1 << 20)])])
    (g,) = started(proc, nvml).sample()
    assert g.processes == (GpuProcess(999, None, 1 << 20, None),)


def test_utilisation_window_advances(proc):
    dev = device(compute=[(100, 1)], putil=[(100, 10, 50), (100, 20, 70)])
    nvml = FakeNvml([dev])
    s = started(proc, nvml)
    assert s.sample()[0].processes[0].sm_util == 60.0
    # No newer samples: NVML says NotFound, which is "no data", not an error.
    assert s.sample()[0].processes[0].sm_util is None
    dev["putil"].append((100, 30, 10))
    assert s.sample()[0].processes[0].sm_util == 10.0
    assert nvml.util_queries == [(0, 0), (0, 20), (0, 20)]


def test_stop_shuts_down_once():
    nvml = FakeNvml([device()])
    s = started(nvml=nvml)
    s.stop()
    s.stop()
    assert nvml.shutdowns == 1 and s.sample() == ()


def test_against_real_pynvml_error_names():
    pynvml = pytest.importorskip("pynvml")
    for name in ("NVMLError", "NVMLError_NotSupported", "NVMLError_NotFound", "NVMLError_DriverNotLoaded"):
        assert issubclass(getattr(pynvml, name), pynvml.NVMLError)
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) == "Driver Not Loaded"


# --- the probe: in a child process, so that NVML is never loaded into koordd for good (issue 36) ------------

@pytest.fixture
def fake_nvml_dir(tmp_path, monkeypatch):
    d = tmp_path / "nvml"
    monkeypatch.syspath_prepend(str(d))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    return d


def test_the_probe_leaves_no_nvml_library_and_no_pynvml_in_this_process(fake_nvml_dir):
    """nvmlInit dlopens libnvidia-ml and nothing unloads it: probed in koordd itself (as before issue 36), the
    library and the driver's client state stayed in the daemon for good (63 MB against 31 MB without a GPU)."""
    lib = nvml_fake.fake_pynvml(fake_nvml_dir, count=2)
    assert probe_nvml(None) == (True, "2 GPU(s)")
    done = nvml_fake.calls(fake_nvml_dir)
    assert [what for what, _ in done] == ["init", "count", "shutdown"]
    assert all(pid != os.getpid() for _, pid in done)              # another process called NVML
    assert "pynvml" not in sys.modules
    if lib is not None:
        assert not nvml_fake.mapped(lib)                           # /proc/self/maps: not loaded here


@pytest.mark.parametrize("kw, want", [
    ({"init_error": "Driver Not Loaded"}, (False, "nvmlInit: Driver Not Loaded")),
    ({"count": 0}, (False, "0 GPU(s)")),
])
def test_the_probe_says_what_nvml_said(fake_nvml_dir, kw, want):
    nvml_fake.fake_pynvml(fake_nvml_dir, **kw)
    assert probe_nvml(None) == want


def test_a_probe_that_breaks_says_so_in_one_line(fake_nvml_dir):
    nvml_fake.fake_pynvml(fake_nvml_dir, crash=True)
    available, detail = probe_nvml(None)
    assert not available and detail == "the NVML probe failed (exit 1): RuntimeError: the binding broke"


def test_without_pynvml_no_child_is_started(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(gpu.subprocess, "run", lambda *a, **kw: pytest.fail("a child was started"))
    assert probe_nvml(None) == (False, "pynvml not installed")
