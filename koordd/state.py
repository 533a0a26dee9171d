"""Files under state_dir that must survive a crash: the restore journal and atomic writes.

The restore journal holds the original value of every knob koordd has changed,
written to disk *before* the knob is, so whoever starts next can explain and
undo every change.
"""
from __future__ import annotations

import errno
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
    target: str                   # what its backend (kind) names: a cgroup path, a resctrl group, ...
    knob: str
    original: str
    owner: str
    since: float
    kind: str = "cgroup"


class JournalUnreadable(ValueError):
    pass


def _held(e: dict) -> Held:
    # Journals before version 3 (and 0.1's originals.json) held cgroups only, named "cgroup".
    return Held(e["target"] if "target" in e else e["cgroup"], e["knob"], e["original"], e["owner"],
                float(e["since"]), e.get("kind", "cgroup"))


def _replay(path: Path) -> tuple[dict[tuple[str, str, str], Held], int, bool, list[int]]:
    """The journal's held knobs, its line count, whether it must be rewritten before the next
    append, and its damaged lines. Rewritten: its last line was torn (a crash mid-append; that line is
    dropped, its write never completed, nor the knob write to follow it), a line before it is damaged
    (skipped: the records around it still hold originals; a lost release only means a restore that
    finds the knob already back), or it is of an older version."""
    held: dict[tuple[str, str, str], Held] = {}
    damaged: list[int] = []
    lines = path.read_text().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    try:
        header = json.loads(lines[0])
        if header not in [{"version": v} for v in RestoreJournal.READS]:
            raise JournalUnreadable(f"unknown header {lines[0][:80]!r}")
    except (IndexError, ValueError) as e:
        raise JournalUnreadable(f"no version header: {e}") from None
    for n, line in enumerate(lines[1:], 2):
        try:
            record = json.loads(line)
            if "hold" in record:
                h = _held(record["hold"])
                held[(h.kind, h.target, h.knob)] = h
            else:
                r = record["release"]
                held.pop((r.get("kind", "cgroup"), r["target"] if "target" in r else r["cgroup"], r["knob"]), None)
        except (ValueError, KeyError, TypeError) as e:
            if n == len(lines):
                log.warning("%s:%d: torn last record dropped (%s)", path, n, e)
                return held, n, True, damaged
            log.error("%s:%d: damaged record skipped (%s): %r", path, n, e, line[:120])
            damaged.append(n)
    return held, len(lines), bool(damaged) or header["version"] != RestoreJournal.VERSION, damaged


def read_held(state_dir: Path | str) -> tuple[list[dict], Path] | None:
    """The held knobs as dicts and the file they came from, for readers (koordctl, tests); None when
    koordd has none. Reads a 0.1 journal (originals.json) too. JournalUnreadable/OSError if broken."""
    d = Path(state_dir)
    path = d / RestoreJournal.FILE
    if path.exists():
        return [asdict(h) for h in _replay(path)[0].values()], path
    old = d / RestoreJournal.V1_FILE
    if old.exists():
        try:
            return [asdict(_held(e)) for e in json.loads(old.read_text())["held"]], old
        except (ValueError, KeyError, TypeError) as e:
            raise JournalUnreadable(str(e)) from None
    return None


class RestoreJournal:
    """Append-only: one fsynced line per change ({"hold": ...} before a knob is written, {"release":
    ...} after it is restored), compacted when dead lines outnumber live ones. A 0.1 journal
    (originals.json, rewritten whole on every change) is read and converted at start."""
    FILE = "originals.jsonl"
    V1_FILE = "originals.json"
    VERSION = 3                     # 3: targets of any kind ("target", "kind"); 2 held cgroups ("cgroup")
    READS = (2, 3)
    COMPACT_MIN = 64                # lines before compaction is considered

    def __init__(self, state_dir: Path | str):
        self.dir = Path(state_dir)
        self.path = self.dir / self.FILE
        self._held: dict[tuple[str, str, str], Held] = {}
        self._lines = 0
        self._fd: int | None = None
        self._load()

    def _load(self) -> None:
        old = self.dir / self.V1_FILE
        try:
            if self.path.exists():
                self._held, self._lines, rewrite, damaged = _replay(self.path)
                if damaged:
                    self._keep_aside(self.path, f"lines {', '.join(map(str, damaged))} damaged")
                if rewrite:
                    self._lines = 0     # the next change compacts first (a torn line, an older format)
            elif old.exists():
                # Converted at the first change (so a dry-run start writes nothing).
                for e in json.loads(old.read_text())["held"]:
                    h = _held(e)
                    self._held[(h.kind, h.target, h.knob)] = h
        except (OSError, ValueError, KeyError, TypeError) as e:
            # Keep the unreadable file for a human; starting empty is the only way forward.
            bad = self.path if self.path.exists() else old
            aside = bad.with_suffix(f"{bad.suffix}.corrupt.{int(time.time())}")
            log.error("%s: unreadable restore journal (%s); moved to %s", bad, e, aside)
            try:
                bad.rename(aside)
            except OSError:
                pass
            self._held.clear()
            self._lines = 0

    @staticmethod
    def _keep_aside(path: Path, why: str) -> None:
        """A copy of a journal read in part, for a human: the next change rewrites it without the damage."""
        aside = path.with_suffix(f"{path.suffix}.corrupt.{int(time.time())}")
        try:
            aside.write_bytes(path.read_bytes())
            log.error("%s: %s; the rest is kept, the file as it was is copied to %s", path, why, aside)
        except OSError as e:
            log.error("%s: %s; the rest is kept (no copy: %s)", path, why, e)

    def _append(self, record: dict) -> None:
        if self._fd is None:
            if self._lines == 0:
                self._compact()         # a new file starts with its header (and an older journal's entries)
                old = self.dir / self.V1_FILE
                if old.exists():
                    old.unlink()
                    log.info("%s: converted to %s", old, self.path)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        data = (json.dumps(record) + "\n").encode()
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            written = os.write(self._fd, data)
            if written != len(data):        # a full disk takes what fits: half a line
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({written} of {len(data)} bytes written)")
            os.fsync(self._fd)
        except OSError as e:
            self._cut_back(start)
            # Named, for the loop's error: a bare "[Errno 28]" would not say which disk is full.
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        self._lines += 1

    def _compact_if_due(self) -> None:
        """Compact once dead lines outnumber live ones. Called after a change is in memory too: a
        compaction rewrites the file from what is held, and one set off by a hold's own append would
        leave that hold out of the file (a kill -9 after its knob write: the knob changed, no entry)."""
        if self._lines > max(self.COMPACT_MIN, 4 * len(self._held)):
            try:
                self._compact()
            except OSError as e:            # the record is safe already; compaction is tried again later
                log.warning("%s: cannot compact the restore journal: %s", self.path, e)

    def _cut_back(self, size: int) -> None:
        """Take a record that failed half-way off the file: the next one must not land after half a line
        (that would make the whole file unreadable at the next start). If even that fails, the next
        change rewrites the file from what is held in memory."""
        try:
            os.ftruncate(self._fd, size)
            os.fsync(self._fd)
        except OSError:
            self.close()
            self._lines = 0

    def _compact(self) -> None:
        """Rewrite the file with only the live entries (atomically, durably)."""
        self.close()
        lines = [json.dumps({"version": self.VERSION})] + [json.dumps({"hold": asdict(h)}) for h in self._held.values()]
        write_atomic(self.path, "\n".join(lines) + "\n")
        self._lines = len(lines)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def get(self, target: str, knob: str, kind: str = "cgroup") -> Held | None:
        return self._held.get((kind, target, knob))

    def add(self, held: Held) -> None:
        """Persist an original before its knob is written: OSError (the file named) when it cannot be,
        and then the knob must not be written."""
        self._append({"hold": asdict(held)})
        self._held[(held.kind, held.target, held.knob)] = held
        self._compact_if_due()

    def remove(self, target: str, knob: str, kind: str = "cgroup") -> None:
        """Forget a knob that was put back (or is gone). A release that cannot be written (a full disk)
        leaves its hold on disk, which is safe: a fresh start finds the knob at its original and drops
        it. So it does not fail the restore, nor cut the restores that follow it short."""
        if self._held.pop((kind, target, knob), None) is None:
            return
        try:
            self._append({"release": {"kind": kind, "target": target, "knob": knob}})
        except OSError as e:
            log.error("%s: cannot record that %s %s is restored (%s); the entry stays on disk until the "
                      "journal can be rewritten", self.path, target or "/", knob, e)
            self.close()
            self._lines = 0             # the next change that can be written rewrites the file without it
            return
        self._compact_if_due()

    def entries(self, owner: str | None = None) -> list[Held]:
        """Held knobs, oldest first, optionally of one owner."""
        return [h for h in self._held.values() if owner is None or h.owner == owner]
