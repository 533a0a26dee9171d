"""The latency-sensitive applications' own latency per cgroup: the server-side response time of their
request/response traffic, measured in the kernel without changing them (docs/app-latency.md).

koordd/bpf/app_latency.bpf.o, a CO-RE object loaded by koordd's loader (libbpf), stamps a TCP or UNIX
stream socket when bytes arrive that the server has not read, starts the clock at the oldest bytes the
server's read takes (restarted by a read after one that emptied the socket, so a client's pause is not
counted; kept by one after a read that left bytes, so a queue on the connection is) and counts, at the
next send on it, the time since, for the deepest watched cgroup at or above the sending task's: log2
histograms per cgroup, read each round as their deltas (sensors/cgroup_hist.py, as the run-queue
sensor's). Only the latency-sensitive classes' cgroups are watched: they are the ones with an SLO.

Three histograms: `responses` counts every response once (the round's count, mean and maximum);
`weighted` holds the same responses with weights, a connection's responses in about a second weighing as
much together as another connection's: the quantiles come from it, so a client flooding one connection
with cheap requests does not hide another's slow ones. The round's `slots` (which the SLO merges over
rounds) are the weighted histogram in whole responses (`apportion`), summing to the round's count.
`crowded` counts the responses sent while their socket was crowded: from an arrival that found it near its
limit (a UNIX peer with 3/4 of its send buffer queued, a TCP window used up) to the answer after the read
that emptied it. Their clients were held back, and the rest of their wait is nowhere in the histograms
(AppLatency.crowded; core/health.py's app_socket_full).

Needs libbpf1, a kernel with BTF and the tracepoints sk_data_ready, sock_recv_length and sock_send_length
(Linux 6.6+), and
a v2 tree (the unified one on hybrid hosts): a socket and a task name their cgroup there. There is no
fallback: without them the sensor is unavailable and says why.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from koordd.core.classes import LATENCY_SENSITIVE
from koordd.core.histogram import quantile_us, slot_upper_us
from koordd.core.snapshot import APP_LATENCY, AppLatency
from koordd.kernel import bpf_objects
from koordd.kernel.bpf_shared import APP_SLOTS
from koordd.kernel.cgroupfs import DEFAULT_ROOT, LayoutError, detect_layout
from koordd.kernel.libbpf import BpfObject
from koordd.sensors.cgroup_hist import KERNEL_BTF, CgroupHistograms
from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable

PROGRAM = bpf_objects.APP_LATENCY
SLOTS = APP_SLOTS               # koordd_shared.h's: slot k holds responses of [2^(k-1), 2^k) µs


def summarize(slots: list[int], total_ns: int, weights: Sequence[int] | None = None,
              whole: Sequence[int] | None = None, crowded: int = 0) -> AppLatency | None:
    """The round's AppLatency: count, mean and maximum of the responses (`slots`: each counted once);
    the quantiles of `weights` (the same responses weighted by connection; `slots` where not given);
    `whole`: the histogram it reports (`slots` where not given); `crowded`: of them, those sent on a
    socket while it was crowded (never more than the count)."""
    count = sum(slots)
    if count <= 0:
        return None
    if weights is None or not any(weights):
        weights = slots
    whole = slots if whole is None else whole
    top = max(i for i, n in enumerate(slots) if n)
    return AppLatency(count, total_ns / 1000 / count, quantile_us(weights, 0.50), quantile_us(weights, 0.99),
                      quantile_us(weights, 0.999), slot_upper_us(top), tuple(whole[:top + 1]),
                      min(max(crowded, 0), count))


def apportion(count: int, weights: Sequence[int], carry: Sequence[float]) -> tuple[list[int], list[float]]:
    """`count` responses split over the slots in proportion to `weights`, in whole responses: each slot's
    share plus what rounding left it owed last round (`carry`), the remainders rounded as the largest
    remainder method does (ties to the slower slot). Returns the slots and the new carry. A slot without
    weight this round gets nothing and its carry is dropped; a share too small to round up is carried
    until it does, so a tail of 0.3 responses a round still shows once in three rounds."""
    total = sum(weights)
    if count <= 0 or total <= 0:
        return [0] * len(weights), [0.0] * len(weights)
    share = [count * w / total + c if w else 0.0 for w, c in zip(weights, carry)]
    whole = [max(math.floor(x), 0) for x in share]
    short = count - sum(whole)
    if short > 0:       # the largest remainders among the weighted slots, ties to the slower
        order = sorted((i for i, w in enumerate(weights) if w), key=lambda i: (share[i] - whole[i], i), reverse=True)
        for k in range(short):
            whole[order[k % len(order)]] += 1
    while short < 0:    # clamping a negative share to 0 gave too many: off the smallest remainders
        i = min((i for i, n in enumerate(whole) if n), key=lambda i: (share[i] - whole[i], -i))
        whole[i] -= 1
        short += 1
    return whole, [x - n if w else 0.0 for x, n, w in zip(share, whole, weights)]


class ResponseTimes(CgroupHistograms):
    """The program's histograms of response times (its maps `responses`, `weighted` and `crowded`), per
    sampled cgroup and round."""

    def __init__(self, tree: Path, program: Path = PROGRAM, load: Callable[[Path], BpfObject] = BpfObject,
                 kernel_btf: Path = KERNEL_BTF):
        super().__init__(tree, program, "responses", SLOTS, load, kernel_btf, more=("weighted", "crowded"))
        self.carry: dict[str, list[float]] = {}      # path -> what apportion left each slot owed

    def read(self, paths: Iterable[str]) -> dict[str, AppLatency]:
        out = {}
        for path, ((slots, total_ns), (weights, _), (crowded, _)) in self.all_deltas(paths).items():
            if not any(weights):
                weights = slots
            whole, self.carry[path] = apportion(sum(slots), weights, self.carry.get(path, [0.0] * SLOTS))
            out[path] = summarize(slots, total_ns, weights, whole, sum(crowded))
        for path in [p for p in self.carry if p not in self.ids]:
            del self.carry[path]
        return out


class AppLatencySensor(OptionalSensor):
    """Section APP_LATENCY: cgroup path -> AppLatency of the round, for every latency-sensitive cgroup
    that answered a request this round."""
    name = APP_LATENCY
    # Its host feature, "bpf" (libbpf and the kernel's BTF), is the run-queue sensor's row in koordctl
    # doctor (a feature has one owner, tests/unit/runtime/test_capabilities.py); whether this program loads is doctor's
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
