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

A process that leaves the cgroup takes koordd's value with it; the value's reason (its place in BE) is
gone. So the backend follows the processes it saw in a cgroup koordd holds, reading a value koordd wrote
there (the actuator says what it holds before each read: holding()). A reading ends with
" left <pid>@<start>=<value>,..." while such a process is outside the cgroup with koordd's value still
on it. Such a reading is never the value koordd wants, so the next write puts each of them back to its
value before koordd (its own in the original, else the original's common one), once. A stop's restore
does the same, even when the cgroup itself has no process left ("none left ..."). A process in
another cgroup koordd set (LS's score) is that cgroup's. One whose value someone else changed is left
alone. A refusal (EACCES: no CAP_SYS_RESOURCE and a minimum raised since) is named in the write's error,
and that process is not tried again.

-1000 makes a process immune to the OOM killer; koordd writes it only when a config asks for it.
The kubelet gives the processes of its containers values of its own (koordd/core/kubelet.py): on its
cgroups this knob is the kubelet's, and koordd leaves it alone unless `kubelet_override` names it.

The host feature `memory.oom.group` (a cgroup knob: koordd/backends/cgroup_knobs.py) is probed here too,
for `koordctl doctor`: the OOM policy of a whole cgroup lives next to that of its processes.
"""
from __future__ import annotations

import errno
import logging
from collections import Counter
from pathlib import Path
from typing import Sequence

from koordd.core.backend import Backend, BackendSet, Harm, InvalidValue, KnobSpec, TargetGone, TaskBackend, TaskWrite
from koordd.core.cgroup_text import parent_of
from koordd.kernel.cgroupfs import CgroupFS, LayoutError
from koordd.kernel.host_probe import Host, find_knob, read
from koordd.backends.threads import cgroup_members

log = logging.getLogger("koordd.backend")

OOM_MIN, OOM_MAX = -1000, 1000
MIXED, NONE, LEFT = "mixed", "none", "left"
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


def _split(text: str) -> tuple[str, str]:
    """(the cgroup's own reading, the list of processes that left it after " left ", or "")."""
    head, sep, tail = text.strip().partition(f" {LEFT} ")
    return head, tail if sep else ""


def _procs(text: str) -> dict[Proc, int]:
    """{process: value} of "<pid>@<start>=<value>,..."."""
    out = {}
    for item in text.split(",") if text else ():
        proc, sep, value = item.partition("=")
        pid, at, start = proc.partition("@")
        if not (sep and at and pid.isascii() and pid.isdigit() and start.isascii() and start.isdigit()):
            raise InvalidValue(f"oom_score_adj: {item[:40]!r} is not <pid>@<start>=<value>")
        out[(int(pid), int(start))] = _int(value)
    return out


def _list(procs: dict[Proc, int]) -> str:
    return ",".join(f"{pid}@{start}={v}" for (pid, start), v in sorted(procs.items()))


def parse(text: str) -> tuple[int | None, dict[Proc, int]]:
    """(common value, {process: its own value}) of a reading of the cgroup's processes; (None, {}) for
    "none". The processes that left it (" left ...", parse_left) are not the cgroup's. InvalidValue if it
    is none of the forms this backend reads."""
    t = _split(text)[0]
    parse_left(text)                     # checked, not returned
    if t == NONE:
        return None, {}
    if not t.startswith(MIXED):
        return _int(t), {}
    parts = t.split()
    if len(parts) not in (2, 3) or parts[0] != MIXED:
        raise InvalidValue(f"oom_score_adj: {text[:80]!r} is not \"mixed <value> <pid>@<start>=<value>,...\"")
    return _int(parts[1]), _procs(parts[2] if len(parts) == 3 else "")


def parse_left(text: str) -> dict[Proc, int]:
    """The processes a reading names as having left the cgroup with koordd's value still on them."""
    left = _split(text)[1]
    if left and len(left.split()) != 1:
        raise InvalidValue(f"oom_score_adj: {left[:80]!r} is not <pid>@<start>=<value>,...")
    return _procs(left)


def format_reading(values: dict[Proc, int], left: dict[Proc, int] | None = None) -> str:
    """The canonical reading of {process: value} (see the module's doc), and of those that left."""
    tail = f" {LEFT} {_list(left)}" if left else ""
    if not values:
        return NONE + tail
    counts = Counter(values.values())
    if len(counts) == 1:
        return str(next(iter(counts))) + tail
    # The most common value; a tie goes to the lowest, the one that protects most on a restore.
    common = min(counts, key=lambda v: (-counts[v], v))
    return f"{MIXED} {common} {_list({p: v for p, v in values.items() if v != common})}" + tail


def _normalize(text: str) -> str:
    common, own = parse(text)
    left = parse_left(text)
    tail = f" {LEFT} {_list(left)}" if left else ""
    if common is None:
        return NONE + tail
    own = {proc: v for proc, v in own.items() if v != common}
    if not own:
        return str(common) + tail
    return f"{MIXED} {common} {_list(own)}" + tail


def raised(new: str, original: str) -> bool:
    """Whether `new` puts any process above the lowest value it had in `original` (the kernel's OOM killer
    would take it sooner); either may be a "mixed ..." reading. One that cannot be compared counts as raised."""
    try:
        new_common, new_own = parse(new)
        old_common, old_own = parse(original)
    except ValueError:
        return True                 # a value we cannot compare is not one we may write on protected work
    if new_common is None or old_common is None:
        return False                # no processes: nothing is made likelier to die
    return max([new_common, *new_own.values()]) > min([old_common, *old_own.values()])


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


class OomScoreBackend(TaskBackend):
    kind = "oom_score"
    knobs = {"oom_score_adj": KnobSpec(
        "oom_score_adj", f"/proc/PID/oom_score_adj of every process in the cgroup and below it ({OOM_MIN}..{OOM_MAX}; "
                         f"higher = killed first by the kernel's OOM killer)", _normalize,
        harm=Harm("raise the OOM score of", raised))}     # oom_shaping: BE's processes first in the OOM killer's line
    features = {"memory.oom.group": probe_oom_group}

    def __init__(self, fs: CgroupFS, proc: Path | str = "/proc"):
        self.fs = fs
        self.proc = Path(proc)
        # target -> (the original, the values koordd wrote there), as the actuator gave them to
        # still_koordds() just before it restores: write() of that original leaves processes reading
        # anything else alone (someone else's values). Backend.write() gets only the value to write.
        self._koordds: dict[str, tuple[str, frozenset[int]]] = {}
        # What koordd holds on a target, as holding() was told (or write() made it): (the original's common
        # value, each process's own original, the values koordd wrote); and the processes seen in it reading
        # one of those. One of them found outside the target later, still with koordd's value, left it: its
        # own value goes back (write()). Kept in memory: one that left while no koordd ran keeps its score.
        self._holds: dict[str, tuple[int | None, dict[Proc, int], frozenset[int]]] = {}
        self._seen: dict[str, set[Proc]] = {}
        self._where: dict[Proc, str] = {}       # process -> the target it was last seen in: the one it left
        self._originals: dict[str, str] = {}    # target -> the original of koordd's hold: a write of it restores

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

    def _score(self, proc: Proc) -> int | None:
        """The value of that very process now; None if it is gone (or its pid is another's)."""
        try:
            start, kthread = self._stat(proc[0])
            if start != proc[1] or kthread:
                return None
            return int((self.proc / str(proc[0]) / "oom_score_adj").read_text())
        except (FileNotFoundError, ProcessLookupError, ValueError):
            return None

    def _forget(self, target: str) -> None:
        self._holds.pop(target, None)
        for proc in self._seen.pop(target, ()):
            if self._where.get(proc) == target:
                del self._where[proc]

    def _saw(self, target: str, procs) -> None:
        seen = self._seen.setdefault(target, set())
        for proc in procs:
            seen.add(proc)
            self._where[proc] = target

    def holding(self, target: str, knob: str, hold) -> None:
        if hold is None:
            self._forget(target)
            self._originals.pop(target, None)
            return
        original, written = hold
        try:
            self._originals[target] = _normalize(original)
        except InvalidValue:
            self._originals.pop(target, None)
        try:
            common, own = parse(original)
            values: set[int] = set()
            for w in written:
                c, o = parse(w)
                values |= {c, *o.values()} - {None}
        except InvalidValue:
            values = set()
        if not values:
            self._forget(target)        # koordd's values not known (a journal before version 4): nothing to follow
            return
        self._holds[target] = (common, own, frozenset(values))

    def _left(self, target: str, values: dict[Proc, int]) -> dict[Proc, int]:
        """The processes seen in `target` with a value koordd wrote there that are outside it now, still
        reading such a value (and in no other target koordd set them in): {process: its value}."""
        hold = self._holds.get(target)
        if hold is None:
            return {}
        written = hold[2]
        self._saw(target, (proc for proc, v in values.items() if v in written))
        seen = self._seen[target]
        out: dict[Proc, int] = {}
        for proc in sorted(seen - values.keys()):
            v = self._score(proc)
            if v is not None and v in written and self._where.get(proc) == target:
                out[proc] = v
                continue
            # Gone, someone else's value now, or seen since in another target koordd set (that one's now).
            self._drop(target, proc)
        return out

    def _drop(self, target: str, proc: Proc) -> None:
        self._seen[target].discard(proc)
        if self._where.get(proc) == target:
            del self._where[proc]

    def read(self, target: str, knob: str) -> str:
        values = self._values(target)
        return format_reading(values, self._left(target, values))

    def reading(self, value: str) -> bool:
        # "mixed <common> <pid>@<start>=<value>,...", or one that names processes that left (" left ...").
        return value.startswith(MIXED) or bool(_split(value)[1])

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
            left = parse_left(current)
        except InvalidValue:
            return False
        # Processes started since, a write cut short, or some processes changed by someone else read
        # "mixed": still koordd's to put back while any process reads a value koordd wrote (write()
        # then restores those and leaves the others). Those that left the cgroup read koordd's value.
        return bool({common, *own.values(), *left.values()} & written) or \
            super().still_koordds(target, knob, current, values)

    def write(self, target: str, knob: str, value: str) -> None:
        """Every process of the cgroup (and below) to `value`; and every process that left it with
        koordd's value on it back to the value it had before koordd (its own original, else the common
        one), once: one the kernel refuses (EACCES) is named in the error and not tried again."""
        common, own = parse(value)
        stash = self._koordds.pop(target, None)
        # A restore of the original koordd was told of: only processes reading a value koordd wrote go back.
        told = stash is not None and stash[0] == _normalize(value)
        restoring = told or _normalize(value) == self._originals.get(target)
        ours = stash[1] if told else None
        values = self._values(target)
        w = TaskWrite(gone=(FileNotFoundError, ProcessLookupError))     # exited meanwhile
        for proc, current in values.items() if common is not None else ():
            wanted = own.get(proc, common)
            if current == wanted:
                continue
            if ours is not None and current not in ours:
                continue                            # changed behind koordd's back: that value stands
            w.put(f"pid {proc[0]}: {wanted}", self._put, proc, wanted)
        hold = self._holds.get(target)
        if hold is not None:
            before_common, before_own, _ = hold
            for proc, current in self._left(target, values).items():
                self._drop(target, proc)            # tried once: put back, or refused and said so
                wanted = before_own.get(proc, before_common)
                if wanted is not None and wanted != current:
                    w.put(f"pid {proc[0]} (it left {target}: back to its value before koordd): {wanted}",
                          self._put, proc, wanted)
        if restoring:
            self._forget(target)
        elif common is not None:
            # koordd's value is on the target now: follow its processes from here (the first write of a
            # hold: what they read before it is the journal's original; holding() says it from then on).
            if hold is None:
                before = format_reading(values)
                self._holds[target] = (*parse(before), frozenset({common}))
            else:
                self._holds[target] = (hold[0], hold[1], hold[2] | {common})
            self._saw(target, values)               # _left() drops those not reading koordd's
        # The kernel refuses a value below the process's oom_score_adj_min (its lowest so far, 0 for
        # most) without CAP_SYS_RESOURCE: a container or unit that dropped it can only raise scores.
        w.refused("process(es) refused oom_score_adj", lambda e: "; lowering it needs CAP_SYS_RESOURCE, which "
                  "koordd lacks" if e.errno == errno.EACCES else "")

    def _put(self, proc: Proc, value: int) -> bool:
        """Write `value` to that very process: False (nothing written) if its pid is another process's now."""
        if self._start(proc[0]) != proc[1]:
            return False                            # the pid is another process's now
        with open(self.proc / str(proc[0]) / "oom_score_adj", "w") as f:
            f.write(str(value))
        return True

    def parent(self, target: str) -> str | None:
        return parent_of(target) or None


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends."""
    return [OomScoreBackend(fs)]


BACKENDS = BackendSet((OomScoreBackend,), backends)     # koordd/core/catalogue.py BUILTIN
