"""The CPU wake-up latency koordd asks of the kernel, a held knob: target kind `pm_qos`.

One knob, `cpu_dma_latency`, on the node-wide target PM_QOS_TARGET ("node"): "none" while koordd holds no
request, else the microseconds of the request it holds on /dev/cpu_dma_latency (koordd/kernel/pm_qos.py).
The value is in force only while koordd holds the device's file descriptor: a write opens the device (once)
and writes the value into it; writing "none" (a restore: what the journal holds as the original) closes it.
It reads what koordd holds, not the host's aggregate (another program, tuned's latency-performance profile,
may hold its own request: koordd neither sees nor drops it), so skip-if-equal compares koordd's own request
and a write of the value koordd holds already touches nothing.

Held and released through the actuator like any knob: the write is journaled (original "none") and recorded
as a decision, the restore at stop (or when the loop lets go) closes the fd and is recorded as RESTORED; dry-run
writes nothing. After a crash nothing needs restoring: the kernel drops the request when the process dies
(kill -9 included: exit closes every fd), so the next start reads "none", the journal's original, and drops
the entry (tests/kernel/test_pm_qos_kernel.py). close() (the daemon's last resort at exit) drops it too.

A host without the device (a kernel without CPU idle PM QoS, a container without /dev/cpu_dma_latency) or
where it cannot be opened for writing (not root) lacks the knob: probe() says why, the daemon says so in one
line at start, `koordctl doctor` in its `pm_qos` row, and loops see it missing from snapshot.supported.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

from koordd.core.backend import Backend, BackendSet, InvalidValue, KnobSpec, Unsupported
from koordd.core.targets import PM_QOS_TARGET
from koordd.kernel.host_probe import Host, cpuidle_driver, read
from koordd.kernel.pm_qos import MAX_US, NO_CONSTRAINT, LatencyRequest, default_device, read_target

KNOB = "cpu_dma_latency"
NONE = "none"


def normalize(text: str) -> str:
    t = text.strip()
    if t == NONE:
        return t
    if not (t.isascii() and t.isdigit()):
        raise InvalidValue(f"{KNOB} must be {NONE!r} or microseconds 0..{MAX_US}, got {text!r}")
    v = int(t)
    if v > MAX_US:
        raise InvalidValue(f"{KNOB} must be at most {MAX_US} µs, got {v}")
    return str(v)


def why_not(device: Path) -> str | None:
    """Why koordd cannot hold a request on `device`, or None. Opens it for writing and closes it at once:
    that adds a request at "no constraint" for a moment, which changes nothing."""
    try:
        fd = os.open(device, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"no {device} (a kernel without CPU idle PM QoS, or a container without the device)"
    except OSError as e:
        name = errno.errorcode.get(e.errno or 0, "error")
        return f"{device}: {name} opening it for writing ({e.strerror}; koordd holds it as root)"
    os.close(fd)
    return None


def _describe(us: int) -> str:
    return "no request" if us >= NO_CONSTRAINT else f"{us} µs requested"


def probe_pm_qos(host: Host) -> tuple[bool, str]:
    """Whether koordd can hold a CPU latency request, the aggregate now, and the cpuidle driver it acts on."""
    device = default_device()
    idle = host.sys / "devices/system/cpu/cpuidle"
    driver = cpuidle_driver(host.sys) or "?"
    governor = read(idle / "current_governor_ro") or read(idle / "current_governor") or "?"
    cpuidle = f"cpuidle driver {driver}, governor {governor}"
    if driver == "none":
        # The idle path is the architecture's default halt, which no PM QoS request governs: the wake lever's
        # experiments will find it buys nothing (docs/benchmarks.md, bench-wakeup).
        cpuidle += " (no cpuidle driver: a request cannot change how CPUs idle here; be_suppress's wake lever is not tried)"
    why = why_not(device)
    if why is not None:
        return False, f"{why}; {cpuidle}"
    try:
        now = read_target(device)
    except (OSError, ValueError) as e:
        return False, f"{device}: cannot read the CPU latency target ({e}); {cpuidle}"
    return True, f"{device}: CPU latency target {now} µs ({_describe(now)}); {cpuidle}"


class PmQosBackend(Backend):
    """koordd's one CPU latency request. `device`: tests give a file of their own."""
    kind = "pm_qos"
    knobs = {KNOB: KnobSpec(KNOB, "the CPU wake-up latency koordd asks of the kernel through /dev/cpu_dma_latency, "
                                  "in µs (0: CPUs stay out of deep idle), or none; in force only while koordd runs",
                            normalize)}
    features = {"pm_qos": probe_pm_qos}

    def __init__(self, device: Path | str | None = None):
        self.device = Path(device) if device is not None else default_device()
        self.request: LatencyRequest | None = None

    def _check(self, target: str) -> None:
        if target != PM_QOS_TARGET:
            raise InvalidValue(f"{KNOB} is a knob of the node (target {PM_QOS_TARGET!r}), not of {target!r}")

    def probe(self) -> dict[str, str]:
        why = why_not(self.device)
        return {KNOB: why} if why else {}

    def read(self, target: str, knob: str) -> str:
        self._check(target)
        if self.request is not None:
            return str(self.request.value)
        if not self.device.exists():
            raise Unsupported(f"no {self.device}")
        return NONE

    def validate(self, target: str, knob: str, value: str) -> str:
        self._check(target)
        return normalize(value)

    def write(self, target: str, knob: str, value: str) -> None:
        self._check(target)
        v = normalize(value)
        if v == NONE:
            self.close()
        elif self.request is None:
            self.request = LatencyRequest(int(v), self.device)
        elif self.request.value != int(v):
            self.request.update(int(v))

    def close(self) -> None:
        request, self.request = self.request, None
        if request is not None:
            request.close()


def backends(fs) -> list[Backend]:
    """What this module brings to koordd's backends (the cgroup layout is not used)."""
    return [PmQosBackend()]


BACKENDS = BackendSet((PmQosBackend,), backends)     # koordd/core/catalogue.py BUILTIN
