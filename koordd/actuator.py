"""The only writer of kernel knobs.

Every action goes through one pipeline:
  owner check -> supported -> valid (kernel rules) -> cgroup exists -> read current
  -> skip if equal -> persist the original -> write (unless dry-run) -> decision record.
A refused write is recorded with the reason or the kernel's error; a cgroup
that vanished on the way is skipped silently (normal churn).
"""
from __future__ import annotations

import errno
import logging
import time
from typing import Callable, Iterable

from .cgroups import CgroupFS, CgroupGone, depth, parent_of
from .decisions import APPLIED, DRY_RUN, REFUSED, RESTORED, Decision, DecisionLog
from .knobs import KNOBS, InvalidValue, Unsupported, validate
from .loop import Action
from .state import Held, RestoreJournal

log = logging.getLogger(__name__)


def kernel_error(e: OSError) -> str:
    name = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else "error"
    return f"{name}: {e.strerror or e}"


class Actuator:
    def __init__(self, fs: CgroupFS, journal: RestoreJournal, decisions: DecisionLog, dry_run: bool = False):
        self.fs, self.journal, self.decisions, self.dry_run = fs, journal, decisions, dry_run
        self._would_be: dict[tuple[str, str], tuple[str, str]] = {}  # dry-run: (loop, value) we pretend to have written
        self._refused: dict[tuple[str, str], tuple] = {}     # last refusal per knob, to record it once
        self._would_restore: set[tuple[str, str]] = set()     # dry-run: restores already said once
        self.unsupported: dict[str, str] = {}     # knob -> why this host lacks it (Sensors.probe)

    def apply(self, loop: str, actions: Iterable[Action]) -> list[Decision]:
        return self.apply_round([(loop, list(actions))])[loop]

    def apply_round(self, batches: list[tuple[str, list[Action]]]) -> dict[str, list[Decision]]:
        """The actions of every loop due in one round, written in one order (see _ordered), so a
        parent's limit written by one loop and a child's written by another never cross; each
        loop gets its own decisions back."""
        out: dict[str, list[Decision]] = {loop: [] for loop, _ in batches}
        for loop, a in self._ordered([(loop, a) for loop, actions in batches for a in actions]):
            if a.value is None:
                d = self._restore_action(loop, a)
            elif a.knob in KNOBS and KNOBS[a.knob].oneshot:
                d = self._command(loop, a)
            else:
                d = self._set(loop, a)
            if d is not None:
                out[loop].append(d)
        return out

    def _ordered(self, pairs: list[tuple[str, Action]]) -> list[tuple[str, Action]]:
        """Limits that go down are written child before parent, limits that go up parent before child,
        so no child ever asks for more than its parent allows (v1 refuses that with EINVAL)."""
        if not _nested({a.cgroup for _, a in pairs}):
            return pairs            # no parent and child in one batch: nothing to order, nothing to read

        def key(pair: tuple[str, Action]) -> tuple[int, int]:
            a = pair[1]
            knob = KNOBS.get(a.knob)
            if knob is None or knob.magnitude is None:
                return (1, depth(a.cgroup))
            held = self.journal.get(a.cgroup, a.knob)
            target = a.value if a.value is not None else (held.original if held else None)
            try:
                lowering = target is not None and \
                    knob.magnitude(target) < knob.magnitude(knob.read(self.fs, a.cgroup))
            except (OSError, CgroupGone, ValueError, Unsupported):
                lowering = False
            return (0, -depth(a.cgroup)) if lowering else (1, depth(a.cgroup))

        return sorted(pairs, key=key)

    def _command(self, loop: str, a: Action) -> Decision | None:
        """A write that is an act, not a state (memory.reclaim, cgroup.kill): nothing to compare or restore."""
        if a.knob in self.unsupported:
            return self._refuse(loop, a, None, self.unsupported[a.knob])
        try:
            value = validate(self.fs, a.cgroup, a.knob, a.value)
            if not self.dry_run:
                KNOBS[a.knob].write(self.fs, a.cgroup, value)
        except CgroupGone:
            return None
        except (Unsupported, InvalidValue) as e:
            return self._refuse(loop, a, None, str(e))
        except OSError as e:
            # EAGAIN from memory.reclaim means "reclaimed less than asked": still worth recording.
            return self._refuse(loop, a, None, kernel_error(e))
        return self._record(Decision(time.time(), loop, a.cgroup, a.knob, None, value,
                                     DRY_RUN if self.dry_run else APPLIED, a.message, dict(a.reason)))

    # --- setting ------------------------------------------------------------

    def _set(self, loop: str, a: Action) -> Decision | None:
        key = (a.cgroup, a.knob)
        held = self.journal.get(*key)
        if held is not None and held.owner != loop:
            return self._refuse(loop, a, None, f"knob is held by loop {held.owner}")
        if a.knob in self.unsupported:
            return self._refuse(loop, a, None, self.unsupported[a.knob])
        knob = KNOBS.get(a.knob)
        try:
            if knob is None:
                raise Unsupported(f"unknown knob {a.knob!r}")
            old = knob.read(self.fs, a.cgroup)
            new = validate(self.fs, a.cgroup, a.knob, a.value)
        except CgroupGone:
            return None
        except (Unsupported, InvalidValue) as e:
            return self._refuse(loop, a, None, str(e))
        except FileNotFoundError:
            return self._refuse(loop, a, None, f"{a.knob} does not exist for this cgroup: its controller is not "
                                f"enabled in the parent's cgroup.subtree_control (for a systemd slice: "
                                f"systemctl set-property <slice> CPUWeight=100 / MemoryAccounting=yes)")
        except OSError as e:
            return self._refuse(loop, a, None, f"cannot read current value: {kernel_error(e)}")
        if self.dry_run:
            if self._would_be.get(key, (loop, old))[1] == new:
                return None
            self._would_be[key] = (loop, new)
            return self._record(Decision(time.time(), loop, a.cgroup, a.knob, old, new, DRY_RUN, a.message,
                                         dict(a.reason)))
        if old == new:
            self._refused.pop(key, None)
            return None
        if held is None:
            self._journal_side_effects(loop, a.cgroup, knob)
            # Persist the original before touching the knob: a crash after this line is still undoable.
            self.journal.add(Held(a.cgroup, a.knob, old, loop, time.time()))
        try:
            knob.write(self.fs, a.cgroup, new)
        except CgroupGone:
            self.journal.remove(*key)
            return None
        except OSError as e:
            self._forget_if_unchanged(held, a.cgroup, a.knob, old)
            return self._refuse(loop, a, old, kernel_error(e), new)
        self._refused.pop(key, None)
        return self._record(Decision(time.time(), loop, a.cgroup, a.knob, old, new, APPLIED, a.message,
                                     dict(a.reason)))

    def _journal_side_effects(self, loop: str, cgroup: str, knob) -> None:
        """Knobs the kernel rewrites as a side effect of this write (cpu.idle rewrites cpu.weight) get
        their originals saved first, so newest-first restore puts this knob back, then them."""
        for name in knob.resets:
            side = KNOBS[name]
            if self.journal.get(cgroup, name) is None and side.supported(self.fs):
                try:
                    self.journal.add(Held(cgroup, name, side.read(self.fs, cgroup), loop, time.time()))
                except (OSError, CgroupGone, ValueError):
                    pass

    def _forget_if_unchanged(self, held: Held | None, cgroup: str, knob: str, old: str) -> None:
        """After a failed write, drop the journal entry we just made unless part of the write landed."""
        if held is not None:
            return
        try:
            now = KNOBS[knob].read(self.fs, cgroup)
        except (OSError, CgroupGone, ValueError):
            now = old
        if now == old:
            self.journal.remove(cgroup, knob)

    def _refuse(self, loop: str, a: Action, old: str | None, error: str, new: str | None = None) -> Decision | None:
        key, sig = (a.cgroup, a.knob), (a.value, error)
        if self._refused.get(key) == sig:
            return None        # the same refusal every tick would drown the journal: record it once
        self._refused[key] = sig
        return self._record(Decision(time.time(), loop, a.cgroup, a.knob, old, new or a.value, REFUSED,
                                     a.message, dict(a.reason), error))

    def _record(self, d: Decision) -> Decision:
        self.decisions.record(d)
        return d

    # --- restoring ------------------------------------------------------------

    def _restore_action(self, loop: str, a: Action) -> Decision | None:
        self._would_be.pop((a.cgroup, a.knob), None)
        held = self.journal.get(a.cgroup, a.knob)
        if held is None:
            return None
        if held.owner != loop:
            return None        # not ours: another loop's change stays
        return self.restore(held, a.message, dict(a.reason))

    def restore(self, held: Held, message: str, reason: dict | None = None, loop: str | None = None) -> Decision | None:
        """Put one held knob back to its original value and forget it."""
        knob = KNOBS.get(held.knob)
        try:
            if knob is None:
                raise Unsupported(f"unknown knob {held.knob!r}")
            current = knob.read(self.fs, held.cgroup)
            if self.dry_run:
                # Say what a real run would put back; the knob and its journal entry stay as they are.
                if current == held.original or (held.cgroup, held.knob) in self._would_restore:
                    return None
                self._would_restore.add((held.cgroup, held.knob))
                return self._record(Decision(time.time(), loop or held.owner, held.cgroup, held.knob, current,
                                             held.original, DRY_RUN, message, reason or {}))
            if current != held.original:
                knob.write(self.fs, held.cgroup, held.original)
        except CgroupGone:
            if self.dry_run:
                return None
            self.journal.remove(held.cgroup, held.knob)   # nothing left to restore
            return None
        except (OSError, Unsupported, ValueError) as e:
            # Keep it in the journal: the next attempt (or the next start) tries again.
            err = kernel_error(e) if isinstance(e, OSError) else str(e)
            if self._refused.get((held.cgroup, held.knob)) == (None, err):
                return None    # retried every tick: recorded once
            self._refused[(held.cgroup, held.knob)] = (None, err)
            return self._record(Decision(time.time(), loop or held.owner, held.cgroup, held.knob, None,
                                         held.original, REFUSED, message, reason or {}, err))
        self.journal.remove(held.cgroup, held.knob)
        self._refused.pop((held.cgroup, held.knob), None)
        if current == held.original:
            return None
        return self._record(Decision(time.time(), loop or held.owner, held.cgroup, held.knob, current,
                                     held.original, RESTORED, message, reason or {}))

    def restore_where(self, keep: Callable[[Held], bool], message: str) -> list[Decision]:
        """Restore every held knob for which keep(held) is False, newest change first."""
        out = []
        for held in reversed(self.journal.entries()):
            if not keep(held):
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


def _nested(cgroups: set[str]) -> bool:
    """True when one of the cgroups lies below another."""
    for cg in cgroups:
        parent = parent_of(cg)
        while parent:
            if parent in cgroups:
                return True
            parent = parent_of(parent)
    return False
