"""The OOM killer's preference for a cgroup's processes, as one knob: `oom_score_adj`.

A target is a cgroup path, named as for the cgroup backend; the value (-1000..1000, the kernel's
/proc/PID/oom_score_adj) applies to every process in that cgroup and the cgroups below it. As with
`sched_policy` (koordd/backends/threads.py) the cgroup, not each process, is the target: one journal
entry per cgroup, and the processes a workload starts later are brought in line each round (a child
inherits its parent's value at fork, so most new ones already are). The kernel keeps one value per
process (all its threads share it) and copies a write to every process sharing its memory (vfork).

Reading gives the value all processes share, "none" when there are none (which satisfies any value),
or, when they differ, "mixed <common> <pid>@<start>=<value>,...": the most common value, then each
process that has another one, named by pid and start time (/proc/PID/stat field 22) so a pid reused
by a new process is not mistaken for the old one. That reading is what the journal keeps as the
original: a restore gives every process its own value back, processes started since get the common
value, and a process whose value is neither its original nor one koordd wrote was changed behind
koordd's back and is left as it is. Lowering a value needs CAP_SYS_RESOURCE (koordd runs as root).

-1000 makes a process immune to the OOM killer; koordd writes it only when a config asks for it.
The kubelet gives the processes of its containers values of its own (koordd/core/kubelet.py): on its
cgroups this knob is the kubelet's, and koordd leaves it alone unless `kubelet_override` names it.

The host feature `memory.oom.group` (a cgroup knob: koordd/backends/cgroup.py) is probed here too,
for `koordctl doctor`: the OOM policy of a whole cgroup lives next to that of its processes.
"""
from __future__ import annotations

import errno
import logging
from collections import Counter
from pathlib import Path
from typing import Sequence

from koordd.core.backend import Backend, BackendSet, InvalidValue, KnobSpec, PartialWrite, TargetGone
from koordd.core.cgroup import parent_of
from koordd.kernel.cgroupfs import CgroupFS, LayoutError
from koordd.kernel.host import Host, find_knob, read
from koordd.backends.threads import cgroup_members

log = logging.getLogger("koordd.backend")

OOM_MIN, OOM_MAX = -1000, 1000
MIXED, NONE = "mixed", "none"
Proc = tuple[int, int]      # (pid, start time in clock ticks since boot)
PF_KTHREAD = 0x00200000     # include/linux/sched.h: /proc/PID/stat's flags of a kernel thread


def _int(text: str, what: str = "oom_score_adj") -> int:
    t = text.strip()
    body = t[1:] if t[:1] in "+-" else t
    if not (body.isascii() and body.isdigit()):
        raise InvalidValue(f"{what} must be an integer {OOM_MIN}..{OOM_MAX}, got {text!r}")
    v = int(t)
    if not OOM_MIN <= v <= OOM_MAX:
        raise InvalidValue(f"{what} must be {OOM_MIN}..{OOM_MAX} (the kernel's range), got {v}")
    return v


def parse(text: str) -> tuple[int | None, dict[Proc, int]]:
    """(common value, {process: its own value}) of a reading; (None, {}) for "none". InvalidValue if
    it is none of the forms this backend reads."""
    t = text.strip()
    if t == NONE:
        return None, {}
    if not t.startswith(MIXED):
        return _int(t), {}
    parts = t.split()
    if len(parts) not in (2, 3) or parts[0] != MIXED:
        raise InvalidValue(f"oom_score_adj: {text[:80]!r} is not \"mixed <value> <pid>@<start>=<value>,...\"")
    common, own = _int(parts[1]), {}
    for item in (parts[2].split(",") if len(parts) == 3 else ()):
        proc, sep, value = item.partition("=")
        pid, at, start = proc.partition("@")
        if not (sep and at and pid.isascii() and pid.isdigit() and start.isascii() and start.isdigit()):
            raise InvalidValue(f"oom_score_adj: {item[:40]!r} is not <pid>@<start>=<value>")
        own[(int(pid), int(start))] = _int(value)
    return common, own


def format_reading(values: dict[Proc, int]) -> str:
    """The canonical reading of {process: value} (see the module's doc)."""
    if not values:
        return NONE
    counts = Counter(values.values())
    if len(counts) == 1:
        return str(next(iter(counts)))
    # The most common value; a tie goes to the lowest, the one that protects most on a restore.
    common = min(counts, key=lambda v: (-counts[v], v))
    own = ",".join(f"{pid}@{start}={v}" for (pid, start), v in sorted(values.items()) if v != common)
    return f"{MIXED} {common} {own}"


def _normalize(text: str) -> str:
    common, own = parse(text)
    if common is None:
        return NONE
    own = {proc: v for proc, v in own.items() if v != common}
    if not own:
        return str(common)
    return f"{MIXED} {common} " + ",".join(f"{pid}@{start}={v}" for (pid, start), v in sorted(own.items()))


def probe_oom_group(host: Host) -> tuple[bool, str]:
    """memory.oom.group: cgroup v2's memory controller (4.19+); on v1 (and hybrid hosts, whose memory
    controller is v1) the kernel's OOM killer takes one process at a time, whatever koordd asks."""
    try:
        layout = host.layout
    except (LayoutError, OSError) as e:
        return False, str(e)
    if "memory" not in layout.v2_controllers or layout.unified is None:
        return False, (f"the memory controller is not on cgroup v2 ({layout.describe()}): no memory.oom.group, "
                       f"oom_shaping's be_oom_group does nothing here (the OOM killer takes one process at a time)")
    subtree = (read(layout.unified / "cgroup.subtree_control") or "").split()
    if "memory" not in subtree:
        return False, f"memory not enabled in {layout.unified}/cgroup.subtree_control, so no cgroup has memory.oom.group"
    found = find_knob(layout.unified, "memory.oom.group")
    if found is None:
        return False, f"no memory.oom.group in {layout.unified} or its children (needs Linux 4.19+ and memory enabled)"
    return True, f"found {found}"


class OomScoreBackend(Backend):
    kind = "oom_score"
    cgroup_targets = True
    knobs = {"oom_score_adj": KnobSpec(
        "oom_score_adj", f"/proc/PID/oom_score_adj of every process in the cgroup and below it ({OOM_MIN}..{OOM_MAX}; "
                         f"higher = killed first by the kernel's OOM killer)", _normalize)}
    features = {"memory.oom.group": probe_oom_group}

    def __init__(self, fs: CgroupFS, proc: Path | str = "/proc"):
        self.fs = fs
        self.proc = Path(proc)
        # target -> (the original, the values koordd wrote there), as the actuator gave them to
        # still_koordds() just before it restores: write() of that original leaves processes reading
        # anything else alone (someone else's values). Backend.write() gets only the value to write.
        self._koordds: dict[str, tuple[str, frozenset[int]]] = {}

    def probe(self) -> dict[str, str]:
        if self.fs.dir(self.fs.walk_controller(), "") is None:
            return {"oom_score_adj": f"no cgroup hierarchy lists processes on this host ({self.fs.layout.describe()})"}
        if not (self.proc / "self" / "oom_score_adj").exists():
            return {"oom_score_adj": f"no {self.proc}/self/oom_score_adj"}
        return {}

    def pids(self, target: str) -> list[int]:
        """Process ids in cgroup `target` and every cgroup below it; TargetGone when it is not there."""
        return sorted(set(cgroup_members(self.fs, target, "cgroup.procs", "cgroup.procs")))

    def _stat(self, pid: int) -> tuple[int, bool]:
        """(start time, whether it is a kernel thread) from /proc/PID/stat."""
        stat = (self.proc / str(pid) / "stat").read_text()
        # After the command name, which may hold spaces and parentheses: field 9 (flags) is the 7th
        # after ")", field 22 (starttime) the 20th.
        fields = stat.rpartition(")")[2].split()
        return int(fields[19]), bool(int(fields[6]) & PF_KTHREAD)

    def _start(self, pid: int) -> int:
        return self._stat(pid)[0]

    def _values(self, target: str) -> dict[Proc, int]:
        out = {}
        for pid in self.pids(target):
            try:
                start, kthread = self._stat(pid)
                if kthread:
                    continue        # no memory of its own: the OOM killer never picks it
                out[(pid, start)] = int((self.proc / str(pid) / "oom_score_adj").read_text())
            except (FileNotFoundError, ProcessLookupError):
                continue            # exited meanwhile
        return out

    def read(self, target: str, knob: str) -> str:
        return format_reading(self._values(target))

    def same(self, current: str, wanted: str) -> bool:
        return current == wanted or current == NONE

    def validate(self, target: str, knob: str, value: str) -> str:
        v = _normalize(value)
        if v.startswith(MIXED):
            raise InvalidValue("oom_score_adj \"mixed ...\" is what a cgroup reads, not a value to set")
        return v

    def validate_original(self, target: str, knob: str, value: str) -> str:
        return _normalize(value)

    def still_koordds(self, target: str, knob: str, current: str, values: Sequence[str]) -> bool:
        written = set()
        for v in values[1:]:
            try:
                common, own = parse(v)
            except InvalidValue:
                continue
            written |= {common, *own.values()} - {None}
        try:
            self._koordds[target] = (_normalize(values[0]), frozenset(written))
        except InvalidValue:
            self._koordds.pop(target, None)
        try:
            common, own = parse(current)
        except InvalidValue:
            return False
        # Processes started since, a write cut short, or some processes changed by someone else read
        # "mixed": still koordd's to put back while any process reads a value koordd wrote (write()
        # then restores those and leaves the others).
        return bool({common, *own.values()} & written) or super().still_koordds(target, knob, current, values)

    def write(self, target: str, knob: str, value: str) -> None:
        common, own = parse(value)
        if common is None:
            return                                   # an original of no processes: nothing to put back
        stash = self._koordds.pop(target, None)
        # A restore of the original koordd was told of: only processes reading a value koordd wrote go back.
        ours = stash[1] if stash is not None and stash[0] == _normalize(value) else None
        errors, done = [], 0
        for proc, current in self._values(target).items():
            wanted = own.get(proc, common)
            if current == wanted:
                continue
            if ours is not None and current not in ours:
                continue                            # changed behind koordd's back: that value stands
            try:
                fd_path = self.proc / str(proc[0]) / "oom_score_adj"
                if self._start(proc[0]) != proc[1]:
                    continue                        # the pid is another process's now
                with open(fd_path, "w") as f:
                    f.write(str(wanted))
                done += 1
            except (FileNotFoundError, ProcessLookupError):
                continue                            # exited meanwhile
            except OSError as e:
                errors.append((proc[0], e))
        if errors:
            pid, e = errors[0]
            # The kernel refuses a value below the process's oom_score_adj_min (its lowest so far, 0 for
            # most) without CAP_SYS_RESOURCE: a container or unit that dropped it can only raise scores.
            hint = "; lowering it needs CAP_SYS_RESOURCE, which koordd lacks" if e.errno == errno.EACCES else ""
            raise (PartialWrite if done else OSError)(
                e.errno, f"{len(errors)} process(es) refused oom_score_adj {common} (first: pid {pid}: {e.strerror}"
                         f"{hint})")

    def parent(self, target: str) -> str | None:
        return parent_of(target) or None


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends."""
    return [OomScoreBackend(fs)]


BACKENDS = BackendSet((OomScoreBackend,), backends)     # koordd/core/registry.py BUILTIN
