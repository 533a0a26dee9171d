"""Which optional sensors exist: koordd's own, and third parties' from the entry-point group `koordd.sensors`."""
from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Callable

from ..snapshot import CGROUP_FIELDS
from .contract import OptionalSensor
from .gpu import GpuSensor

log = logging.getLogger(__name__)
GROUP = "koordd.sensors"
BUILTIN: dict[str, type[OptionalSensor]] = {GpuSensor.name: GpuSensor}

SensorFactory = Callable[[], OptionalSensor]


def load_sensor_registry() -> dict[str, SensorFactory]:
    """name -> sensor class. A third-party sensor that fails to import, or whose name is taken, is left
    out with one error line: it must not stop koordd, nor change what a loop's needs() word means."""
    registry: dict[str, SensorFactory] = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        if ep.name in BUILTIN or ep.name in CGROUP_FIELDS:
            what = "koordd's own sensor" if ep.name in BUILTIN else "a cgroup field"
            log.error("sensor %s (%s) left out: %s is already %s", ep.name, ep.value, ep.name, what)
            continue
        try:
            cls = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken third-party sensor must not stop koordd
            log.error("sensor %s (%s) failed to load: %s", ep.name, ep.value, e)
            continue
        if getattr(cls, "name", None) != ep.name:
            log.error("sensor %s: entry point names class %s whose name is %r", ep.name, ep.value,
                      getattr(cls, "name", None))
            continue
        registry[ep.name] = cls
    return registry
