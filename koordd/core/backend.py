"""Targets and the backends that serve them.

An action names a target and a knob. The knob says which backend serves it
(knob names are unique across backends), the backend says what the target is:
a cgroup path for the cgroup backend; a resctrl group, a tc class on a device,
a node-wide sysfs object or a task id for backends of later loops. Each backend
reads, validates (the kernel's rules), writes, and may hold resources from
open() to close(); the actuator runs the same pipeline for all of them
(validate -> skip if equal -> journal -> write -> decision -> restore).

Third-party backends register under the entry-point group `koordd.backends`:
a class whose instances take no arguments (or a factory), bringing its knobs.
"""
from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable, Mapping, Sequence

from koordd.core.probe import Probe

log = logging.getLogger("koordd.backend")     # its name before the move: log lines unchanged


class TargetGone(Exception):
    """The target disappeared (normal churn: a cgroup removed, a device unplugged): skipped silently."""


class Unsupported(Exception):
    """The knob has no place on this host (layout, kernel, missing file)."""


class PartialWrite(OSError):
    """Part of a write landed before the kernel refused the rest (a cgroup's threads: some moved):
    the knob's journal entry must stay, whatever the knob reads now."""


class InvalidValue(ValueError):
    """The value breaks a kernel rule; the message says which."""


class UnsafeValue(InvalidValue):
    """A value the kernel would take but koordd never writes on this host, by a rule of its own (a
    vm.min_free_kbytes above 10% of memory: the kernel would OOM-kill at once). Refused to every write, a
    restore's included: the actuator then leaves the knob as it is and drops the hold (a forged or stale
    journal entry), where a plain InvalidValue of a restore (a parent's limit of the moment) is kept for later."""


@dataclass(frozen=True)
class Harm:
    """What a write of a knob does to the work in its target (a cgroup and what runs below it), where it does
    harm: declared on the knob (KnobSpec.harm), read by koordd's guard (koordd/act/protect.py), which refuses
    such a write on protected work. Either an act on the tasks themselves (a kill, a freeze, a reclaim):
    harm whatever the value, but `lifts`; or a cap: harm where the new value is tighter than the original.
    A knob without one does no harm (a weight is a share, not a cap)."""
    what: str                                              # the refusal's words: "would <what> <cgroup>"
    tighter: Callable[[str, str], bool] | None = None      # a cap: (new, original) -> whether new is tighter
    lifts: str | None = None                               # an act's value that undoes it (cgroup.freeze "0")

    def of(self, new: str, original: str | None) -> str | None:
        """`what`, if writing `new` over `original` (None: not read, a command) does this harm; else None."""
        if self.tighter is None:
            return None if self.lifts is not None and new.strip() == self.lifts else self.what
        return self.what if original is not None and self.tighter(new, original) else None


def lower(magnitude: Callable[[str], float]) -> Callable[[str, str], bool]:
    """A cap's Harm.tighter by a magnitude (the knob's own, the one the write order uses): a lower value
    is tighter, and one that cannot be compared counts as tighter (it is not one to write on protected work)."""
    def tighter(new: str, original: str) -> bool:
        try:
            return magnitude(new) < magnitude(original)
        except (ValueError, ZeroDivisionError):
            return True
    return tighter


@dataclass(frozen=True)
class KnobSpec:
    """What the actuator needs to know of a knob, whatever its backend. The cgroup backend's Knob has
    the same attributes."""
    name: str
    doc: str
    normalize: Callable[[str], str] = str                # canonical text or InvalidValue
    oneshot: bool = False                                # a command: never read, compared or restored
    magnitude: Callable[[str], float] | None = None      # for write order: parents first when raising
    resets: tuple[str, ...] = ()                         # knobs the kernel rewrites when this one changes
    # A command that runs beside the round (a prekill hook): Backend.start() begins it and returns its Job;
    # the actuator never waits for it in a round (see Job).
    beside: bool = False
    harm: Harm | None = None                             # what a write does to protected work (the guard)
    # A write that may block for long (memory.reclaim returns only once the kernel reclaimed what it was
    # asked: seconds on a host that swaps): timed, all such writes of a round within one budget; those past
    # it are not written and are deferred to the next round (the actuator's SLOW_WRITE_BUDGET).
    slow: bool = False


class Job:
    """A command a backend runs beside the round (KnobSpec.beside): started by Backend.start(), watched by
    a thread of its own from begin(), never waited for in a round. The actuator holds back this loop's
    later actions on the same target until the job is done or its deadline passed, then applies them on
    the main thread, where every write is made."""
    timeout: float = 0.0          # the longest the command may run (from its value)

    def begin(self, deadline: float, woken: Callable[[], None]) -> None:
        """Watch it from now until it ends or `deadline` (monotonic) passes (then it is ended); call
        `woken()` (from any thread) when it is done."""
        raise NotImplementedError

    def done(self) -> bool:
        raise NotImplementedError

    def result(self) -> None:
        """After done(): None if the command succeeded, else the OSError that says how it failed."""
        raise NotImplementedError

    def cancel(self, why: str) -> None:
        """End it now (its processes killed) and wait until it is; done() afterwards. Idempotent."""
        raise NotImplementedError


class Backend:
    """One kind of target. Subclasses set `kind` and `knobs` and implement read/validate/write."""
    kind: ClassVar[str] = ""
    knobs: Mapping[str, KnobSpec] = {}
    # Targets are cgroup paths: a knob held on a cgroup that left the loop's classes goes back.
    cgroup_targets: ClassVar[bool] = False
    # The host features this kind uses, each with its probe (koordd/core/probe.py): koordctl doctor's rows.
    features: ClassVar[Mapping[str, Probe]] = {}

    def probe(self) -> dict[str, str]:
        """Knobs this host cannot serve, each with why (at start and on reload)."""
        return {}

    def read(self, target: str, knob: str) -> str:
        """The current value in canonical text; TargetGone, Unsupported, OSError or ValueError."""
        raise NotImplementedError

    def validate(self, target: str, knob: str, value: str) -> str:
        """The canonical value if the kernel would accept it for this target, else InvalidValue."""
        return self.knobs[knob].normalize(value)

    def write(self, target: str, knob: str, value: str) -> None:
        raise NotImplementedError

    def start(self, target: str, knob: str, value: str) -> Job:
        """A knob of KnobSpec.beside: begin the command and return at once with its Job (not begun);
        TargetGone, or OSError when it cannot start."""
        raise NotImplementedError

    def validate_original(self, target: str, knob: str, value: str) -> str:
        """For a restore of `value`, an original this backend read that validate() refused with a plain
        InvalidValue: one whose knob reads values it is never set to ("mixed") lets those through, for
        write() to put back as it does. The actuator calls validate() first: an UnsafeValue there is final,
        whatever this says (a restore meets the rules of a write)."""
        return self.validate(target, knob, value)

    def scope(self, knob: str, current: str, wanted: str) -> str:
        """Of `current` (the knob as read), the part a write of `wanted` sets: what is compared with it,
        journaled as the original and put back by a restore. All of it for a knob that is one value;
        io.max names devices, and a write changes only those it names."""
        return current

    def same(self, current: str, wanted: str) -> bool:
        """Whether a knob reading `current` already is `wanted` (nothing to write)."""
        return current == wanted

    def parent(self, target: str) -> str | None:
        """The enclosing target of the same kind whose limit bounds this one's (write order), if any."""
        return None

    def identity(self, target: str, knob: str) -> str | None:
        """What tells this target from another of the same name made after it (a cgroup's inode, a
        device's ifindex), journaled with a hold: a restore never lands on a target re-created since.
        None: not known (then only the value is compared). TargetGone when the target is gone."""
        return None

    def holding(self, target: str, knob: str, hold: tuple[str, Sequence[str]] | None) -> None:
        """Told by the actuator just before it reads a knob to write or restore it: what koordd holds there,
        (its original, the values koordd wrote, newest last), or None when it holds nothing. A backend whose
        target stands for objects that come and go (a cgroup's processes) follows with it those koordd set,
        so one that leaves the target gets its own value back (koordd/backends/oom.py). Default: nothing."""

    def still_koordds(self, target: str, knob: str, current: str, values: Sequence[str]) -> bool:
        """Whether a knob reading `current` still holds what koordd left in it: `values` are the values
        its writes went through, the original first and the newest last. A backend whose write takes
        steps says here what a write cut short between two of them reads."""
        return any(self.same(current, v) for v in values)

    def close(self) -> None:
        """Release what the backend holds open (file descriptors, sockets)."""


class TaskBackend(Backend):
    """A knob that each task (thread or process) of a cgroup and of the cgroups below it has on its own (a
    thread's scheduling policy, a process's OOM score): the cgroup, not each task, is the target, and a write
    sets every task in it. It reads the value they share; MIXED while they differ (tasks started since, a
    write cut short: still koordd's to put back); `empty` where there is none (any value already: nothing to
    write). Such readings are never set by a loop (validate() refuses them), and a restore puts them back
    (validate_original() lets them through; write() says how). Subclasses implement read() and write(), and
    check() where the host has rules beyond the knob's form."""
    cgroup_targets: ClassVar[bool] = True
    MIXED: ClassVar[str] = "mixed"
    empty: ClassVar[str | None] = "none"       # what a cgroup without a task reads; None: no such reading

    def reading(self, value: str) -> bool:
        """Whether `value` (canonical) is a form the knob reads and is never set to."""
        return value == self.MIXED

    def check(self, target: str, knob: str, value: str) -> str:
        """A canonical value that is no reading, as written on this host: InvalidValue or Unsupported if not."""
        return value

    def validate(self, target: str, knob: str, value: str) -> str:
        v = self.knobs[knob].normalize(value)
        if self.reading(v):
            raise InvalidValue(f"{knob} {v[:40]!r} is what a cgroup reads, not a value to set")
        return self.check(target, knob, v)

    def validate_original(self, target: str, knob: str, value: str) -> str:
        return value if self.reading(value) else self.validate(target, knob, value)

    def same(self, current: str, wanted: str) -> bool:
        return current == wanted or current == self.empty

    def still_koordds(self, target: str, knob: str, current: str, values: Sequence[str]) -> bool:
        return current == self.MIXED or super().still_koordds(target, knob, current, values)

    def common(self, values: Iterable[str]) -> str | None:
        """The reading of tasks reading `values`: their one value, MIXED where they differ, `empty` where
        there is no task."""
        found = set(values)
        if not found:
            return self.empty
        return found.pop() if len(found) == 1 else self.MIXED


class TaskWrite:
    """One write of a TaskBackend over the tasks of its cgroup, each task written on its own: put() each
    task that does not read the value yet; a task that exited meanwhile is skipped, a refusal is kept and
    the others are still written; then refused() raises one error for them all, naming the first: a
    PartialWrite where some task was written (the knob's journal entry must stay), else an OSError."""

    def __init__(self, gone: tuple[type[OSError], ...] = (ProcessLookupError,)):
        self.gone = gone            # what a task that exited meanwhile raises (besides ESRCH)
        self.done = 0               # tasks written
        self.errors: list[tuple[str, OSError]] = []    # (the task as the error names it, its refusal)

    def put(self, task: str, write: Callable[..., object], *args) -> None:
        """write(*args) for one task, named `task` in an error ("thread 12"). A write that returns False
        did not happen (its id is another task's now): not counted as done."""
        try:
            wrote = write(*args)
        except OSError as e:
            if isinstance(e, self.gone) or e.errno == errno.ESRCH:
                return              # exited meanwhile
            self.errors.append((task, e))
            return
        if wrote is not False:
            self.done += 1

    def refused(self, what: str, hint: Callable[[OSError], str] = lambda e: "") -> None:
        """If any task refused: raise "<n> <what> (first: <task>: <its error><hint(error)>)"."""
        if self.errors:
            task, e = self.errors[0]
            raise (PartialWrite if self.done else OSError)(
                e.errno, f"{len(self.errors)} {what} (first: {task}: {e.strerror}{hint(e)})")


@dataclass(frozen=True)
class BackendSet:
    """One module's backends as koordd registers its own (koordd/core/catalogue.py BUILTIN): their classes,
    whose `features` koordctl doctor reports, and how they are built on a cgroup layout (a CgroupFS), since
    they take it and share state (a classifier, the sched_ext scheduler) a class alone cannot."""
    classes: tuple[type[Backend], ...]
    build: Callable[..., list[Backend]]


class Backends:
    """The backends of this run, by kind and by knob."""

    def __init__(self, backends: Iterable[Backend] = ()):
        self._by_kind: dict[str, Backend] = {}
        self._by_knob: dict[str, Backend] = {}
        for b in backends:
            self.add(b)

    def add(self, backend: Backend) -> None:
        if not backend.kind or backend.kind in self._by_kind:
            raise ValueError(f"backend kind {backend.kind!r} is empty or already registered")
        taken = sorted(k for k in backend.knobs if k in self._by_knob)
        if taken:
            raise ValueError(f"backend {backend.kind}: knob(s) {', '.join(taken)} already served by "
                             f"{self._by_knob[taken[0]].kind}")
        self._by_kind[backend.kind] = backend
        self._by_knob.update({k: backend for k in backend.knobs})

    def of_kind(self, kind: str) -> Backend | None:
        return self._by_kind.get(kind)

    def for_knob(self, knob: str) -> Backend | None:
        return self._by_knob.get(knob)

    def spec(self, knob: str) -> KnobSpec | None:
        b = self._by_knob.get(knob)
        return b.knobs[knob] if b is not None else None

    def knobs(self) -> frozenset[str]:
        return frozenset(self._by_knob)

    def kinds(self) -> tuple[str, ...]:
        return tuple(self._by_kind)

    def probe(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for b in self._by_kind.values():
            try:
                out.update(b.probe())
            except Exception as e:  # noqa: BLE001 - a broken backend loses its knobs, not the daemon
                out.update({k: f"{b.kind} backend failed to probe: {e}" for k in b.knobs})
        return out

    def close(self) -> None:
        for b in self._by_kind.values():
            try:
                b.close()
            except Exception:  # noqa: BLE001 - closing the others matters more
                log.exception("backend %s failed to close", b.kind)

