"""Which optional sensors exist: koordd's own (listed in koordd/core/catalogue.py BUILTIN) and third parties'
from the entry-point group `koordd.sensors`."""
from __future__ import annotations

from typing import Callable

from koordd.core.catalogue import SENSORS, builtin, load
from koordd.core.snapshot import CGROUP_FIELDS
from koordd.sensors.contract import OptionalSensor

SensorFactory = Callable[[], OptionalSensor]


def builtin_sensors() -> dict[str, type[OptionalSensor]]:
    """name -> class, of koordd's own optional sensors."""
    return builtin(SENSORS)


def load_sensor_registry() -> dict[str, SensorFactory]:
    """name -> sensor class: koordd's own and the entry points'. A third-party sensor whose name is a
    built-in sensor's or a cgroup field's is left out: it must not change what a needs() word means."""
    return load(SENSORS, taken={f: "a cgroup field" for f in CGROUP_FIELDS})
