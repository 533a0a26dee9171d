"""Files under state_dir that must survive a crash: the restore journal and atomic writes.

The restore journal holds the original value of every knob koordd has changed,
written to disk *before* the knob is, so whoever starts next can explain and
undo every change.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)


def write_atomic(path: Path, text: str, durable: bool = True) -> None:
    """Replace `path` so a reader (or a crash) sees the old file or the new one, never half of one.
    durable=False skips the fsyncs, for files that are rewritten every tick and need not survive a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    if not durable:
        return
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@dataclass(frozen=True)
class Held:
    """A knob koordd changed: its value before koordd's first write, and the loop that owns it."""
    cgroup: str
    knob: str
    original: str
    owner: str
    since: float


class RestoreJournal:
    FILE = "originals.json"

    def __init__(self, state_dir: Path | str):
        self.path = Path(state_dir) / self.FILE
        self._held: dict[tuple[str, str], Held] = {}
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            for e in data["held"]:
                h = Held(e["cgroup"], e["knob"], e["original"], e["owner"], float(e["since"]))
                self._held[(h.cgroup, h.knob)] = h
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            # Keep the unreadable file for a human; starting empty is the only way forward.
            aside = self.path.with_suffix(f".corrupt.{int(time.time())}")
            log.error("%s: unreadable restore journal (%s); moved to %s", self.path, e, aside)
            try:
                self.path.rename(aside)
            except OSError:
                pass
            self._held.clear()

    def _save(self) -> None:
        write_atomic(self.path, json.dumps({"version": 1, "held": [asdict(h) for h in self._held.values()]},
                                           indent=1) + "\n")

    def get(self, cgroup: str, knob: str) -> Held | None:
        return self._held.get((cgroup, knob))

    def add(self, held: Held) -> None:
        self._held[(held.cgroup, held.knob)] = held
        self._save()

    def remove(self, cgroup: str, knob: str) -> None:
        if self._held.pop((cgroup, knob), None) is not None:
            self._save()

    def entries(self, owner: str | None = None) -> list[Held]:
        """Held knobs, oldest first, optionally of one owner."""
        return [h for h in self._held.values() if owner is None or h.owner == owner]
