"""Knobs the kubelet owns: koordd does not fight the kubelet over them unless the config says so.

The kubelet (with its container runtime) writes the cgroups under its pod root (`kubepods.slice`
with the systemd cgroup driver, `kubepods` with cgroupfs; the same names on cgroup v1 and v2):

    root       kubepods.slice                                  kubepods
    QoS        kubepods.slice/kubepods-besteffort.slice        kubepods/besteffort   (and burstable)
    pod        .../kubepods-besteffort-pod<uid>.slice          kubepods/besteffort/pod<uid>
               kubepods.slice/kubepods-pod<uid>.slice          kubepods/pod<uid>     (Guaranteed)
    container  .../cri-containerd-<id>.scope, crio-<id>.scope  .../pod<uid>/<id>

`owner(target, knob, roots)` says whether (target, knob) is the kubelet's and why: a pure function of
the path, no I/O. A knob is the kubelet's on a cgroup where the kubelet (or the runtime, from what
the kubelet asks) writes it, and where a value koordd writes makes the kernel refuse the kubelet's
own write (`cpu.idle` = 1 makes every `cpu.weight` write fail with EINVAL; a `cpu.max.burst` above
a new quota makes that `cpu.max` write fail). Everything else is free: `cpu.max` of a QoS cgroup
(be_suppress), `cpu.max` and `memory.max` of a BestEffort pod (the kubelet gives those no limit),
`memory.high` above the containers, thread policies, and the commands (`cgroup.kill`,
`memory.reclaim`, `cgroup.freeze`), which are acts, not values the kubelet sets. `oom_score_adj` (a
process knob koordd sets for a whole cgroup) is the kubelet's on all of its cgroups: the kubelet's own
values stand, and koordd's oom_shaping writes it only on cgroups outside the kubelet's roots.

`KubeletRule` carries the config (`[daemon] kubelet_owned`, `kubelet_override`, `kubelet_cgroups`)
and is what the actuator asks before a write (koordd/act/actuator.py); docs/kubernetes.md has the table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from koordd.core.cgroup_text import match_pattern
from koordd.core.options import Option, PatternList

ROOT, QOS, POD, CONTAINER = "root", "QoS", "pod", "container"
DEFAULT_ROOTS = ("kubepods.slice", "kubepods")

# Why the kubelet writes each knob, per level. Knob names are koordd's (the cgroup-v2 names; on v1
# cpu.weight is cpu.shares, cpu.max is cfs_quota_us/cfs_period_us, memory.max is limit_in_bytes).
_WEIGHT = "cpu.weight (cpu.shares on v1): the kubelet sets it from CPU requests, at start and every minute"
_IDLE = "cpu.idle = 1 makes the kernel refuse every cpu.weight write (EINVAL), the kubelet's too"
_PIDS = "pids.max: --pod-max-pids / node allocatable"
_HUGETLB = "hugetlb limits: hugepage requests"
_MEMORY_QOS_MIN = "memory.min: MemoryQoS (cgroup v2) reserves memory requests"
_MEMORY_QOS_LOW = "memory.low: MemoryQoS's TieredReservation protects Burstable requests"
_BLOCKIO = ("io.weight/io.max (blkio.* on v1): the runtime applies the container's blockio class (containerd's "
            "and CRI-O's blockio_config_file, the blockio.resources.beta.kubernetes.io annotations)")
# koordd's oom_score_adj (koordd/backends/oom.py) reaches every process below its target, so at every level.
_OOM = ("oom_score_adj: the kubelet gives each container's processes its QoS class's score (Guaranteed -997, "
        "BestEffort 1000, Burstable 2..999 from its memory request)")

OWNED: dict[str, dict[str, str]] = {
    ROOT: {
        "cpu.weight": "cpu.weight (cpu.shares on v1): the kubelet sets it to node allocatable CPU",
        "cpu.idle": _IDLE,
        "memory.max": "memory.max: node allocatable memory (--enforce-node-allocatable=pods)",
        "memory.min": _MEMORY_QOS_MIN,
        "memory.low": _MEMORY_QOS_LOW,
        "pids.max": _PIDS,
        "hugetlb": _HUGETLB,
        "oom_score_adj": _OOM,
    },
    QOS: {
        "cpu.weight": _WEIGHT,
        "cpu.idle": _IDLE,
        "memory.max": "memory.max: --qos-reserved (QOSReserved) limits the QoS cgroups",
        "memory.min": _MEMORY_QOS_MIN,
        "memory.low": _MEMORY_QOS_LOW,
        "hugetlb": _HUGETLB,
        "oom_score_adj": _OOM,
    },
    POD: {
        "cpu.weight": "cpu.weight (cpu.shares on v1): the sum of the pod's CPU requests (BestEffort: the minimum)",
        "cpu.idle": _IDLE,
        "pids.max": _PIDS,
        "hugetlb": _HUGETLB,
        "oom_score_adj": _OOM,
        "memory.min": _MEMORY_QOS_MIN,
        "memory.low": _MEMORY_QOS_LOW,
        # Only pods with limits: BestEffort pods have none (see _BESTEFFORT_FREE).
        "cpu.max": "cpu.max (cfs_quota_us on v1): the pod's CPU limits, also on an in-place resize",
        "cpu.max.burst": "the kernel refuses a cpu.max quota below cpu.max.burst: a resize of the pod's CPU limit would fail",
        "memory.max": "memory.max (limit_in_bytes on v1): the pod's memory limits",
    },
    CONTAINER: {
        "cpu.weight": "cpu.weight (cpu.shares on v1): the runtime sets the container's CPU request",
        "cpu.idle": _IDLE,
        "cpu.max": "cpu.max (cfs_quota_us on v1): the runtime sets the container's CPU limit",
        "cpu.max.burst": "the kernel refuses a cpu.max quota below cpu.max.burst: the runtime's update would fail",
        "cpuset.cpus": "cpuset.cpus: the static CPU manager assigns and reconciles every container's CPUs",
        "cpuset.mems": "cpuset.mems: the memory manager",
        "memory.max": "memory.max (limit_in_bytes on v1): the runtime sets the container's memory limit",
        "memory.high": "memory.high: MemoryQoS throttles containers below their limit",
        "memory.min": _MEMORY_QOS_MIN,
        "memory.low": _MEMORY_QOS_LOW,
        "memory.swap.max": "memory.swap.max: the kubelet's swap behaviour",
        "memory.oom.group": "memory.oom.group: the kubelet (1.28+, cgroup v2) sets it to 1 on every container "
                            "unless singleProcessOOMKill",
        "pids.max": _PIDS,
        "hugetlb": _HUGETLB,
        "oom_score_adj": _OOM,
        "io.weight": _BLOCKIO,
        "io.max": _BLOCKIO,
    },
}
# A BestEffort pod has no limits: the kubelet writes neither its cpu.max nor its memory.max.
_BESTEFFORT_FREE = frozenset({"cpu.max", "cpu.max.burst", "memory.max"})

# Every name kubelet_override may take (hugetlb stands for each hugetlb.<size>.* file).
KNOWN_KNOBS = frozenset(k for level in OWNED.values() for k in level)

_QOS = re.compile(r"(?:^|.*-)(burstable|besteffort)(?:\.slice)?$")
_POD = re.compile(r"(?:^|.*-)pod[0-9a-fA-F_-]+(?:\.slice)?$")


@dataclass(frozen=True)
class Ownership:
    """The kubelet owns `knob` of a cgroup at `level` (root, QoS, pod, container) of QoS `qos`."""
    level: str
    qos: str | None      # "guaranteed", "burstable", "besteffort"; None at the root
    why: str


def place(target: str, roots: Iterable[str] = DEFAULT_ROOTS) -> tuple[str, str | None] | None:
    """(level, QoS class) of a cgroup the kubelet made, or None for one it did not (outside its
    roots, a name it does not use, or a cgroup a container made inside itself)."""
    parts = target.strip("/").split("/")
    for root in roots:
        n = root.count("/") + 1
        if len(parts) >= n and match_pattern(root, "/".join(parts[:n])):
            rest = parts[n:]
            break
    else:
        return None
    if not rest:
        return ROOT, None
    qos = None
    if m := _QOS.match(rest[0]):
        qos, rest = m.group(1), rest[1:]
        if not rest:
            return QOS, qos
    if not _POD.match(rest[0]):
        return None
    qos = qos or "guaranteed"
    if len(rest) == 1:
        return POD, qos
    return (CONTAINER, qos) if len(rest) == 2 else None


def _family(knob: str) -> str:
    return "hugetlb" if knob.startswith("hugetlb.") else knob


def owner(target: str, knob: str, roots: Iterable[str] = DEFAULT_ROOTS) -> Ownership | None:
    """Whether the kubelet owns `knob` of cgroup `target`, and why; None when koordd may write it."""
    where = place(target, roots)
    if where is None:
        return None
    level, qos = where
    name = _family(knob)
    why = OWNED[level].get(name)
    if why is None or (level == POD and qos == "besteffort" and name in _BESTEFFORT_FREE):
        return None
    return Ownership(level, qos, why)


@dataclass(frozen=True)
class KubeletRule:
    """The config's word on kubelet-owned knobs: `respect` refuses koordd's writes to them (those in
    `override` excepted), `override` lets every one through."""
    mode: str = "respect"
    override: frozenset[str] = frozenset()
    roots: tuple[str, ...] = DEFAULT_ROOTS

    @staticmethod
    def of(daemon) -> "KubeletRule":
        """From the config's [daemon] settings."""
        return KubeletRule(daemon.kubelet_owned, frozenset(daemon.kubelet_override), tuple(daemon.kubelet_cgroups))

    def refusal(self, target: str, knob: str) -> str | None:
        """Why koordd may not write `knob` of `target`, naming the rule and the option; None if it may."""
        if self.mode == "override" or _family(knob) in self.override:
            return None
        o = owner(target, knob, self.roots)
        if o is None:
            return None
        qos = f", {o.qos}" if o.qos else ""
        return (f"kubelet-owned: {knob} of {target or '/'} (the kubelet's {o.level} cgroup{qos}): {o.why}; "
                f"[daemon] kubelet_owned = \"override\" or kubelet_override = [\"{_family(knob)}\"] lets koordd write it")


class KnobNames(Option):
    """An array of knob names the kubelet may own (KNOWN_KNOBS), kept as a tuple without repeats."""

    def convert(self, value):
        if not isinstance(value, (list, tuple)) or not all(isinstance(k, str) for k in value):
            raise ValueError("expected an array of knob names (strings)")
        bad = [k for k in value if _family(k) not in KNOWN_KNOBS]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a knob the kubelet owns ({', '.join(sorted(KNOWN_KNOBS))})")
        return tuple(dict.fromkeys(value))


KUBELET_OPTIONS: tuple[Option, ...] = (
    Option("kubelet_owned", str, "respect", "knobs the kubelet writes on its cgroups (docs/kubernetes.md): "
                                            "respect refuses koordd's writes to them, override writes them anyway",
           choices=("respect", "override")),
    KnobNames("kubelet_override", tuple, (), "knobs koordd writes even where the kubelet owns them, with "
                                             "kubelet_owned = \"respect\" (e.g. [\"cpu.max\"] for cpu_burst on "
                                             "Guaranteed pods)"),
    PatternList("kubelet_cgroups", tuple, DEFAULT_ROOTS, "the kubelet's pod roots (globs per path component): "
                                                         "its QoS, pod and container cgroups lie below them"),
)
