"""core_sched under systemd on pure cgroup v2 (scripts/vmtest's VM): `koordctl doctor`'s core_sched row
says what the kernel and the machine offer, and agrees with the kernel's own answer to
prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET) (this module's ctypes call, not koordd's).

What this VM cannot show, plainly: its kernel, Debian sid's cloud flavour (7.2.13+deb14-cloud-amd64,
checked 2026-11), is built with "# CONFIG_SCHED_CORE is not set", so every PR_SCHED_CORE command is
refused (EINVAL), and the VM (`-smp 2`) has no SMT, without which a kernel that has the option refuses
too (ENODEV). So no cookie can be set or read back here; tests/kernel/test_core_sched_kernel.py does that
on a host kernel with the option. The daemon-level tests (cookies per class under systemd, a late thread,
stop clears them; two emulated siblings never running LS and BE at once) are written on branch
wip-core-sched-vm, for a VM kernel with CONFIG_SCHED_CORE and KOORDD_VMTEST_SMP=2,sockets=1,cores=1,threads=2.
What core scheduling is for (LS never sharing a core's caches and pipelines with BE) cannot be measured
under TCG at all: its "siblings" share nothing but the host thread that emulates both.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from . import vm
from .test_doctor import doctor

pytestmark = vm.only_in_vm

PR_SCHED_CORE, PR_SCHED_CORE_GET, PIDTYPE_PID = 62, 0, 0
LOOP = "core_sched"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def cookie(tid: int) -> int:
    """Thread `tid`'s core-scheduling cookie id (0: none); OSError with the kernel's errno."""
    out = ctypes.c_uint64(0)
    if _libc.prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, tid, PIDTYPE_PID, ctypes.addressof(out)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return out.value


def test_doctor_reports_core_sched_and_smt():
    row = doctor()[LOOP]
    smt = Path("/sys/devices/system/cpu/smt/active")
    assert smt.exists(), f"the VM's kernel has no {smt} (CONFIG_HOTPLUG_SMT); doctor: {row}"
    smt_active = smt.read_text().strip()
    assert f"SMT active: {'yes' if smt_active == '1' else 'no'}" in row["detail"], row
    try:
        cookie(0)
        works = True
    except OSError:
        works = False
    assert row["available"] == works, (row, works)
    if works:
        assert "CONFIG_SCHED_CORE" in row["detail"], row
