"""llc_partition: split the last-level cache (and memory bandwidth) between classes with resctrl.

Each class in `classes` (default LSR, LS, BE) gets a resctrl control group of its own, named
`koordd-<class>`, and every thread of the class's cgroups is moved into it each round (threads
started since the last round included; a thread id is reused by the kernel, so membership is
checked, not remembered). A group's `L3` mask covers a percent range of the cache's ways
(`<class>_l3`, e.g. "0-30"), koordlet's way: first way ceil(ways × start%), end ceil(ways × end%),
contiguous, at least min_cbm_bits, the same on every cache id; `MB` limits the class's memory
bandwidth to `<class>_mb` percent (Intel: rounded up to the granularity; AMD: that share of 2048,
the unlimited value).

`mode`:
- "static": the ranges as configured (defaults LSR and LS 0-100%, BE 0-30%: BE's cache pollution is
  held to 30% of the ways, while LS may use them all).
- "adaptive" (Heracles): BE starts with `be_l3_min` percent of the ways and gains one way per round
  while LS slack (the LS classes' health targets, as be_suppress's rule slack reads them) is 10% or
  more, up to the end of `be_l3`; under 5% slack it drops back to its minimum at once and does not
  grow again for `adaptive_cooldown`. LS keeps its own range.

resctrl is rarely mounted at boot: with `mount = true` the loop mounts it at /sys/fs/resctrl (where
the CPU and kernel have it), and koordd unmounts it on stop, which removes every group in it; a
systemd mount unit is the other way, and then koordd leaves the mount alone. Under the shipped unit
the mount is made in the mount namespace systemd gives koordd (ProtectSystem=), which does not
propagate to the host: the groups are the kernel's and act all the same, but a shell on the host
sees /sys/fs/resctrl empty. Prefer the mount unit there (not verified: no host here has resctrl).

A group named `koordd-<class>` that koordd did not make (none in its restore journal) is left
alone, and its class gets no partition. On stop, when the loop is disabled or a class leaves
`classes`, each group koordd made is removed, which hands its threads back to the default group;
groups it did not make are never touched. Without resctrl (no cat_l3/mba, not mounted) the loop
does nothing and `koordctl doctor` says why; where the CPU has L3 allocation but no MBA (or the
reverse), only the other is written.

Verified on a fake resctrl tree only (koordtest/fakes/resctrl.py): no machine available to this project
has resctrl.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from koordd.core.classes import WORKLOAD_CLASSES
from koordd.core.health import RunqWindow, ls_signals, worst_slack
from koordd.core.slo import SloWindow
from koordd.core.loop import Action, Loop, NODE, restore
from koordd.core.options import ClassList, Duration, Option
from koordd.core.schemata import L3Info, l3_line, l3_ways, mb_line, mb_value, ways_mask
from koordd.core.snapshot import RESCTRL, RUNQ_LATENCY, Snapshot
from koordd.core.targets import RESCTRL_TARGET as MOUNT_TARGET

CLASSES = WORKLOAD_CLASSES
GROUP_PREFIX = "koordd-"
GROW_AT, HOLD_AT = 0.10, 0.05         # Heracles: grow BE at 10% slack or more, take back under 5%


def group_of(cls: str) -> str:
    return GROUP_PREFIX + cls


class PercentRange(Option):
    """"start-end" percent of a resource, kept as that text ("0-30")."""

    def convert(self, value):
        if not isinstance(value, str):
            raise ValueError(f"expected a range such as \"0-30\" (percent), got {type(value).__name__}")
        start, sep, end = value.partition("-")
        try:
            a, b = float(start), float(end)
        except ValueError:
            raise ValueError(f"expected a range such as \"0-30\" (percent), got {value!r}") from None
        if not sep or not 0 <= a < b <= 100:
            raise ValueError(f"expected start-end with 0 <= start < end <= 100, got {value!r}")
        return f"{a:g}-{b:g}"


def percent_range(text: str) -> tuple[float, float]:
    a, _, b = text.partition("-")
    return float(a), float(b)


@dataclass
class State:
    be_ways: int | None = None                      # adaptive: BE's ways now
    cooldown_until: float = 0.0                     # adaptive: no growth before then
    runq: RunqWindow = field(default_factory=RunqWindow)
    slo: SloWindow = field(default_factory=SloWindow)      # LS slack: recent rounds' responses per SLO


class LlcPartition(Loop):
    __doc__ = __doc__
    name = "llc_partition"
    options = (
        ClassList("classes", tuple, ("LSR", "LS", "BE"), "classes that get a resctrl group (koordd-<class>)",
                  choices=CLASSES),
        Option("mount", bool, False, "mount resctrl at /sys/fs/resctrl where the CPU and kernel have it and it "
               "is not mounted; koordd unmounts it again on stop (which removes every group in it)"),
        Option("mode", str, "static", "static: the ranges below; adaptive: BE's cache share follows LS slack",
               choices=("static", "adaptive")),
        PercentRange("lse_l3", str, "0-100", "LSE's share of the cache ways, start-end percent"),
        PercentRange("lsr_l3", str, "0-100", "LSR's share of the cache ways, start-end percent"),
        PercentRange("ls_l3", str, "0-100", "LS's share of the cache ways, start-end percent"),
        PercentRange("be_l3", str, "0-30", "BE's share of the cache ways, start-end percent (adaptive: "
                     "the most it grows to)"),
        Option("be_l3_min", float, 10.0, "adaptive: BE's share of the ways at the start and after LS "
               "slack fell under 5%, percent (at least min_cbm_bits ways)", min=0, max=100),
        Option("adaptive_cooldown", Duration, Duration(30.0), "adaptive: after BE lost its ways, how long "
               "before it may grow again", min=0, max=3600),
        Option("lse_mb", float, 100.0, "LSE's memory bandwidth limit, percent", min=1, max=100),
        Option("lsr_mb", float, 100.0, "LSR's memory bandwidth limit, percent", min=1, max=100),
        Option("ls_mb", float, 100.0, "LS's memory bandwidth limit, percent", min=1, max=100),
        Option("be_mb", float, 100.0, "BE's memory bandwidth limit, percent", min=1, max=100),
    )

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        return frozenset({(cls, "resctrl_group") for cls in settings.classes}
                         | {(NODE, k) for k in ("resctrl.group", "schemata.L3", "schemata.MB", "resctrl.mount")})

    @staticmethod
    def needs(settings) -> frozenset[str]:
        extra = {RUNQ_LATENCY, "cpu_pressure"} if settings.mode == "adaptive" else set()
        return frozenset({RESCTRL} | extra)

    @staticmethod
    def initial_state(settings) -> State:
        return State()

    @staticmethod
    def decide(snapshot: Snapshot, settings, state: State) -> list[Action]:
        section = snapshot.section(RESCTRL)
        if section is None:
            # Not mounted, or no resctrl here (the sensor said why, once; the mount knob is unsupported).
            if settings.mount and "resctrl.mount" in snapshot.supported:
                return [Action(MOUNT_TARGET, "resctrl.mount", "mounted", {"step": "mount"},
                               "resctrl mounted at /sys/fs/resctrl (option mount)")]
            return []
        info = section.info
        actions: list[Action] = []
        for cls in settings.classes:
            group = group_of(cls)
            roots = [c.path for c in snapshot.of_class(cls)]
            ours = (group, "resctrl.group") in snapshot.held
            if not roots or (group in section.groups and not ours):
                continue                    # nothing to partition, or a group that is not koordd's
            l3, why = _l3_of(cls, info.l3, snapshot, settings, state) if info.l3 else (None, {})
            mb = mb_value(info.mb, getattr(settings, f"{cls.lower()}_mb")) if info.mb else None
            reason = {"class": cls, "group": group, **why,
                      **({"ways": bin(l3).count("1"), "of_ways": info.l3.ways} if l3 is not None else {}),
                      **({"mb": mb} if mb is not None else {})}
            actions.append(Action(group, "resctrl.group", "present", reason, f"{cls} gets resctrl group {group}"))
            if l3 is not None:
                actions.append(Action(group, "schemata.L3", l3_line(info.l3, l3), reason,
                                      f"{cls}: {reason['ways']} of {info.l3.ways} cache ways"
                                      + (f" ({why['step']})" if "step" in why else "")))
            if mb is not None:
                actions.append(Action(group, "schemata.MB", mb_line(info.mb, mb), reason,
                                      f"{cls}: memory bandwidth {mb}{'' if info.vendor == 'amd' else '%'}"))
            actions += [Action(cg, "resctrl_group", group, reason, f"{cls} threads of {cg} into {group}")
                        for cg in roots]
        wanted = {group_of(c) for c in settings.classes}
        for target, knob in sorted(snapshot.held):
            if knob == "resctrl.group" and target.startswith(GROUP_PREFIX) and target not in wanted:
                actions.append(restore(target, knob, f"{target} no longer wanted: removed, its threads back "
                                                     "in the default group", step="remove"))
        return actions


def _l3_of(cls: str, l3: L3Info, snapshot: Snapshot, settings, state: State) -> tuple[int, dict]:
    """The class's L3 mask, and for BE in adaptive mode the numbers behind it."""
    start, end = percent_range(getattr(settings, f"{cls.lower()}_l3"))
    if cls != "BE" or settings.mode != "adaptive":
        return ways_mask(l3, *l3_ways(l3, start, end)), {}
    first, most = l3_ways(l3, start, end)
    least = min(max(l3.min_cbm_bits, 1, math.ceil(l3.ways * settings.be_l3_min / 100)), most)
    if state.be_ways is None:
        state.be_ways = least
    found = worst_slack(ls_signals(snapshot, snapshot.section(RUNQ_LATENCY), state.runq, state.slo))
    now = snapshot.time
    if found is None:
        step = "hold (no LS signal)"
    elif found[0] < HOLD_AT:
        state.be_ways, state.cooldown_until, step = least, now + float(settings.adaptive_cooldown), "back to least"
    elif found[0] >= GROW_AT and now >= state.cooldown_until and state.be_ways < most:
        state.be_ways, step = state.be_ways + 1, "grow one way"
    else:
        step = "hold"
    state.be_ways = max(least, min(state.be_ways, most))
    why = {"step": step, "least_ways": least, "most_ways": most}
    if found is not None:
        why.update(slack=round(found[0], 3), worst=found[1])
    return ways_mask(l3, first, state.be_ways), why
