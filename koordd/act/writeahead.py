"""The restore journal's part of one write, made before the knob is touched (write-ahead).

A crash after the journal entry is still undoable: a new hold saves the original (and first the originals
of the knobs the kernel rewrites with it: KnobSpec.resets); on a knob koordd holds already it saves the
value about to be written, so a restore puts the original back only over what koordd wrote. After the
write the entry is settled; if the target vanished, dropped; if the write failed, taken back, unless part
of it landed (then what the knob reads is koordd's doing, and journaled as written).
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Container, Iterator

from koordd.act.journal import Held, RestoreJournal
from koordd.core.backend import Backend, PartialWrite, TargetGone, Unsupported
from koordd.kernel.cgroupfs import OutsideRoot

log = logging.getLogger("koordd.actuator")     # the actuator's: log lines unchanged


class WriteAhead:
    """One write's journal entry: save() before the write, then the write made inside writing()."""

    def __init__(self, journal: RestoreJournal, backend: Backend, target: str, knob: str, held: Held | None,
                 old: str):
        """`held`: what koordd holds on the knob (None: nothing); `old`: what the knob reads now."""
        self.journal, self.backend, self.target, self.knob = journal, backend, target, knob
        self.held, self.old, self.new = held, old, old

    @property
    def saves(self) -> str:
        """What save() journals, for a refusal that says it could not: the original, or the value to write."""
        return "the original" if self.held is None else "the value to write"

    def save(self, loop: str, new: str, identity: str | None, unsupported: Container[str]) -> None:
        """Journal the write of `new` before it is made; `identity`: the target's now (Backend.identity).
        OSError (a full or failing state disk): nothing journaled that a write needs, so no write."""
        held, kind = self.held, self.backend.kind
        self.new = new
        if held is not None and None not in (held.identity, identity) and held.identity != identity:
            # Another object of that name (a cgroup re-created): its original is what it reads now.
            log.info("%s %s: the target was made anew (%s, was %s); its hold starts over from %r",
                     self.target or "/", self.knob, identity, held.identity, self.old)
            self.held = held = None
        if held is None:
            self._side_effects(loop, unsupported)
            self.journal.add(Held(self.target, self.knob, self.old, loop, time.time(), kind, identity, (new,)))
            return
        unknown_after(self.journal, self.backend, self.target, self.knob)
        if held.written != (new,):
            # A crash before the write leaves the value before it: koordd's, named too; someone else's (or
            # one of a journal that did not say) is not koordd's to undo.
            ours = not held.written or any(self.backend.same(self.old, w) for w in held.written)
            self.journal.wrote(self.target, self.knob, kind, (self.old if ours else held.written[-1], new))

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Around the write: the entry settled if it landed, dropped if the target vanished, taken back
        (failed()) if the write failed; the error goes on."""
        try:
            yield
        except TargetGone:
            self.vanished()
            raise
        except OutsideRoot:         # a symlink out of the hierarchy: found only at the write, nothing written
            self.failed(unchanged=True)
            raise
        except OSError as e:
            self.failed(partial=isinstance(e, PartialWrite))
            raise
        self.landed()

    def landed(self) -> None:
        self.journal.settle(self.target, self.knob, self.backend.kind, (self.new,))

    def vanished(self) -> None:
        """The target is gone: nothing left to restore."""
        self.journal.remove(self.target, self.knob, self.backend.kind)

    def failed(self, partial: bool = False, unchanged: bool = False) -> None:
        """After a failed write: unless part of it landed (`partial`), drop the entry save() made for a new
        hold, or take back the value it said was about to be written. If part landed, what the knob reads
        now is koordd's doing: journaled as written, so a restore puts the original back over it.
        `unchanged`: the write was refused before it reached the knob (nothing to read)."""
        kind, old = self.backend.kind, self.old
        try:
            now = old if unchanged else self.backend.scope(self.knob, self.backend.read(self.target, self.knob), old)
        except (OSError, TargetGone, ValueError, Unsupported):
            now = old
        if now == old and not partial:
            if self.held is None:
                self.journal.remove(self.target, self.knob, kind)
            else:
                self.journal.settle(self.target, self.knob, kind, self.held.written)
            return
        try:
            self.journal.wrote(self.target, self.knob, kind, (now,))
        except OSError as e:
            log.error("%s %s: cannot record the value a failed write left (%r): %s", self.target or "/", self.knob,
                      now, e)

    def _side_effects(self, loop: str, unsupported: Container[str]) -> None:
        """Knobs the kernel rewrites as a side effect of this write (cpu.idle rewrites cpu.weight) get their
        originals saved first, so newest-first restore puts this knob back, then them."""
        backend, kind = self.backend, self.backend.kind
        for name in backend.knobs[self.knob].resets:
            if self.journal.get(self.target, name, kind) is None and name not in unsupported:
                try:
                    original = backend.read(self.target, name)
                except (OSError, TargetGone, ValueError, Unsupported):
                    continue
                self.journal.add(Held(self.target, name, original, loop, time.time(), kind))   # OSError: no write
        unknown_after(self.journal, backend, self.target, self.knob)


def unknown_after(journal: RestoreJournal, backend: Backend, target: str, knob: str) -> None:
    """Before a write (or restore) of `knob`: the knobs the kernel rewrites with it, held already, no longer
    read what koordd wrote, nor anything koordd can know beforehand. Journaled as not known (restored
    wherever they differ from their original, as journals before version 4 were). OSError: no write."""
    for name in backend.knobs[knob].resets:
        h = journal.get(target, name, backend.kind)
        if h is not None and h.written:
            journal.wrote(target, name, backend.kind, ())
