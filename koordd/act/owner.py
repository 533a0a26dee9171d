"""One koordd per host owns the knobs: an flock(2) on /run/koordd/owner.lock.

Each koordd journals only its own writes. Two of them on one host (a second instance, `koordd --once`
beside the running service, a pod beside koordd.service) take each other's changes for originals, and
each ends with a knob changed and nothing in its journal to undo it. So every koordd that may write
takes this lock before it touches anything, and one that finds it taken refuses, naming the holder.
--dry-run writes no knob and takes none.

Why this lock, and there:
- One fixed path whatever the config says: per host, not per state_dir or config.
- /run is the host's tmpfs: the file goes at reboot, with every process that could hold it. The unit
  makes /run/koordd (RuntimeDirectory=, kept between runs by RuntimeDirectoryPreserve=, as ProtectSystem=
  strict leaves the rest of /run read-only); the DaemonSet mounts the host's /run/koordd, so a pod and a
  host service lock one file.
- The kernel drops an flock when its holder dies, kill -9 included: no stale lock to clear. The file is
  never removed (a removed locked file would let the next koordd lock a new file of the same name).
- Not an abstract unix socket: its name is per network namespace (a pod without hostNetwork, a unit
  with PrivateNetwork= would each get their own), and any user may bind it first, to squat it or to pose
  as the holder. This file lies in a directory only root may write.
The holder writes into the file who it is: pid, command, config, state_dir and since when.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from koordd.core.trust import untrusted_always

PATH = Path("/run/koordd/owner.lock")
# Test-only, as trust.SKIP_ENV: test runs on one host (in parallel, beside a koordd service) each lock a
# file of their own. Never set in a unit file.
TEST_ENV = "KOORDD_TEST_OWNER_LOCK"


def lock_path() -> Path:
    return Path(os.environ.get(TEST_ENV) or PATH)


@dataclass(frozen=True)
class Holder:
    """Who holds the lock, as it wrote into the file (fields it has not written yet are None)."""
    pid: int | None
    config: str | None = None
    state_dir: str | None = None
    since: float | None = None
    command: str | None = None
    # State_dirs of holders before this one whose journals may still hold knobs and have not been carried
    # into this holder's state_dir yet (OwnerLock.carried): a start refused before that passes them on.
    carry_from: tuple[str, ...] = ()

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)) if self.since else "unknown"
        return (f"koordd pid {self.pid if self.pid is not None else '(unknown)'} ({self.command or 'command unknown'}; "
                f"config {self.config or 'unknown'}, state_dir {self.state_dir or 'unknown'}, since {when})")


class HostOwned(Exception):
    """Another koordd holds the lock: this one must not write."""

    def __init__(self, holder: Holder, path: Path, detail: str = ""):
        self.holder, self.path = holder, path
        super().__init__(detail or f"{holder.describe()} owns this host's knobs (it holds {path}); this koordd "
                         "writes nothing: stop that one first, or run this one with --dry-run")


class UntrustedLock(Exception):
    """The lock's file or directory could be changed by someone other than root."""


class OwnerLock:
    """The lock, held: released by release() or when this process ends, however it ends."""

    def __init__(self, fd: int, path: Path, previous: Holder | None = None, record: dict | None = None):
        self.fd: int | None = fd
        self.path = path
        # Who held the host before, as the file still says: a koordd killed with holds in a state_dir
        # other than this one's left them there (the daemon carries them over: state.note_move).
        self.previous = previous
        self.record = dict(record or {})

    @property
    def carry_from(self) -> tuple[str, ...]:
        """The state_dirs whose holds this holder must carry over: the one before it used and those its
        own predecessors had not carried yet (a start refused before carrying them, an untrusted
        state_dir fixed since), oldest first."""
        return tuple(self.record.get("carry_from", ()))

    def carried(self, left: list[str] | tuple[str, ...] = ()) -> None:
        """The holds of carry_from are noted in this holder's state_dir (journal.note_move, on disk),
        but for those `left` (not trusted now): the next holder need only look there."""
        if self.fd is not None and list(self.record.get("carry_from", ())) != list(left):
            self.record["carry_from"] = list(left)
            _write_record(self.fd, self.record)

    @classmethod
    def take(cls, config: Path | str, state_dir: Path | str, path: Path | None = None) -> "OwnerLock":
        """Take the lock and write who holds it. HostOwned when another process holds it, UntrustedLock
        when it is not root's alone, OSError when it cannot be made at all."""
        path = lock_path() if path is None else Path(path)
        if not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(path.parent, 0o755)        # koordctl status, as any user, may read who holds it
        why = untrusted_always(path.parent)
        if why:
            raise UntrustedLock(f"{path}: {why}")
        for _ in range(3):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            try:
                st = os.fstat(fd)
                _check(path, st)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise HostOwned(_holder(fd, st), path) from None
                try:
                    now = os.stat(path)
                except FileNotFoundError:
                    now = None
                if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                    os.close(fd)        # locked a file someone removed or replaced meanwhile: lock the new one
                    continue
                previous = _holder(fd, st)
                # Until this koordd has carried them over, the state_dirs before it stay in the file: a
                # start refused after taking the lock (an untrusted state_dir, an unreadable journal) must
                # not make the next one forget where the holds are.
                before = [*previous.carry_from, *([previous.state_dir] if previous.state_dir else [])]
                here = os.path.realpath(state_dir)
                carry = [d for i, d in enumerate(before) if d not in before[:i] and os.path.realpath(d) != here]
                record = {"pid": os.getpid(), "command": " ".join(sys.argv), "config": str(config),
                          "state_dir": str(state_dir), "since": time.time(), "carry_from": carry}
                _write_record(fd, record)
                return cls(fd, path, previous if previous.pid is not None else None, record)
            except BaseException:
                os.close(fd)
                raise
        raise UntrustedLock(f"{path} was replaced three times while koordd locked it")

    def __del__(self) -> None:
        self.release()

    def release(self) -> None:
        """Closing the file drops the lock; what it says stays until the next holder writes its own."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _write_record(fd: int, record: dict) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    os.fchmod(fd, 0o644)            # readable whatever koordd's umask (077)


def _check(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedLock(f"{path} is not a regular file")
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedLock(f"{path} may be written by others than root (uid {st.st_uid}, mode "
                            f"{stat.S_IMODE(st.st_mode):04o})")


def _holder(fd: int, st: os.stat_result) -> Holder:
    """What the holder wrote; its pid from /proc/locks where it has written nothing yet."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict):
        record = {}

    def field(name, kind):
        v = record.get(name)
        return v if isinstance(v, kind) and not isinstance(v, bool) else None

    pid = field("pid", int)
    if pid is None:
        pid = _locker(st)
    since = field("since", (int, float))
    carry = record.get("carry_from")
    carry = tuple(d for d in carry if isinstance(d, str) and d)[:64] if isinstance(carry, list) else ()
    return Holder(pid, field("config", str), field("state_dir", str), float(since) if since else None,
                  field("command", str), carry)


def _locker(st: os.stat_result) -> int | None:
    """The pid /proc/locks gives for the flock on this file (in this PID namespace), if any."""
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == want and parts[4].isdigit():
                    return int(parts[4])
    except OSError:
        pass
    return None


def current_holder(path: Path | None = None) -> Holder | None:
    """Who holds the lock now, None when nobody does; read without taking it (a koordd starting meanwhile
    must not find it taken by a reader)."""
    path = lock_path() if path is None else Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP):
            return None
        raise
    try:
        st = os.fstat(fd)
        if _locker(st) is None:
            return None
        return _holder(fd, st)
    finally:
        os.close(fd)
