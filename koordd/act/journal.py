"""Files under state_dir that must survive a crash: the restore journal and atomic writes.

The restore journal holds the original value of every knob koordd has changed,
written to disk *before* the knob is, so whoever starts next can explain and
undo every change. With each original it keeps which object the knob belonged
to (the target's identity: a cgroup's inode, a device's ifindex) and the values
koordd wrote, so a restore never lands on an object re-created since or on a
value someone else set after koordd.
"""
from __future__ import annotations

import errno
import itertools
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

log = logging.getLogger("koordd.state")     # its name before the move: log lines unchanged


def write_atomic(path: Path, text: str, durable: bool = True) -> None:
    """Replace `path` so a reader (or a crash) sees the old file or the new one, never half of one.
    durable=False skips the fsyncs, for files that are rewritten every tick and need not survive a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_beside(path)
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


_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_tmp_counter = itertools.count()


def _create_beside(path: Path) -> tuple[int, str]:
    """A new file (mode 0600) in `path`'s folder to write before it replaces `path`: tempfile.mkstemp's
    flags (never an existing file or a link planted there: O_EXCL, O_NOFOLLOW), named by pid and a counter,
    without tempfile (it imports shutil, bz2, lzma and random: 0.8 MB of RSS in every koordd). A name
    left by a koordd killed with the same pid is skipped."""
    for _ in range(1000):
        tmp = str(path.parent / f".{path.name}.{os.getpid()}.{next(_tmp_counter)}")
        try:
            return os.open(tmp, _TMP_FLAGS, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free name for a temporary file beside it", str(path))


@dataclass(frozen=True)
class Held:
    """A knob koordd changed: its value before koordd's first write, and the loop that owns it.
    `identity`: what the target was when koordd first wrote it (Backend.identity; None: not known, a
    journal of version 3 or older, or a backend without one). `written`: the values koordd may have
    left in the knob, newest last: one once a write is done, two between the record of a new value and
    its write (a crash there leaves either); empty when not known (version 3 or older, or a knob the
    kernel rewrites when koordd writes another: cpu.weight under cpu.idle)."""
    target: str                   # what its backend (kind) names: a cgroup path, a resctrl group, ...
    knob: str
    original: str
    owner: str
    since: float
    kind: str = "cgroup"
    identity: str | None = None
    written: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.target, self.knob)


class JournalUnreadable(ValueError):
    """A journal koordd cannot read whole (an unknown version, no header, a read error): starting
    without its holds would leave their knobs changed for good, so koordd refuses to start."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path}: {why}")
        self.path = path


class BadRecord(ValueError):
    pass


def _str(d: dict, name: str, optional: bool = False) -> str | None:
    v = d.get(name)
    if v is None and optional:
        return None
    if not isinstance(v, str) or (not v and name in ("knob", "kind")):
        raise BadRecord(f"{name} is {v!r}, not a{' non-empty' if name in ('knob', 'kind') else ''} string")
    return v


def _held(e: object) -> Held:
    """A hold record checked field by field: a wrong type is a BadRecord here, not an AttributeError
    in the restore that would crash every start."""
    if not isinstance(e, dict):
        raise BadRecord(f"hold is {type(e).__name__}, not an object")
    # Journals before version 3 (and 0.1's originals.json) held cgroups only, named "cgroup".
    target = _str(e, "target" if "target" in e else "cgroup")
    since = e.get("since")
    if isinstance(since, bool) or not isinstance(since, (int, float)) or not math.isfinite(since):
        raise BadRecord(f"since is {since!r}, not a number")
    written = e.get("written", [])
    if not isinstance(written, list) or not all(isinstance(w, str) for w in written) or len(written) > 2:
        raise BadRecord(f"written is {written!r}, not a list of at most two strings")
    return Held(target, _str(e, "knob"), _str(e, "original"), _str(e, "owner"), float(since),
                _str(e, "kind") if "kind" in e else "cgroup", _str(e, "identity", optional=True), tuple(written))


def _key(r: object) -> tuple[str, str, str]:
    if not isinstance(r, dict):
        raise BadRecord(f"record is {type(r).__name__}, not an object")
    return (_str(r, "kind") if "kind" in r else "cgroup", _str(r, "target" if "target" in r else "cgroup"),
            _str(r, "knob"))


def _apply(held: dict[tuple[str, str, str], Held], record: object) -> None:
    """One journal line onto the held knobs; BadRecord if it is not one koordd writes."""
    if not isinstance(record, dict) or len(record) != 1:
        raise BadRecord("not a record of one hold, wrote or release")
    (what, body), = record.items()
    if what == "hold":
        h = _held(body)
        held[h.key] = h
    elif what == "release":
        held.pop(_key(body), None)
    elif what == "wrote":
        key, values = _key(body), body.get("values")
        if not isinstance(values, list) or len(values) > 2 or not all(isinstance(v, str) for v in values):
            raise BadRecord(f"values is {values!r}, not a list of at most two strings")
        if key in held:
            held[key] = replace(held[key], written=tuple(values))
    else:
        raise BadRecord(f"unknown record {what!r}")


def _replay(path: Path) -> tuple[dict[tuple[str, str, str], Held], int, bool, list[int]]:
    """The journal's held knobs, its line count, whether it must be rewritten before the next
    append, and its damaged lines. Rewritten: its last line was torn (a crash mid-append; that line is
    dropped, its write never completed, nor the knob write to follow it), a line before it is damaged
    or of the wrong shape (skipped: the records around it still hold originals; a lost release only
    means a restore that finds the knob already back), it does not end with a newline (the next append
    would run on), or it is of an older version. JournalUnreadable when it cannot be read at all, or
    its header is not one of a version this koordd reads (a newer koordd's: a downgrade)."""
    held: dict[tuple[str, str, str], Held] = {}
    damaged: list[int] = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise JournalUnreadable(path, f"cannot be read: {getattr(e, 'strerror', None) or e}") from None
    if text == "":
        log.warning("%s: empty; no knob is held", path)
        return held, 0, True, damaged
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    try:
        header = json.loads(lines[0])
    except ValueError:
        header = None
    if header not in [{"version": v} for v in RestoreJournal.READS]:
        raise JournalUnreadable(path, f"header {lines[0][:80]!r} is not a journal version this koordd reads "
                                      f"({', '.join(map(str, RestoreJournal.READS))}): written by another "
                                      f"koordd (a newer one?) or damaged")
    for n, line in enumerate(lines[1:], 2):
        try:
            record = json.loads(line)
        except ValueError as e:
            if n == len(lines):
                log.warning("%s:%d: torn last record dropped (%s)", path, n, e)
                return held, n, True, damaged
            log.error("%s:%d: damaged record set aside (%s): %r", path, n, e, line[:120])
            damaged.append(n)
            continue
        try:
            _apply(held, record)
        except BadRecord as e:
            log.error("%s:%d: record of the wrong shape set aside (%s): %r", path, n, e, line[:120])
            damaged.append(n)
    rewrite = bool(damaged) or header["version"] != RestoreJournal.VERSION or not text.endswith("\n")
    return held, len(lines), rewrite, damaged


def _replay_v1(path: Path) -> tuple[dict[tuple[str, str, str], Held], list[int]]:
    """koordd 0.1's originals.json: its holds, and the positions of entries of the wrong shape."""
    try:
        entries = json.loads(path.read_text())["held"]
        if not isinstance(entries, list):
            raise TypeError(f"held is {type(entries).__name__}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise JournalUnreadable(path, f"cannot be read: {getattr(e, 'strerror', None) or e}") from None
    held, damaged = {}, []
    for i, e in enumerate(entries):
        try:
            h = _held(e)
            held[h.key] = h
        except BadRecord as why:
            log.error("%s: entry %d of the wrong shape set aside (%s)", path, i, why)
            damaged.append(i)
    return held, damaged


def read_held(state_dir: Path | str) -> tuple[list[dict], Path] | None:
    """The held knobs as dicts and the file they came from, for readers (koordctl, tests); None when
    koordd has none. Reads a 0.1 journal (originals.json) too. JournalUnreadable if broken."""
    d = Path(state_dir)
    path = d / RestoreJournal.FILE
    if path.exists():
        return [asdict(h) for h in _replay(path)[0].values()], path
    old = d / RestoreJournal.V1_FILE
    if old.exists():
        return [asdict(h) for h in _replay_v1(old)[0].values()], old
    return None


def _aside(path: Path, tag: str) -> Path:
    """A free name next to `path` for a copy kept for a human: two in one second must not overwrite."""
    base = path.with_name(f"{path.name}.{tag}.{int(time.time())}")
    candidate, n = base, 0
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = base.with_name(f"{base.name}.{n}")
    return candidate


def sweep_temporaries(directory: Path, names: tuple[str, ...]) -> None:
    """write_atomic's temporary files of `names` in `directory` that a kill -9 left behind. Only one
    koordd writes a state_dir (the owner lock), so none of them is in use."""
    prefixes = tuple(f".{n}." for n in names)
    try:
        found = [n for n in os.listdir(directory) if n.startswith(prefixes)]
    except FileNotFoundError:
        return
    for name in found:
        try:
            os.unlink(directory / name)
            log.info("%s: removed %s, left by a write that was cut short", directory, name)
        except OSError:
            pass


def note_move(new_dir: Path | str, old_dir: Path | str) -> None:
    """Say in `new_dir` that holds may still be in the journal of `old_dir` (the state_dir before a
    config change): the next RestoreJournal on `new_dir` carries them over, so a crash between the
    change and a clean stop abandons none."""
    new, old = Path(new_dir), Path(old_dir).absolute()
    if new.absolute() == old:
        return
    path = new / RestoreJournal.MOVED_FROM
    try:
        dirs = json.loads(path.read_text())
        dirs = [d for d in dirs if isinstance(d, str)] if isinstance(dirs, list) else []
    except (OSError, ValueError):
        dirs = []
    if str(old) not in dirs:
        write_atomic(path, json.dumps(dirs + [str(old)]) + "\n")


class RestoreJournal:
    """Append-only: one fsynced line per change ({"hold": ...} before a knob is first written, {"wrote":
    ...} before koordd writes it another value, {"release": ...} after it is restored), compacted when
    dead lines outnumber live ones. A journal of an older version (3: no identity nor written values;
    2: "cgroup" for "target"; 0.1's originals.json) is read and rewritten at the first change. One
    koordd cannot read (a newer version, no header) is never discarded: JournalUnreadable."""
    FILE = "originals.jsonl"
    V1_FILE = "originals.json"
    MOVED_FROM = "moved-from.json"  # state_dirs whose journals are carried over here (note_move)
    MAX_CARRIED = 64                # state_dirs followed through moved-from.json files, at most
    VERSION = 4                     # 4: identity and written values; 3: targets of any kind; 2: cgroups
    READS = (2, 3, 4)
    COMPACT_MIN = 64                # lines before compaction is considered

    def __init__(self, state_dir: Path | str):
        self.dir = Path(state_dir)
        self.path = self.dir / self.FILE
        self._held: dict[tuple[str, str, str], Held] = {}
        self._lines = 0                         # lines in the file; 0: rewrite it before the next append
        self._fd: int | None = None
        self._file: tuple[int, int] | None = None    # (st_dev, st_ino) of the file memory agrees with
        self._carried: list[Path] = []          # journals whose holds are carried here: moved aside once written
        self._load()

    def _load(self) -> None:
        old = self.dir / self.V1_FILE
        if self.path.exists():
            self._file = _file_id(self.path)
            self._held, self._lines, rewrite, damaged = _replay(self.path)
            if damaged:
                self._keep_aside(self.path, f"lines {', '.join(map(str, damaged))} damaged")
            if rewrite:
                self._lines = 0     # the next change compacts first (a torn line, an older format)
        elif old.exists():
            # Converted at the first change (so a dry-run start writes nothing).
            self._held, damaged = _replay_v1(old)
            if damaged:
                self._keep_aside(old, f"entries {', '.join(map(str, damaged))} damaged")
            self._carried.append(old)
        self._carry_over()

    def _carry_over(self) -> None:
        """The holds of journals in state_dirs used before this one (note_move): merged into memory
        now, written here at the first change, then moved aside there."""
        try:
            dirs = json.loads((self.dir / self.MOVED_FROM).read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            raise JournalUnreadable(self.dir / self.MOVED_FROM, f"cannot be read: {e}") from None
        for d in self._moved_from_chain(dirs):
            path = Path(d) / self.FILE
            if path.exists():
                held = _replay(path)[0]
            elif (path := Path(str(d)) / self.V1_FILE).exists():
                held = _replay_v1(path)[0]
            else:
                continue
            for key, h in held.items():
                ours = self._held.get(key)
                # Both hold it: the earlier hold saw the knob before either run wrote it.
                if ours is None or h.since < ours.since and h.identity in (None, ours.identity):
                    self._held[key] = h if ours is None else replace(h, written=ours.written, owner=ours.owner)
            log.warning("%s: %d held knob(s) carried over from %s, the state_dir before this one",
                        self.path, len(held), path)
            self._carried.append(path)
        self._carried.append(self.dir / self.MOVED_FROM)
        self._lines = 0

    def _moved_from_chain(self, dirs) -> list[str]:
        """The state_dirs `dirs` names and, in turn, those their own moved-from.json names (a koordd on
        a carried state_dir that crashed before its first change had not merged them yet): each once,
        this one's own never, at most MAX_CARRIED."""
        here, out, todo = str(self.dir.absolute()), [], list(dirs) if isinstance(dirs, list) else []
        while todo and len(out) < self.MAX_CARRIED:
            d = todo.pop(0)
            if not isinstance(d, str) or not d or str(Path(d).absolute()) in (here, *out):
                continue
            out.append(str(Path(d).absolute()))
            try:
                more = json.loads((Path(d) / self.MOVED_FROM).read_text())
            except (OSError, ValueError):
                continue        # none there (the usual case), or unreadable: its own journal is read all the same
            todo += more if isinstance(more, list) else []
        return out

    @staticmethod
    def _keep_aside(path: Path, why: str) -> None:
        """A copy of a journal read in part, for a human: the next change rewrites it without the damage."""
        try:
            aside = _aside(path, "corrupt")
            with open(aside, "xb") as f:
                f.write(path.read_bytes())
            log.error("%s: %s; the rest is kept, the file as it was is copied to %s", path, why, aside)
        except OSError as e:
            log.error("%s: %s; the rest is kept (no copy: %s)", path, why, e)

    def _current(self) -> None:
        """Make the open file the one at the path, agreeing with memory, before appending: the path may
        have been replaced (an editor, a restore from a backup: appending to the open file would write
        to a deleted one) or removed since koordd last wrote it."""
        try:
            on_disk = _file_id(self.path)
        except FileNotFoundError:
            on_disk = None
        if self._lines and on_disk is not None and on_disk == self._file:
            return
        self.close()
        if self._lines and self._file is not None:
            if on_disk is None:
                log.error("%s: removed by someone else; written again from the %d knob(s) koordd holds",
                          self.path, len(self._held))
            else:
                self._merge_replaced()
        self._compact()

    def _merge_replaced(self) -> None:
        """Another file took the journal's place: its holds that koordd does not know are added (a restore
        still checks each against the knob), then the file is rewritten from memory."""
        try:
            theirs = _replay(self.path)[0]
        except JournalUnreadable as e:
            aside = _aside(self.path, "replaced")
            log.error("%s; replaced by someone else: kept as %s, and written again from the %d knob(s) koordd "
                      "holds", e, aside, len(self._held))
            try:
                self.path.rename(aside)
            except OSError:
                pass
            return
        new = {k: h for k, h in theirs.items() if k not in self._held}
        self._held.update(new)
        log.error("%s: replaced by someone else; rewritten with the %d knob(s) koordd holds and %d more it held",
                  self.path, len(self._held) - len(new), len(new))

    def _append(self, record: dict, durable: bool = True) -> None:
        self._current()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        data = (json.dumps(record) + "\n").encode()
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            written = os.write(self._fd, data)
            if written != len(data):        # a full disk takes what fits: half a line
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({written} of {len(data)} bytes written)")
            if durable:
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
        """Rewrite the file with only the live entries (atomically, durably); then move aside the journals
        whose holds it now carries, and remove what compactions a kill -9 cut short left behind."""
        self.close()
        lines = [json.dumps({"version": self.VERSION})]
        lines += [json.dumps({"hold": _record(h)}) for h in self._held.values()]
        self._sweep_temporaries()
        write_atomic(self.path, "\n".join(lines) + "\n")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        st = os.fstat(self._fd)
        self._file, self._lines = (st.st_dev, st.st_ino), len(lines)
        for path in self._carried:
            try:
                if path.parent == self.dir:         # 0.1's file converted, the note of a move followed
                    path.unlink()
                    log.info("%s: its holds are in %s now", path, self.path)
                else:
                    path.rename(aside := _aside(path, "carried-over"))
                    log.info("%s: its holds are in %s now; kept as %s", path, self.path, aside)
            except FileNotFoundError:
                pass
            except OSError as e:    # read again at the next start: the holds are the same, no harm
                log.warning("%s: its holds are in %s now, but it cannot be moved aside: %s", path, self.path, e)
        self._carried = []

    def _sweep_temporaries(self) -> None:
        """write_atomic's temporary files of this journal that a kill -9 mid-compaction left behind."""
        sweep_temporaries(self.dir, (self.FILE,))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def get(self, target: str, knob: str, kind: str = "cgroup") -> Held | None:
        return self._held.get((kind, target, knob))

    def add(self, held: Held) -> None:
        """Persist an original before its knob is written: OSError (the file named) when it cannot be,
        and then the knob must not be written. Replaces a hold of the same knob (a re-created target)."""
        self._append({"hold": _record(held)})
        self._held[held.key] = held
        self._compact_if_due()

    def wrote(self, target: str, knob: str, kind: str, values: tuple[str, ...]) -> None:
        """Persist, before the write, the values koordd may leave in a knob it holds: the one before and
        the one it is about to write (a crash between this line and the write leaves either); none when
        it cannot know (the kernel is about to rewrite it as a side effect). OSError: do not write."""
        key = (kind, target, knob)
        values = list(dict.fromkeys(values))
        # Not fsynced: in the page cache it outlives a killed koordd, and what could lose the page cache
        # (the host going down) takes the knob with it: cgroups, qdiscs and resctrl groups are made anew
        # at boot (another identity), so no record of a value written there is wanted.
        self._append({"wrote": {"kind": kind, "target": target, "knob": knob, "values": values}}, durable=False)
        self._held[key] = replace(self._held[key], written=tuple(values))
        self._compact_if_due()

    def settle(self, target: str, knob: str, kind: str, written: tuple[str, ...]) -> None:
        """The values koordd may have left in the knob, now that a write is done (or failed): kept in
        memory only, the file naming them already (with one more, harmless); the next compaction agrees."""
        key = (kind, target, knob)
        if key in self._held:
            self._held[key] = replace(self._held[key], written=tuple(written))

    def remove(self, target: str, knob: str, kind: str = "cgroup") -> None:
        """Forget a knob that was put back (or is gone). A release that cannot be written (a full disk)
        leaves its hold on disk, which is safe: a fresh start finds the knob at its original, or at a
        value koordd did not write, and drops it. So it does not fail the restore, nor cut the restores
        that follow it short."""
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


def _record(h: Held) -> dict:
    return {**asdict(h), "written": list(h.written)}


def _file_id(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino
