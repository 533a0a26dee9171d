"""Reclaimable capacity: CPU and memory the latency-sensitive classes were given but do not use, in
the spirit of Koordinator's batch and Mid resources, so a cluster scheduler can place BE work on the
nodes where it will fit. koordd only publishes the figure (status.json, the metrics endpoint); it
changes nothing by it.

Per LS, LSR or LSE class root, for CPU (cores) and memory (bytes):

    given     its limit: CPU min(cpu.max quota / period, the CPUs of its cpuset, the node's CPUs),
              memory min(memory.max, the node's memory); a root without a limit was given the node
    peak      its highest usage over the last `window` (CPU: cores used; memory: memory.current,
              page cache included: a cache LS reads from is LS's too); a class root nested in it
              (a BE job in an LS pod) uses its own, not the LS root's (Snapshot.own_usage)
    needs     min(given, peak x (1 + margin_percent / 100))
    system    the highest, over `window`, of what neither LS nor BE uses: node used - LS used -
              BE used (host daemons, SYSTEM, the kernel), at least 0

    reclaimable = max(0, min(Σ given, node - system) - Σ needs)

A windowed peak, not a mean: LS's usage may come back at any moment, so only what it has left
unused for the whole window counts, and a rise counts at once (the peak follows it up the same
tick) while a fall counts only once the window has passed. The margin covers what the window has
not seen. Koordinator's own formula (node - system - LS max(usage, request)) also counts capacity
that nobody was given; this counts only what LS holds and leaves idle: the part a scheduler that
already packs requests does not know about.

Pure: `observe()` is a function of the snapshot, the settings and its own state (the windows).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from koordd.core.cgroup_text import parse_cpu_max, parse_cpulist
from koordd.core.health import LATENCY_SENSITIVE
from koordd.core.options import Duration, Option
from koordd.core.snapshot import CgroupSample, Snapshot, own_usage

RECLAIMABLE_OPTIONS = (
    Option("window", Duration, Duration(600.0), "LS usage counts at its peak over this window: only what LS "
           "left unused for all of it is reclaimable", min=1, max=86400),
    Option("margin_percent", float, 10.0, "safety margin: LS needs its peak plus this percent (within what "
           "it was given)", min=0, max=1000),
)

CPU, MEMORY = "cpu", "memory"


class WindowPeak:
    """The largest value pushed within the last `window` seconds: a deque of (time, value) that
    stays decreasing (a value hides every older, smaller one), so it holds few entries and the
    peak is its first."""

    def __init__(self, window: float):
        self.window = window
        self.entries: deque[tuple[float, float]] = deque()

    def push(self, now: float, value: float) -> float:
        while self.entries and self.entries[-1][1] <= value:
            self.entries.pop()
        self.entries.append((now, value))
        while self.entries[0][0] < now - self.window:
            self.entries.popleft()
        return self.entries[0][1]


@dataclass
class ReclaimableState:
    """The windows of peaks, by (resource, cgroup or "system"); `since`: the first observation."""
    peaks: dict[tuple[str, str], WindowPeak] = field(default_factory=dict)
    since: float | None = None

    def peak(self, resource: str, key: str, now: float, value: float, window: float) -> float:
        w = self.peaks.get((resource, key))
        if w is None or w.window != window:
            w = self.peaks[(resource, key)] = WindowPeak(window)
        return w.push(now, value)

    def forget_except(self, keys: set[tuple[str, str]]) -> None:
        for k in [k for k in self.peaks if k not in keys]:
            del self.peaks[k]


@dataclass(frozen=True)
class Capacity:
    """One resource's figure and the numbers behind it (cores or bytes)."""
    reclaimable: float
    node: float                 # the node's capacity
    given: float                # Σ given of the LS roots, at most the node
    needs: float                # Σ min(given, peak x margin)
    peak: float                 # Σ peaks of the LS roots
    system: float               # the peak of what neither LS nor BE uses


@dataclass(frozen=True)
class Reclaimable:
    cpu: Capacity | None        # None: a number it needs was unknown this round
    memory: Capacity | None
    ls_cgroups: int
    observed_seconds: float     # how long koordd has watched: under `window`, the peaks have seen less

    def as_dict(self) -> dict:
        def one(c: Capacity | None, unit: type) -> dict | None:
            return None if c is None else {k: unit(getattr(c, k)) if unit is int else round(getattr(c, k), 3)
                                           for k in ("reclaimable", "node", "given", "needs", "peak", "system")}
        return {"cpu_cores": one(self.cpu, float), "memory_bytes": one(self.memory, int),
                "ls_cgroups": self.ls_cgroups, "observed_seconds": round(self.observed_seconds, 1)}


def cpu_given(c: CgroupSample, node_cpus: float) -> float:
    """Cores cgroup `c` may use: its quota, the CPUs of its cpuset, the node, whichever is least. A
    limit that is absent or unreadable (no cpu controller delegated: no cpu.max) limits nothing."""
    given = node_cpus
    try:
        quota, period = parse_cpu_max(c.cpu_max) if c.cpu_max else (None, 1)
    except ValueError:
        quota = None
    if quota is not None:
        given = min(given, quota / period)
    try:
        cpus = parse_cpulist(c.cpuset_cpus) if c.cpuset_cpus else frozenset()
    except ValueError:
        cpus = frozenset()
    if cpus:                      # v2's "" means the parent's CPUs
        given = min(given, float(len(cpus)))
    return given


def memory_given(c: CgroupSample, node_bytes: float) -> float:
    """Bytes cgroup `c` may use: memory.max, or the node's memory where it has none."""
    if c.memory_max and c.memory_max != "max":
        try:
            return min(node_bytes, float(c.memory_max))
        except ValueError:
            pass
    return node_bytes


def _capacity(state: ReclaimableState, resource: str, now: float, window: float, margin: float, node: float,
              ls: list[tuple[str, float, float]], others_used: float, node_used: float,
              keys: set[tuple[str, str]]) -> Capacity:
    """`ls`: (cgroup, given, used) per LS root; `others_used`: what BE uses."""
    given = needs = peaks = 0.0
    for path, g, used in ls:
        peak = state.peak(resource, path, now, used, window)
        keys.add((resource, path))
        given += g
        peaks += peak
        needs += min(g, peak * (1 + margin / 100))
    system_now = max(node_used - sum(u for _, _, u in ls) - others_used, 0.0)
    system = state.peak(resource, "", now, system_now, window)
    keys.add((resource, ""))
    given = min(given, node)
    return Capacity(max(0.0, min(given, node - system) - needs), node, given, needs, peaks, system)


def observe(snapshot: Snapshot, settings, state: ReclaimableState) -> Reclaimable:
    """This round's reclaimable capacity, its windows advanced by `snapshot`."""
    now, node = snapshot.time, snapshot.node
    window, margin = float(settings.window), float(settings.margin_percent)
    if state.since is None:
        state.since = now
    ls_roots = snapshot.of_class(*LATENCY_SENSITIVE)
    be_roots = snapshot.of_class("BE")
    keys: set[tuple[str, str]] = set()
    cpu = memory = None
    # Each root's own usage: a root nested in another (an LS job in be.slice) is inside its usage too.
    ls_cpu = [own_usage(snapshot, (c,)) for c in ls_roots]
    be_cpu = own_usage(snapshot, be_roots)
    if node.cpu_used is not None and None not in ls_cpu and be_cpu is not None:
        cpus = float(node.cpu_count)
        cpu = _capacity(state, CPU, now, window, margin, cpus,
                        [(c.path, cpu_given(c, cpus), used) for c, used in zip(ls_roots, ls_cpu)],
                        be_cpu, node.cpu_used, keys)
    else:
        keys |= {k for k in state.peaks if k[0] == CPU}         # unknown this round: keep what was seen
    ls_memory = [own_usage(snapshot, (c,), "memory_current") for c in ls_roots]
    be_memory = own_usage(snapshot, be_roots, "memory_current")
    if node.memory_total is not None and node.memory_available is not None \
            and None not in ls_memory and be_memory is not None:
        total = float(node.memory_total)
        memory = _capacity(state, MEMORY, now, window, margin, total,
                           [(c.path, memory_given(c, total), float(used)) for c, used in zip(ls_roots, ls_memory)],
                           float(be_memory), float(node.memory_total - node.memory_available), keys)
    else:
        keys |= {k for k in state.peaks if k[0] == MEMORY}
    state.forget_except(keys)       # roots that vanished take their peaks with them
    return Reclaimable(cpu, memory, len(ls_roots), now - state.since)


# What observe() reads of each class root: the daemon asks the sensors for these every round.
FIELDS = frozenset(("cpu_usage", "cpu_max", "cpuset_cpus", "memory_current", "memory_max"))
