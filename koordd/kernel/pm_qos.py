"""The CPU latency PM QoS interface, /dev/cpu_dma_latency (Documentation/power/pm_qos_interface.rst).

Every open of the device adds a request to the kernel's CPU latency constraint (at the default, "no
constraint", until a value is written); a write of a 32-bit integer (native byte order) sets that request
to so many microseconds; the request lasts exactly as long as the file descriptor: close() removes it,
and so does the kernel when the process dies (kill -9 included), since exiting closes every fd. The
cpuidle governors keep CPUs out of idle states whose exit latency is above the smallest request: 0 keeps
them polling (on a VM: no halt, so a wake-up is not a slow vCPU re-entry). A read of 4 bytes gives the
aggregate: the smallest request in force, PM_QOS_CPU_LATENCY_DEFAULT_VALUE when there is none.

`LatencyRequest` is one such request; `read_target` the aggregate. The device path is the caller's (tests
give a regular file: a write there lands at its start, a read gives it back). Opened O_CLOEXEC (Python's
default): a command koordd runs never inherits the request.
"""
from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

DEVICE = Path("/dev/cpu_dma_latency")
# Test-only, as koordd/act/owner.py's TEST_ENV: the unit tests (tests/conftest.py) point koordd, in-process or
# started as a process, at a device of their own, so that no unit test holds the host's. Never set on a node.
TEST_ENV = "KOORDD_TEST_PM_QOS_DEVICE"
NO_CONSTRAINT = 2_000_000_000      # PM_QOS_CPU_LATENCY_DEFAULT_VALUE (µs): what the device reads with no request
MAX_US = 2**31 - 1                 # an s32
_S32 = struct.Struct("i")          # the kernel's s32, native byte order


def default_device() -> Path:
    """The device koordd uses: DEVICE (TEST_ENV's in the unit tests)."""
    return Path(os.environ.get(TEST_ENV) or DEVICE)


def read_target(device: Path | str = DEVICE) -> int:
    """The aggregate CPU latency target in µs (the smallest request in force). OSError when the device
    cannot be opened or read; ValueError when it gives fewer than 4 bytes."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _S32.size)
    finally:
        os.close(fd)
    if len(data) != _S32.size:
        raise ValueError(f"{device}: read {len(data)} bytes, not {_S32.size}")
    return _S32.unpack(data)[0]


class LatencyRequest:
    """One request, held from the constructor to close(): the kernel keeps CPUs within `value` µs of
    wake-up latency while it is held."""

    def __init__(self, value: int, device: Path | str = DEVICE):
        self.device = Path(device)
        self.fd: int | None = os.open(self.device, os.O_WRONLY | os.O_CLOEXEC)
        try:
            self._put(value)
        except BaseException:
            self.close()
            raise
        self.value = value

    def _put(self, value: int) -> None:
        if self.fd is None:
            raise ValueError(f"{self.device}: the request is closed")
        if stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.lseek(self.fd, 0, os.SEEK_SET)      # a stand-in file: each value replaces the last
        data = _S32.pack(value)
        if os.write(self.fd, data) != len(data):
            raise OSError(f"{self.device}: short write of the request")

    def update(self, value: int) -> None:
        """Set the held request to `value` µs (the same fd: the request is never dropped on the way)."""
        self._put(value)
        self.value = value

    @property
    def held(self) -> bool:
        return self.fd is not None

    def close(self) -> None:
        """Drop the request (idempotent)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
