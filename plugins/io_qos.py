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
not IO's and are left out). Only the fields `be_io_max` limits move; a field it leaves at max stays max.
- Cut: pressure above the target or an SLO missed: BE's limits are cut at once by `cut_percent`, every
  round it lasts, down to `floor_percent` of `be_io_max`. koordd remembers the limit it cut from: the
  knee, the lowest limit known to hurt LS (each cut sets it anew, higher or lower).
- Raise: only after `calm_rounds` calm rounds in a row (pressure under 90% of the target, and at least
  10% slack where there is an SLO); a cut, or a round that is not calm, starts the count again, and each
  raise needs a fresh count. Below the knee a raise goes half the way up to it: back fast after a cut,
  then closing in on the knee in ever smaller steps. A raise is never less than `step_percent` of the
  current limit, which is what takes it past the knee, by one small step. At or above the knee it adds
  `step_percent` of the limit, or the distance the limit has already come above the knee if that is
  more: slow just past the knee, then faster while LS stays calm, so a workload that now tolerates more
  is found again in a few raises (one that tolerates less is found by the next cut). It stops at
  `be_io_max`.
- Patience at the knee: a raise to within `step_percent` of the knee, or past it, waits twice as many
  calm rounds each time such a raise was followed by a cut (up to 16 times calm_rounds: with the
  defaults and a 1 s interval, one try in about 50 s); a raise from above the knee starts it again at
  calm_rounds.
- Hold: pressure between 90% and 100% of the target, or no LS signal at all.
So the limit settles under the knee, where LS's pressure sits under the target, and tries the knee
again rarely, one round at a time; the old dynamic mode (a raise of step_percent of be_io_max after one
calm round) crossed it about every other round. A harmful limit lasts one round (`interval`): the cut
follows the round that saw it. io.pressure is a mean: LS's tail latency suffers before it moves much
(on a loop device with LS at 400 random 4 KiB reads/s, LS alone showed 5-6% and BE held at 25-200 MB/s
6-8%, with LS's p99 already 2-4 times LS alone's), so the limit settles where the mean says, not where
the p99 would: set the target a point or two above LS's own pressure without BE (koordctl or the
decisions show it), or declare an SLO (follow_slo), which sees the latency itself. LS is seen only
where it blocks in read/write/fsync: waits in io_getevents() (libaio) are not IO pressure.

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
MAX_PATIENCE = 16        # a raise past the knee waits at most 16 times calm_rounds calm rounds
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
    knee: float | None = None             # the fraction of the last cut: the lowest limit known to hurt LS
    calm: int = 0                         # calm rounds in a row since the last cut, raise or unquiet round
    patience: int = 1                     # a raise near the knee waits calm_rounds * patience calm rounds
    tried: bool = False                   # the last raise went near the knee (a cut next: the knee was right)
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
        Option("step_percent", float, 10.0, "dynamic: the least a raise adds, as a share of BE's current limits "
                                            "(below the last cut's limit a raise goes half the way up to it)",
               min=1, max=100),
        Option("calm_rounds", int, 3, "dynamic: calm rounds in a row (LS under 90% of target) before each raise",
               min=1, max=1000),
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
        state.calm = 0
        return "hold (no LS signal)", _memory(signal, state)
    floor = settings.floor_percent / 100
    over = pressure is not None and pressure > settings.io_pressure_target
    missed = slack is not None and slack[0] < 0
    if over or missed:
        if state.tried:
            state.patience = min(MAX_PATIENCE, state.patience * 2)    # the knee was right: try it less often
        state.knee, state.calm, state.tried = state.fraction, 0, False
        state.fraction = max(floor, state.fraction * (1 - settings.cut_percent / 100))
        why = " and ".join(w for w, on in (("LS IO pressure above target", over), ("LS misses its SLO", missed)) if on)
        return f"cut: {why}", _memory(signal, state)
    calm = pressure is None or pressure < settings.io_pressure_target * RAISE_BELOW
    if not (calm and (slack is None or slack[0] >= GROW_AT)):
        state.calm = 0
        return "hold", _memory(signal, state)
    if state.fraction >= 1.0:
        return "at ceiling", _memory(signal, state)
    state.calm += 1
    knee = state.knee
    target = min(1.0, raised(state.fraction, knee, settings.step_percent / 100))
    near = knee is not None and target >= knee * (1 - settings.step_percent / 100)   # within a step of it
    if state.calm < settings.calm_rounds * (state.patience if near else 1):
        return "hold (calm, fewer than calm_rounds)", _memory(signal, state)
    if knee is not None and state.fraction >= knee:
        state.patience = 1              # calm above the knee: it moved up, the next one is tried as soon
    state.calm, state.fraction, state.tried = 0, target, near
    return "raise", _memory(signal, state)


def raised(fraction: float, knee: float | None, step: float) -> float:
    """The limit after a raise: below the knee half the way up to it; at or above it (or with none known)
    `step` of the limit or, if more, the distance the limit has come above the knee; never less than
    `step` of the limit."""
    if knee is not None and fraction < knee:
        return fraction + max((knee - fraction) / 2, step * fraction)
    return fraction + max(step * fraction, fraction - knee if knee is not None else 0.0)


def _memory(signal: dict, state: State) -> dict:
    signal.update(knee=None if state.knee is None else round(state.knee, 4), calm=state.calm,
                  patience=state.patience)
    return signal
