"""NVIDIA GPU sensor: per-device utilisation and memory, and which cgroup uses the GPU.

An optional sensor (sensors/contract.py), the snapshot's "gpus" section: it reads
NVML through `pynvml` (PyPI package nvidia-ml-py), initialised in start(), so NVML
is loaded only while a loop needs GPUs, and a missing library or driver is a
SensorUnavailable the daemon reports once.

Per process it merges the compute and graphics process lists (pid, used memory)
with `nvmlDeviceGetProcessUtilization` (SM %), and maps each host pid to its
cgroup through `<proc_root>/<pid>/cgroup`. NVML reports host pids, so the proc
root must be the host's.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from koordd.core.snapshot import GPUS
from koordd.kernel.host_probe import Host, installed
from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    cgroup: str | None          # relative to the hierarchy root, "" for the root; None: process gone
    used_memory: int | None     # bytes
    sm_util: float | None       # percent, mean over the samples since the previous sample()


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str
    name: str
    utilization_percent: float | None
    memory_used: int | None     # bytes
    memory_total: int | None    # bytes
    processes: tuple[GpuProcess, ...]


def parse_proc_cgroup(text: str) -> str | None:
    """The cgroup of a process from /proc/<pid>/cgroup text.

    The unified line (`0::/path`) wins when present, also on hybrid hosts; on pure
    v1 hosts the cpu hierarchy names the cgroup, as that is the one koordd acts on.
    """
    v1_cpu = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier_id, controllers, path = parts
        if hier_id == "0" and controllers == "":
            return path.strip().lstrip("/")
        if v1_cpu is None and "cpu" in controllers.split(","):
            v1_cpu = path.strip().lstrip("/")
    return v1_cpu


def _text(value: Any) -> str:
    # Older bindings return bytes for names and UUIDs.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# The probe, as a child process runs it: nvmlInit dlopens libnvidia-ml, which no nvmlShutdown unloads, and
# initialises the driver's client state: tens of MB of RSS that a koordd probing at start would keep for
# good, GPU sensor or not (issue 36: 63 MB on a host with a GPU against 31 MB without). Only the child
# pays it, and it exits.
_CHILD = """
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
def probe():
    try:
        import pynvml
    except Exception as e:
        return False, f"import pynvml: {type(e).__name__}: {e}"
    error = getattr(pynvml, "NVMLError", Exception)
    try:
        pynvml.nvmlInit()
    except error as e:
        return False, f"nvmlInit: {e}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except error as e:
        return False, f"nvmlDeviceGetCount: {e}"
    finally:
        pynvml.nvmlShutdown()
    return count > 0, f"{count} GPU(s)"
print(json.dumps(probe()))
"""
PROBE_TIMEOUT = 20.0        # seconds: nvmlInit waits for a driver that is still loading


def probe_nvml(host: Host) -> tuple[bool, str]:
    """Whether NVML initialises and sees a GPU, asked of a short-lived child process (not of this one:
    see _CHILD). Without pynvml installed, no child is started."""
    why = installed("pynvml")
    if why:
        return False, why
    try:
        done = subprocess.run([sys.executable, "-S", "-c", _CHILD, json.dumps(sys.path)], capture_output=True,
                              text=True, errors="replace", timeout=PROBE_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"the NVML probe did not answer within {PROBE_TIMEOUT:g}s"
    except OSError as e:
        return False, f"the NVML probe could not start: {e.strerror or e}"
    try:
        available, detail = json.loads(done.stdout.strip().splitlines()[-1])
        if not isinstance(available, bool) or not isinstance(detail, str):
            raise ValueError
    except (ValueError, IndexError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"the NVML probe failed (exit {done.returncode}): {last}"
    return available, detail


class GpuSensor(OptionalSensor):
    name = GPUS
    features = {"nvml": probe_nvml}

    def __init__(self, proc_root: str | Path = "/proc", nvml: Any = None):
        self.proc_root = Path(proc_root)
        self._nvml = nvml           # pynvml, or a fake in tests; imported by start() when None
        self._started = False
        # Newest utilisation sample timestamp per device index: the next query asks
        # only for newer samples, so each sample() covers the time since the last one.
        self._last_seen: dict[int, int] = {}

    def start(self) -> None:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                raise SensorUnavailable("pynvml not installed") from None
            self._nvml = pynvml
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as e:
            raise SensorUnavailable(f"nvmlInit: {e}") from None
        self._started = True

    def sample(self, context: SensorContext | None = None) -> tuple[GpuSample, ...]:
        """Every device NVML lists; NVML gives host pids and their cgroups itself, so `context` is unused."""
        if not self._started:
            return ()
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError:
            return ()
        samples = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError:
                continue    # e.g. GPU lost: the others are still worth reporting
            samples.append(self._device(index, handle))
        return tuple(samples)

    def stop(self) -> None:
        # nvmlInit counts references: one shutdown per successful init, never more.
        if self._started:
            self._started = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass

    def _call(self, fn, *args):
        """fn(*args), or None on any NVML error (NotSupported on MIG/vGPU, GpuIsLost, ...)."""
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def _device(self, index: int, handle) -> GpuSample:
        nvml = self._nvml
        util = self._call(nvml.nvmlDeviceGetUtilizationRates, handle)
        mem = self._call(nvml.nvmlDeviceGetMemoryInfo, handle)
        name = self._call(nvml.nvmlDeviceGetName, handle)
        uuid = self._call(nvml.nvmlDeviceGetUUID, handle)
        return GpuSample(
            index=index,
            uuid=_text(uuid) if uuid is not None else "",
            name=_text(name) if name is not None else "",
            utilization_percent=float(util.gpu) if util is not None else None,
            memory_used=int(mem.used) if mem is not None else None,
            memory_total=int(mem.total) if mem is not None else None,
            processes=self._processes(index, handle),
        )

    def _processes(self, index: int, handle) -> tuple[GpuProcess, ...]:
        nvml = self._nvml
        memory: dict[int, int | None] = {}
        for fn in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
            for p in self._call(fn, handle) or ():
                used = getattr(p, "usedGpuMemory", None)
                # A process with both a compute and a graphics context shows up in
                # both lists with its whole device memory: take the max, not the sum.
                prev = memory.get(p.pid)
                memory[p.pid] = used if prev is None else max(prev, used or 0)
        sm = self._sm_util(index, handle)
        # Union: a process whose context is gone may still have used the SMs in the window.
        pids = sorted(set(memory) | set(sm))
        return tuple(GpuProcess(pid, self._cgroup(pid), memory.get(pid), sm.get(pid)) for pid in pids)

    def _sm_util(self, index: int, handle) -> dict[int, float]:
        nvml = self._nvml
        # NotFound means no samples since last_seen: no data, not an error.
        samples = self._call(nvml.nvmlDeviceGetProcessUtilization, handle, self._last_seen.get(index, 0))
        if not samples:
            return {}
        per_pid: dict[int, list[int]] = {}
        for s in samples:
            per_pid.setdefault(s.pid, []).append(s.smUtil)
            self._last_seen[index] = max(self._last_seen.get(index, 0), s.timeStamp)
        # The buffer may hold several samples per pid in the window: average them.
        return {pid: sum(v) / len(v) for pid, v in per_pid.items() if pid > 0}

    def _cgroup(self, pid: int) -> str | None:
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            return None     # exited, or not in our pid namespace
        return parse_proc_cgroup(text)
