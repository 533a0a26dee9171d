"""proactive_reclaim: take back memory best-effort (BE) work does not use, a little at a time, while it
does not miss it (Meta's senpai).

Reads, for every BE cgroup (the pods of kubepods-besteffort.slice, the jobs of be.slice: each class
root's children; a root without children is one of its own): its `memory.current` and its memory
PSI "some": the share of time some of its tasks waited for memory. The per-round growth of the PSI
total (stall µs per second of the round, as a percent) where there are two samples, else `avg10`.

Each round, per cgroup, against `psi_target` (percent of time):
- at or above it: nothing is reclaimed, the step falls back to `min_step`, and the cgroup is left
  alone for `backoff` (never reclaim from a cgroup whose PSI is above target);
- under it but rising (higher than last round and past half the target): the step halves, and that
  smaller step is reclaimed;
- under it otherwise: the step is reclaimed, and once the kernel confirms it (a write to
  `memory.reclaim` returns only when that much was reclaimed) it grows by `grow_percent`.
The step never exceeds `max_step_percent` of the cgroup's `memory.current`. A write to memory.reclaim
returns only once the kernel reclaimed that much (seconds for GiBs on a host that swaps to disk), and
every loop's round waits for it: a cgroup's ask is RECLAIM_WRITE_BYTES (32 MiB) at most, one write, and a
round asks for RECLAIM_ROUND_BYTES (256 MiB) at most over all the cgroups (koordd/core/reclaim.py), those
that waited longest for a step first; the others wait for the next round. The actuator times these
writes: once they took its budget for the round (1 s, SLOW_WRITE_BUDGET, koordd/act/actuator.py), the
rest are deferred, not written; a deferred cgroup keeps its step and its place in line, and is asked
again next round. A reclaim the kernel
could not complete (EAGAIN: less than asked was reclaimable) halves the step. What the kernel
reclaimed, cumulatively per cgroup since the loop started, is each decision's `saved_total_bytes`
(with `reclaim_bytes`, this round's ask): the bytes saved. A write that returned is at least that
much; memory the workload touches again comes back, and its PSI then stops the loop.

Reclaiming from a cgroup that has memory it does not touch costs it nothing; from one that does
touch it, refaults (file pages read again, anon pages swapped in) that show as memory pressure at
once, which is why the step follows the PSI of the very cgroup reclaimed from.

Refaults of clean page cache that a fast disk (or the host's page cache) serves stall too little to
reach the PSI target: once memory.current is down to the working set, PSI alone lets each step take
hot pages that are read straight back. So the loop also watches the cgroup's refaults (memory.stat
`workingset_refault_file` + `workingset_refault_anon`, in bytes): when those that grew since the last
step are more than `refault_percent` of that step, the step reached memory the cgroup uses, and the
round counts as PSI at the target (back to `min_step`, left alone for `backoff`). Only a round right
after a step is judged, against that step; counters that went backwards (a cgroup recreated under the
same name) or are missing leave the round to PSI alone. A workload that refaults by itself (it reads
more than fits) is then reclaimed from at `min_step` once per `backoff` at most. `refault_percent = 0`
turns this off and reads no memory.stat.

Only BE: koordd's guard (koordd/act/protect.py) refuses `memory.reclaim` on LS, LSR, LSE and SYSTEM
cgroups and on any cgroup that holds one or lies inside one, whatever the config says, so `classes`
takes BE alone.

Swap: with `be_swap_max`, each BE class root's `memory.swap.max` (v2) is set: "0" keeps BE out of
swap (its anon memory then stays in RAM or is OOM-killed, never swapped), a size caps its swap, "max"
lets it swap freely; "" leaves it alone. Restored on stop. Where the host has no swap device the
knob is harmless. senpai on a host with swap reclaims anon memory too; without swap, only page cache.

Needs `memory.reclaim`: cgroup v2 with the memory controller, Linux 5.19+. On cgroup v1 and hybrid
hosts (whose memory controller is v1) there is none: the loop says so in one log line and does
nothing; `koordctl doctor` shows the `memory.reclaim` row. Off by default.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from koordd.core.decisions import APPLIED, DEFERRED
from koordd.core.loop import Action, Loop, carried_out, restore
from koordd.core.options import ClassList, Duration, Option
from koordd.core.protected import Protected
from koordd.core.reclaim import RECLAIM_ROUND_BYTES, RECLAIM_WRITE_BYTES
from koordd.core.snapshot import CgroupSample, Refaults, Snapshot
from koordd.core.units import parse_memory_value

log = logging.getLogger("koordd.loop.proactive_reclaim")

MiB = 1 << 20
PAGE = 4096                      # smaller asks are not worth a write: the kernel reclaims in pages
CLASSES = ("BE",)                # see the docstring: the guard refuses reclaim on every other class
RISING_FRACTION = 0.5            # "rising" counts once the pressure is past half the target


def parse_size(text: str | int, zero_ok: bool = False) -> int | None:
    """Bytes of a size such as "16M" (binary suffixes), None for ""; "max" only where the caller
    allows it (swap). ValueError naming what is wrong."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ValueError(f"expected a size such as \"16M\", got {type(text).__name__}")
    s = text.strip() if isinstance(text, str) else str(text)
    if s == "":
        return None
    if s == "0":
        if zero_ok:
            return 0
        raise ValueError("must be more than 0")
    parsed = parse_memory_value(s)
    if parsed is None or parsed[0] != "bytes":
        raise ValueError(f"expected a size in bytes such as \"16M\" or \"1G\", got {s!r}")
    return int(parsed[1])


class SizeOption(Option):
    """A size in bytes (K, M, G, T suffixes), checked when the config loads; kept as its text."""

    def convert(self, value: Any) -> str:
        if parse_size(value) is None:
            raise ValueError("expected a size such as \"16M\", got \"\"")
        return str(value).strip()


class SwapOption(Option):
    """memory.swap.max: "" leave alone, "0" no swap, a size, or "max"."""

    def convert(self, value: Any) -> str:
        if isinstance(value, str) and value.strip().lower() == "max":
            return "max"
        n = parse_size(value, zero_ok=True)
        return "" if n is None else str(n)


@dataclass
class Step:
    """One cgroup's adaptive step."""
    step: float                           # bytes to reclaim next round
    last_pressure: float | None = None    # percent, the previous round's
    backoff_until: float = 0.0            # monotonic time: no reclaim before
    saved_total: int = 0                  # bytes the kernel reclaimed on this loop's asks
    asked: int = 0                        # this round's ask, for settle()
    stepped: int = 0                      # last round's ask, once carried out: what its refaults are judged by
    refaults: int | None = None           # the cumulative refault bytes the last round read
    turn: float = float("-inf")           # when its last step was asked: who waited longest goes first
    turn_before: float = float("-inf")    # the turn before this round's ask: kept where the ask was deferred


@dataclass
class State:
    cgroups: dict[str, Step] = field(default_factory=dict)
    told_unsupported: bool = False        # the one log line on a host without memory.reclaim


class ProactiveReclaim(Loop):
    __doc__ = __doc__
    name = "proactive_reclaim"
    options = (
        ClassList("classes", tuple, CLASSES, "classes whose cgroups are reclaimed from (BE only: koordd's guard "
                  "refuses memory.reclaim on LS, LSR, LSE and SYSTEM)", choices=CLASSES),
        Option("psi_target", float, 0.1, "memory PSI some (percent of time) a cgroup must stay under to be "
               "reclaimed from", min=0.001, max=100),
        SizeOption("min_step", str, "1M", "the smallest step, and where it starts again after pressure"),
        Option("max_step_percent", float, 1.0, "the largest step, as a percent of the cgroup's memory.current",
               min=0.01, max=50),
        Option("grow_percent", float, 50.0, "how much the step grows after a quiet round's reclaim",
               min=1, max=400),
        Option("backoff", Duration, Duration(30.0), "how long a cgroup is left alone after its PSI reached "
               "psi_target", min=0, max=3600),
        Option("refault_percent", float, 25.0, "refaults since the last step, as a percent of that step, that "
               "count as PSI at psi_target (the step reached the working set); 0 = off", min=0, max=1000),
        SwapOption("be_swap_max", str, "", "BE class roots' memory.swap.max (v2): \"0\" no swap, a size, \"max\"; "
                   "\"\" = leave alone"),
    )

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        out = {(cls, "memory.reclaim") for cls in settings.classes}
        if settings.be_swap_max:
            out.add(("BE", "memory.swap.max"))
        return frozenset(out)

    @staticmethod
    def members_of(settings) -> frozenset[str]:
        return frozenset(settings.classes)

    @staticmethod
    def needs(settings) -> frozenset[str]:
        return frozenset({"memory_current", "memory_pressure"})

    @staticmethod
    def class_needs(settings) -> frozenset[str]:
        # memory.stat costs the kernel a statistics flush: read of the BE roots and pods alone, and only
        # while the refault signal is on.
        return frozenset({"memory_refaults"}) if settings.refault_percent > 0 else frozenset()

    @classmethod
    def member_needs(cls, settings) -> frozenset[str]:
        return cls.needs(settings) | cls.class_needs(settings)

    @staticmethod
    def initial_state(settings) -> State:
        return State()

    @staticmethod
    def decide(snapshot: Snapshot, settings, state: State) -> list[Action]:
        actions = _swap_actions(snapshot, settings)
        if "memory.reclaim" not in snapshot.supported:
            if not state.told_unsupported:
                state.told_unsupported = True
                log.warning("proactive_reclaim does nothing on this host: it has no memory.reclaim (cgroup v2 "
                            "with the memory controller, Linux 5.19+); koordctl doctor's memory.reclaim row "
                            "says why")
            return actions
        state.told_unsupported = False
        guard = Protected.of_snapshot(snapshot)
        seen = set()
        budget = RECLAIM_ROUND_BYTES
        units = sorted(snapshot.units(*settings.classes),
                       key=lambda u: (state.cgroups[u.path].turn if u.path in state.cgroups else float("-inf"), u.path))
        for unit in units:
            if guard.why(unit.path):
                continue            # an LS job in be.slice, or be.slice holding one: the actuator would refuse
            seen.add(unit.path)
            action = _reclaim(snapshot.time, unit, settings, state, budget)
            if action is not None:
                budget -= state.cgroups[unit.path].asked
                actions.append(action)
        for gone in set(state.cgroups) - seen:
            del state.cgroups[gone]
        return actions

    @staticmethod
    def settle(actions: list[Action], decisions: list, settings, state: State) -> None:
        done = carried_out(decisions)
        # Dry-run carries a reclaim out on paper only: the step moves as it would, nothing is saved.
        written = {(d.target, d.knob) for d in decisions if d.outcome == APPLIED}
        deferred = {(d.target, d.knob) for d in decisions if d.outcome == DEFERRED}
        grow = 1 + settings.grow_percent / 100
        floor = parse_size(settings.min_step)
        for a in actions:
            st = state.cgroups.get(a.target)
            if a.knob != "memory.reclaim" or st is None or not st.asked:
                continue
            if (a.target, a.knob) in deferred:
                # Not tried (the actuator's budget for slow writes was spent): no failure, its step stays,
                # and its place in line too, so it goes first next round.
                st.turn = st.turn_before
            elif (a.target, a.knob) in done:
                st.stepped = st.asked
                if (a.target, a.knob) in written:
                    st.saved_total += st.asked
                if a.reason.get("step") == "grow":
                    st.step = st.step * grow
            else:
                # Refused: EAGAIN (less than asked was reclaimable) or the cgroup went; ask less next time.
                st.step = max(floor, st.step / 2)
            st.asked = 0


def pressure_percent(sample: CgroupSample) -> tuple[float, str] | None:
    """The cgroup's memory PSI some, in percent of time: this round's growth of the total where there
    is one (it sees a burst at once), else avg10; None when the kernel gave none."""
    stat = sample.memory_pressure
    if stat is None or stat.some is None:
        return None
    if stat.some.growth is not None:
        return stat.some.growth / 1e4, "round"        # µs of stall per second -> percent
    return stat.some.avg10, "avg10"


def refault_growth(sample: CgroupSample, st: Step) -> int | None:
    """Refault bytes since the round before (kept in `st` for the next); None where either round had no
    counters, or they went backwards (the cgroup was recreated: this reading starts it afresh)."""
    now = sample.memory_refaults.total if isinstance(sample.memory_refaults, Refaults) else None
    before, st.refaults = st.refaults, now
    if now is None or before is None or now < before:
        return None
    return now - before


def _reclaim(now: float, cg: CgroupSample, settings, state: State, budget: int) -> Action | None:
    floor = parse_size(settings.min_step)
    st = state.cgroups.setdefault(cg.path, Step(float(floor)))
    st.asked = 0
    # Read every round, before any early return, so the growth always spans one round.
    stepped, st.stepped = st.stepped, 0
    refaulted = refault_growth(cg, st) if settings.refault_percent > 0 else None
    measured = pressure_percent(cg)
    if measured is None or cg.memory_current is None:
        return None                 # blind this round: reclaim nothing we cannot watch
    pressure, source = measured
    last, st.last_pressure = st.last_pressure, pressure
    target = settings.psi_target
    refault_limit = stepped * settings.refault_percent / 100 if stepped else None
    if pressure >= target or (refaulted is not None and refault_limit is not None and refaulted > refault_limit):
        # Either way the last step took memory the cgroup uses: start small again, after a while.
        st.step, st.backoff_until = float(floor), now + float(settings.backoff)
        return None
    if now < st.backoff_until:
        return None
    if last is not None and pressure > last and pressure > target * RISING_FRACTION:
        st.step, how = max(float(floor), st.step / 2), "shrink"
    else:
        how = "grow"
    cap = cg.memory_current * settings.max_step_percent / 100
    st.step = min(st.step, max(cap, float(floor)))
    ask = int(min(st.step, cap, budget, RECLAIM_WRITE_BYTES)) // PAGE * PAGE
    if ask < PAGE:
        return None                 # too little memory in use to take anything back, or the round's budget spent
    st.asked, st.turn_before, st.turn = ask, st.turn, now
    reason = {"class": cg.cls or "BE", "memory_current": cg.memory_current, "psi_some_percent": round(pressure, 4),
              "psi_source": source, "psi_target": target, "step": how, "reclaim_bytes": ask,
              "saved_total_bytes": st.saved_total,
              # this round's refaults (None: not measured) against the last step's share (None: no step)
              "refault_bytes": refaulted, "refault_limit_bytes": None if refault_limit is None else int(refault_limit)}
    refaults = "" if refaulted is None else f", refaults {refaulted / MiB:.1f} MiB"
    return Action(cg.path, "memory.reclaim", str(ask), reason,
                  f"reclaim {ask / MiB:.1f} MiB of {cg.path}: memory PSI some {pressure:.3f}% under "
                  f"{target:g}%{refaults} ({how}; {st.saved_total / MiB:.1f} MiB reclaimed so far)")


def _swap_actions(snapshot: Snapshot, settings) -> list[Action]:
    out = []
    for cg in snapshot.of_class("BE"):
        if settings.be_swap_max and "memory.swap.max" in snapshot.supported:
            out.append(Action(cg.path, "memory.swap.max", settings.be_swap_max,
                              {"class": "BE", "swap_max": settings.be_swap_max},
                              f"BE memory.swap.max {settings.be_swap_max}"))
        elif (cg.path, "memory.swap.max") in snapshot.held:
            out.append(restore(cg.path, "memory.swap.max", "be_swap_max is \"\": the original goes back"))
    return out
