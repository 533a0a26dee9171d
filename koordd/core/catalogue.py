"""Where loops, optional sensors and backends come from: entry points of the groups `koordd.loops`,
`koordd.sensors` and `koordd.backends`, koordd's own and third parties', loaded the same way for all three.

koordd's own loops are plugins (plugins/, the package koordd_plugins): entry points of koordd's own
distribution (pyproject.toml), found in its installed metadata exactly as a third party's are; OWN_LOOPS
names them only for the order they run in and to say so when an install lost them. koordd's own sensors
and backends are part of koordd: BUILTIN names each as an entry point does ("module:attribute"). Either
way the registry loads a group's modules only when that group is asked for: `koordctl validate` loads the
loops and no sensor or backend (tests/unit/test_layers.py). Each group's values lie in its own package
(tests/unit/core/test_catalogue.py), as the layers of pyproject.toml would have it for an import.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

from koordd.core.backend import Backend, Backends
from koordd.core.installed import EntryPoint, distribution, entry_points, normalized
from koordd.core.loop import Loop

log = logging.getLogger("koordd.registry")     # its name before the move: log lines unchanged
LOOPS, SENSORS, BACKENDS = "koordd.loops", "koordd.sensors", "koordd.backends"

# koordd's own loops, in the order they run in (the order of the config reference): entry points of koordd's
# distribution (pyproject.toml), whose metadata has no order of its own (setuptools sorts it).
OWN_LOOPS = ("be_suppress", "cpu_burst", "memory_evict", "net_shaping", "llc_partition", "qos_baseline", "sched_ext",
             "avx_weight", "io_qos", "proactive_reclaim", "core_sched", "oom_shaping")
PLUGINS = "koordd_plugins"      # the package they lie in (plugins/ in the source tree)

# koordd's own sensors and backends. Sensors: name -> the class, whose `name` says the same. Backends: a
# module's name -> its BackendSet (koordd/core/backend.py): the classes, and how they are built on this host's
# cgroup layout.
BUILTIN: dict[str, dict[str, str]] = {
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
        "cgroup_knobs": "koordd.backends.cgroup_knobs:BACKENDS",
        "threads": "koordd.backends.threads:BACKENDS",
        "resctrl": "koordd.backends.resctrl:BACKENDS",
        "tc": "koordd.backends.tc:BACKENDS",
        "netclass": "koordd.backends.netclass:BACKENDS",
        "sched_ext": "koordd.backends.sched_ext:BACKENDS",
        "iocost": "koordd.backends.iocost:BACKENDS",
        "core_sched": "koordd.backends.core_sched:BACKENDS",
        "sysctl": "koordd.backends.sysctl:BACKENDS",
        "pm_qos": "koordd.backends.pm_qos:BACKENDS",
        "oom": "koordd.backends.oom:BACKENDS",
        "prekill": "koordd.backends.prekill:BACKENDS",
    },
}
WHAT = {LOOPS: "loop", SENSORS: "sensor", BACKENDS: "backend"}     # for the log lines
ATTR = {LOOPS: "name", SENSORS: "name", BACKENDS: "kind"}          # what a third party's class names itself by


class BrokenInstall(RuntimeError):
    """koordd's installed metadata lacks some of its own loops: koordd cannot run as it was shipped."""


def builtin(group: str, points: Iterable[EntryPoint] | None = None) -> dict[str, Any]:
    """koordd's own of `group`, loaded. One that is missing or fails to import is koordd's own bug (an
    install without its metadata, or with stale metadata): it raises. `points`: the group's entry points,
    where the caller has them already."""
    if group == LOOPS:
        return {name: ep.load() for name, ep in own_loop_points(points).items()}
    return {name: EntryPoint(name, value, group).load() for name, value in BUILTIN[group].items()}


def own_loop_points(points: Iterable[EntryPoint] | None = None) -> dict[str, EntryPoint]:
    """OWN_LOOPS' entry points in koordd's own metadata, in OWN_LOOPS' order. BrokenInstall, naming them,
    when some are missing or name no module of koordd_plugins (an install of an older koordd's metadata:
    a stale koordd.egg-info in a checkout). No copy of the list to fall back on: a package that lost its
    entry points would lose a third party's too, and must fail here, where it is plain."""
    found = {ep.name: ep for ep in (entry_points(group=LOOPS) if points is None else points) if _koordds_own(ep)}
    lost = [n for n in OWN_LOOPS if n not in found or not found[n].value.startswith(PLUGINS + ".")]
    if lost:
        raise BrokenInstall(
            f"koordd's own loops {', '.join(lost)} are not entry points of group {LOOPS} naming modules of "
            f"{PLUGINS} in koordd's installed metadata ({_metadata()}): reinstall koordd (in a checkout: "
            "scripts/dev-env; on a node: its .deb)")
    return {name: found[name] for name in OWN_LOOPS}


def _metadata() -> str:
    """Where the metadata read as koordd's is (the first on sys.path: a checkout's koordd.egg-info before
    the venv's)."""
    dist = distribution("koordd")
    return dist.path if dist else "none found: koordd is not installed"


def third_party(group: str, taken: Mapping[str, str] | None = None,
                points: Iterable[EntryPoint] | None = None) -> dict[str, Any]:
    """entry-point name -> the class it names, for those whose `name` (a backend's: `kind`) says the same.
    One that fails to import, is misnamed, or whose name is koordd's own or taken (`taken`: name -> what
    already has it) is left out with one error line: a broken third-party package must not stop koordd."""
    what, attr = WHAT[group], ATTR[group]
    # A third-party backend's name is its kind, koordd's own are named after their modules: a kind taken is
    # refused by Backends.add (load_backends), naming it.
    own = OWN_LOOPS if group == LOOPS else () if group == BACKENDS else BUILTIN[group]
    taken = {**{n: f"koordd's own {what}" for n in own}, **(taken or {})}
    out: dict[str, Any] = {}
    for ep in entry_points(group=group) if points is None else points:
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
    """An entry point of koordd's own distribution (its loops), never a third party's."""
    dist = getattr(ep, "dist", None)
    return dist is not None and normalized(dist.name or "") == "koordd"


def load(group: str, taken: Mapping[str, str] | None = None) -> dict[str, Any]:
    """koordd's own of `group` and the third parties' (the metadata read once: it is a walk of sys.path)."""
    points = list(entry_points(group=group))
    return {**builtin(group, points), **third_party(group, taken, points)}


def load_registry() -> dict[str, type[Loop]]:
    """name -> loop class."""
    return load(LOOPS)


def load_backends(*builtin_backends: Backend) -> Backends:
    """`builtin_backends` (koordd's own, built on this host's layout: koordd/backends/host_backends.py) plus the
    third parties' (named by their kind); one that fails to load, to start or clashes with another is left
    out with one error line."""
    out = Backends(builtin_backends)
    for kind, cls in third_party(BACKENDS).items():
        try:
            out.add(cls())
        except Exception as e:  # noqa: BLE001 - a broken third-party backend must not stop koordd
            logging.getLogger("koordd.backend").error("backend %s (%s) left out: %s", kind, cls, e)
    return out
