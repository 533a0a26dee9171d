"""The daemon's parts, built from a config and handed to each other through their constructors.

The one place the registries are read (loops are read by main(), before the config they validate):
backends (koordd's own and the entry points'), optional sensors.
"""
from __future__ import annotations

import logging
import resource
from dataclasses import dataclass
from typing import Mapping

from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog, journal_sender
from koordd.act.protect import process_cgroups
from koordd.backends.cgroup_knobs import KNOBS, kernel_lacks
from koordd.backends.host_backends import all_backends
from koordd.core.backend import Backends
from koordd.core.config import Config
from koordd.core.kubelet import KubeletRule
from koordd.kernel.cgroupfs import CgroupFS, Layout, on_cgroupfs
from koordd.runtime.host_claim import HostClaim
from koordd.runtime.runner import Runner
from koordd.sensors.collect import Sensors
from koordd.sensors.lifecycle import SensorManager
from koordd.sensors.optional_sensors import load_sensor_registry

log = logging.getLogger("koordd")


@dataclass
class Parts:
    fs: CgroupFS
    backends: Backends
    actuator: Actuator
    sensors: Sensors
    runner: Runner


def build(config: Config, registry, layout: Layout, claim: HostClaim, dry_run: bool) -> Parts:
    """`registry`: the loops (name -> Loop class)."""
    fs = CgroupFS(layout, keep_open=on_cgroupfs(layout), max_open=raise_open_files_limit())
    backends = all_backends(fs)
    unsupported = backends.probe()
    actuator = Actuator(backends, claim.journal, DecisionLog(claim.state_dir, send=journal_sender()),
                        dry_run=dry_run, unsupported=unsupported,
                        processes=process_cgroups(),     # PID 1's and koordd's: never evicted or throttled
                        kubelet=KubeletRule.of(config.daemon))     # before the loops' first writes
    sensors = Sensors(fs, config.classes, optional=SensorManager(load_sensor_registry()),
                      supported=supported(backends, unsupported))
    return Parts(fs, backends, actuator, sensors, Runner(registry, actuator, sensors=sensors.optional.names))


def supported(backends: Backends, unsupported: Mapping[str, str]) -> frozenset[str]:
    """The knobs this host has, for loops to choose from (snapshot.supported)."""
    return backends.knobs() - unsupported.keys()


def log_missing_knobs(unsupported: Mapping[str, str], fs: CgroupFS) -> None:
    """One line per knob the host lacks; of the cgroup knobs, only those the kernel lacks (those
    the layout lacks follow from the cgroup mode)."""
    for name, why in sorted(kernel_lacks({k: why for k, why in unsupported.items() if k in KNOBS}, fs).items()):
        log.info("knob %s", why)
    # Other backends' knobs, one line per reason (a backend lacking its feature lacks all its knobs).
    by_reason: dict[str, list[str]] = {}
    for name, why in unsupported.items():
        if name not in KNOBS:
            by_reason.setdefault(why, []).append(name)
    for why, names in sorted(by_reason.items()):
        log.info("knob%s %s unavailable: %s", "s" if len(names) > 1 else "", ", ".join(sorted(names)), why)


def raise_open_files_limit(reserve: int = 256) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (systemd's default soft limit is 1024) and return
    how many cgroup files may be kept open, leaving `reserve` for everything else."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ValueError, OSError):
            pass
    return max(soft - reserve, 0)
