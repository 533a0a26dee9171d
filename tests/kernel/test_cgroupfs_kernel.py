"""CgroupFS on the real hierarchy: a v1 thread list read again at once still lists the threads started
in between (the kernel hands a kept-open v1 `tasks` file its old list for a second)."""
from __future__ import annotations

import sys

from koordd.kernel.cgroupfs import CgroupFS, detect_layout

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_thread_list_read_again_at_once_lists_a_process_started_in_between(cgroups):
    layout = detect_layout()
    fs = CgroupFS(layout, keep_open=True)
    controller = "cpu"
    try:
        first = cgroups.spawn("be", SLEEPER)
        listed = fs.read(controller, cgroups.cgroup("be"), "tasks" if cgroups.mode == "hybrid" else "cgroup.threads")
        assert str(first.pid) in listed.split()
        second = cgroups.spawn("be", SLEEPER)
        again = fs.read(controller, cgroups.cgroup("be"), "tasks" if cgroups.mode == "hybrid" else "cgroup.threads")
        assert {str(first.pid), str(second.pid)} <= set(again.split())
    finally:
        fs.close()
