"""The table of knobs: one logical name (as in the kernel's cgroup-v2 docs) per knob.

Each knob knows the file(s) it lives in on v2 and on v1, how to read the
current value in canonical v2 text, how to write a canonical value, and which
kernel rules a value must satisfy before it is written. Values travel through
koordd as that canonical text ("50000 100000", "max 100000", "0-3"), so
decisions, the restore journal and the logs all read the same on every host.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from koordd.core import blkio
from koordd.core.backend import Backend, BackendSet, Harm, InvalidValue, PartialWrite, Unsupported, lower
from koordd.core.cgroup_text import (CFS_PERIOD_RANGE, CFS_QUOTA_MIN, format_cpu_max, format_cpulist, parent_of,
    parse_cpu_max, parse_cpulist, parse_int)
from koordd.kernel.cgroupfs import CgroupFS, CgroupGone, Layout, LayoutError
from koordd.kernel.host_probe import Host, find_knob, read
from koordd.kernel.v1_kill import kill_v1

V1_MEMORY_UNLIMITED = 9223372036854771712   # PAGE_COUNTER_MAX * 4096, what v1 shows for "no limit"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


# --- canonical values ------------------------------------------------------


def shares_to_weight(shares: int) -> int:
    """v1 cpu.shares (2..262144) -> v2 cpu.weight (1..10000), the kernel's/systemd's mapping:
    weight = shares * 100 / 1024 rounded, so the defaults 1024 and 100 meet."""
    return max(1, min(10000, (shares * 100 + 512) // 1024))


def weight_to_shares(weight: int) -> int:
    """The inverse (rounded), exact on the way back: shares_to_weight(weight_to_shares(w)) == w."""
    return max(2, min(262144, (weight * 1024 + 50) // 100))


# --- the table -------------------------------------------------------------

Reader = Callable[[str], str]


@dataclass(frozen=True)
class Knob:
    """A logical knob. `read`/`write` take the CgroupFS and cgroup; v1/v2 is chosen from the layout."""
    name: str
    controller: str | None                    # v2 controller; None: a core file of every v2 cgroup
    doc: str
    v2_file: str | None
    v1_file: str | None
    normalize: Callable[[str], str]           # canonical text or InvalidValue
    v1_controller: str | None = None          # the v1 hierarchy, when it differs from `controller`
    to_v1: Callable[[str], str] = lambda v: v
    from_v1: Callable[[str], str] = lambda v: v
    v1_read: Callable[[CgroupFS, str], str] | None = None          # v1 forms spread over files
    v1_write: Callable[[CgroupFS, str, str], None] | None = None
    v2_write: Callable[[CgroupFS, str, str], None] | None = None   # a v2 value written in several writes (io.max)
    check: Callable[[str, "KnobContext"], None] = lambda v, ctx: None
    oneshot: bool = False                     # a command (memory.reclaim, cgroup.kill): never read or restored
    magnitude: Callable[[str], float] | None = None   # for write order: parents first when raising
    resets: tuple[str, ...] = ()              # knobs the kernel rewrites when this one changes
    harm: Harm | None = None                  # what a write does to protected work (koordd/act/protect.py)
    slow: bool = False                        # a write that may block for long (memory.reclaim): KnobSpec.slow

    def uses_v2(self, fs: CgroupFS) -> bool:
        if self.controller is None:
            # Core v2 files (cgroup.freeze, cgroup.kill) exist on hybrid hosts too, but workloads there
            # are placed by their v1 hierarchies: use the v1 form unless the host is pure v2.
            return fs.layout.mode == "v2"
        return self.controller in fs.layout.v2_controllers

    def _v1_controller(self) -> str | None:
        return self.v1_controller or self.controller

    def supported(self, fs: CgroupFS) -> bool:
        if self.uses_v2(fs):
            return self.v2_file is not None
        return self._v1_controller() in fs.layout.v1 and (self.v1_file is not None or self.v1_write is not None)

    def present(self, fs: CgroupFS) -> bool | None:
        """Whether this kernel has the knob's file: looked up in the cgroups right below the root that
        would carry it. None when none can tell (no such cgroup yet, or on v2 the controller is not
        enabled below the root yet): then the layout's word stands."""
        if not self.supported(fs):
            return False
        v2 = self.uses_v2(fs)
        filename = self.v2_file if v2 else self.v1_file
        base = fs.dir(self.controller if v2 else self._v1_controller(), "")
        if filename is None or base is None:
            return None           # a v1 form spread over several files (cpu.max): nothing single to look for
        if v2 and self.controller is not None:
            try:
                if self.controller not in (base / "cgroup.subtree_control").read_text().split():
                    return None
            except OSError:
                return None
        try:
            children = [d for d in base.iterdir() if d.is_dir()]
        except OSError:
            return None
        if not children:
            return None
        return any((d / filename).exists() for d in children)

    def _require(self, fs: CgroupFS) -> None:
        if not self.supported(fs):
            raise Unsupported(f"{self.name} is not available on this host ({fs.layout.describe()})")

    def read(self, fs: CgroupFS, cgroup: str) -> str:
        self._require(fs)
        if self.uses_v2(fs):
            return self.normalize(fs.read(self.controller, cgroup, self.v2_file).strip())
        if self.v1_read is not None:
            return self.v1_read(fs, cgroup)
        return self.normalize(self.from_v1(fs.read(self._v1_controller(), cgroup, self.v1_file).strip()))

    def write(self, fs: CgroupFS, cgroup: str, value: str) -> None:
        self._require(fs)
        if self.uses_v2(fs):
            if self.v2_write is not None:
                self.v2_write(fs, cgroup, value)
            else:
                fs.write(self.controller, cgroup, self.v2_file, value)
        elif self.v1_write is not None:
            self.v1_write(fs, cgroup, value)
        else:
            fs.write(self._v1_controller(), cgroup, self.v1_file, self.to_v1(value))


class KnobContext:
    """What a kernel-rule check may look at: other knobs of the same cgroup and of its parent."""

    def __init__(self, fs: CgroupFS, cgroup: str):
        self.fs, self.cgroup = fs, cgroup

    def current(self, knob: str, cgroup: str | None = None) -> str | None:
        k = KNOBS[knob]
        try:
            return k.read(self.fs, self.cgroup if cgroup is None else cgroup) if k.supported(self.fs) else None
        except (OSError, ValueError):
            return None

    def effective_cpus(self, cgroup: str) -> frozenset[int] | None:
        """CPUs a cgroup may use: v2 cpuset.cpus.effective, v1 cpuset.cpus."""
        name = "cpuset.cpus.effective" if "cpuset" in self.fs.layout.v2_controllers else "cpuset.cpus"
        try:
            return parse_cpulist(self.fs.read("cpuset", cgroup, name))
        except (OSError, ValueError):
            return None


def _read_v1_cpu_max(fs: CgroupFS, cgroup: str) -> str:
    quota = int(fs.read("cpu", cgroup, "cpu.cfs_quota_us"))
    period = int(fs.read("cpu", cgroup, "cpu.cfs_period_us"))
    return format_cpu_max(None if quota < 0 else quota, period)


def _write_v1_cpu_max(fs: CgroupFS, cgroup: str, value: str) -> None:
    quota, period = parse_cpu_max(value)
    if int(fs.read("cpu", cgroup, "cpu.cfs_period_us")) != period:
        fs.write("cpu", cgroup, "cpu.cfs_period_us", str(period))
    fs.write("cpu", cgroup, "cpu.cfs_quota_us", "-1" if quota is None else str(quota))


def _cpu_max_magnitude(value: str) -> float:
    quota, period = parse_cpu_max(value)
    return float("inf") if quota is None else quota / period


def _norm_cpu_max(text: str) -> str:
    quota, period = parse_cpu_max(text)
    lo, hi = CFS_PERIOD_RANGE
    if not lo <= period <= hi:
        raise InvalidValue(f"cpu.max period must be {lo}..{hi} µs, got {period}")
    if quota is not None and quota < CFS_QUOTA_MIN:
        raise InvalidValue(f"cpu.max quota must be >= {CFS_QUOTA_MIN} µs or max, got {quota}")
    return format_cpu_max(quota, period)


def _check_cpu_max(value: str, ctx: KnobContext) -> None:
    # The kernel refuses a quota below the current burst (EINVAL): say so before writing.
    quota, period = parse_cpu_max(value)
    burst = ctx.current("cpu.max.burst")
    if quota is not None and burst is not None and int(burst) > quota:
        raise InvalidValue(f"quota {quota} µs is below cpu.max.burst {burst} µs (kernel requires burst <= quota)")
    parent = parent_of(ctx.cgroup)
    if quota is not None and parent and not KNOBS["cpu.max"].uses_v2(ctx.fs):
        # v1 refuses a child quota above its parent's (EINVAL); v2 would just cap it.
        current = ctx.current("cpu.max", parent)
        pq, pp = parse_cpu_max(current) if current else (None, 1)
        if pq is not None and quota / period > pq / pp:
            raise InvalidValue(f"quota {quota}/{period} µs exceeds the parent's {pq}/{pp} "
                               f"(cgroup v1 requires child <= parent)")


def _norm_uint(name: str, lo: int = 0, hi: int | None = None) -> Callable[[str], str]:
    def norm(text: str) -> str:
        v = parse_int(text.strip(), name)
        if v < lo or (hi is not None and v > hi):
            raise InvalidValue(f"{name} must be {lo}..{hi if hi is not None else 'inf'}, got {v}")
        return str(v)
    return norm


def _check_burst(value: str, ctx: KnobContext) -> None:
    current = ctx.current("cpu.max")
    if current is None:
        return
    quota, _ = parse_cpu_max(current)
    if quota is not None and int(value) > quota:
        raise InvalidValue(f"burst {value} µs exceeds cpu.max quota {quota} µs (kernel requires burst <= quota)")


def _norm_cpulist(text: str) -> str:
    try:
        return format_cpulist(parse_cpulist(text))
    except ValueError as e:
        raise InvalidValue(f"cpuset.cpus: {e}") from None


def _cpus(text: str) -> float:
    # An empty v2 cpuset.cpus is no restriction: the parent's CPUs apply.
    return float("inf") if not text.strip() else len(parse_cpulist(text))


def _check_cpuset(value: str, ctx: KnobContext) -> None:
    cpus = parse_cpulist(value)
    if not cpus:
        if "cpuset" in ctx.fs.layout.v2_controllers:
            return  # v2: empty means "inherit the parent's CPUs"
        raise InvalidValue("cpuset.cpus may not be empty on cgroup v1")
    parent = parent_of(ctx.cgroup)
    allowed = ctx.effective_cpus(parent if parent is not None else "")
    if allowed is not None and not cpus <= allowed:
        raise InvalidValue(f"CPUs {format_cpulist(cpus - allowed)} are not in the parent's cpuset "
                           f"({format_cpulist(allowed)})")


def _norm_memory(text: str) -> str:
    # The kernel keeps a limit in pages and shows it rounded down: so does the canonical form.
    t = text.strip()
    return "max" if t == "max" else str(int(_norm_uint("memory limit")(t)) // PAGE_SIZE * PAGE_SIZE)


def _memory_magnitude(value: str) -> float:
    return float("inf") if value == "max" else float(value)


def _turns_on(new: str, original: str) -> bool:
    """Harm.tighter of a 0/1 knob whose 1 is the harm (cpu.idle, memory.oom.group)."""
    return new.strip() == "1" and original.strip() != "1"


def _kill_v1(fs: CgroupFS, cgroup: str) -> None:
    """v1 has no cgroup.kill: freeze (v1 freezer), SIGKILL every task of the memory subtree through
    pidfds, thaw; repeated passes where there is no freezer (koordd/kernel/v1_kill.py)."""
    kill_v1(fs, cgroup)


def _memory_from_v1(raw: str) -> str:
    return "max" if int(raw) >= V1_MEMORY_UNLIMITED else raw


# --- block IO (koordd/core/blkio.py: the canonical text) ---------------------------------------------

SYS_DEV_BLOCK = "/sys/dev/block"        # MAJ:MIN -> the device's sysfs directory (tests point it elsewhere)
# io.max field -> the v1 file that carries it (blkio.throttle.*_device: "MAJ:MIN value" lines, 0 = no limit)
V1_THROTTLE = {"rbps": "blkio.throttle.read_bps_device", "wbps": "blkio.throttle.write_bps_device",
               "riops": "blkio.throttle.read_iops_device", "wiops": "blkio.throttle.write_iops_device"}
V1_BFQ_WEIGHT_MAX = 1000                # blkio.bfq.weight (and v2 io.bfq.weight) take 1..1000


def _norm_io_max(text: str) -> str:
    try:
        return blkio.normalize_io_max(text)
    except ValueError as e:
        raise InvalidValue(str(e)) from None


def _norm_io_weight(text: str) -> str:
    try:
        return blkio.normalize_io_weight(text)
    except ValueError as e:
        raise InvalidValue(str(e)) from None


def _check_io_max(value: str, ctx: KnobContext) -> None:
    # The kernel answers ENODEV for a partition or a device that is not there: say which, and what to name.
    for dev in blkio.parse_io_max(value):
        d = os.path.join(SYS_DEV_BLOCK, dev)
        if not os.path.exists(d):
            raise InvalidValue(f"io.max: no block device {dev} on this host ({SYS_DEV_BLOCK}/{dev})")
        if os.path.exists(os.path.join(d, "partition")):
            whole = read(Path(os.path.realpath(d)).parent / "dev")
            raise InvalidValue(f"io.max: {dev} is a partition; the kernel limits whole disks"
                               + (f" (name {whole})" if whole else ""))


def _check_io_weight(value: str, ctx: KnobContext) -> None:
    if not KNOBS["io.weight"].uses_v2(ctx.fs) and blkio.weight_of(value) > V1_BFQ_WEIGHT_MAX:
        raise InvalidValue(f"io.weight {blkio.weight_of(value)} is above {V1_BFQ_WEIGHT_MAX}, the most "
                           f"blkio.bfq.weight (cgroup v1) takes")


def _write_v2_io_max(fs: CgroupFS, cgroup: str, value: str) -> None:
    """One write per device: the kernel parses one line per write. A later line refused after an earlier
    one landed is a PartialWrite, so the journal keeps what did land."""
    lines = [line for line in value.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        try:
            fs.write("io", cgroup, "io.max", line)
        except CgroupGone:
            raise
        except OSError as e:
            if i == 0:
                raise
            raise PartialWrite(e.errno, f"{e.strerror or e} (io.max line {line!r}; earlier lines landed)") from None


def _read_v1_io_max(fs: CgroupFS, cgroup: str) -> str:
    devices: dict[str, dict] = {}
    for field, filename in V1_THROTTLE.items():
        for line in fs.read("blkio", cgroup, filename).splitlines():
            if not line.strip():
                continue
            dev_text, _, raw = line.strip().partition(" ")
            dev = blkio.parse_device(dev_text)
            n = int(raw)
            devices.setdefault(dev, blkio.unlimited())[field] = n if n > 0 else None
    return blkio.format_io_max(devices)


def _write_v1_io_max(fs: CgroupFS, cgroup: str, value: str) -> None:
    """Each device's four fields, each in its throttle file (0 removes a limit); a refusal after a write
    landed is a PartialWrite."""
    wrote = False
    for dev, limits in blkio.parse_io_max(value).items():
        for field, filename in V1_THROTTLE.items():
            try:
                fs.write("blkio", cgroup, filename, f"{dev} {limits[field] or 0}")
            except CgroupGone:
                raise
            except OSError as e:
                if not wrote:
                    raise
                raise PartialWrite(e.errno, f"{e.strerror or e} ({filename} of {dev}; earlier writes landed)") from None
            wrote = True


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("cpu.max", "cpu", "CPU bandwidth limit: \"<quota_us|max> <period_us>\"",
         "cpu.max", None, _norm_cpu_max, v1_read=_read_v1_cpu_max, v1_write=_write_v1_cpu_max,
         check=_check_cpu_max, magnitude=_cpu_max_magnitude,
         harm=Harm("cap the CPU of", lower(_cpu_max_magnitude))),
    Knob("cpu.max.burst", "cpu", "CPU burst allowance above quota, µs",
         "cpu.max.burst", "cpu.cfs_burst_us", _norm_uint("cpu.max.burst"), check=_check_burst, magnitude=float,
         harm=Harm("cut the CPU burst of", lower(float))),
    Knob("cpu.weight", "cpu", "proportional CPU weight 1..10000 (v1: cpu.shares)",
         "cpu.weight", "cpu.shares", _norm_uint("cpu.weight", 1, 10000),
         to_v1=lambda v: str(weight_to_shares(int(v))), from_v1=lambda r: str(shares_to_weight(int(r)))),
    Knob("cpu.idle", "cpu", "1 = the group runs as SCHED_IDLE",
         "cpu.idle", "cpu.idle", _norm_uint("cpu.idle", 0, 1),
         resets=("cpu.weight",),        # idle forces weight 1, and leaving idle sets the default weight
         harm=Harm("make idle", _turns_on)),
    Knob("cpuset.cpus", "cpuset", "CPUs the group may run on",
         "cpuset.cpus", "cpuset.cpus", _norm_cpulist, check=_check_cpuset,
         harm=Harm("shrink the CPUs of", lower(_cpus))),
    Knob("memory.max", "memory", "hard memory limit, bytes or max (v1: memory.limit_in_bytes)",
         "memory.max", "memory.limit_in_bytes", _norm_memory,
         to_v1=lambda v: "-1" if v == "max" else v, from_v1=_memory_from_v1, magnitude=_memory_magnitude,
         harm=Harm("cap the memory of", lower(_memory_magnitude))),
    # v2 only: v1 has no equivalent of these protections and the throttling limit.
    Knob("memory.high", "memory", "memory throttling limit, bytes or max", "memory.high", None, _norm_memory,
         magnitude=_memory_magnitude, harm=Harm("throttle the memory of", lower(_memory_magnitude))),
    Knob("memory.low", "memory", "best-effort memory protection, bytes", "memory.low", None, _norm_memory),
    Knob("memory.min", "memory", "hard memory protection, bytes", "memory.min", None, _norm_memory),
    # Less swap pushes anon memory into RAM or the OOM killer instead: a cap like memory.max.
    Knob("memory.swap.max", "memory", "swap limit, bytes or max (v2; 0 = no swap)", "memory.swap.max", None,
         _norm_memory, magnitude=_memory_magnitude, harm=Harm("cap the swap of", lower(_memory_magnitude))),
    # v2 only (4.19+): v1's OOM killer takes one process at a time, whatever is asked (oom_shaping).
    Knob("memory.oom.group", "memory", "1 = the OOM killer kills the whole cgroup, never part of it (v2)",
         "memory.oom.group", None, _norm_uint("memory.oom.group", 0, 1),
         harm=Harm("make the OOM killer take all of", _turns_on)),
    Knob("memory.reclaim", "memory", "proactive reclaim of this many bytes (5.19+)", "memory.reclaim", None,
         _norm_uint("memory.reclaim", 1), oneshot=True, harm=Harm("reclaim memory of"), slow=True),
    Knob("cgroup.freeze", None, "1 = every task of the cgroup is frozen (v1: freezer.state)",
         "cgroup.freeze", "freezer.state", _norm_uint("cgroup.freeze", 0, 1), v1_controller="freezer",
         to_v1=lambda v: "FROZEN" if v == "1" else "THAWED",
         from_v1=lambda raw: "0" if raw == "THAWED" else "1", harm=Harm("freeze", lifts="0")),     # thawing helps
    Knob("cgroup.kill", None, "1 = SIGKILL every task of the subtree (5.14+; v1: freeze, kill, thaw)",
         "cgroup.kill", None, _norm_uint("cgroup.kill", 1, 1), v1_controller="memory",
         v1_write=lambda fs, cg, v: _kill_v1(fs, cg), oneshot=True, harm=Harm("kill")),
    # io_qos. io.weight: the default weight ("default N"; per-device weights are left alone), iocost's on
    # v2, BFQ's blkio.bfq.weight on v1. io.max: per device; a write changes the devices it names only, and
    # the backend scopes koordd's hold to them (CgroupBackend.scope), on v1 over the four throttle files.
    Knob("io.weight", "io", "proportional IO weight \"default N\", 1..10000 (v2 iocost; v1: blkio.bfq.weight, 1..1000)",
         "io.weight", "blkio.bfq.weight", _norm_io_weight, v1_controller="blkio",
         to_v1=lambda v: str(blkio.weight_of(v)), check=_check_io_weight),     # v1 reads "N": normalize takes it
    Knob("io.max", "io", "IO limits per device: \"MAJ:MIN rbps=N wbps=N riops=N wiops=N\" lines, N or max "
         "(v1: blkio.throttle.*_device)", "io.max", None, _norm_io_max, v1_controller="blkio",
         v1_read=_read_v1_io_max, v1_write=_write_v1_io_max, v2_write=_write_v2_io_max, check=_check_io_max,
         harm=Harm("cap the IO of", blkio.tighter)),     # a lower rbps/wbps/riops/wiops on any device
)}


def validate(fs: CgroupFS, cgroup: str, knob: str, value: str) -> str:
    """Canonical form of `value` if the kernel would accept it for this cgroup, else InvalidValue/Unsupported."""
    k = KNOBS.get(knob)
    if k is None:
        raise Unsupported(f"unknown knob {knob!r}")
    k._require(fs)
    canonical = k.normalize(value)
    k.check(canonical, KnobContext(fs, cgroup))
    return canonical


def unsupported_knobs(fs: CgroupFS) -> dict[str, str]:
    """Knobs this host cannot serve, each with why: the cgroup layout has no place for it, or the
    kernel has no such file (cpu.idle before 5.15, memory.reclaim before 5.19). Probed at start and
    on reload; loops read the rest as `snapshot.supported`."""
    out = {}
    for name, knob in KNOBS.items():
        if not knob.supported(fs):
            out[name] = f"{name} is not available on this host ({fs.layout.describe()})"
        elif knob.present(fs) is False:
            if not knob.uses_v2(fs):
                where = f"of the v1 {knob._v1_controller()} hierarchy has {knob.v1_file}"
            elif knob.controller:
                where = f"below the root with the {knob.controller} controller has it"
            else:
                where = "below the root has it"
            out[name] = f"{name} is not available on this kernel: no cgroup {where}"
    return out


def kernel_lacks(unsupported: dict[str, str], fs: CgroupFS) -> dict[str, str]:
    """Of unsupported_knobs(fs), the knobs the layout offers but this kernel lacks (worth a line of
    their own: those the layout lacks follow from the cgroup mode)."""
    return {name: why for name, why in unsupported.items() if KNOBS[name].supported(fs)}


def _cpu_knob(layout: Layout, v2_file: str, v1_file: str, since: str) -> tuple[bool, str]:
    """Look for a cpu-controller knob in whichever hierarchy serves cpu (as CgroupFS does)."""
    if "cpu" in layout.v2_controllers and layout.unified is not None:
        root, filename = layout.unified, v2_file
        subtree = (read(root / "cgroup.subtree_control") or "").split()
        if "cpu" not in subtree:
            # Without cpu in the root's subtree_control no cgroup has cpu.* files, whatever the kernel.
            return False, f"cpu not enabled in {root}/cgroup.subtree_control, so no cgroup has {v2_file}"
    elif "cpu" in layout.v1:
        root, filename = layout.v1["cpu"], v1_file
    else:
        return False, "no cpu controller in any hierarchy"
    found = find_knob(root, filename)
    if found is not None:
        return True, f"found {found}"
    return False, f"no {filename} in {root} or its children (needs Linux {since})"


def probe_cpu_burst(host: Host) -> tuple[bool, str]:
    return _cpu_knob(host.layout, "cpu.max.burst", "cpu.cfs_burst_us", "5.14+")


def probe_cpu_idle(host: Host) -> tuple[bool, str]:
    return _cpu_knob(host.layout, "cpu.idle", "cpu.idle", "5.15+")


def probe_memory_reclaim(host: Host) -> tuple[bool, str]:
    """memory.reclaim (proactive_reclaim, memory_evict's first step): cgroup v2 with the memory controller,
    Linux 5.19+; and whether the host swaps at all (proactive_reclaim's be_swap_max, memory.swap.max)."""
    swaps = read(host.proc / "swaps")
    devices = len(swaps.splitlines()) - 1 if swaps else 0
    swap = f"swap: {devices} device(s) in {host.proc / 'swaps'}" if swaps is not None else "swap: unknown"
    layout = host.layout
    if "memory" not in layout.v2_controllers or layout.unified is None:
        return False, (f"the memory controller is not on cgroup v2 here ({layout.describe()}): no memory.reclaim, "
                       f"proactive_reclaim does nothing; {swap}")
    root = layout.unified
    if "memory" not in (read(root / "cgroup.subtree_control") or "").split():
        return False, f"memory not enabled in {root}/cgroup.subtree_control, so no cgroup has memory.reclaim; {swap}"
    found = find_knob(root, "memory.reclaim")
    if found is None:
        return False, f"no memory.reclaim in {root} or its children (needs Linux 5.19+); {swap}"
    return True, f"found {found}; {swap}"


def probe_io(host: Host) -> tuple[bool, str]:
    """Block IO control (io_qos): where limits go (v2 io.max, v1 blkio.throttle.*), whether weights act
    (iocost's io.weight on v2, BFQ's weight and which disks schedule with BFQ), and iocost's root files."""
    layout = host.layout
    schedulers = {}
    try:
        for q in sorted((host.sys / "block").iterdir()):
            text = read(q / "queue/scheduler") or ""
            chosen = next((w[1:-1] for w in text.split() if w.startswith("[")), None)
            if chosen is not None and not q.name.startswith(("loop", "ram", "zram")):
                schedulers[q.name] = chosen
    except OSError:
        pass
    bfq_disks = [d for d, sch in schedulers.items() if sch == "bfq"]
    bfq = (f"BFQ schedules {', '.join(bfq_disks)}" if bfq_disks else
           "BFQ schedules no disk (weights act only where a disk's scheduler is bfq"
           + (f"; now: {', '.join(f'{d}={sch}' for d, sch in schedulers.items())})" if schedulers else ")"))
    if "io" in layout.v2_controllers and layout.unified is not None:
        root = layout.unified
        enabled = "io" in (read(root / "cgroup.subtree_control") or "").split()
        iocost = (root / "io.cost.qos").is_file()
        throttle = find_knob(root, "io.max") is not None if enabled else None
        facts = [f"cgroup v2 io controller{'' if enabled else f' (not enabled in {root}/cgroup.subtree_control)'}",
                 "io.max: " + ("yes" if throttle else "unknown until io is enabled below the root" if throttle is None
                               else "no (kernel without CONFIG_BLK_DEV_THROTTLING)"),
                 "iocost: " + (f"yes ({root}/io.cost.qos, io.cost.model; io.weight acts through it)" if iocost
                               else "no (kernel without CONFIG_BLK_CGROUP_IOCOST: io.weight acts only through BFQ's "
                                    "io.bfq.weight)"), bfq]
        return enabled and throttle is not False, "; ".join(facts)
    if "blkio" in layout.v1:
        root = layout.v1["blkio"]
        throttle = (root / "blkio.throttle.read_bps_device").is_file()
        weight = find_knob(root, "blkio.bfq.weight")
        try:
            bfq_loaded = weight is not None or any(p.name.startswith("blkio.bfq.") for p in root.iterdir())
        except OSError:
            bfq_loaded = False
        facts = [f"cgroup v1 blkio ({root})",
                 "blkio.throttle: " + ("yes" if throttle else "no (kernel without CONFIG_BLK_DEV_THROTTLING)"),
                 "blkio.bfq.weight: " + ("yes" if bfq_loaded else "no (BFQ not loaded: modprobe bfq)"),
                 bfq, "iocost: no (cgroup v2 only)"]
        return throttle, "; ".join(facts)
    return False, f"no io controller on cgroup v2 and no v1 blkio hierarchy ({layout.describe()})"


def probe_knobs(host: Host) -> tuple[bool, str]:
    """The knobs the cgroup layout offers whose files this kernel lacks (probed file by file, as the
    backend's probe() does at start and on reload)."""
    try:
        fs = CgroupFS(host.layout)
    except LayoutError as e:
        return False, str(e)
    missing = kernel_lacks(unsupported_knobs(fs), fs)
    offered = sorted(name for name, knob in KNOBS.items() if knob.supported(fs))
    if missing:
        return False, "; ".join(missing[name] for name in sorted(missing))
    return True, f"every knob the layout offers is there: {', '.join(offered)}"


class CgroupBackend(Backend):
    """Cgroup knobs (the table above) on this host's layout: a target is a cgroup path relative to
    the hierarchy root ("be.slice/job1"), the same name on v2 and on every v1 hierarchy."""
    kind = "cgroup"
    knobs = KNOBS
    features = {"cpu.max.burst": probe_cpu_burst, "cpu.idle": probe_cpu_idle, "knobs": probe_knobs, "io": probe_io,
                "memory.reclaim": probe_memory_reclaim}
    cgroup_targets = True

    def __init__(self, fs: CgroupFS):
        self.fs = fs

    def probe(self) -> dict[str, str]:
        return unsupported_knobs(self.fs)

    def read(self, target: str, knob: str) -> str:
        try:
            return KNOBS[knob].read(self.fs, target)
        except FileNotFoundError:
            raise Unsupported(f"{knob} does not exist for this cgroup: its controller is not enabled in the "
                              f"parent's cgroup.subtree_control (for a systemd slice: systemctl set-property "
                              f"<slice> CPUWeight=100 / MemoryAccounting=yes)") from None

    def validate(self, target: str, knob: str, value: str) -> str:
        return validate(self.fs, target, knob, value)

    def scope(self, knob: str, current: str, wanted: str) -> str:
        # io.max: koordd's hold is on the devices it writes; another device's limit is someone else's.
        return blkio.scope(current, wanted) if knob == "io.max" else current

    def write(self, target: str, knob: str, value: str) -> None:
        KNOBS[knob].write(self.fs, target, value)

    def parent(self, target: str) -> str | None:
        return parent_of(target) or None     # the root cgroup bounds nothing koordd writes

    def identity(self, target: str, knob: str) -> str | None:
        """The inode of the cgroup's directory in the knob's hierarchy (its cgroup id on kernfs, never
        reused while the host runs); other backends whose targets are cgroups use the walked hierarchy's."""
        k = KNOBS.get(knob)
        if k is None:
            controller = self.fs.walk_controller()
        else:
            controller = k.controller if k.uses_v2(self.fs) else k._v1_controller()
        d = self.fs.dir(controller, target)
        if d is None:
            return None
        try:
            return f"inode {os.stat(d).st_ino}"
        except FileNotFoundError:
            raise CgroupGone(target) from None
        except OSError:
            return None

    def still_koordds(self, target: str, knob: str, current: str, values: Sequence[str]) -> bool:
        if super().still_koordds(target, knob, current, values):
            return True
        if knob != "cpu.max" or KNOBS[knob].uses_v2(self.fs):
            return False
        # v1 writes cfs_period_us, then cfs_quota_us: cut between, the old quota reads with the new period.
        try:
            quota, period = parse_cpu_max(current)
            return any(quota == parse_cpu_max(a)[0] and period == parse_cpu_max(b)[1]
                       for a, b in zip(values, values[1:]))
        except InvalidValue:
            return False

    def close(self) -> None:
        self.fs.close()


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends."""
    return [CgroupBackend(fs)]


BACKENDS = BackendSet((CgroupBackend,), backends)     # koordd/core/catalogue.py BUILTIN
