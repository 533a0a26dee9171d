"""The only writer of knobs, whatever their target.

Every action goes through one pipeline, the same for every backend (koordd.core.backend):
  owner check -> supported -> kubelet rule -> read current, valid (kernel rules) -> guard
  (koordd/act/protect.py) -> skip if equal -> write-ahead (koordd/act/writeahead.py: the original, or
  the new value of a knob held, journaled) -> write (unless dry-run) -> decision record.
Each step either passes or raises Refused with the words of the decision; a target that vanished on the
way (TargetGone) is skipped silently (normal churn). A restore takes the same way back: in the same
order, through the same validation, kubelet rule and guard, and only onto a knob that still holds what
koordd wrote on the same object.

A command that runs long (a prekill hook: KnobSpec.beside) is only begun in a round; what the loop asked
of the same target after it waits (Beside) and is applied by finish(), on the main thread, once the
command is done or its budget ran out; cancel() ends such commands and makes nothing that waited.

A write that may block (KnobSpec.slow: memory.reclaim returns only once the kernel reclaimed what it was
asked) is timed; all such writes of a round share one budget, SLOW_WRITE_BUDGET: once it is spent, the
round's remaining ones are not written, each a DEFERRED decision that its loop asks again next round.
"""
from __future__ import annotations

import errno
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, TypeVar

from koordd.act.decision_log import DecisionLog
from koordd.act.journal import Held, RestoreJournal
from koordd.act.protect import Guard
from koordd.act.writeahead import WriteAhead, unknown_after
from koordd.backends.host_backends import builtin_backends
from koordd.core.backend import Backend, Backends, InvalidValue, Job, PartialWrite, TargetGone, Unsupported, UnsafeValue
from koordd.core.decisions import APPLIED, DEFERRED, DRY_RUN, KEPT, Decision, LEFT, REFUSED, RESTORED
from koordd.core.kubelet import KubeletRule
from koordd.core.loop import Action
from koordd.kernel.cgroupfs import CgroupFS, OutsideRoot

log = logging.getLogger("koordd.actuator")     # its name before the move: log lines unchanged


def kernel_error(e: OSError) -> str:
    name = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else "error"
    return f"{name}: {e.strerror or e}"


Key = tuple[str, str, str]       # (kind, target, knob)

# What the writes that may block (KnobSpec.slow: memory.reclaim) may take of one round, all loops' together,
# by the monotonic clock: past it the round's remaining such writes are DEFERRED (to the next round), not
# written. A round's other work takes milliseconds; with the one write still in flight when the budget runs
# out (a step of koordd.core.reclaim.RECLAIM_WRITE_BYTES, 32 MiB: about 0.3 s at 100 MB/s of swap-out, 3 s
# at 10 MB/s) a round stays well under half of WatchdogSec=30s (systemd/koordd.service: a ping every 15 s).
SLOW_WRITE_BUDGET = 1.0
T = TypeVar("T")


class Refused(Exception):
    """A step of a write that refuses it: the decision's error, and the values it names."""

    def __init__(self, why: str, old: str | None = None, new: str | None = None):
        super().__init__(why)
        self.old, self.new = old, new


class Forbidden(Exception):
    """A restore that must never be written (a forged or stale journal entry): dropped with a decision."""


@dataclass
class Beside:
    """A command running beside the round (a prekill hook), and what its loop asked of the same target
    after it in that round (the kill): held back until the command is done or `deadline` passed."""
    loop: str
    action: Action
    kind: str
    job: Job
    deadline: float                                       # monotonic: the episode's budget ends
    then: list[Action] = field(default_factory=list)


class Actuator:
    def __init__(self, backends: Backends | CgroupFS, journal: RestoreJournal, decisions: DecisionLog,
                 dry_run: bool = False, unsupported: Mapping[str, str] | None = None,
                 processes: Mapping[str, str] | None = None, kubelet: KubeletRule | None = None,
                 clock: Callable[[], float] = time.monotonic):
        """`unsupported`: knob -> why this host lacks it (Backends.probe); `processes`: cgroup -> whose
        (PID 1, koordd: never harmed); `kubelet`: which knobs the kubelet owns (koordd/core/kubelet.py;
        None: koordd writes them all); `clock`: what times the writes that may block (tests: a fake one).
        A CgroupFS alone for `backends`: an actuator of koordd's own cgroup knobs (tests, tools)."""
        self.backends = backends if isinstance(backends, Backends) else Backends(builtin_backends(backends))
        self.journal, self.decisions, self.dry_run = journal, decisions, dry_run
        self._would_be: dict[Key, tuple[str, str]] = {}   # dry-run: (loop, value) we pretend to have written
        self._refused: dict[Key, tuple] = {}              # last refusal per knob, to record it once
        self._would_restore: set[Key] = set()             # dry-run: restores already said once
        self.unsupported: dict[str, str] = dict(unsupported or {})
        self.guard = Guard(processes)                     # what no write may do to protected work
        self.kubelet = kubelet
        self.beside: list[Beside] = []                    # commands running beside the round, oldest first
        self.woken: Callable[[], None] = lambda: None     # called (from any thread) when one is done
        self.clock = clock
        self.slow_budget = SLOW_WRITE_BUDGET              # seconds a round's slow writes may take (see above)
        self._slow_spent = 0.0                            # what this round's slow writes took so far

    @property
    def processes(self) -> dict[str, str]:
        """cgroup -> whose (PID 1, koordd): never harmed (the guard's)."""
        return self.guard.processes

    @processes.setter
    def processes(self, processes: Mapping[str, str]) -> None:
        self.guard.processes = dict(processes)

    def reconfigure(self, kubelet: KubeletRule | None, unsupported: Mapping[str, str]) -> None:
        """After a reload: the new config's kubelet rule, and the knobs this host lacks, probed again."""
        self.kubelet, self.unsupported = kubelet, dict(unsupported)

    def protect(self, classes: Mapping[str, str | None]) -> None:
        """This round's classes (cgroup -> class, from the snapshot): what evicting or throttling
        writes may not reach (koordd/act/protect.py). Most rounds write nothing harmful: the protected
        set is built only when one does."""
        self.guard.protect(classes)

    def apply(self, loop: str, actions: Iterable[Action]) -> list[Decision]:
        return self.apply_round([(loop, list(actions))])[loop]

    def apply_round(self, batches: list[tuple[str, list[Action]]]) -> dict[str, list[Decision]]:
        """The actions of every loop due in one round, written in one order (see _ordered), so a
        parent's limit written by one loop and a child's written by another never cross; each
        loop gets its own decisions back. The writes that may block (KnobSpec.slow) share one budget,
        `slow_budget` seconds: once spent, the rest of them are DEFERRED, not written."""
        out: dict[str, list[Decision]] = {loop: [] for loop, _ in batches}
        self._slow_spent = 0.0
        started: dict[tuple[str, str], Beside] = {}      # (loop, target) -> its command begun in this batch
        budgets: dict[str, float] = {}                    # loop -> the deadline of the commands it began
        for loop, a in self._ordered([(loop, a) for loop, actions in batches for a in actions]):
            backend = self.backends.for_knob(a.knob)
            waiting = started.get((loop, a.target))
            if waiting is not None:
                waiting.then.append(a)      # after the command: applied once it is done (finish())
                continue
            if backend is None:
                d = self._refuse(loop, a, "", None, f"unknown knob {a.knob!r} (no backend serves it)")
            elif a.value is None:
                d = self._restore_action(loop, a, backend)
            elif getattr(backend.knobs[a.knob], "slow", False) and self._slow_spent >= self.slow_budget:
                d = self._defer(loop, a, backend)
            elif getattr(backend.knobs[a.knob], "beside", False):
                d, job = self._begin(loop, a, backend)
                if job is not None:
                    # One budget for every command a loop begins in one round: they run side by side,
                    # and the last of them ends when the first one's time is up.
                    deadline = min(budgets.setdefault(loop, time.monotonic() + job.timeout),
                                   time.monotonic() + job.timeout)
                    b = Beside(loop, a, backend.kind, job, deadline)
                    self.beside.append(b)
                    started[(loop, a.target)] = b
                    job.begin(deadline, self.woken)
            elif backend.knobs[a.knob].oneshot:
                d = self._command(loop, a, backend)
            else:
                d = self._set(loop, a, backend)
            if d is not None:
                out[loop].append(d)
        return out

    # --- beside the round --------------------------------------------------------

    def _begin(self, loop: str, a: Action, backend: Backend) -> tuple[Decision | None, Job | None]:
        """A command that runs beside the round: the checks of any command, then the backend begins it
        and the actuator goes on. Its decision comes when it is done (finish()); dry-run begins nothing."""
        try:
            with refusing():
                value = self._command_value(a, backend)
                if self.dry_run:
                    return self._made(loop, a, backend.kind, None, value, DRY_RUN), None
                return None, backend.start(a.target, a.knob, value)
        except TargetGone:
            return None, None
        except Refused as r:
            return self._refuse(loop, a, backend.kind, None, str(r)), None

    def waiting(self, loop: str) -> list[Action]:
        """The actions of `loop` not yet applied: its commands running beside the round and what follows them."""
        return [a for b in self.beside if b.loop == loop for a in (b.action, *b.then)]

    def next_deadline(self) -> float | None:
        """When the earliest command beside the round runs out of time (monotonic); None if none runs."""
        return min((b.deadline for b in self.beside), default=None)

    def finish(self, now: float | None = None) -> list[tuple[str, list[Action], list[Decision]]]:
        """The commands beside the round that are done, or whose budget ran out (ended now): their
        decisions, then the actions held back behind them, applied here (on the caller's thread, the
        main one, where every write is made) through the same checks as in a round. Per command:
        (loop, its actions, their decisions)."""
        now = time.monotonic() if now is None else now
        out = []
        for b in [b for b in self.beside if b.job.done() or now >= b.deadline]:
            if not b.job.done():
                b.job.cancel("its budget ran out")      # its own watcher ends it at the deadline; at the latest here
            self.beside.remove(b)
            d = self._outcome(b)
            rest = self.apply_round([(b.loop, b.then)])[b.loop] if b.then else []
            out.append((b.loop, [b.action, *b.then], ([d] if d is not None else []) + rest))
        return out

    def _outcome(self, b: Beside) -> Decision | None:
        try:
            b.job.result()
        except OSError as e:
            return self._refuse(b.loop, b.action, b.kind, None, kernel_error(e))
        return self._record(Decision(time.time(), b.loop, b.action.target, b.action.knob, None, b.action.value,
                                     APPLIED, b.action.message, dict(b.action.reason), kind=b.kind))

    def cancel(self, why: str, loop: str | None = None) -> list[Decision]:
        """End the commands beside the round (of `loop`, or all), and make nothing that waited for them:
        a stop, or the loop disabled. Each command, and each write that waited for it, is one refused
        decision saying so."""
        out = []
        for b in [b for b in self.beside if loop is None or b.loop == loop]:
            b.job.cancel(why)
            self.beside.remove(b)
            out.append(self._refuse(b.loop, b.action, b.kind, None, f"cancelled: {why}"))
            for a in b.then:
                backend = self.backends.for_knob(a.knob)
                if a.value is not None:
                    out.append(self._refuse(b.loop, a, backend.kind if backend else "", None,
                                            f"not made: {why} before the {b.action.knob} it waited for was done"))
        return [d for d in out if d is not None]

    def _ordered(self, pairs: list[tuple[T, Action]]) -> list[tuple[T, Action]]:
        """Limits that go down are written child before parent, limits that go up parent before child,
        so no child ever asks for more than its parent allows (v1 refuses that with EINVAL). Restores
        (value None, the journal's original) are ordered alike; otherwise the batch's order stays."""
        if not self._nested([a for _, a in pairs]):
            return pairs            # no parent and child in one batch: nothing to order, nothing to read

        def key(pair: tuple[T, Action]) -> tuple[int, int]:
            a = pair[1]
            backend = self.backends.for_knob(a.knob)
            if backend is None:
                return (1, 0)
            depth = _depth(backend, a.target)
            magnitude = backend.knobs[a.knob].magnitude
            if magnitude is None:
                return (1, depth)
            held = self.journal.get(a.target, a.knob, backend.kind)
            target = a.value if a.value is not None else (held.original if held else None)
            try:
                lowering = target is not None and magnitude(target) < magnitude(backend.read(a.target, a.knob))
            except (OSError, TargetGone, ValueError, Unsupported):
                lowering = False
            return (0, -depth) if lowering else (1, depth)

        return sorted(pairs, key=key)

    def _nested(self, actions: list[Action]) -> bool:
        """True when one target of the batch lies below another of the same backend."""
        targets = {(b.kind, a.target) for a in actions if (b := self.backends.for_knob(a.knob)) is not None}
        for kind, target in targets:
            backend = self.backends.of_kind(kind)
            parent = backend.parent(target)
            while parent is not None:
                if (kind, parent) in targets:
                    return True
                parent = backend.parent(parent)
        return False

    def _command_value(self, a: Action, backend: Backend) -> str:
        """A command's checks (the host has the knob; the guard lets it through) and its value, validated."""
        if a.knob in self.unsupported:
            raise Refused(self.unsupported[a.knob])
        self._guarded(backend, a.target, a.knob, a.value, None)
        return backend.validate(a.target, a.knob, a.value)

    def _command(self, loop: str, a: Action, backend: Backend) -> Decision | None:
        """A write that is an act, not a state (memory.reclaim, cgroup.kill): nothing to compare or restore.
        EAGAIN from memory.reclaim means "reclaimed less than asked": still worth recording, refused."""
        try:
            with refusing(garbled="garbled kernel file: "):     # a kernel file read on the way that does not parse
                value = self._command_value(a, backend)
                if not self.dry_run:
                    with self._timed(backend, a.knob):
                        backend.write(a.target, a.knob, value)
        except TargetGone:
            return None
        except Refused as r:
            return self._refuse(loop, a, backend.kind, None, str(r))
        return self._made(loop, a, backend.kind, None, value, DRY_RUN if self.dry_run else APPLIED)

    # --- setting ------------------------------------------------------------

    def _set(self, loop: str, a: Action, backend: Backend) -> Decision | None:
        """One write, the pipeline of the module's doc a step a line: each passes, or raises Refused."""
        kind, key = backend.kind, (backend.kind, a.target, a.knob)
        try:
            held = self._writable(loop, a, backend)
            old, new = self._read(a, backend, held)
            self._guarded(backend, a.target, a.knob, new, held.original if held else old, old)
            if self.dry_run:
                return self._pretend(loop, a, backend, old, new)
            if backend.same(old, new):
                self._refused.pop(key, None)
                return self._made(loop, a, kind, old, new, KEPT) if a.say else None
            self._write(loop, a, backend, held, old, new)
        except TargetGone:
            return None
        except Refused as r:
            return self._refuse(loop, a, kind, r.old, str(r), r.new)
        self._refused.pop(key, None)
        return self._made(loop, a, kind, old, new, APPLIED)

    def _writable(self, loop: str, a: Action, backend: Backend) -> Held | None:
        """What koordd holds on the knob, where `loop` may write it: no other loop holds it, this host has it,
        the kubelet does not own it. Refused if not."""
        held = self.journal.get(a.target, a.knob, backend.kind)
        if held is not None and held.owner != loop:
            raise Refused(f"knob is held by loop {held.owner}")
        if a.knob in self.unsupported:
            raise Refused(self.unsupported[a.knob])
        kubelet = self.kubelet.refusal(a.target, a.knob) if self.kubelet and backend.cgroup_targets else None
        if kubelet:
            raise Refused(kubelet)
        return held

    def _read(self, a: Action, backend: Backend, held: Held | None) -> tuple[str, str]:
        """(what the knob reads, of it what the write sets; the value to write, validated). A current value
        that does not parse leaves nothing to compare or restore: Refused."""
        with refusing("cannot read current value: ", garbled="cannot read current value: "):
            self._tell(backend, a.target, a.knob, held)
            old = backend.read(a.target, a.knob)
            new = backend.validate(a.target, a.knob, a.value)
            return backend.scope(a.knob, old, new), new

    def _guarded(self, backend: Backend, target: str, knob: str, new: str, original: str | None,
                 old: str | None = None) -> None:
        """Refused if the write would evict or throttle protected work (the guard: koordd/act/protect.py)."""
        why = self.guard.refusal(backend.knobs[knob], target, new, original) if backend.cgroup_targets else None
        if why:
            raise Refused(why, old, new)

    def _pretend(self, loop: str, a: Action, backend: Backend, old: str, new: str) -> Decision | None:
        """Dry-run: say once what would be written, as if it had been."""
        key = (backend.kind, a.target, a.knob)
        if backend.same(self._would_be.get(key, (loop, old))[1], new):
            return self._made(loop, a, backend.kind, old, new, KEPT) if a.say else None
        self._would_be[key] = (loop, new)
        return self._made(loop, a, backend.kind, old, new, DRY_RUN)

    def _write(self, loop: str, a: Action, backend: Backend, held: Held | None, old: str, new: str) -> None:
        """The journal first (write-ahead: a crash after it is still undoable), then the knob. Refused,
        the journal entry taken back, where either fails."""
        ahead = WriteAhead(self.journal, backend, a.target, a.knob, held, old)
        try:
            ahead.save(loop, new, self._identity(backend, a.target, a.knob), self.unsupported)
        except OSError as e:        # a full or failing state disk: an original not saved is a knob not written
            raise Refused(f"cannot save {ahead.saves} in the restore journal {e.filename}: {kernel_error(e)}",
                          old, new) from None
        try:
            with ahead.writing(), self._timed(backend, a.knob):
                backend.write(a.target, a.knob, new)
        except OutsideRoot as e:    # a symlink out of the hierarchy: found only at the write
            raise Refused(str(e), old, new) from None
        except OSError as e:
            raise Refused(kernel_error(e), old, new) from None

    def _identity(self, backend: Backend, target: str, knob: str) -> str | None:
        """The target's identity (Backend.identity); for a backend of cgroup targets that has none, the
        cgroup's own. TargetGone if it is gone; None when it cannot be told."""
        try:
            identity = backend.identity(target, knob)
            if identity is None and backend.cgroup_targets and backend.kind != "cgroup":
                cgroups = self.backends.of_kind("cgroup")
                identity = cgroups.identity(target, "") if cgroups is not None else None
            return identity
        except TargetGone:
            raise
        except Exception as e:  # noqa: BLE001 - a third-party backend's bug costs the identity, not the write
            log.debug("%s %s: no identity (%s)", target or "/", knob, e)
            return None

    @contextmanager
    def _timed(self, backend: Backend, knob: str) -> Iterator[None]:
        """A write: where it may block (KnobSpec.slow), what it took goes to this round's slow budget."""
        if not getattr(backend.knobs[knob], "slow", False):
            yield
            return
        start = self.clock()
        try:
            yield
        finally:
            self._slow_spent += self.clock() - start

    def _defer(self, loop: str, a: Action, backend: Backend) -> Decision:
        """A write that may block, after this round's budget for them was spent: not tried, nothing checked.
        Its loop asks it again next round (not a failure: memory_evict does not escalate for it)."""
        return self._record(Decision(time.time(), loop, a.target, a.knob, None, a.value, DEFERRED, a.message,
                                     dict(a.reason), f"this round's budget for slow writes ({self.slow_budget:g} s) "
                                     f"is spent: asked again next round", kind=backend.kind))

    def _refuse(self, loop: str, a: Action, kind: str, old: str | None, error: str,
                new: str | None = None) -> Decision | None:
        key, sig = (kind, a.target, a.knob), (a.value, error)
        if self._refused.get(key) == sig:
            return None        # the same refusal every tick would drown the journal: record it once
        self._refused[key] = sig
        return self._record(Decision(time.time(), loop, a.target, a.knob, old, new or a.value, REFUSED,
                                     a.message, dict(a.reason), error, kind=kind or "unknown"))

    def _made(self, loop: str, a: Action, kind: str, old: str | None, new: str | None, outcome: str) -> Decision:
        return self._record(Decision(time.time(), loop, a.target, a.knob, old, new, outcome, a.message,
                                     dict(a.reason), kind=kind))

    def _record(self, d: Decision) -> Decision:
        self.decisions.record(d)
        return d

    # --- restoring ------------------------------------------------------------

    def _restore_action(self, loop: str, a: Action, backend: Backend) -> Decision | None:
        self._would_be.pop((backend.kind, a.target, a.knob), None)
        held = self.journal.get(a.target, a.knob, backend.kind)
        if held is None:
            return None
        if held.owner != loop:
            return None        # not ours: another loop's change stays
        return self.restore(held, a.message, dict(a.reason))

    def restore(self, held: Held, message: str, reason: dict | None = None, loop: str | None = None) -> Decision | None:
        """Put one held knob back to its original value and forget it: only where it still holds what
        koordd wrote on the same object (else it is left, with a decision that says why), and through
        the validation, kubelet rule and guard of any write. A hold of a journal of version 3 or older
        knows neither: its knob is put back wherever it differs from the original, as those did."""
        key = held.key

        def said(old: str | None, outcome: str, error: str | None = None) -> Decision:
            return self._record(Decision(time.time(), loop or held.owner, held.target, held.knob, old, held.original,
                                         outcome, message, reason or {}, error, kind=held.kind))
        try:
            backend = self._serving(held)
            self._tell(backend, held.target, held.knob, held)
            current = backend.scope(held.knob, backend.read(held.target, held.knob), held.original)
            unchanged = backend.same(current, held.original)
            if not unchanged:
                left = self._not_koordds(held, backend, current)
                if left is not None:
                    if self.dry_run:
                        return None
                    self.journal.remove(held.target, held.knob, held.kind)
                    return said(current, LEFT, f"{left}: left as it is, journal entry dropped")
                value = self._restorable(held, backend, current)
            if self.dry_run:
                # Say what a real run would put back; the knob and its journal entry stay as they are.
                if unchanged or key in self._would_restore:
                    return None
                self._would_restore.add(key)
                return said(current, DRY_RUN)
            if not unchanged:
                unknown_after(self.journal, backend, held.target, held.knob)
                backend.write(held.target, held.knob, value)
        except TargetGone:
            if not self.dry_run:
                self.journal.remove(held.target, held.knob, held.kind)   # nothing left to restore
            return None
        except (OutsideRoot, Forbidden) as e:
            # koordd never journals such a target or value: the entry is forged, corrupt, or of a rule
            # that forbids it now. Never written; dropped, so it is not retried forever, after a record
            # that says what it named.
            if not self.dry_run:
                self.journal.remove(held.target, held.knob, held.kind)
            return said(None, REFUSED, f"{e}: journal entry dropped, nothing written")
        except (OSError, Unsupported, ValueError) as e:
            # Keep it in the journal: the next attempt (or the next start) tries again.
            err = kernel_error(e) if isinstance(e, OSError) else str(e)
            if self._refused.get(key) == (None, err):
                return None    # retried every tick: recorded once
            self._refused[key] = (None, err)
            return said(None, REFUSED, err)
        self.journal.remove(held.target, held.knob, held.kind)
        self._refused.pop(key, None)
        return None if unchanged else said(current, RESTORED)

    def _serving(self, held: Held) -> Backend:
        """The backend that serves the held knob: Unsupported if none does (kept in the journal)."""
        backend = self.backends.of_kind(held.kind)
        if backend is None or held.knob not in backend.knobs:
            raise Unsupported(f"no backend of kind {held.kind!r} serves {held.knob!r} (the package that "
                              f"brought it is not installed?); kept in the restore journal")
        return backend

    @staticmethod
    def _tell(backend: Backend, target: str, knob: str, held: Held | None) -> None:
        """Backend.holding(): what koordd holds on the knob it is about to read (None: nothing)."""
        try:
            backend.holding(target, knob, None if held is None else (held.original, held.written))
        except Exception as e:  # noqa: BLE001 - a third-party backend's bug costs what it follows, not the write
            log.debug("%s %s: holding() failed (%s)", target or "/", knob, e)

    def _not_koordds(self, held: Held, backend: Backend, current: str) -> str | None:
        """Why a held knob that differs from its original is no longer koordd's to put back, or None:
        its target was made anew since koordd wrote it, or someone else wrote it after koordd."""
        if held.identity is not None:
            identity = self._identity(backend, held.target, held.knob)
            if identity is not None and identity != held.identity:
                return (f"{held.target or '/'} was made anew since koordd wrote it ({identity}, was "
                        f"{held.identity}): its {current!r} is not koordd's")
        if held.written and not backend.still_koordds(held.target, held.knob, current,
                                                      (held.original, *held.written)):
            return f"changed by someone else since koordd wrote {held.written[-1]!r}: it reads {current!r}"
        return None

    def _restorable(self, held: Held, backend: Backend, current: str) -> str:
        """The original as it is written back, checked as any write is, through the backend's validate():
        Forbidden (dropped) for a value the knob never takes, one a write's rule refuses for good
        (UnsafeValue: a forged vm.min_free_kbytes of 268 x MemTotal) or a restore that would harm a
        protected cgroup (Guard.restore_refusal); InvalidValue (kept, tried again) for one the kernel would
        refuse now (a parent's limit); OutsideRoot (dropped) for a target out of its root.
        validate_original() is asked only after validate() refused with a plain InvalidValue: it lets
        through the forms a knob reads and is never set to ("mixed"), and can never let an UnsafeValue
        through, whatever the backend."""
        try:
            backend.knobs[held.knob].normalize(held.original)
        except ValueError as e:
            raise Forbidden(f"the original {held.original!r} is no value of {held.knob}: {e}") from None
        try:
            value = backend.validate(held.target, held.knob, held.original)
        except UnsafeValue as e:
            raise Forbidden(f"the original {held.original!r} breaks a rule of every write: {e}") from None
        except InvalidValue:
            value = backend.validate_original(held.target, held.knob, held.original)
        if backend.cgroup_targets:
            why = self.guard.restore_refusal(backend.knobs[held.knob], held.target, value, current)
            if why:
                raise Forbidden(why)
        return value

    def restore_where(self, keep: Callable[[Held], bool], message: str) -> list[Decision]:
        """Restore every held knob for which keep(held) is False: newest change first, in the order
        apply_round writes (parents first where limits go up), so v1 takes a child's quota back only
        once its parent's allows it."""
        chosen = [h for h in reversed(self.journal.entries()) if not keep(h)]
        out = []
        for held, _ in self._ordered([(h, Action(h.target, h.knob, None, {}, message)) for h in chosen]):
            d = self.restore(held, message)
            if d is not None:
                out.append(d)
        return out

    def restore_owner(self, loop: str, message: str) -> list[Decision]:
        self._would_be = {k: v for k, v in self._would_be.items() if v[0] != loop}
        return self.restore_where(lambda h: h.owner != loop, message)

    def restore_all(self, message: str) -> list[Decision]:
        self._would_be.clear()
        return self.restore_where(lambda h: False, message)


@contextmanager
def refusing(prefix: str = "", garbled: str | None = None) -> Iterator[None]:
    """A backend's errors as the refusals they make: in its own words (Unsupported, InvalidValue, OutsideRoot),
    or the kernel's after `prefix` (OSError); any other ValueError after `garbled`, where given (else it goes
    on, as TargetGone does: skipped)."""
    try:
        yield
    except (Unsupported, InvalidValue, OutsideRoot) as e:
        raise Refused(str(e)) from None
    except OSError as e:
        raise Refused(prefix + kernel_error(e)) from None
    except ValueError as e:
        if garbled is None:
            raise
        raise Refused(f"{garbled}{e}") from None


def _depth(backend: Backend, target: str) -> int:
    n, parent = 0, backend.parent(target)
    while parent is not None:
        n, parent = n + 1, backend.parent(parent)
    return n
