"""io_qos: block IO for latency-sensitive work first, a bounded share of each disk for best-effort work.

Writes, on every class root of the class (off by default; each option 0 or "" leaves its knob alone):
- LS, LSR and LSE `io.weight` = `ls_io_weight`, BE's = `be_io_weight` ("default N"): proportional
  shares of a contended disk. On cgroup v2 they act through iocost (io.weight, where the kernel has
  CONFIG_BLK_CGROUP_IOCOST and iocost is enabled on the disk); on v1 and hybrid hosts the knob is
  BFQ's `blkio.bfq.weight` (1..1000), which acts only on disks whose scheduler is bfq. `koordctl
  doctor` ("io") says which the host has. Per-device weights someone else set stay as they are.
- BE `io.max` on each disk of `devices` = `be_io_max` ("rbps=100M wbps=50M riops=max wiops=2000":
  bytes/s with an optional K/M/G/T suffix, IO/s, or max): a hard ceiling on BE's reads and writes of
  that disk. On v1 and hybrid hosts it is written to blkio.throttle.{read,write}_{bps,iops}_device.
  A disk is named by "MAJ:MIN", by its device path ("/dev/vda", "/dev/mapper/vg-lv") or by any path
  on a filesystem mounted from it ("/var/lib/containerd"); a partition stands for its whole disk (the
  kernel limits disks). The names are looked up by the block_devices sensor, at start and whenever
  a device or a mount comes or goes; one that names no disk is skipped, and each decision's reason
  lists how every name resolved. Symbolic links are not followed: name the device or the mount
  itself. Buffered writes reach the disk through writeback, which v1 does not charge to the writer's
  cgroup: on v1 `wbps`/`wiops` bound direct IO only (cgroup v2 charges writeback to its cgroup).
- On cgroup v2 with iocost (CONFIG_BLK_CGROUP_IOCOST): each disk's `io.cost.qos` = `iocost_qos`
  ("enable=1 ctrl=auto" turns iocost on, which is what makes io.weight act on that disk; ctrl=user
  with rpct/rlat/wpct/wlat/min/max sets its latency targets) and `io.cost.model` = `iocost_model`
  ("ctrl=auto": the kernel's model for the device class; ctrl=user model=linear with rbps, rseqiops,
  rrandiops, wbps, wseqiops, wrandiops: a model measured on the device, e.g. by resctl-bench). These
  live in the root cgroup, one line per disk: koordd writes the disks of `devices` and the keys it
  names, and gives back those keys only. v1 and hybrid hosts have no iocost: the knobs are skipped.

Dynamic mode (`dynamic = true`): BE's io.max follows LS's IO health, as be_suppress follows CPU. Each
round the worst LS, LSR or LSE class root's `io.pressure` "some" (the share of time some of its tasks
waited for IO: since the previous round where two samples exist, else avg10) is compared with
`io_pressure_target`, and where a class declares an SLO (`[classes.slo]`, core/slo.py) and
`follow_slo` is on, its service's latency with its SLO (the slack be_suppress reads; CPU signals are
not IO's and are left out). Pressure above the target or an SLO missed: BE's limits are cut at once
by `cut_percent`, every round it lasts, down to `floor_percent` of `be_io_max`. Pressure under 90%
of the target and at least 10% slack (or no SLO): they rise by `step_percent` of `be_io_max` per
round, up to `be_io_max` itself. In between they hold; with no LS signal at all they hold too. Only
the fields `be_io_max` limits move; a field it leaves at max stays max.

Never on LS: io.max is written on BE class roots only; a BE root that holds LS, LSR, LSE or SYSTEM
work, or lies inside it, gets no limit (one koordd held there is lifted), and the actuator's guard
refuses any lower io.max on a protected cgroup (koordd/act/protect.py). The kubelet's containers'
io.weight and io.max are its runtime's (its blockio class) and are refused under
`kubelet_owned = "respect"`; io_qos writes the class roots (the kubelet's QoS cgroups), which are not.

Restore (on stop, when the loop is disabled, when an option is turned off, or when a cgroup leaves
its class): io.weight goes back to its default before koordd's first write; io.max goes back device
by device, on the disks koordd limited only (a disk without a limit before gets "max" again), and a
disk koordd never limited is not touched. When the disks change (config, a device replaced), koordd
gives back its limits on the old set before it limits the new one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from koordd.core.blkio import (BLOCK_DEVICES, FIELDS, BlockDevices, format_io_max, normalize_iocost, parse_device,
    parse_io_max, parse_limits)
from koordd.core.classes import LATENCY_SENSITIVE
from koordd.core.health import _slo_signals as slo_signals, worst_slack
from koordd.core.loop import NODE, Action, Loop, restore
from koordd.core.options import Option
from koordd.core.protected import Protected
from koordd.core.slo import SloWindow
from koordd.core.snapshot import CgroupSample, Snapshot

GROW_AT = 0.10           # as be_suppress: BE grows only at 10% LS slack or more
RAISE_BELOW = 0.9        # and only while LS's IO pressure is under 90% of its target
MAX_WEIGHT = 10000


class DeviceNames(Option):
    """An array of disks: "MAJ:MIN" or an absolute path (device or mount), kept as a tuple."""

    def convert(self, value: Any) -> tuple[str, ...]:
        if not isinstance(value, (list, tuple)) or not all(isinstance(d, str) for d in value):
            raise ValueError("expected an array of \"MAJ:MIN\", device paths or mount paths, e.g. [\"/dev/vda\"]")
        out = []
        for d in value:
            s = d.strip()
            if s.startswith("/"):
                if ".." in s.split("/") or len(s) > 4096:
                    raise ValueError(f"{d[:40]!r}: a path without \"..\", at most 4096 characters")
                out.append(s)
                continue
            try:
                out.append(parse_device(s))
            except ValueError:
                raise ValueError(f"{d[:40]!r} is neither \"MAJ:MIN\" (e.g. \"8:0\") nor an absolute path") from None
        return tuple(dict.fromkeys(out))


class IocostParams(Option):
    """A disk's io.cost.qos or io.cost.model parameters ("enable=1 ctrl=auto"), kept in the kernel's form."""

    def __init__(self, name, *args, knob: str, **kw):
        super().__init__(name, *args, **kw)
        object.__setattr__(self, "knob", knob)

    def convert(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"expected a string of {self.knob} parameters such as \"ctrl=auto\"")
        return normalize_iocost(self.knob, value) if value.strip() else ""


class IoLimits(Option):
    """"rbps=100M wbps=50M riops=max wiops=2000" (fields left out: max), kept in canonical form."""

    def convert(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError("expected a string such as \"rbps=100M wbps=50M\"")
        if not value.strip():
            return ""
        limits = parse_limits(value, "be_io_max")
        return " ".join(f"{f}={'max' if limits[f] is None else limits[f]}" for f in FIELDS)


@dataclass
class State:
    fraction: float = 1.0                 # dynamic: BE's limits as a share of be_io_max
    slo: SloWindow = field(default_factory=SloWindow)


class IoQos(Loop):
    __doc__ = __doc__
    name = "io_qos"
    options = (
        DeviceNames("devices", tuple, (), "disks BE's io.max limits: \"MAJ:MIN\", a device path (\"/dev/vda\") or "
                                          "a path on a filesystem mounted from it (\"/var/lib/containerd\")"),
        IoLimits("be_io_max", str, "", "BE's limits on each disk of devices: rbps/wbps (bytes/s, K/M/G/T "
                                       "suffixes), riops/wiops (IO/s), each a number or max; \"\" = leave "
                                       "io.max alone"),
        Option("ls_io_weight", int, 0, "LS, LSR and LSE io.weight (v1: blkio.bfq.weight, at most 1000); "
                                       "0 = leave alone", min=0, max=MAX_WEIGHT),
        Option("be_io_weight", int, 0, "BE io.weight (v1: blkio.bfq.weight); 0 = leave alone", min=0, max=MAX_WEIGHT),
        IocostParams("iocost_qos", str, "", "cgroup v2 with iocost: io.cost.qos of each disk of devices, e.g. "
                                            "\"enable=1 ctrl=auto\" (makes io.weight act on it); \"\" = leave alone",
                     knob="io.cost.qos"),
        IocostParams("iocost_model", str, "", "cgroup v2 with iocost: io.cost.model of each disk of devices, "
                                              "\"ctrl=auto\" or ctrl=user model=linear with its coefficients; "
                                              "\"\" = leave alone", knob="io.cost.model"),
        Option("dynamic", bool, False, "BE's io.max follows LS's IO pressure and SLO slack, with be_io_max as "
                                       "its ceiling"),
        Option("io_pressure_target", float, 10.0, "dynamic: LS io.pressure \"some\" (percent of time) above which "
                                                  "BE's limits are cut", min=0.1, max=100),
        Option("follow_slo", bool, True, "dynamic: an LS class's SLO (its service latency) counts too"),
        Option("cut_percent", float, 50.0, "dynamic: how much of its limits BE loses at once, each round LS is "
                                           "above target", min=1, max=95),
        Option("step_percent", float, 10.0, "dynamic: how much of be_io_max BE regains per round while LS is "
                                            "well under target", min=1, max=100),
        Option("floor_percent", float, 5.0, "dynamic: BE's limits never go below this share of be_io_max",
               min=0.1, max=100),
    )

    @staticmethod
    def problems(settings) -> dict[str, str]:
        out = {}
        if (settings.be_io_max or settings.iocost_qos or settings.iocost_model) and not settings.devices:
            out["devices"] = ("be_io_max, iocost_qos and iocost_model apply to the disks of devices: name at least "
                              "one (\"MAJ:MIN\" or a path)")
        if settings.dynamic:
            limits = parse_limits(settings.be_io_max) if settings.be_io_max else {}
            if not any(v is not None for v in limits.values()):
                out["dynamic"] = ("dynamic mode moves BE's io.max below be_io_max: be_io_max must limit at least "
                                  "one field (e.g. \"wbps=200M\")")
        return out

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        out = set()
        if settings.be_io_max:
            out.add(("BE", "io.max"))
        if settings.be_io_weight:
            out.add(("BE", "io.weight"))
        if settings.ls_io_weight:
            out |= {(cls, "io.weight") for cls in LATENCY_SENSITIVE}
        out |= {(NODE, knob) for knob, value in _iocost_settings(settings) if value}
        return frozenset(out)

    @staticmethod
    def needs(settings) -> frozenset[str]:
        out = set()
        if settings.be_io_max or settings.iocost_qos or settings.iocost_model:
            out.add(BLOCK_DEVICES)
            if settings.dynamic:
                out.add("io_pressure")
        return frozenset(out)

    @staticmethod
    def initial_state(settings) -> State:
        return State()

    @staticmethod
    def decide(snapshot: Snapshot, settings, state: State) -> list[Action]:
        actions: list[Action] = []
        if "io.weight" in snapshot.supported:
            for classes, weight in ((LATENCY_SENSITIVE, settings.ls_io_weight), (("BE",), settings.be_io_weight)):
                if not weight:
                    continue
                for cg in snapshot.of_class(*classes):
                    actions.append(Action(cg.path, "io.weight", f"default {weight}",
                                          {"class": cg.cls, "io_weight": weight}, f"{cg.cls} io.weight {weight}"))
        if settings.be_io_max and "io.max" in snapshot.supported:
            actions += _io_max_actions(snapshot, settings, state)
        return actions + _iocost_actions(snapshot, settings)


def _iocost_settings(settings) -> tuple[tuple[str, str], ...]:
    return (("io.cost.qos", settings.iocost_qos), ("io.cost.model", settings.iocost_model))


def _iocost_actions(snapshot: Snapshot, settings) -> list[Action]:
    """Each disk's io.cost.qos / io.cost.model (targets: the disks); a disk that left devices, or a
    setting turned off, gets koordd's keys back (the model after qos: iocost goes off first)."""
    actions: list[Action] = []
    devices = None
    if any(value for _, value in _iocost_settings(settings)):
        devices = snapshot.section(BLOCK_DEVICES)
    disks, found, _ = resolve(devices, settings.devices) if devices is not None else ([], {}, {})
    for knob, value in _iocost_settings(settings):
        if value and not disks:
            continue            # no sensor this round, or no name resolves (as io.max): hold what is there
        wanted = disks if value and knob in snapshot.supported else []
        actions += [restore(target, knob, f"{target} is no longer configured by io_qos")
                    for target, k in sorted(snapshot.held) if k == knob and target not in wanted]
        actions += [Action(disk, knob, value, {"devices": found, knob: value}, f"{knob} of {disk}: {value}")
                    for disk in wanted]
    return actions


def resolve(devices: BlockDevices, specs: tuple[str, ...]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(the disks, sorted and each once; name -> disk; name -> why it names none)."""
    found, unresolved = {}, {}
    for spec in specs:
        disk, why = devices.resolve(spec)
        if disk is None:
            unresolved[spec] = why
        else:
            found[spec] = disk
    disks = sorted(set(found.values()), key=lambda d: tuple(int(x) for x in d.split(":")))
    return disks, found, unresolved


def _io_max_actions(snapshot: Snapshot, settings, state: State) -> list[Action]:
    devices = snapshot.section(BLOCK_DEVICES)
    guard = Protected.of_snapshot(snapshot)
    be, actions = [], []
    for cg in snapshot.of_class("BE"):
        why = guard.why(cg.path)
        if why is None:
            be.append(cg)
        else:
            actions.append(restore(cg.path, "io.max", f"{cg.path} {why}: no IO limit", step="protected"))
    if devices is None:
        return actions          # the sensor did not run this round: hold what is there
    disks, found, unresolved = resolve(devices, settings.devices)
    if not disks:
        return actions          # no name resolves (a disk unplugged): hold, the reasons of earlier rounds say which
    ceiling = parse_limits(settings.be_io_max)
    reason: dict[str, Any] = {"devices": found, "be_io_max": settings.be_io_max}
    if unresolved:
        reason["unresolved"] = unresolved
    step = "static"
    if settings.dynamic:
        step, signal = _dynamic_step(snapshot, settings, state)
        reason.update(signal, step=step, fraction=round(state.fraction, 4))
    limits = {f: None if v is None else max(1, round(v * state.fraction)) for f, v in ceiling.items()}
    value = format_io_max({d: limits for d in disks})
    text = " ".join(f"{f}={limits[f]}" for f in FIELDS if limits[f] is not None) or "no limit"
    message = (f"BE io.max {text} on {', '.join(disks)}"
               + (f" ({state.fraction:.0%} of be_io_max: {step})" if settings.dynamic else ""))
    for cg in be:
        held = snapshot.held.get((cg.path, "io.max"))
        if held is not None and _devices_of(held) != set(disks):
            # The disks changed: give back the old ones' limits first, so the new hold covers exactly these.
            actions.append(restore(cg.path, "io.max", "the disks io_qos limits changed", step="disks changed"))
        actions.append(Action(cg.path, "io.max", value, {**reason, "class": "BE"}, message))
    return actions


def _devices_of(original: str) -> set[str] | None:
    try:
        return set(parse_io_max(original))
    except ValueError:
        return None


def _ls_io_pressure(samples: tuple[CgroupSample, ...]) -> tuple[float | None, str | None]:
    """The worst LS io.pressure "some", percent: over the last round where two samples exist (total's
    growth), else avg10; with the cgroup it is of."""
    worst: tuple[float | None, str | None] = (None, None)
    for c in samples:
        p = c.io_pressure.some if c.io_pressure is not None else None
        if p is None:
            continue
        value = p.growth / 1e4 if p.growth is not None else p.avg10      # µs of stall per s -> percent
        if worst[0] is None or value > worst[0]:
            worst = (value, c.path)
    return worst


def _dynamic_step(snapshot: Snapshot, settings, state: State) -> tuple[str, dict]:
    pressure, where = _ls_io_pressure(snapshot.of_class(*LATENCY_SENSITIVE))
    slack = None
    if settings.follow_slo:
        # Only the service's own latency: the run-queue and CPU-pressure signals of ls_signals are CPU's.
        ls = snapshot.of_class(*LATENCY_SENSITIVE)
        state.slo.forget_except(c.path for c in ls if snapshot.slo_of(c.path) is not None)
        slack = worst_slack([s for c in ls for s in slo_signals(snapshot, c.path, state.slo)])
    signal: dict[str, Any] = {"ls_io_pressure": None if pressure is None else round(pressure, 3),
                              "io_pressure_target": settings.io_pressure_target}
    if where is not None:
        signal["ls_io_pressure_cgroup"] = where
    if slack is not None:
        signal.update(slo_slack=round(slack[0], 3), slo_worst=slack[1])
    if pressure is None and slack is None:
        return "hold (no LS signal)", signal
    floor = settings.floor_percent / 100
    over = pressure is not None and pressure > settings.io_pressure_target
    missed = slack is not None and slack[0] < 0
    if over or missed:
        state.fraction = max(floor, state.fraction * (1 - settings.cut_percent / 100))
        return ("cut: " + " and ".join(w for w, on in (("LS IO pressure above target", over),
                                                        ("LS misses its SLO", missed)) if on)), signal
    calm = pressure is None or pressure < settings.io_pressure_target * RAISE_BELOW
    if calm and (slack is None or slack[0] >= GROW_AT):
        if state.fraction >= 1.0:
            return "at ceiling", signal
        state.fraction = min(1.0, state.fraction + settings.step_percent / 100)
        return "raise", signal
    return "hold", signal
