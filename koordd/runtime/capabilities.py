"""What this host can do: one probe per kernel feature or library koordd may use.

Backs `koordctl doctor [--json]` and the daemon's start-up report. The probes of a feature a backend or
sensor uses are that backend's or sensor's own (their `features`: koordd/core/probe.py); those here are
of the host itself (the cgroup tree, PSI, journald, systemd) and of the optional sensors as a whole. A
probe never raises: a missing feature is an unavailable `Capability` whose detail says why, so callers
degrade with one clear log line instead of failing later mid-loop. Roots are injectable so tests can
point every probe at a fake tree.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Collection

from koordd.backends.host_backends import builtin_classes
from koordd.core.probe import Capability, Probe
from koordd.kernel.cgroupfs import LayoutError
from koordd.kernel.host_probe import Host, find_knob, read, try_import, yes
from koordd.sensors.lifecycle import start_sensor, stop_sensor
from koordd.sensors.optional_sensors import builtin_sensors, load_sensor_registry

__all__ = ["Capability", "PROBES", "format_report", "probe_all", "report_json"]


# --- the host's own probes --------------------------------------------------------------------------

def _probe_cgroup(r: Host) -> tuple[bool, str]:
    try:
        return True, r.layout.describe()
    except LayoutError as e:
        return False, str(e)


def _probe_psi(r: Host) -> tuple[bool, str]:
    pressure = r.proc / "pressure"
    if not pressure.is_dir():
        return False, f"no {pressure}: kernel built without CONFIG_PSI or psi=0"
    readable = [res for res in ("cpu", "memory", "io") if read(pressure / res) is not None]
    missing = sorted({"cpu", "memory", "io"} - set(readable))
    system = f"{pressure}: {','.join(readable) or 'none'} readable" + (f" ({','.join(missing)} not)" if missing else "")
    try:
        unified, why = r.layout.unified, "no v2 tree"
    except (LayoutError, OSError) as e:
        # A broken cgroup tree must not hide the system-wide PSI the memory loops rely on.
        unified, why = None, str(e)
    if unified is None:
        per_cg = f"per-cgroup: no ({why})"
    else:
        found = find_knob(unified, "cpu.pressure")
        per_cg = f"per-cgroup: yes ({found})" if found else f"per-cgroup: no cpu.pressure in {unified}"
    return not missing, f"{system}; {per_cg}"


def _probe_sensors(r: Host) -> tuple[bool, str]:
    """Each registered optional sensor (koordd's and third parties'), started and stopped again."""
    why, how = {}, {}
    for name, factory in sorted(load_sensor_registry().items()):
        sensor, why[name] = start_sensor(factory)
        if sensor is not None:
            how[name] = getattr(sensor, "detail", None)      # e.g. which source it started with
            stop_sensor(sensor)
    return all(w is None for w in why.values()), "; ".join(
        f"{n}: {w or 'starts'}" + (f" ({how[n]})" if how.get(n) else "") for n, w in why.items())


def _probe_journald(r: Host) -> tuple[bool, str]:
    sock = r.run / "systemd/journal/socket"
    _, why = try_import("systemd.journal")
    return sock.exists() and why is None, f"{sock}: {yes(sock.exists())}; python systemd.journal: {why or 'imports'}"


def _probe_systemd(r: Host) -> tuple[bool, str]:
    marker = r.run / "systemd/system"
    notify = os.environ.get("NOTIFY_SOCKET")
    detail = "systemd is PID 1" if marker.is_dir() else f"no {marker}: systemd is not PID 1"
    return marker.is_dir(), detail + (f"; NOTIFY_SOCKET={notify}" if notify else "; NOTIFY_SOCKET not set")


HOST: dict[str, Probe] = {"cgroup": _probe_cgroup, "psi": _probe_psi, "sensors": _probe_sensors,
                          "journald": _probe_journald, "systemd": _probe_systemd}


def _owned() -> dict[str, Probe]:
    """feature -> probe, of koordd's own backends and sensors (tests/unit/runtime/test_capabilities.py: each feature
    has one owner and a row below)."""
    return {name: probe for owner in (*builtin_classes(), *builtin_sensors().values())
            for name, probe in owner.features.items()}


# doctor's rows, in this order: the host's, and those of the backends and sensors that use them.
ORDER = ("cgroup", "cpu.max.burst", "cpu.idle", "knobs", "memory.oom.group", "memory.reclaim", "sysctl", "pm_qos", "io", "psi",
         "perf", "bpf", "resctrl", "sched_ext", "core_sched", "netlink", "nvml", "sensors", "journald", "systemd")
PROBES: list[tuple[str, Probe]] = [(name, {**HOST, **_owned()}[name]) for name in ORDER]


def probe_all(cgroup_root: Path | str = "/sys/fs/cgroup", sys_root: Path | str = "/sys",
              proc_root: Path | str = "/proc", run_root: Path | str = "/run",
              skip: Collection[str] = ()) -> list[Capability]:
    """Run every probe but those in `skip`; one that raises becomes an unavailable Capability carrying
    the exception."""
    host = Host(Path(cgroup_root), Path(sys_root), Path(proc_root), Path(run_root))
    caps = []
    for name, probe in PROBES:
        if name in skip:
            continue
        try:
            available, detail = probe(host)
        except Exception as e:
            available, detail = False, f"probe failed: {type(e).__name__}: {e}"
        caps.append(Capability(name, available, detail))
    return caps


def format_report(caps: list[Capability]) -> str:
    width = max((len(c.name) for c in caps), default=0)
    return "\n".join(f"{c.name:<{width}}  {yes(c.available):<3}  {c.detail}" for c in caps)


def report_json(caps: list[Capability]) -> str:
    return json.dumps([asdict(c) for c in caps], indent=2)
