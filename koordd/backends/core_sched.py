"""The core-scheduling cookie of a cgroup's threads, as one knob: `core_sched`.

A target is a cgroup path, named as for the cgroup backend; the value applies to every thread in that
cgroup and the cgroups below it (as `sched_policy`, koordd/backends/threads.py): threads started since
the last round are brought in line by the next write, which the actuator makes whenever the cgroup no
longer reads the value.

Values: a label (koordd's loops use the class name, "BE", "LS"), or "none". Every cgroup written with
one label shares ONE cookie, held by this backend for the label: the threads of all BE cgroups may
share an SMT core with each other, never with a thread of another cookie or of none (the kernel forces
the sibling idle instead). "none" clears the cookies of the cgroup's threads.

Reading gives the label whose cookie every thread has, "none" when none has a cookie, "empty" when the
cgroup has no threads (it satisfies any value: nothing to change), and "mixed" otherwise: threads
started since without one (they inherit their creator's, so most do have it), threads of another
label, or a cookie this run of koordd did not make (another program's, or the one koordd made before a
restart, which the kernel cannot tell it about).

Restore: the kernel has no command that puts a cookie back, nor one that clears it; a cookie is cleared
by sharing a cookie-less thread's "cookie" onto the thread (PR_SCHED_CORE_SHARE_TO from a thread that
has none, koordd/kernel/core_sched.py). So restoring clears: an original of "none" or "empty" comes back
exactly; an original of "mixed" (threads that had cookies of their own, another program's) comes back as
"none", those cookies are lost, and whoever made them must make them again. After a kill -9 the cookies
stay on the threads (the kernel keeps them while a thread lives); the next start reads "mixed" where
koordd's were and its restore clears them.
"""
from __future__ import annotations

import errno
import re

from koordd.core.backend import Backend, BackendSet, InvalidValue, KnobSpec, TargetGone, TaskBackend, TaskWrite, \
    Unsupported
from koordd.core.cgroup_text import parent_of
from koordd.kernel.cgroupfs import CgroupFS
from koordd.kernel.core_sched import Prctl, probe, smt
from koordd.backends.threads import cgroup_threads

NONE, MIXED, EMPTY = "none", "mixed", "empty"
UNKNOWN = -1                # a thread whose cookie the kernel would not show: never a cookie id (u64)
_LABEL = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")


def _normalize(value: str) -> str:
    v = value.strip()
    if v.lower() in (NONE, MIXED, EMPTY):
        return v.lower()
    if not _LABEL.fullmatch(v):
        raise InvalidValue(f"core_sched must be \"none\" or a label (a letter, then up to 31 letters, digits, "
                           f"_ or -), got {value!r}")
    return v


def probe_core_sched(host) -> tuple[bool, str]:
    """koordctl doctor: whether the host has SMT at all, and whether its kernel does core scheduling."""
    _, smt_detail = smt(host.sys)
    ok, detail = probe()
    return ok, f"{detail}; {smt_detail}"


class CoreSchedBackend(TaskBackend):
    kind = "core_sched"
    empty = EMPTY               # "none" is a value: no cookie
    features = {"core_sched": probe_core_sched}
    knobs = {"core_sched": KnobSpec(
        "core_sched", "core-scheduling cookie of every thread in the cgroup and below it: a label shared by every "
        "cgroup written with it, or none", _normalize)}

    def __init__(self, fs: CgroupFS, prctl=None):
        self.fs = fs
        self.prctl = prctl          # koordd.kernel.core_sched.Prctl (tests give a fake); made at first use
        self.cookies: dict[str, int] = {}           # label -> the cookie id this backend made for it
        self.carriers: dict[str, int] = {}          # label -> a thread last seen with that cookie
        self.targets: dict[str, set[str]] = {}      # label -> the cgroups written with it
        self.written: set[str] = set()              # every cgroup written with a label: its subtree is its own

    def _prctl(self):
        if self.prctl is None:
            self.prctl = Prctl()
        return self.prctl

    def probe(self) -> dict[str, str]:
        if self.fs.dir(self.fs.walk_controller(), "") is None:
            return {"core_sched": f"no cgroup hierarchy lists threads on this host ({self.fs.layout.describe()})"}
        ok, why = probe(self._prctl())
        return {} if ok else {"core_sched": why}

    def _threads(self, target: str) -> list[int]:
        """The threads of the cgroup and below it, less those of a cgroup below it that has a label of its
        own (an LS job in be.slice, written "LS"): else the two writes would undo each other every round,
        and the LS job would get BE's cookie."""
        others = {t for t in self.written if t != target and (not target or t.startswith(target + "/"))}
        return cgroup_threads(self.fs, target, others)

    def _cookies(self, target: str) -> dict[int, int]:
        """tid -> cookie id, for the threads of the cgroup and below it that are still there."""
        out = {}
        for tid in self._threads(target):
            try:
                out[tid] = self._prctl().get(tid)
            except OSError as e:
                if e.errno == errno.ESRCH:
                    continue        # gone meanwhile
                if e.errno == errno.EPERM:
                    out[tid] = UNKNOWN      # not ours to see (an LSM's ptrace rule): the write says so, naming it
                    continue
                raise
        return out

    def read(self, target: str, knob: str) -> str:
        ids = set(self._cookies(target).values())
        if not ids:
            return EMPTY
        if ids == {0}:
            return NONE
        if len(ids) == 1:
            label = next((lbl for lbl, cid in self.cookies.items() if cid in ids), None)
            if label is not None:
                return label
        return MIXED

    def reading(self, value: str) -> bool:
        return value in (MIXED, EMPTY)

    def write(self, target: str, knob: str, value: str) -> None:
        if value in (NONE, MIXED, EMPTY):
            # Cleared (a restore): its subtree is its parent's again, if the parent has a label.
            self.written.discard(target)
            threads = self._cookies(target)
            self._share(None, [t for t, cid in threads.items() if cid != 0], value)
            for targets in self.targets.values():
                targets.discard(target)
            return
        self.written.add(target)
        threads = self._cookies(target)
        self.targets.setdefault(value, set()).add(target)
        carrier = self._carrier(value, threads)
        if carrier is None:
            if not threads:
                return
            # No thread anywhere holds the label's cookie (first write, or all of them exited): a new one.
            carrier = next(iter(threads))
            self._prctl().create(carrier)
            self.cookies[value] = self._prctl().get(carrier)
            self.carriers[value] = carrier
            threads[carrier] = self.cookies[value]
        wanted = self.cookies[value]
        self._share(carrier, [t for t, cid in threads.items() if cid != wanted], value)

    def _carrier(self, label: str, threads: dict[int, int]) -> int | None:
        """A live thread with the label's cookie: the one last seen with it, one of this cgroup, or one of
        another cgroup written with the label; None when there is none."""
        wanted = self.cookies.get(label)
        if wanted is None:
            return None
        last = self.carriers.get(label)
        if last is not None:
            try:
                if self._prctl().get(last) == wanted:
                    return last
            except OSError:
                pass
        for tid, cid in threads.items():
            if cid == wanted:
                self.carriers[label] = tid
                return tid
        for other in sorted(self.targets.get(label, ())):
            try:
                found = next((t for t, cid in self._cookies(other).items() if cid == wanted), None)
            except TargetGone:
                continue
            if found is not None:
                self.carriers[label] = found
                return found
        return None

    def _share(self, carrier: int | None, tids: list[int], value: str) -> None:
        """On a thread of its own: take the carrier's cookie (None: stay without one), push it to `tids`."""
        if not tids:
            return
        prctl = self._prctl()

        def push() -> TaskWrite:
            if carrier is not None:
                prctl.share_from(carrier)
            elif prctl.get(0) != 0:
                # A thread inherits its creator's cookie: pushing this one would set a cookie, not clear one.
                raise OSError(errno.EBUSY, "koordd's own thread has a core-scheduling cookie; cannot clear")
            w = TaskWrite()
            for tid in tids:
                w.put(f"thread {tid}", prctl.share_to, tid)
            return w

        try:
            w = prctl.run_as_carrier(push)
        except OSError as e:
            if carrier is not None and e.errno == errno.ESRCH:
                # The carrier exited between finding and pulling: the next round finds or makes another.
                raise OSError(errno.EAGAIN, f"the thread holding the {value} cookie exited; retried next round") \
                    from None
            raise
        w.refused(f"thread(s) refused core_sched {value}")

    def parent(self, target: str) -> str | None:
        return parent_of(target) or None


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends."""
    return [CoreSchedBackend(fs)]


BACKENDS = BackendSet((CoreSchedBackend,), backends)     # koordd/core/catalogue.py BUILTIN
