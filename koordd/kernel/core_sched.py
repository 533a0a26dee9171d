"""Core scheduling (CONFIG_SCHED_CORE, Linux 5.14+): prctl(PR_SCHED_CORE, ...) on one task at a time.

Tasks with different cookies never run at the same time on the two SMT siblings of a core: the kernel
forces a sibling idle instead (Documentation/admin-guide/hw-vuln/core-scheduling.rst). A cookie is an
object the kernel refcounts; user space sees it only as an id (a hash of its address, stable while it
lives) through PR_SCHED_CORE_GET.

The interface has no "clear" command. What it has (kernel/sched/core_sched.c, sched_core_share_pid):
- CREATE: a new cookie on a task (or its thread group / process group);
- SHARE_TO: the CALLING task's cookie onto another task: from a caller without a cookie, this clears
  the other task's (cookie 0 is "none"), which is how a cookie is removed;
- SHARE_FROM: another task's cookie onto the calling task (thread scope only);
- GET: a task's cookie id (0: none).
Errors: EINVAL for an unknown PR_SCHED_CORE (a kernel without CONFIG_SCHED_CORE refuses option 62
outright), ENODEV where the kernel has it but the machine has no SMT, ESRCH for a task gone, EPERM
without ptrace access to it.

Because SHARE_TO/SHARE_FROM act on the calling thread, `Prctl.run_as_carrier` runs them on a short-lived
thread of its own: koordd's own threads never take a workload's cookie (which would keep them off the
cores that workload's siblings run on), and the carrier's cookie dies with it.
"""
from __future__ import annotations

import ctypes
import errno
import os
import threading
from pathlib import Path
from typing import Callable, TypeVar

PR_SCHED_CORE = 62
PR_SCHED_CORE_GET, PR_SCHED_CORE_CREATE, PR_SCHED_CORE_SHARE_TO, PR_SCHED_CORE_SHARE_FROM = 0, 1, 2, 3
PIDTYPE_PID, PIDTYPE_TGID, PIDTYPE_PGID = 0, 1, 2

T = TypeVar("T")


class Prctl:
    """The four PR_SCHED_CORE commands on the real kernel (tests hand the backend a fake with the same
    methods). Each raises OSError with the kernel's errno."""

    def __init__(self):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

    def _call(self, cmd: int, pid: int, scope: int, addr: int = 0) -> None:
        if self._libc.prctl(PR_SCHED_CORE, cmd, pid, scope, addr) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def get(self, tid: int) -> int:
        """The cookie id of thread `tid` (0: the calling thread); 0 = no cookie."""
        out = ctypes.c_uint64(0)
        self._call(PR_SCHED_CORE_GET, tid, PIDTYPE_PID, ctypes.addressof(out))
        return out.value

    def create(self, tid: int) -> None:
        """A new cookie on thread `tid` alone."""
        self._call(PR_SCHED_CORE_CREATE, tid, PIDTYPE_PID)

    def share_to(self, tid: int) -> None:
        """The calling thread's cookie (none: clears) onto thread `tid`."""
        self._call(PR_SCHED_CORE_SHARE_TO, tid, PIDTYPE_PID)

    def share_from(self, tid: int) -> None:
        """Thread `tid`'s cookie onto the calling thread."""
        self._call(PR_SCHED_CORE_SHARE_FROM, tid, PIDTYPE_PID)

    def run_as_carrier(self, fn: Callable[[], T]) -> T:
        """`fn()` on a new thread, which starts with no cookie of its own where koordd's own threads have
        none (a thread inherits its creator's), and takes whatever it pulls with it when it ends."""
        out: list = []

        def body():
            try:
                out.append((True, fn()))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
                out.append((False, e))
        t = threading.Thread(target=body, name="koordd-core-sched", daemon=True)
        t.start()
        t.join()
        ok, value = out[0]
        if not ok:
            raise value
        return value


def probe(prctl=None) -> tuple[bool, str]:
    """Whether this kernel does core scheduling: PR_SCHED_CORE_GET on koordd itself."""
    try:
        (prctl or Prctl()).get(0)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False, "prctl(PR_SCHED_CORE) refused with EINVAL: the kernel has no CONFIG_SCHED_CORE (5.14+)"
        if e.errno == errno.ENODEV:
            return False, "the kernel has CONFIG_SCHED_CORE but this machine has no SMT (ENODEV): nothing to isolate"
        return False, f"prctl(PR_SCHED_CORE, GET) failed: {os.strerror(e.errno) if e.errno else e}"
    return True, "prctl(PR_SCHED_CORE) works (CONFIG_SCHED_CORE)"


def smt(sys_root: Path | str = "/sys") -> tuple[bool | None, str]:
    """(SMT active?, what /sys says): /sys/devices/system/cpu/smt/active and .../control."""
    base = Path(sys_root) / "devices/system/cpu/smt"
    try:
        active = (base / "active").read_text().strip()
    except OSError:
        return None, f"no {base}/active (kernel without CONFIG_HOTPLUG_SMT): SMT unknown"
    try:
        control = (base / "control").read_text().strip()
    except OSError:
        control = "unknown"
    return active == "1", f"SMT active: {'yes' if active == '1' else 'no'} (control {control})"
