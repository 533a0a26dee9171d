"""memory_evict: relieve memory pressure by reclaiming, freezing or killing best-effort (BE) cgroups,
before the kernel's OOM killer picks a victim of its own (which may well be latency-sensitive).

Reads: memory in use that page-cache reclaim cannot free (anon + unevictable) against a capacity,
memory PSI, and the memory use of every BE cgroup.
- Without `scope`: the whole node (`AnonPages + Unevictable` of `/proc/meminfo` against MemTotal;
  PSI from `/proc/pressure/memory`).
- With `scope` (a cgroup path relative to the cgroup root, e.g. "kubepods.slice"): that cgroup's
  anon + unevictable memory against its own `memory.max` (v1 `memory.limit_in_bytes`; when it has
  none, the node's MemTotal) and its `memory.pressure`. Only BE cgroups below the scope are victims.

Triggers a round when either
- usage ≥ `threshold_percent` of the capacity (koordlet's rule), or
- memory PSI "full" avg10 has stayed above `pressure_full_percent` for `pressure_duration`
  (systemd-oomd's rule; 0 turns it off).
A round picks victims until their usage covers what it takes to get below the lower mark
(`threshold_percent` − `release_gap_percent`); a pressure-only round takes one victim. Victims are
BE cgroups only, first by `priority` (glob patterns, earlier = evicted first, a pattern also
matches the cgroups below what it names; unmatched come last), then the largest memory use first.
A victim killed by a previous round but still present counts as already freed, so a second round
does not kill more than needed. Rounds are at least `cooldown` apart.

Escalates per victim, across rounds: where the host has `memory.reclaim` (cgroup v2, 5.19+) and
`reclaim` is on, a victim's first step is a proactive reclaim of its share of the bytes to free.
A write to memory.reclaim returns only once that much is reclaimed, which on a large share takes
seconds (anon pages going to swap): a round asks for RECLAIM_ROUND_BYTES (256 MiB, koordd/core/reclaim.py)
at most, over all its victims, in writes of RECLAIM_WRITE_BYTES (32 MiB) at most; a share larger than
that goes on in the next rounds while each step is carried out, and a victim past the round's bytes
waits for the next round. The actuator times these writes: once they took its budget for the round
(1 s, SLOW_WRITE_BUDGET, koordd/act/actuator.py), the rest are deferred, not written; a deferred write
is no failure: its bytes are asked again next round, and its victim is not escalated for it. Once its
share is reclaimed (or a step could not be: EAGAIN), if a later round still needs that victim, it is killed (`cgroup.kill`: the whole subtree on v2,
frozen, killed and thawed on v1) or, with `action = "freeze"`, frozen (`cgroup.freeze`, v1
`freezer.state`). At most `max_kills_per_minute` kills: a victim beyond that is frozen instead.

A victim frozen by this loop stays frozen while usage is above the lower mark or memory PSI is
above `pressure_full_percent`; once both have been below for `thaw_delay`, the most recently
frozen victim is thawed, then the next one a `thaw_delay` later, and so on. Stopping koordd or
disabling the loop thaws every cgroup it froze. A victim killed while frozen (by this loop or
anyone else) is thawed right after the kill, as a decision of its own: on v1 a frozen task cannot die.

Victims are the children of the BE class roots (the pods of kubepods-besteffort.slice, the jobs
of be.slice), so one round takes out no more than it needs; a BE root without children is a
victim of its own. Never acts on an LS, LSR, LSE or SYSTEM cgroup, nor on a BE cgroup that has
one of those below it (an LS job in be.slice: not a victim, and neither is be.slice) or above it,
the cgroups the actuator's guard refuses (koordd/act/protect.py).

Prekill hook (off unless `prekill_command` is set, oomd's and systemd-oomd's request): before
each kill, the command (an array: argv[0] an absolute path, no shell) runs with the victim's cgroup
path as its last argument (also in KOORDD_CGROUP, its directory in KOORDD_CGROUP_DIR): to dump a
heap, drain a node-local queue, or tell a scheduler why. It is its own action (`cgroup.prekill`,
koordd/backends/prekill.py), run by the actuator, not by this loop, and beside the rounds, not in
them: the hooks of one round's victims run side by side, sharing one budget, `prekill_timeout` (at
most 10 s) from their start; each victim is killed as soon as its hook is done, or when the budget
runs out (the hook's process group is then killed). One that fails or times out is one refused
decision (a log line) and the kill goes ahead. A stop, or this loop disabled, while hooks run ends
them and kills no victim still waiting for its hook.

Writes, on BE cgroups: `memory.reclaim`, `cgroup.kill`, `cgroup.prekill` (commands, nothing to
restore) and `cgroup.freeze` (restored).
"""
from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field

from koordd.core.cgroup_text import normalize_cgroup, pattern_rank
from koordd.core.decisions import APPLIED, DEFERRED, DRY_RUN
from koordd.core.loop import Action, Loop, carried_out, restore
from koordd.core.options import Duration, Option, PatternList
from koordd.core.protected import Protected
from koordd.core.reclaim import RECLAIM_ROUND_BYTES, reclaim_writes
from koordd.core.snapshot import CgroupSample, PressureStat, Snapshot

MiB = 1 << 20
KILL_SETTLE = 15.0           # s a killed victim that is still present counts as freed (systemd-oomd waits 15 s)
MIN_RECLAIM = MiB            # smaller shares go straight to the next step: reclaim would not help
PRESSURE_RECLAIM_FRACTION = 0.25   # of its usage, for a victim of a pressure-only round


class Argv(Option):
    """A command as an array of strings, argv[0] an absolute path (no PATH lookup, no shell); () for none."""

    def convert(self, value):
        if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
            raise ValueError("expected an array of strings (argv[0] an absolute path), e.g. [\"/usr/local/bin/dump\"]")
        if value and not value[0].startswith("/"):
            raise ValueError(f"argv[0] must be an absolute path, got {value[0]!r}")
        if any("\0" in a for a in value):
            raise ValueError("an argument holds a NUL byte")
        return tuple(value)


class CgroupPath(Option):
    """One cgroup path relative to the cgroup root; "" for none."""

    def convert(self, value):
        return normalize_cgroup(super().convert(value))


@dataclass
class State:
    next_round: float = -math.inf                            # cool-down: no round before this
    pressure_since: float | None = None                      # PSI full above the limit since
    calm_since: float | None = None                          # below the lower mark, no pressure, since
    reclaimed: dict[str, float] = field(default_factory=dict)   # victim -> time of its reclaim step
    reclaim_left: dict[str, float] = field(default_factory=dict)  # victim -> bytes of its share still to reclaim
    killed: dict[str, float] = field(default_factory=dict)      # victim -> time killed, while present
    frozen: dict[str, float] = field(default_factory=dict)      # victim this loop froze -> time
    kills: deque = field(default_factory=deque)                 # times of the kills of the last minute


class MemoryEvict(Loop):
    __doc__ = __doc__
    name = "memory_evict"
    options = (
        Option("threshold_percent", float, 70.0,
               "anon + unevictable memory, percent of the capacity, at which a round starts", min=1, max=100),
        Option("release_gap_percent", float, 2.0,
               "a round frees memory down to threshold_percent minus this", min=0, max=50),
        Option("pressure_full_percent", float, 60.0,
               "memory PSI full avg10 above which (for pressure_duration) a round starts; 0 turns it off",
               min=0, max=100),
        Option("pressure_duration", Duration, Duration(30.0), "how long PSI must stay above pressure_full_percent",
               min=0, max=3600),
        Option("action", str, "kill", "what happens to a victim after reclaim: kill or freeze",
               choices=("kill", "freeze")),
        PatternList("priority", tuple, (), "BE cgroup patterns, earlier = evicted first; unmatched come last"),
        CgroupPath("scope", str, "", "protect this cgroup (its memory limit is the capacity) instead of the node"),
        Option("cooldown", Duration, Duration(4.0), "least time between two rounds", min=0, max=3600),
        Option("max_kills_per_minute", int, 5, "kills in any minute at most; further victims are frozen",
               min=1, max=1000),
        Option("thaw_delay", Duration, Duration(30.0),
               "calm time (below the lower mark, no pressure) before a frozen victim is thawed", min=0, max=3600),
        Option("reclaim", bool, True, "try memory.reclaim on a victim first, where the host has it"),
        Argv("prekill_command", tuple, (), "command run with the victim's cgroup path before each kill (argv, "
             "no shell); [] = none"),
        Option("prekill_timeout", Duration, Duration(5.0), "the budget of one round's prekill commands (they run "
               "side by side): then those still running are killed and their kills go ahead. At most 10 s: memory "
               "pressure does not wait, a victim's memory counts as freed for 15 s from the decision, and it stays "
               "well under half of WatchdogSec=30s", min=0.1, max=10),
    )

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        out = {("BE", "memory.reclaim"), ("BE", "cgroup.freeze"), ("BE", "cgroup.kill")}
        return frozenset(out | {("BE", "cgroup.prekill")} if settings.prekill_command else out)

    @staticmethod
    def needs(settings) -> frozenset[str]:
        # memory.current only where memory.stat has no anon count; memory.max and PSI for the scope.
        return frozenset({"frozen", "memory_anon", "memory_current", "memory_max", "memory_pressure"})

    @staticmethod
    def member_needs(settings) -> frozenset[str]:
        return frozenset({"frozen", "memory_anon", "memory_current"})      # victims: size and state only

    @classmethod
    def member_fields(cls, snapshot: Snapshot, settings, state: State) -> frozenset[str]:
        """Victims are read only when a round may come this tick (usage at the threshold, or memory
        pressure) or a killed victim's size still counts; otherwise listing them is enough (adopting
        and thawing go by path), and hundreds of idle pods cost no file reads."""
        if state.killed:
            return cls.member_needs(settings)
        measured = _capacity_and_usage(snapshot, settings.scope)
        if measured is None or snapshot.time < state.next_round:
            return frozenset()
        capacity, usage, pressure_stat = measured
        if usage >= _high(capacity, settings) or _pressured(pressure_stat, settings):
            return cls.member_needs(settings)
        return frozenset()

    @staticmethod
    def watches(settings) -> frozenset[str]:
        return frozenset({settings.scope}) if settings.scope else frozenset()

    @staticmethod
    def members_of(settings) -> frozenset[str]:
        return frozenset({"BE"})      # victims are pods or jobs, not the whole BE slice

    @staticmethod
    def initial_state(settings) -> State:
        return State()

    @staticmethod
    def settle(actions: list[Action], decisions: list, settings, state: State) -> None:
        _settle(actions, decisions, state)

    @staticmethod
    def decide(snapshot: Snapshot, settings, state: State) -> list[Action]:
        now = snapshot.time
        measured = _capacity_and_usage(snapshot, settings.scope)
        if measured is None:
            return []          # scope gone or a sensor is blind: hold everything as it is
        capacity, usage, pressure_stat = measured
        guard = Protected.of_snapshot(snapshot)
        be = [c for c in snapshot.units("BE") if _inside(c.path, settings.scope) and not guard.why(c.path)]
        by_path = {c.path: c for c in be}
        actions = _adopt_frozen(snapshot, settings.scope, guard, state)
        _forget(state, by_path, snapshot, now)

        pending = sum(_usage(by_path[p]) for p in state.killed)
        effective = usage - pending
        high = _high(capacity, settings)
        low = capacity * max(settings.threshold_percent - settings.release_gap_percent, 0.0) / 100
        pressured = _pressured(pressure_stat, settings)
        pressure_trigger = _pressure_lasted(settings, state, pressured, now)
        over = effective >= high
        reason = {"scope": settings.scope or None, "capacity": capacity, "usage": usage, "pending_release": pending,
                  "effective_usage": effective, "threshold_percent": settings.threshold_percent,
                  "high_mark": round(high), "low_mark": round(low), "pressure_full_avg10": _full_avg10(pressure_stat),
                  "pressure_trigger": pressure_trigger, "action": settings.action}
        actions += _calm(settings, state, capacity, effective, low, pressured, reason, now)

        if not (over or pressure_trigger) or now < state.next_round:
            return actions
        need = max(effective - low, 0.0)
        victims = _pick(be, need, settings, state)
        round_actions = _act(victims, need, settings, state, snapshot, now, reason, over, capacity, effective, low)
        if round_actions:
            state.next_round = now + settings.cooldown
            if pressured:
                state.pressure_since = now        # after acting, the pressure must last a full duration again
        return actions + round_actions


# --- what is measured ------------------------------------------------------------------------------

def _capacity_and_usage(snapshot: Snapshot, scope: str) -> tuple[int, int, PressureStat | None] | None:
    node = snapshot.node
    if not scope:
        usage = node.memory_anon
        if usage is None and node.memory_total is not None and node.memory_available is not None:
            usage = node.memory_total - node.memory_available
        if not node.memory_total or usage is None:
            return None
        return node.memory_total, usage, node.memory_pressure
    sample = snapshot.cgroups.get(scope)
    if sample is None:
        return None
    capacity = node.memory_total
    if sample.memory_max not in (None, "max"):
        capacity = int(sample.memory_max)
    usage = _usage(sample, None)
    if not capacity or usage is None:
        return None
    return capacity, usage, sample.memory_pressure


def _high(capacity: float, settings) -> float:
    return capacity * settings.threshold_percent / 100


def _pressured(pressure_stat: PressureStat | None, settings) -> bool:
    full = _full_avg10(pressure_stat)
    return settings.pressure_full_percent > 0 and full is not None and full > settings.pressure_full_percent


def _pressure_lasted(settings, state: State, pressured: bool, now: float) -> bool:
    """Time how long memory pressure has lasted: whether it has for pressure_duration."""
    if not pressured:
        state.pressure_since = None
    elif state.pressure_since is None:
        state.pressure_since = now
    return pressured and now - state.pressure_since >= settings.pressure_duration


def _calm(settings, state: State, capacity: float, effective: float, low: float, pressured: bool, reason: dict,
          now: float) -> list[Action]:
    """Below the lower mark the episode is over (a new one starts with reclaim again); below it without
    pressure for thaw_delay, the most recently frozen victim is thawed, the next one a thaw_delay later."""
    if effective < low:
        state.reclaimed.clear()        # this episode is over: a new one starts with reclaim again
        state.reclaim_left.clear()
    if effective >= low or pressured:
        state.calm_since = None
        return []
    if state.calm_since is None:
        state.calm_since = now
    if not state.frozen or now - state.calm_since < settings.thaw_delay:
        return []
    victim = max(state.frozen, key=lambda p: (state.frozen[p], p))
    del state.frozen[victim]
    state.calm_since = now            # the next thaw waits another thaw_delay
    return [restore(victim, "cgroup.freeze", f"{_where(settings.scope)} at {_mib(effective)} of {_mib(capacity)}, "
                    f"below {_pct(low, capacity)} for {settings.thaw_delay:g}s: thawing {victim}",
                    **reason, step="thaw")]


def _usage(sample: CgroupSample, unknown=0):
    """Memory page-cache reclaim cannot free (anon + unevictable); memory.current where that is unknown."""
    if sample.memory_anon is not None:
        return sample.memory_anon
    return sample.memory_current if sample.memory_current is not None else unknown


def _full_avg10(stat: PressureStat | None) -> float | None:
    return stat.full.avg10 if stat is not None and stat.full is not None else None


def _inside(path: str, scope: str) -> bool:
    return not scope or path.startswith(scope + "/")


# --- state upkeep ----------------------------------------------------------------------------------

def _adopt_frozen(snapshot: Snapshot, scope: str, guard: Protected, state: State) -> list[Action]:
    """Adopt the BE cgroups this loop holds frozen (after a reload or a restart state is fresh, the
    journal is not); thaw those now outside the scope, or now holding (or inside) a cgroup of
    another class: an LS job started in a frozen BE slice must not stay frozen."""
    actions = []
    held = {cg for (cg, knob) in snapshot.held if knob == "cgroup.freeze"}
    for cg in sorted(held):
        sample = snapshot.find(cg)
        if sample is None or sample.cls != "BE":
            continue             # gone or relabelled: the runner puts it back
        protected = guard.why(cg)
        if not _inside(cg, scope) or protected:
            state.frozen.pop(cg, None)
            why = f"outside the scope {scope!r}" if not _inside(cg, scope) else f"protected: it {protected}"
            actions.append(restore(cg, "cgroup.freeze", f"{cg} is {why}: thawing", scope=scope or None, step="thaw"))
        elif cg not in state.frozen:
            state.frozen[cg] = snapshot.time
    for cg in [cg for cg in state.frozen if cg not in held]:
        del state.frozen[cg]     # thawed by someone (or the write was refused): not ours any more
    return actions


def _forget(state: State, by_path: dict[str, CgroupSample], snapshot: Snapshot, now: float) -> None:
    for cg, t in list(state.killed.items()):
        if cg not in by_path or now - t > KILL_SETTLE:
            del state.killed[cg]
    for cg in [cg for cg in state.reclaimed if cg not in by_path]:
        del state.reclaimed[cg]
        state.reclaim_left.pop(cg, None)
    while state.kills and state.kills[0] <= now - 60:
        state.kills.popleft()


# --- a round ---------------------------------------------------------------------------------------

def _pick(be: list[CgroupSample], need: float, settings, state: State) -> list[CgroupSample]:
    """Victims in eviction order until their usage covers `need` (at least one)."""
    # Freezing again gains nothing: when freezing is all that is left, frozen cgroups are no candidates.
    only_freeze = settings.action == "freeze" or len(state.kills) >= settings.max_kills_per_minute
    candidates = [c for c in be if c.path not in state.killed
                  and not (only_freeze and (c.frozen or c.path in state.frozen))]
    candidates.sort(key=lambda c: (pattern_rank(c.path, settings.priority), -_usage(c), c.path))
    victims, covered = [], 0
    for c in candidates:
        victims.append(c)
        covered += _usage(c)
        if covered >= need:
            break
    return victims


def _act(victims, need, settings, state: State, snapshot: Snapshot, now, reason, over, capacity, effective,
         low) -> list[Action]:
    """A round's steps on its victims, in order: each victim's share of `need` (a pressure-only round: a part
    of its usage) reclaimed where the host can and the round's reclaim bytes last, else the victim killed
    while the kill budget lasts, else frozen."""
    actions: list[Action] = []
    can_reclaim = settings.reclaim and "memory.reclaim" in snapshot.supported
    trigger = _trigger(settings, reason, over, capacity, effective)
    goal = f", to get below {_pct(low, capacity)}" if over else ""
    remaining = need
    budget = RECLAIM_ROUND_BYTES          # of memory.reclaim, this round
    for rank, c in enumerate(victims):
        used = _usage(c)
        share = min(used, remaining) if need > 0 else used * PRESSURE_RECLAIM_FRACTION
        remaining = max(remaining - used, 0.0)
        why = {**reason, "need": round(need), "victim_usage": used, "victim_rank": rank,
               "priority_rank": pattern_rank(c.path, settings.priority), "kills_last_minute": len(state.kills)}
        left = share if c.path not in state.reclaimed else min(share, state.reclaim_left.get(c.path, 0.0))
        if can_reclaim and left >= MIN_RECLAIM:
            if budget < MIN_RECLAIM:
                continue                          # the round's reclaim budget is spent: its turn comes next round
            amount = int(min(left, budget))
            budget -= amount
            actions += _reclaim(c.path, used, left, amount, why, trigger, goal, state, now)
        elif settings.action == "kill" and len(state.kills) < settings.max_kills_per_minute:
            actions += _kill(c, used, why, trigger, goal, settings, state, now)
        elif not (c.frozen or c.path in state.frozen):   # kill budget spent and already frozen: nothing more
            actions.append(_freeze(c, used, why, trigger, goal, settings, state, now))
    return actions


def _trigger(settings, reason: dict, over: bool, capacity: float, effective: float) -> str:
    """What started the round, as the messages of its actions begin."""
    if over:
        return (f"{_where(settings.scope)} at {_mib(effective)} of {_mib(capacity)} "
                f"({100 * effective / capacity:.0f}%) >= {settings.threshold_percent:g}%")
    return (f"memory pressure full avg10 {reason['pressure_full_avg10']:.1f}% > "
            f"{settings.pressure_full_percent:g}% for {settings.pressure_duration:g}s")


def _reclaim(path: str, used: float, left: float, amount: int, why: dict, trigger: str, goal: str, state: State,
             now: float) -> list[Action]:
    """Reclaim `amount` bytes of the victim's share (`left` of it still to go), in writes short enough for
    the actuator to time (see the module docstring); what is left goes on next round."""
    state.reclaimed[path] = now
    state.reclaim_left[path] = left - amount
    rest = f", {_mib(left - amount)} more next round" if left - amount >= MIN_RECLAIM else ""
    writes = reclaim_writes(amount)
    out = []
    for i, n in enumerate(writes):
        part = f" (write {i + 1} of {len(writes)}: {_mib(n)})" if len(writes) > 1 else ""
        out.append(Action(path, "memory.reclaim", str(n),
                          {**why, "step": "reclaim", "reclaim_bytes": n, "round_reclaim_bytes": amount},
                          f"{trigger}: reclaiming {_mib(amount)}{part} from {path} ({_mib(used)}){goal}{rest}"))
    return out


def _kill(c: CgroupSample, used: float, why: dict, trigger: str, goal: str, settings, state: State,
          now: float) -> list[Action]:
    """Kill the victim (its prekill hook first, where one is set), spending the kill budget; thaw it if frozen."""
    state.kills.append(now)
    state.killed[c.path] = now
    state.reclaimed.pop(c.path, None)
    state.reclaim_left.pop(c.path, None)
    out = []
    if settings.prekill_command:
        # Right before the kill, in the same batch: the actuator begins it beside the round and
        # makes the kill when it is done or out of time, whether or not it succeeded.
        out.append(Action(c.path, "cgroup.prekill", _hook(settings), {**why, "step": "prekill"},
                          f"{trigger}: prekill hook for {c.path} before the kill"))
    out.append(Action(c.path, "cgroup.kill", "1", {**why, "step": "kill"},
                      f"{trigger}: killing {c.path} ({_mib(used)}){goal}"))
    # A frozen task dies only once thawed (v1): ours goes back to its original, anyone
    # else's freeze is lifted as a decision of its own.
    if c.path in state.frozen:
        del state.frozen[c.path]
        out.append(restore(c.path, "cgroup.freeze", f"thawing the killed {c.path}", step="thaw"))
    elif c.frozen:
        out.append(Action(c.path, "cgroup.freeze", "0", {**why, "step": "thaw"},
                          f"thawing the killed {c.path} (frozen by someone else): a frozen task "
                          f"dies only once thawed"))
    return out


def _freeze(c: CgroupSample, used: float, why: dict, trigger: str, goal: str, settings, state: State,
            now: float) -> Action:
    """Freeze the victim: `action` is freeze, or the kill budget is spent."""
    state.frozen[c.path] = now
    capped = settings.action == "kill"
    return Action(c.path, "cgroup.freeze", "1", {**why, "step": "freeze", "kill_budget_spent": capped},
                  f"{trigger}: freezing {c.path} ({_mib(used)}){goal}"
                  + (f"; {settings.max_kills_per_minute} kills in the last minute already" if capped else ""))


def _settle(actions: list[Action], decisions: list, state: State) -> None:
    """A kill or freeze the actuator did not carry out (refused, cgroup gone) spends no kill budget
    and releases no memory: forget it, so the next round sees the victim as it is. A kill that waited
    for its prekill hook settles once made. A reclaim step not carried out ends the
    victim's reclaim: its next step is the kill; one the actuator deferred (its budget for slow writes
    was spent) was not tried: its bytes are asked again next round."""
    _settle_reclaim([a for a in actions if a.knob == "memory.reclaim"], decisions, state)
    done = carried_out(decisions)
    for a in actions:
        if (a.target, a.knob) in done:
            continue
        if a.knob == "cgroup.kill" and a.target in state.killed:
            t = state.killed.pop(a.target)
            if t in state.kills:
                state.kills.remove(t)
        elif a.knob == "cgroup.freeze" and a.value == "1":
            state.frozen.pop(a.target, None)


def _settle_reclaim(actions: list[Action], decisions: list, state: State) -> None:
    """Per victim, its memory.reclaim writes of the round (one or more) against their decisions: one
    neither made nor deferred (refused: EAGAIN, less was reclaimable than asked; or the cgroup went)
    ends its reclaim, no further step; the bytes of those deferred go back to what is left of its share."""
    asked: dict[str, int] = {}
    settled: dict[str, int] = {}
    deferred: dict[str, int] = {}
    for a in actions:
        asked[a.target] = asked.get(a.target, 0) + 1
    for d in decisions:
        if d.knob != "memory.reclaim" or d.target not in asked:
            continue
        if d.outcome in (APPLIED, DRY_RUN, DEFERRED):
            settled[d.target] = settled.get(d.target, 0) + 1
        if d.outcome == DEFERRED:
            deferred[d.target] = deferred.get(d.target, 0) + int(d.new or 0)
    for target, n in asked.items():
        if settled.get(target, 0) < n:
            state.reclaim_left.pop(target, None)       # less was reclaimable than asked: no further step
        elif target in deferred and target in state.reclaimed:
            state.reclaim_left[target] = state.reclaim_left.get(target, 0.0) + deferred[target]


def _hook(settings) -> str:
    """cgroup.prekill's value (koordd/backends/prekill.py hook_value): the command and its timeout."""
    return json.dumps({"argv": list(settings.prekill_command), "timeout": float(settings.prekill_timeout)},
                      separators=(",", ":"), sort_keys=True)


def _where(scope: str) -> str:
    return scope if scope else "node memory"


def _mib(n: float) -> str:
    return f"{n / MiB:.0f} MiB"


def _pct(n: float, capacity: float) -> str:
    return f"{100 * n / capacity:.0f}% ({_mib(n)})"
