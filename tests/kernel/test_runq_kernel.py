"""Run-queue latency on the real kernel, both sources at once over the same window: three busy loops
sharing one CPU (ls) against one thread that sleeps and wakes on the other CPU (be)."""
from __future__ import annotations

import ctypes
import os
import shutil
import sys
import time

import pytest

from koordd.sensors.contract import SensorContext, SensorUnavailable
from koordd.sensors.runq import EBPF, RunqLatencySensor, SCHEDSTAT

from koordtest.kernel import NCPU

pytestmark = pytest.mark.kernel
WINDOW = 3.0
SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.005)"]    # ~200 wakeups a second


def started(source: str) -> RunqLatencySensor:
    sensor = RunqLatencySensor(sources=(source,))
    try:
        sensor.start()
    except SensorUnavailable as e:
        if source == EBPF and os.environ.get("KOORDD_REQUIRE_EBPF"):
            pytest.fail(f"scripts/test set this host up for eBPF, yet: {e}")
        pytest.skip(f"run-queue latency from {source} unavailable here: {e}")
    return sensor


@pytest.fixture
def contended(cgroups):
    """ls: three busy loops on CPU 0; be: a sleeper on CPU 1; be/empty: a cgroup with no task."""
    if NCPU < 2 or shutil.which("taskset") is None:
        pytest.skip("needs 2 CPUs and taskset to keep the two cgroups' threads apart")
    if cgroups.mode == "hybrid":
        empty = cgroups.roles["unified"] / cgroups.name / "be" / "empty"
    else:
        empty = cgroups.roles["cpu"] / cgroups.name / "be" / "empty"
    empty.mkdir()
    try:
        for _ in range(3):
            cgroups.spawn("ls", ["taskset", "-c", "0"] + ["/bin/sh", "-c", "while :; do :; done"])
        cgroups.spawn("be", ["taskset", "-c", "1"] + SLEEPER)
        time.sleep(0.5)                     # everyone running and settled in its cgroup
        yield cgroups, {cgroups.name: "", cgroups.cgroup("ls"): "LS", cgroups.cgroup("be"): "BE",
                        cgroups.cgroup("be") + "/empty": "BE"}
    finally:
        empty.rmdir()


def test_contended_threads_wait_longer_in_both_sources_and_the_sources_agree(contended):
    env, paths = contended
    ebpf, schedstat = started(EBPF), started(SCHEDSTAT)
    try:
        assert (ebpf.kind, schedstat.kind) == (EBPF, SCHEDSTAT)
        # schedstat reads only the latency-sensitive classes' cgroups (the waits the loops read): to
        # compare the sources on the sleeper too, both cgroups are LS to it.
        as_ls = {p: "LS" if cls else cls for p, cls in paths.items()}
        for s, classes in ((ebpf, paths), (schedstat, as_ls)):
            s.sample(SensorContext(time.monotonic(), classes))    # baseline
        time.sleep(WINDOW)
        by_ebpf = ebpf.sample(SensorContext(time.monotonic(), paths))
        by_schedstat = schedstat.sample(SensorContext(time.monotonic(), as_ls))
        only_ls = schedstat.sample(SensorContext(time.monotonic(), paths))
    finally:
        ebpf.stop()
        schedstat.stop()
    ls, be, parent = (by_ebpf.get(p) for p in (env.cgroup("ls"), env.cgroup("be"), env.name))
    s_ls, s_be = by_schedstat.get(env.cgroup("ls")), by_schedstat.get(env.cgroup("be"))
    print(f"\n[kernel] run-queue latency over {WINDOW:g}s, 3 busy loops on one CPU (ls) vs a sleeper (be):"
          f"\n  ebpf      ls {ls}\n            be {be}\n  schedstat ls {s_ls}\n            be {s_be}")
    assert ls is not None and be is not None and s_ls is not None and s_be is not None

    # Three loops sharing a CPU wait for each other's slices: milliseconds; the sleeper, microseconds.
    assert ls.p99_us >= 1000 and ls.mean_us >= 500, ls
    # (The sleeper's p99 catches whatever else ran on its CPU now and then: only its mean and median
    # stand far below; its p99 still below the loops'.)
    assert be.p99_us < ls.p99_us and be.p50_us < ls.p50_us / 4 and be.mean_us < ls.mean_us / 4, (be, ls)
    assert s_ls.mean_us >= 500 and s_be.mean_us < s_ls.mean_us / 4, (s_be, s_ls)
    # The two sources measure the same waits: the same order of magnitude.
    assert 0.1 <= ls.mean_us / s_ls.mean_us <= 10, (ls, s_ls)

    # Attribution: each wait counted for its own thread's cgroup, and up to the parent only.
    assert be.count <= 4 * 200 * WINDOW, be            # the sleeper's own wakeups, not the loops' slices
    assert env.cgroup("be") + "/empty" not in by_ebpf and env.cgroup("be") + "/empty" not in by_schedstat
    assert env.cgroup("be") not in only_ls and env.name not in only_ls, only_ls      # BE's threads not read
    assert parent is not None and parent.count == ls.count + be.count


class Stamp(ctypes.Structure):
    """runq_latency.bpf.c's struct stamp: a task's storage in the map `queued`."""
    _fields_ = [("since", ctypes.c_uint64), ("cgroup", ctypes.c_uint64)]


def test_only_threads_of_watched_cgroups_are_stamped(cgroups):
    """A thread of no watched cgroup gets no task storage (no stamp, no clock read); one of a watched
    cgroup does, naming that cgroup, and its waits are counted there."""
    ls = cgroups.spawn("ls", SLEEPER)
    be = cgroups.spawn("be", SLEEPER)
    time.sleep(0.3)
    sensor = started(EBPF)
    try:
        context = SensorContext(time.monotonic(), {cgroups.cgroup("ls"): "LS"})    # be and the parent: not watched
        sensor.sample(context)
        time.sleep(1.0)
        got = sensor.sample(SensorContext(time.monotonic(), context.cgroups))
        queued = sensor.source.obj.map("queued", ctypes.c_int, Stamp)
        stamps = {}
        for name, proc in (("ls", ls), ("be", be)):
            pidfd = os.pidfd_open(proc.pid)
            try:
                stamps[name] = queued.lookup(ctypes.c_int(pidfd))
            finally:
                os.close(pidfd)
        ls_id = os.stat(cgroups.dir("unified", "ls")).st_ino
    finally:
        sensor.stop()
    assert got[cgroups.cgroup("ls")].count >= 50, got       # ~200 wake-ups a second
    assert stamps["be"] is None, "a thread of no watched cgroup was stamped"
    assert stamps["ls"] is not None and stamps["ls"].cgroup == ls_id
