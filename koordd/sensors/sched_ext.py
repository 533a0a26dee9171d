"""sched_ext sensor: the kernel's sched_ext status each round, the snapshot's "sched_ext" section.

An optional sensor for loops that put classes on a BPF scheduler: they read whether one is loaded
(`state`, `root/ops`) and whether it changed (`enable_seq`) without reading files themselves.
Unavailable where the kernel has no sched_ext.
"""
from __future__ import annotations

from pathlib import Path

from koordd.core.snapshot import SCHED_EXT, SchedExtStatus
from koordd.kernel.sched_ext import has_sched_ext, missing_reason, read_sched_ext
from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable


class SchedExtSensor(OptionalSensor):
    name = SCHED_EXT

    def __init__(self, sys_root: Path | str = "/sys"):
        self.sys_root = sys_root

    def start(self) -> None:
        if not has_sched_ext(self.sys_root):
            raise SensorUnavailable(missing_reason(self.sys_root))

    def sample(self, context: SensorContext | None = None) -> SchedExtStatus | None:
        return read_sched_ext(self.sys_root)
