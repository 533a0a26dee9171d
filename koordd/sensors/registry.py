"""Which optional sensors exist: koordd's own, and third parties' from the entry-point group `koordd.sensors`."""
from __future__ import annotations

from typing import Callable

from koordd.core.registry import load_named
from koordd.core.snapshot import CGROUP_FIELDS
from koordd.sensors.avx import AvxSensor
from koordd.sensors.contract import OptionalSensor
from koordd.sensors.cpi import CpiSensor
from koordd.sensors.gpu import GpuSensor
from koordd.sensors.net import NetSensor
from koordd.sensors.resctrl import ResctrlSensor
from koordd.sensors.runq import RunqLatencySensor
from koordd.sensors.sched_ext import SchedExtSensor

GROUP = "koordd.sensors"
BUILTIN: dict[str, type[OptionalSensor]] = {s.name: s for s in (GpuSensor, RunqLatencySensor, CpiSensor,
                                                                  ResctrlSensor, NetSensor, SchedExtSensor,
                                                                  AvxSensor)}

SensorFactory = Callable[[], OptionalSensor]


def load_sensor_registry() -> dict[str, SensorFactory]:
    """name -> sensor class: koordd's own and the entry points'. A third-party sensor whose name is a
    built-in sensor's or a cgroup field's is left out: it must not change what a needs() word means."""
    taken = {**{f: "a cgroup field" for f in CGROUP_FIELDS}, **{n: "koordd's own sensor" for n in BUILTIN}}
    return {**BUILTIN, **load_named(GROUP, "sensor", taken=taken)}
