"""cgroup.kill where the kernel has none (cgroup v1): kill every task of a memory cgroup and below,
without a task that forks a successor slipping through and without hitting a process that only
reuses a listed PID.

Signalling the listed tasks one by one loses to a process that forks a child and exits: by the time
its PID is signalled, the child (not listed when the file was read) runs on. So:

1. freeze the cgroup in the v1 freezer hierarchy (the same path under /sys/fs/cgroup/freezer) and wait
   until it reads FROZEN: no task of it runs, so none forks or exits;
2. SIGKILL every task of the memory subtree;
3. thaw it (only where it was THAWED before: a cgroup someone froze stays frozen, and its owner thaws
   it), so the killed tasks die;
4. repeat passes until one finds no task not already killed (bounded): tasks outside the freezer
   subtree, and the whole kill where the freezer hierarchy is not mounted or lacks the cgroup.

Each task is signalled through a pidfd (os.pidfd_open, signal.pidfd_send_signal: Linux 5.3+) opened
after the list was read, and only when a second read still lists it: the pidfd names one process for
good, so a PID freed and reused by another process between the read and the signal is never hit.
Without pidfds, kill(2) after the same second read (the window is narrower, not closed).

Not guaranteed: a crash (kill -9) between the freeze and the thaw leaves the cgroup frozen (the kill
is a command, not a held knob: nothing journals it); without a freezer, a chain of processes each
forking its successor faster than a pass may outlast the passes (the write then fails with EBUSY).
"""
from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

from koordd.kernel.cgroupfs import CgroupFS, CgroupGone, thread_ids

FREEZE_POLLS = 200          # freezer.state reads while FREEZING, FREEZE_POLL apart: ~1 s at most
FREEZE_POLL = 0.005
MAX_PASSES = 100
QUIET_PASSES = 2            # passes in a row that find no task not killed yet: the subtree is done


def kill_v1(fs: CgroupFS, cgroup: str) -> None:
    base = fs.dir("memory", cgroup)
    if base is None or not base.is_dir():
        raise CgroupGone(cgroup)
    killed: dict[int, object] = {}          # pid -> its pidfd (or the pid, without pidfds)
    try:
        before = _freeze(fs, cgroup)
        if before is not None:
            try:
                _pass(base, killed)
            finally:
                if before == "THAWED":
                    fs.write("freezer", cgroup, "freezer.state", "THAWED")
        quiet = 0
        for _ in range(MAX_PASSES):
            quiet = quiet + 1 if _pass(base, killed) == 0 else 0
            if quiet >= QUIET_PASSES:
                return
        raise OSError(errno.EBUSY, f"tasks of {cgroup} kept appearing through {MAX_PASSES} kill passes "
                                   "(no v1 freezer to stop them)")
    finally:
        for handle in killed.values():
            _close(handle)


def _freeze(fs: CgroupFS, cgroup: str) -> str | None:
    """Freeze the cgroup in the v1 freezer hierarchy; its state before (THAWED, FREEZING, FROZEN), or
    None where there is no freezer cgroup of that path. Waits, bounded, until it reads FROZEN."""
    if "freezer" not in fs.layout.v1 or not fs.exists("freezer", cgroup):
        return None
    try:
        before = fs.read("freezer", cgroup, "freezer.state").strip()
        fs.write("freezer", cgroup, "freezer.state", "FROZEN")
    except (OSError, ValueError):
        return None         # gone meanwhile, or refused: the passes alone
    for _ in range(FREEZE_POLLS):
        try:
            if fs.read("freezer", cgroup, "freezer.state").strip() == "FROZEN":
                break
        except OSError:
            break
        time.sleep(FREEZE_POLL)
    # Still FREEZING (a task in uninterruptible sleep): kill what is there, the passes do the rest.
    return before


def _listed(base: Path) -> set[int]:
    """Every PID in cgroup.procs of `base` and below."""
    out: set[int] = set()
    for procs in sorted(base.rglob("cgroup.procs")):
        try:
            out.update(thread_ids(procs.read_text(errors="replace"), str(procs)))
        except OSError:             # gone meanwhile, or garbled (GarbledFile): the other cgroups still die
            continue
    return out


def _pass(base: Path, killed: dict[int, object]) -> int:
    """SIGKILL every listed task not killed yet; how many were."""
    fresh = {}
    for pid in _listed(base):
        if pid in killed and _alive(killed[pid]):
            continue                # killed already, dying (a task with SIGKILL pending forks no more)
        handle = _open(pid)
        if handle is not None:
            fresh[pid] = handle
    if not fresh:
        return 0
    still = _listed(base)           # a PID reused between the first read and the open is not in the cgroup
    n = 0
    for pid, handle in fresh.items():
        if pid in still and _send(handle, signal.SIGKILL):
            if pid in killed:
                _close(killed[pid])
            killed[pid] = handle
            n += 1
        else:
            _close(handle)
    return n


def _open(pid: int) -> object | None:
    """A pidfd for `pid` (an int fd), the pid itself as ("pid", pid) without pidfds, None when it is gone."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except (AttributeError, OSError):   # no pidfds (Python, or a kernel before 5.3: ENOSYS), or no fd left
        return ("pid", pid)


def _send(handle: object, sig: int) -> bool:
    try:
        if isinstance(handle, tuple):
            os.kill(handle[1], sig)
        else:
            signal.pidfd_send_signal(handle, sig)
        return True
    except ProcessLookupError:
        return False


def _alive(handle: object) -> bool:
    return _send(handle, 0)


def _close(handle: object) -> None:
    if not isinstance(handle, tuple):
        os.close(handle)
