"""koordd's backends on this host's cgroup layout: koordd's own (each backends module's BACKENDS,
listed in koordd/core/catalogue.py BUILTIN) and the third parties' of the entry-point group `koordd.backends`."""
from __future__ import annotations

from koordd.core.backend import Backend, Backends
from koordd.core.catalogue import BACKENDS, builtin, load_backends
from koordd.kernel.cgroupfs import CgroupFS


def builtin_backends(fs: CgroupFS) -> list[Backend]:
    """koordd's own backends on a cgroup layout: the cgroup knobs, the policy of cgroups' threads, and
    resctrl (its groups, and which group a cgroup's threads are in), tc (a device's HTB tree), the
    egress classifier (where it is attached, which class a cgroup's packets get) and koordd's sched_ext
    scheduler (whether it runs, which class a cgroup's threads have in it)."""
    return [backend for own in builtin(BACKENDS).values() for backend in own.build(fs)]


def builtin_classes() -> list[type[Backend]]:
    """The classes of koordd's own backends, unbuilt (koordctl doctor asks them for their features)."""
    return [cls for own in builtin(BACKENDS).values() for cls in own.classes]


def all_backends(fs: CgroupFS) -> Backends:
    """koordd's own backends and the third parties'; one of those that fails to load, to start, or whose
    kind or knobs are taken is left out with one error line."""
    return load_backends(*builtin_backends(fs))
