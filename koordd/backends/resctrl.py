"""The resctrl knobs, in two backends.

Kind "resctrl", a target is a control group's name (a directory under the resctrl root):
- `resctrl.group`: "present" or "absent". koordd creates its groups with it, so its restore journal
  holds "absent" for each group it made, and only those are ever removed; removing a group hands its
  threads back to the default group (the kernel does).
- `schemata.L3`: the cache masks, as after "L3:" in `schemata` ("0=f;1=f"); checked as the kernel
  checks them (known cache ids, contiguous on Intel, within cbm_mask, at least min_cbm_bits) before
  anything is written.
- `schemata.MB`: the bandwidth limits ("0=50;1=50"), in the vendor's unit, rounded up to the
  granularity as the kernel does, so what is written reads back the same.

Kind "resctrl_tasks", a target is a cgroup (as for the cgroup backend):
- `resctrl_group`: the control group that every thread of the cgroup and below belongs to
  ("default": the root group). Reading gives the group they share, "mixed" or "none" (no threads;
  satisfies any value). Writing moves each thread that is elsewhere, one id per write; a thread
  that exits meanwhile is skipped. Threads a workload starts later are moved on the next round.

Kind "resctrl" also has `resctrl.mount` ("mounted" or "unmounted"), its target "resctrl" (the
filesystem at /sys/fs/resctrl): koordd mounts the filesystem only when a loop asks, and its journal then holds
"unmounted", so it unmounts only what it mounted.

A refused write carries `info/last_cmd_status` in its error. Without resctrl in the CPU or kernel
every knob is unsupported, with the reason; while it is not mounted, each use says so.
"""
from __future__ import annotations

import errno
import re
from pathlib import Path

from koordd.backends.threads import cgroup_threads
from koordd.core.backend import Backend, BackendSet, Harm, InvalidValue, KnobSpec, TargetGone, TaskBackend, TaskWrite, \
    Unsupported
from koordd.core.schemata import ResctrlInfo
from koordd.core.targets import RESCTRL_TARGET
from koordd.kernel.cgroupfs import CgroupFS, thread_ids
from koordd.kernel.host_probe import Host, read
from koordd.kernel.resctrl import DEFAULT_MOUNT, ResctrlError, ResctrlFS, cpu_vendor, parse_schemata, read_info, refused

DEFAULT_GROUP = "default"           # the root group, as a value of resctrl_group
MOUNT_TARGET = RESCTRL_TARGET       # the target of resctrl.mount: the filesystem at the backend's mount point
MIXED, NONE = "mixed", "none"
RESERVED = {"info", "mon_groups", "mon_data", DEFAULT_GROUP}
GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def check_group_name(name: str) -> str:
    if not GROUP_NAME.fullmatch(name) or name in RESERVED:
        raise InvalidValue(f"{name!r} is not a resctrl group koordd may use (a plain name, not "
                           f"{', '.join(sorted(RESERVED))})")
    return name


def _group_value(value: str) -> str:
    v = value.strip()
    if v not in ("present", "absent"):
        raise InvalidValue(f"resctrl.group must be present or absent, got {value!r}")
    return v


def _mount_value(value: str) -> str:
    v = value.strip()
    if v not in ("mounted", "unmounted"):
        raise InvalidValue(f"resctrl.mount must be mounted or unmounted, got {value!r}")
    return v


def _line(value: str) -> dict[int, str]:
    try:
        return parse_schemata("X:" + value.strip())["X"]
    except ResctrlError as e:
        raise InvalidValue(str(e).replace("schemata line 1: ", "")) from None


def _canonical_l3(value: str) -> str:
    line = _line(value)
    try:
        doms = {d: int(v, 16) for d, v in line.items()}
    except ValueError:
        raise InvalidValue(f"schemata.L3 masks are hex, got {value!r}") from None
    return ";".join(f"{d}={m:x}" for d, m in sorted(doms.items()))


def _canonical_mb(value: str) -> str:
    doms = _line(value)
    if not all(v.isdigit() for v in doms.values()):
        raise InvalidValue(f"schemata.MB values are whole numbers, got {value!r}")
    return ";".join(f"{d}={int(v)}" for d, v in sorted(doms.items()))


def cpu_support(proc_root: Path) -> str | None:
    """Why this host cannot have resctrl at all (CPU flags, kernel), or None when it can."""
    try:
        cpuinfo = (proc_root / "cpuinfo").read_text()
        filesystems = (proc_root / "filesystems").read_text()
    except OSError as e:
        return f"cannot read {e.filename}: {e.strerror}"
    flags = set(next((ln.partition(":")[2].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), []))
    if not flags & {"cat_l3", "mba"}:
        return "the CPU has no cache or memory bandwidth allocation (no cat_l3 or mba flag)"
    if "resctrl" not in filesystems.split():
        return "the kernel has no resctrl filesystem (CONFIG_X86_CPU_RESCTRL off)"
    return None


def not_mounted(fs: ResctrlFS) -> Unsupported:
    return Unsupported(f"resctrl is not mounted at {fs.root} (llc_partition's mount option, or "
                       f"mount -t resctrl resctrl {fs.root})")


def probe_resctrl(host: Host) -> tuple[bool, str]:
    supported = "resctrl" in (read(host.proc / "filesystems") or "").split()
    mount = host.sys / "fs/resctrl"
    if (mount / "info").is_dir():
        return True, f"mounted at {mount}"
    if supported:
        return False, f"kernel supports resctrl but it is not mounted (mount -t resctrl resctrl {mount})"
    return False, f"resctrl not in {host.proc}/filesystems (no RDT/CAT hardware or CONFIG_X86_CPU_RESCTRL off)"


class ResctrlGroupBackend(Backend):
    kind = "resctrl"
    features = {"resctrl": probe_resctrl}
    knobs = {
        "resctrl.group": KnobSpec("resctrl.group", "a resctrl control group: present or absent", _group_value),
        "schemata.L3": KnobSpec("schemata.L3", "L3 cache masks per cache id (\"0=f;1=f\")", _canonical_l3),
        "schemata.MB": KnobSpec("schemata.MB", "memory bandwidth limit per domain (\"0=50;1=50\")", _canonical_mb),
        "resctrl.mount": KnobSpec("resctrl.mount", "the resctrl filesystem at its mount point: mounted or unmounted",
                                  _mount_value),
    }

    def __init__(self, fs: ResctrlFS | None = None, proc_root: Path | str = "/proc"):
        self.fs = fs if fs is not None else ResctrlFS(DEFAULT_MOUNT)
        self.proc = Path(proc_root)
        self.info: ResctrlInfo | None = None

    def probe(self) -> dict[str, str]:
        self.info = None
        why = cpu_support(self.proc)
        if why:
            return {k: why for k in self.knobs}
        try:
            info = self._info()
        except Unsupported:
            return {}                   # not mounted (yet): said when a knob is used
        except (OSError, ResctrlError) as e:
            return {k: f"cannot read resctrl's info: {e}" for k in self.knobs if k != "resctrl.mount"}
        return {**({"schemata.L3": "the CPU has no L3 cache allocation"} if info.l3 is None else {}),
                **({"schemata.MB": "the CPU has no memory bandwidth allocation"} if info.mb is None else {})}

    def _info(self) -> ResctrlInfo:
        """info/, read once the tree is mounted."""
        if self.info is None:
            if not self.fs.mounted():
                raise not_mounted(self.fs)
            self.info = read_info(self.fs, cpu_vendor((self.proc / "cpuinfo").read_text()))
        return self.info

    def read(self, target: str, knob: str) -> str:
        if knob == "resctrl.mount":
            return "mounted" if self.fs.mounted() else "unmounted"
        check_group_name(target)
        if not self.fs.mounted():
            raise not_mounted(self.fs)
        exists = self.fs.exists(target)
        if knob == "resctrl.group":
            return "present" if exists else "absent"
        if not exists:
            raise TargetGone(target)
        line = parse_schemata(self.fs.read(f"{target}/schemata")).get(knob.split(".")[1])
        if line is None:
            raise Unsupported(f"{target}/schemata has no {knob.split('.')[1]} line")
        return self.knobs[knob].normalize(";".join(f"{d}={v}" for d, v in sorted(line.items())))

    def validate(self, target: str, knob: str, value: str) -> str:
        v = self.knobs[knob].normalize(value)
        if knob == "resctrl.mount":
            if target != MOUNT_TARGET:
                raise InvalidValue(f"the target of resctrl.mount is {MOUNT_TARGET!r}, not {target!r}")
            return v
        check_group_name(target)
        if knob == "schemata.L3":
            self._check_l3(v)
        elif knob == "schemata.MB":
            v = self._round_mb(v)
        return v

    def _check_l3(self, value: str) -> None:
        l3 = self._info().l3
        if l3 is None:
            raise Unsupported("the CPU has no L3 cache allocation")
        for dom, text in _line(value).items():
            mask = int(text, 16)
            if dom not in l3.cache_ids:
                raise InvalidValue(f"no cache id {dom} (this host has {', '.join(map(str, l3.cache_ids))})")
            if mask == 0 or mask & ~l3.cbm_mask:
                raise InvalidValue(f"mask {mask:x} is not within cbm_mask {l3.cbm_mask:x}")
            run = mask >> ((mask & -mask).bit_length() - 1)
            if run & (run + 1) and self._info().vendor != "amd":
                raise InvalidValue(f"mask {mask:x} has non-consecutive 1-bits")
            if bin(mask).count("1") < l3.min_cbm_bits:
                raise InvalidValue(f"mask {mask:x} has fewer than min_cbm_bits ({l3.min_cbm_bits}) bits")

    def _round_mb(self, value: str) -> str:
        mb = self._info().mb
        if mb is None:
            raise Unsupported("the CPU has no memory bandwidth allocation")
        out = {}
        for dom, text in _line(value).items():
            bw = int(text)
            if dom not in mb.domain_ids:
                raise InvalidValue(f"no memory domain {dom} (this host has {', '.join(map(str, mb.domain_ids))})")
            if not mb.min_bandwidth <= bw <= mb.max_value:
                raise InvalidValue(f"{bw} is outside [{mb.min_bandwidth}, {mb.max_value}]")
            gran = max(mb.bandwidth_gran, 1)
            out[dom] = -(-bw // gran) * gran if mb.vendor != "amd" else bw
        return ";".join(f"{d}={v}" for d, v in sorted(out.items()))

    def write(self, target: str, knob: str, value: str) -> None:
        if knob == "resctrl.mount":
            (self.fs.mount if value == "mounted" else self.fs.umount)()
            self.info = None
            return
        check_group_name(target)
        if not self.fs.mounted():
            raise not_mounted(self.fs)
        try:
            if knob == "resctrl.group":
                if value == "present":
                    self.fs.mkdir(target)
                elif self.fs.exists(target):
                    self.fs.rmdir(target)
                return
            if not self.fs.exists(target):
                raise TargetGone(target)
            self.fs.write(f"{target}/schemata", f"{knob.split('.')[1]}:{value}\n")
        except FileExistsError:
            return                  # made meanwhile: present is what was asked
        except FileNotFoundError:
            raise TargetGone(target) from None
        except OSError as e:
            raise refused(self.fs, e) from None


class ResctrlTasksBackend(TaskBackend):
    kind = "resctrl_tasks"
    knobs = {"resctrl_group": KnobSpec(
        "resctrl_group", "the resctrl group of every thread in the cgroup and below it (\"default\": the root group)",
        lambda v: v.strip(),
        # llc_partition's BE group (plugins/llc_partition.py group_of): a few cache ways, a share of the
        # memory bandwidth, for every thread of the cgroup and below it.
        harm=Harm("confine the cache of", lambda new, old: new == "koordd-BE" and new != old))}

    def __init__(self, cgroups: CgroupFS, fs: ResctrlFS | None = None, proc_root: Path | str = "/proc"):
        self.cgroups = cgroups
        self.fs = fs if fs is not None else ResctrlFS(DEFAULT_MOUNT)
        self.proc = Path(proc_root)

    def probe(self) -> dict[str, str]:
        why = cpu_support(self.proc)
        return {"resctrl_group": why} if why else {}

    def _groups(self) -> list[str]:
        if not self.fs.mounted():
            raise not_mounted(self.fs)
        return [n for n in self.fs.listdir() if n not in RESERVED and self.fs.exists(f"{n}/tasks")]

    def _where(self) -> dict[int, str]:
        """tid -> its group, for every thread in a group other than the default."""
        out = {}
        for g in self._groups():
            try:
                out.update({t: g for t in thread_ids(self.fs.read(f"{g}/tasks"), f"{g}/tasks")})
            except FileNotFoundError:
                continue            # removed meanwhile
        return out

    def read(self, target: str, knob: str) -> str:
        where = self._where()
        return self.common(where.get(t, DEFAULT_GROUP) for t in cgroup_threads(self.cgroups, target))

    def check(self, target: str, knob: str, value: str) -> str:
        if value != DEFAULT_GROUP:
            check_group_name(value)
            if not self.fs.exists(value):
                raise InvalidValue(f"resctrl group {value} does not exist")
        return value

    def write(self, target: str, knob: str, value: str) -> None:
        group = DEFAULT_GROUP if value == MIXED else value      # restoring "mixed": back to the default
        tasks = "tasks" if group == DEFAULT_GROUP else f"{group}/tasks"
        where = self._where()
        w = TaskWrite()
        for tid in cgroup_threads(self.cgroups, target):
            if where.get(tid, DEFAULT_GROUP) != group:
                w.put(f"thread {tid}", self._move, tid, tasks, group)
        w.refused(f"thread(s) refused resctrl group {group}")

    def _move(self, tid: int, tasks: str, group: str) -> None:
        """One thread into the group whose `tasks` file that is; TargetGone when the group is not there."""
        try:
            self.fs.write(tasks, f"{tid}\n")
        except OSError as e:
            if e.errno == errno.ESRCH:
                raise               # exited meanwhile
            if e.errno == errno.ENOENT:
                raise TargetGone(group) from None
            raise refused(self.fs, e) from None


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends: resctrl's groups,
    and which group a cgroup's threads are in."""
    return [ResctrlGroupBackend(), ResctrlTasksBackend(fs)]


BACKENDS = BackendSet((ResctrlGroupBackend, ResctrlTasksBackend), backends)     # koordd/core/catalogue.py BUILTIN
