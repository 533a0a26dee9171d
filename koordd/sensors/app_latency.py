"""The latency-sensitive applications' own latency per cgroup: the server-side response time of their
request/response traffic, measured in the kernel without changing them (docs/app-latency.md).

koordd/bpf/app_latency.bpf.o, a CO-RE object loaded by koordd's loader (libbpf), stamps a TCP or UNIX
stream socket when a request's first bytes arrive and counts, at the next send on it, the time since, for
the deepest watched cgroup at or above the sending task's: a log2 histogram per cgroup, read each round as
its delta (sensors/cgroup_hist.py, as the run-queue sensor's). Only the latency-sensitive classes' cgroups
are watched: they are the ones with an SLO.

Needs libbpf1, a kernel with BTF and the tracepoints sk_data_ready and sock_send_length (Linux 6.6+), and
a v2 tree (the unified one on hybrid hosts): a socket and a task name their cgroup there. There is no
fallback: without them the sensor is unavailable and says why.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Callable, Iterable, Mapping

from koordd.core.classes import LATENCY_SENSITIVE
from koordd.core.histogram import quantile_us, slot_upper_us
from koordd.core.snapshot import APP_LATENCY, AppLatency
from koordd.kernel.bpf_shared import APP_SLOTS
from koordd.kernel.cgroupfs import DEFAULT_ROOT, LayoutError, detect_layout
from koordd.kernel.libbpf import BpfObject
from koordd.sensors.cgroup_hist import KERNEL_BTF, CgroupHistograms
from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable

PROGRAM = Path(str(files("koordd.bpf") / "app_latency.bpf.o"))
SLOTS = APP_SLOTS               # koordd_shared.h's: slot k holds responses of [2^(k-1), 2^k) µs


def summarize(slots: list[int], total_ns: int) -> AppLatency | None:
    count = sum(slots)
    if count <= 0:
        return None
    top = max(i for i, n in enumerate(slots) if n)
    return AppLatency(count, total_ns / 1000 / count, quantile_us(slots, 0.50), quantile_us(slots, 0.99),
                      quantile_us(slots, 0.999), slot_upper_us(top), tuple(slots[:top + 1]))


class ResponseTimes(CgroupHistograms):
    """The program's histograms of response times (its map `responses`), per sampled cgroup and round."""

    def __init__(self, tree: Path, program: Path = PROGRAM, load: Callable[[Path], BpfObject] = BpfObject,
                 kernel_btf: Path = KERNEL_BTF):
        super().__init__(tree, program, "responses", SLOTS, load, kernel_btf)

    def read(self, paths: Iterable[str]) -> dict[str, AppLatency]:
        return {path: summarize(slots, total_ns) for path, (slots, total_ns) in self.deltas(paths).items()}


class AppLatencySensor(OptionalSensor):
    """Section APP_LATENCY: cgroup path -> AppLatency of the round, for every latency-sensitive cgroup
    that answered a request this round."""
    name = APP_LATENCY
    # Its host feature, "bpf" (libbpf and the kernel's BTF), is the run-queue sensor's row in koordctl
    # doctor (a feature has one owner, tests/test_capabilities.py); whether this program loads is doctor's
    # sensors line.
    features = {}

    def __init__(self, cgroup_root: Path | str = DEFAULT_ROOT, program: Path = PROGRAM,
                 load: Callable[[Path], BpfObject] = BpfObject, kernel_btf: Path = KERNEL_BTF):
        self.cgroup_root, self.program, self.load, self.kernel_btf = Path(cgroup_root), program, load, kernel_btf
        self.source: ResponseTimes | None = None

    def start(self) -> None:
        try:
            tree = detect_layout(self.cgroup_root).unified
        except LayoutError as e:
            raise SensorUnavailable(str(e)) from None
        if tree is None:
            raise SensorUnavailable("no v2 tree: sockets and tasks name their cgroup in the v2 hierarchy")
        source = ResponseTimes(tree, self.program, self.load, self.kernel_btf)
        source.open()           # SensorUnavailable, saying why, where it does not load
        self.source = source

    def sample(self, context: SensorContext) -> Mapping[str, AppLatency]:
        return self.source.read(p for p, cls in context.cgroups.items() if cls in LATENCY_SENSITIVE)

    def stop(self) -> None:
        if self.source is not None:
            self.source.close()
        self.source = None
