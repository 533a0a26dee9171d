"""The scheduling policy of a cgroup's threads, as one knob: `sched_policy`.

A target is a cgroup path, named as for the cgroup backend; the value applies to every thread in
that cgroup and the cgroups below it. The cgroup, not each thread, is the target because threads
come and go by the thousand: one journal entry per cgroup stays small, and the threads a workload
starts later are brought in line each round (a thread inherits its creator's policy, so most new
ones already are).

Values: "normal" (SCHED_OTHER), "batch" (SCHED_BATCH), "idle" (SCHED_IDLE), "ext" (SCHED_EXT). A
thread with the idle policy is preempted at once by any non-idle thread waking on its CPU, whatever
their cgroups, and a CPU running only idle threads counts as idle when the kernel places a waking
task. That is most of what `cpu.idle = 1` on a group gives, without touching the group's
`cpu.weight`, which the kubelet writes on its cgroups (and the kernel refuses on an idle group).
A thread with the ext policy runs on the BPF scheduler loaded through sched_ext
(koordd/kernel/sched_ext.py), also where that scheduler takes only such threads (partial mode,
`switch_all` 0); while none is loaded the kernel runs it in the fair class, as a normal thread, so
setting it early is harmless. On a kernel without sched_ext "ext" is refused. Real-time and
deadline threads are never moved: someone gave them that policy on purpose.

Reading gives the policy all movable threads share, "mixed" when they differ, "none" when there are
none; "none" satisfies any value (nothing to change). Writing moves every movable thread that has
another policy; a thread that exits meanwhile is skipped. Restoring "mixed" puts the threads back to
"normal": which thread had which policy is not recorded. A nice value survives the moves.
"""
from __future__ import annotations

import errno
import os

from koordd.core.backend import Backend, BackendSet, Harm, InvalidValue, KnobSpec, TaskBackend, TargetGone, TaskWrite, \
    Unsupported
from koordd.core.cgroup_text import parent_of
from koordd.kernel.cgroupfs import CgroupFS, CgroupGone, thread_ids
from koordd.kernel.sched_ext import has_sched_ext, missing_reason

SCHED_EXT = 7       # include/uapi/linux/sched.h; Python's os module has no name for it
POLICIES = {"normal": os.SCHED_OTHER, "batch": os.SCHED_BATCH, "idle": os.SCHED_IDLE, "ext": SCHED_EXT}
NAMES = {v: k for k, v in POLICIES.items()}
MIXED, NONE = "mixed", "none"


def _normalize(value: str) -> str:
    v = value.strip().lower()
    if v not in POLICIES and v != MIXED:
        raise InvalidValue(f"sched_policy must be one of {', '.join(POLICIES)}, got {value!r}")
    return v


def cgroup_threads(fs: CgroupFS, target: str, leave_out: frozenset[str] | set[str] = frozenset()) -> list[int]:
    """Thread ids in cgroup `target` and every cgroup below it (v2 `cgroup.threads`, v1 `tasks`), except
    the subtrees of `leave_out`; TargetGone when the cgroup is not there."""
    return cgroup_members(fs, target, "cgroup.threads", "tasks", leave_out)


def cgroup_members(fs: CgroupFS, target: str, v2_file: str, v1_file: str,
                   leave_out: frozenset[str] | set[str] = frozenset()) -> list[int]:
    """The ids listed in `v2_file` (v1: `v1_file`) of cgroup `target` and every cgroup below it but the
    subtrees of `leave_out`: threads or processes. TargetGone when the cgroup is not there. CgroupFS opens
    v1 lists afresh for every read (a kept one would be a second old)."""
    controller = fs.walk_controller()
    filename = v1_file if controller is not None else v2_file
    if not fs.exists(controller, target):
        raise TargetGone(target)
    out: list[int] = []
    stack = [target]
    while stack:
        cg = stack.pop()
        try:
            out += thread_ids(fs.read(controller, cg, filename), f"{cg}/{filename}")
        except (CgroupGone, FileNotFoundError):
            continue        # removed while we walked
        except OSError as e:
            if e.errno != errno.EOPNOTSUPP:     # a threaded v2 cgroup lists no processes
                raise
        stack += [c for c in fs.children(controller, cg) if c not in leave_out]
    return out


class ThreadPolicyBackend(TaskBackend):
    kind = "threads"
    knobs = {"sched_policy": KnobSpec(
        "sched_policy", "scheduling policy of every thread in the cgroup and below it (normal, batch, idle, ext)",
        _normalize, harm=Harm("demote the threads of", lambda new, old: new in ("idle", "batch") and new != old))}

    def __init__(self, fs: CgroupFS, sched=os, sys_root: str = "/sys"):
        self.fs = fs
        self.sched = sched          # sched_getscheduler / sched_setscheduler (tests give a fake)
        self.sys_root = sys_root    # where kernel/sched_ext says whether "ext" exists

    def _hierarchy(self) -> str | None:
        return self.fs.walk_controller()

    def probe(self) -> dict[str, str]:
        if self.fs.dir(self._hierarchy(), "") is None:
            return {"sched_policy": f"no cgroup hierarchy lists threads on this host ({self.fs.layout.describe()})"}
        return {}

    def threads(self, target: str) -> list[int]:
        return cgroup_threads(self.fs, target)

    def _movable(self, target: str) -> dict[int, int]:
        """tid -> policy for the threads koordd may move (normal, batch, idle, ext)."""
        out = {}
        for tid in self.threads(target):
            try:
                policy = self.sched.sched_getscheduler(tid)
            except (ProcessLookupError, PermissionError):
                continue
            if policy in NAMES:
                out[tid] = policy
        return out

    def read(self, target: str, knob: str) -> str:
        return self.common(NAMES[p] for p in self._movable(target).values())

    def check(self, target: str, knob: str, value: str) -> str:
        if value == "ext" and not has_sched_ext(self.sys_root):
            raise Unsupported(f"sched_policy ext: {missing_reason(self.sys_root)}")
        return value

    def write(self, target: str, knob: str, value: str) -> None:
        policy = POLICIES.get(value, os.SCHED_OTHER)       # "mixed" (a restore) goes back to normal
        w = TaskWrite()
        for tid, current in self._movable(target).items():
            if current != policy:
                w.put(f"thread {tid}", self.sched.sched_setscheduler, tid, policy, os.sched_param(0))
        # root with CAP_SYS_NICE still gets EPERM from a seccomp filter: systemd's RestrictRealtime=
        # allows no policy above SCHED_IDLE.
        w.refused(f"thread(s) refused sched_policy {value}", lambda e: "; a seccomp filter such as RestrictRealtime= "
                  "refuses it" if policy == SCHED_EXT and e.errno == errno.EPERM else "")

    def parent(self, target: str) -> str | None:
        return parent_of(target) or None


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends."""
    return [ThreadPolicyBackend(fs)]


BACKENDS = BackendSet((ThreadPolicyBackend,), backends)     # koordd/core/catalogue.py BUILTIN
