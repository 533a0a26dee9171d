"""Which backends koordd brings itself: built in here, the way koordd/sensors/registry.py lists its own
sensors; a third party's come from the entry-point group `koordd.backends` (koordd/core/registry.py
load_backends), and loops from `koordd.loops`, koordd's own included (pyproject.toml)."""
from __future__ import annotations

from koordd.backends.cgroup import CgroupBackend
from koordd.backends.netclass import ClassifierBackend, NetClassBackend, process_classifier
from koordd.backends.resctrl import ResctrlGroupBackend, ResctrlTasksBackend
from koordd.backends.scx import scheduler_backends
from koordd.backends.tc import TcBackend
from koordd.backends.threads import ThreadPolicyBackend
from koordd.core.backend import Backend
from koordd.kernel.cgroupfs import CgroupFS


def builtin_backends(fs: CgroupFS) -> list[Backend]:
    """koordd's own backends on a cgroup layout: the cgroup knobs, the policy of cgroups' threads, and
    resctrl (its groups, and which group a cgroup's threads are in), tc (a device's HTB tree), the
    egress classifier (where it is attached, which class a cgroup's packets get) and koordd's sched_ext
    scheduler (whether it runs, which class a cgroup's threads have in it)."""
    shared = process_classifier()
    return [CgroupBackend(fs), ThreadPolicyBackend(fs), ResctrlGroupBackend(), ResctrlTasksBackend(fs), TcBackend(shared),
            ClassifierBackend(shared), NetClassBackend(fs, shared), *scheduler_backends(fs)]
