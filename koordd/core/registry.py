"""Where loops, optional sensors and backends come from: koordd's own, listed once below (BUILTIN), and
third parties' entry points of the groups `koordd.loops`, `koordd.sensors` and `koordd.backends`, loaded
the same way for all three.

BUILTIN names each of koordd's own as an entry point does ("module:attribute"), so that the registry
loads a group's modules only when that group is asked for: `koordctl validate` loads the loops and no
sensor or backend (tests/test_layers.py). Each group's values lie in its own package (tests/test_registry.py),
as the layers of pyproject.toml would have it for an import.
"""
from __future__ import annotations

import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Mapping

from koordd.core.backend import Backend, Backends
from koordd.core.loop import Loop

log = logging.getLogger("koordd.registry")     # its name before the move: log lines unchanged
LOOPS, SENSORS, BACKENDS = "koordd.loops", "koordd.sensors", "koordd.backends"

# koordd's own. Loops and sensors: name -> the class, whose `name` says the same. Backends: a module's name ->
# its BackendSet (koordd/core/backend.py): the classes, and how they are built on this host's cgroup layout.
BUILTIN: dict[str, dict[str, str]] = {
    LOOPS: {
        "be_suppress": "koordd.loops.be_suppress:BeSuppress",
        "cpu_burst": "koordd.loops.cpu_burst:CpuBurst",
        "memory_evict": "koordd.loops.memory_evict:MemoryEvict",
        "net_shaping": "koordd.loops.net_shaping:NetShaping",
        "llc_partition": "koordd.loops.llc_partition:LlcPartition",
        "qos_baseline": "koordd.loops.qos_baseline:QosBaseline",
        "sched_ext": "koordd.loops.sched_ext:SchedExt",
        "avx_weight": "koordd.loops.avx_weight:AvxWeight",
        "io_qos": "koordd.loops.io_qos:IoQos",
        "proactive_reclaim": "koordd.loops.proactive_reclaim:ProactiveReclaim",
        "core_sched": "koordd.loops.core_sched:CoreSched",
        "oom_shaping": "koordd.loops.oom_shaping:OomShaping",
    },
    SENSORS: {
        "gpus": "koordd.sensors.gpu:GpuSensor",
        "runq_latency": "koordd.sensors.runq:RunqLatencySensor",
        "app_latency": "koordd.sensors.app_latency:AppLatencySensor",
        "slo_prometheus": "koordd.sensors.slo_prometheus:SloPrometheusSensor",
        "slo_probe": "koordd.sensors.slo_probe:SloProbeSensor",
        "cpi": "koordd.sensors.cpi:CpiSensor",
        "resctrl": "koordd.sensors.resctrl:ResctrlSensor",
        "net": "koordd.sensors.net:NetSensor",
        "sched_ext": "koordd.sensors.sched_ext:SchedExtSensor",
        "avx": "koordd.sensors.avx:AvxSensor",
        "block_devices": "koordd.sensors.blockdev:BlockDeviceSensor",
    },
    BACKENDS: {      # in this order: the cgroup knobs first, as the actuator has always had them
        "cgroup": "koordd.backends.cgroup:BACKENDS",
        "threads": "koordd.backends.threads:BACKENDS",
        "resctrl": "koordd.backends.resctrl:BACKENDS",
        "tc": "koordd.backends.tc:BACKENDS",
        "netclass": "koordd.backends.netclass:BACKENDS",
        "scx": "koordd.backends.scx:BACKENDS",
        "iocost": "koordd.backends.iocost:BACKENDS",
        "core_sched": "koordd.backends.core_sched:BACKENDS",
        "sysctl": "koordd.backends.sysctl:BACKENDS",
        "oom": "koordd.backends.oom:BACKENDS",
        "prekill": "koordd.backends.prekill:BACKENDS",
    },
}
WHAT = {LOOPS: "loop", SENSORS: "sensor", BACKENDS: "backend"}     # for the log lines
ATTR = {LOOPS: "name", SENSORS: "name", BACKENDS: "kind"}          # what a third party's class names itself by


def builtin(group: str) -> dict[str, Any]:
    """koordd's own of `group`, loaded. One that fails to import is koordd's own bug: it raises."""
    return {name: EntryPoint(name, value, group).load() for name, value in BUILTIN[group].items()}


def third_party(group: str, taken: Mapping[str, str] | None = None) -> dict[str, Any]:
    """entry-point name -> the class it names, for those whose `name` (a backend's: `kind`) says the same.
    One that fails to import, is misnamed, or whose name is koordd's own or taken (`taken`: name -> what
    already has it) is left out with one error line: a broken third-party package must not stop koordd."""
    what, attr = WHAT[group], ATTR[group]
    # A third-party backend's name is its kind, koordd's own are named after their modules: a kind taken is
    # refused by Backends.add (load_backends), naming it.
    own = {} if group == BACKENDS else {n: f"koordd's own {what}" for n in BUILTIN[group]}
    taken = {**own, **(taken or {})}
    out: dict[str, Any] = {}
    for ep in entry_points(group=group):
        if _koordds_own(ep):
            continue
        if ep.name in taken:
            log.error("%s %s (%s) left out: %s is already %s", what, ep.name, ep.value, ep.name, taken[ep.name])
            continue
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001
            log.error("%s %s (%s) failed to load: %s", what, ep.name, ep.value, e)
            continue
        if getattr(obj, attr, None) != ep.name:
            log.error("%s %s: entry point names class %s whose %s is %r", what, ep.name, ep.value, attr,
                      getattr(obj, attr, None))
            continue
        out[ep.name] = obj
    return out


def _koordds_own(ep: EntryPoint) -> bool:
    """An entry point of koordd's own distribution: metadata an older koordd installed (it listed its loops
    as entry points; a stale koordd.egg-info in a checkout still does), never a third party's."""
    dist = getattr(ep, "dist", None)
    return dist is not None and (dist.metadata["Name"] or "").lower() == "koordd"


def load(group: str, taken: Mapping[str, str] | None = None) -> dict[str, Any]:
    """koordd's own of `group` and the third parties'."""
    return {**builtin(group), **third_party(group, taken)}


def load_registry() -> dict[str, type[Loop]]:
    """name -> loop class."""
    return load(LOOPS)


def load_backends(*builtin_backends: Backend) -> Backends:
    """`builtin_backends` (koordd's own, built on this host's layout: koordd/backends/registry.py) plus the
    third parties' (named by their kind); one that fails to load, to start or clashes with another is left
    out with one error line."""
    out = Backends(builtin_backends)
    for kind, cls in third_party(BACKENDS).items():
        try:
            out.add(cls())
        except Exception as e:  # noqa: BLE001 - a broken third-party backend must not stop koordd
            logging.getLogger("koordd.backend").error("backend %s (%s) left out: %s", kind, cls, e)
    return out
