"""Core scheduling on the real kernel: the core_sched backend gives the threads of a BE and an LS cgroup
one cookie per class, read back with PR_SCHED_CORE_GET thread by thread, brings a thread started later in
line, and clears them all again (the restore); koordd's own thread never takes a cookie.

Needs root, a kernel with CONFIG_SCHED_CORE (5.14+) and a machine with SMT: the kernel refuses
PR_SCHED_CORE with EINVAL without the option and ENODEV without SMT. Skipped with the probe's words
otherwise (this development VM: EINVAL, no CONFIG_SCHED_CORE, and no SMT either). Whether core scheduling
then keeps LS and BE off each other's siblings is the kernel's to do; this test proves the cookies only.
"""
from __future__ import annotations

import errno
import os
import sys

import pytest

from koordd.backends.core_sched import CoreSchedBackend
from koordd.kernel.cgroupfs import CgroupFS, detect_layout
from koordd.kernel.core_sched import Prctl, probe, smt
from koordtest.kernel import CGROUP_ROOT, wait_for

pytestmark = pytest.mark.kernel

# Two threads each: the cookie must reach every thread, not just the process's first.
THREADS = [sys.executable, "-c", "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); "
                                 "time.sleep(60)"]


@pytest.fixture(scope="module")
def prctl():
    ok, why = probe()
    if not ok:
        pytest.skip(f"{why}; {smt()[1]}")
    return Prctl()


def test_the_probe_agrees_with_the_kernel():
    """Runs everywhere: GET on ourselves either works, or fails with the errno the probe names."""
    ok, why = probe()
    try:
        Prctl().get(0)
        assert ok
    except OSError as e:
        assert not ok and e.errno in (errno.EINVAL, errno.ENODEV, errno.EPERM)
        assert ("CONFIG_SCHED_CORE" in why) == (e.errno == errno.EINVAL)


def tids(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def test_cookies_per_class_read_back_and_cleared(prctl, cgroups):
    fs = CgroupFS(detect_layout(CGROUP_ROOT))
    backend = CoreSchedBackend(fs, prctl=prctl)
    assert backend.probe() == {}
    be, ls = cgroups.spawn("be", THREADS), cgroups.spawn("ls", THREADS)
    assert wait_for(lambda: len(tids(be.pid)) == 2 and len(tids(ls.pid)) == 2, 10)      # two threads each
    be_cg, ls_cg = cgroups.cgroup("be"), cgroups.cgroup("ls")
    assert backend.read(be_cg, "core_sched") == "none"

    backend.write(be_cg, "core_sched", "BE")
    backend.write(ls_cg, "core_sched", "LS")
    be_ids = {prctl.get(t) for t in tids(be.pid)}
    ls_ids = {prctl.get(t) for t in tids(ls.pid)}
    assert len(be_ids) == 1 and len(ls_ids) == 1 and 0 not in be_ids | ls_ids and be_ids != ls_ids
    assert (backend.read(be_cg, "core_sched"), backend.read(ls_cg, "core_sched")) == ("BE", "LS")
    assert prctl.get(0) == 0                              # koordd's own thread took no cookie

    # A second BE process started later with no cookie: the next write brings it in line.
    late = cgroups.spawn("be", THREADS)
    assert wait_for(lambda: len(tids(late.pid)) == 2, 10)
    assert backend.read(be_cg, "core_sched") == "mixed"
    backend.write(be_cg, "core_sched", "BE")
    assert {prctl.get(t) for t in tids(late.pid)} == be_ids

    # The restore: the kernel's only way back is clearing.
    backend.write(be_cg, "core_sched", "none")
    backend.write(ls_cg, "core_sched", "none")
    assert {prctl.get(t) for p in (be, ls, late) for t in tids(p.pid)} == {0}
    assert backend.read(be_cg, "core_sched") == "none"
