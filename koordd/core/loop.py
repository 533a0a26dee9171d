"""The contract between the core and a control loop.

A loop is a class registered under the entry-point group `koordd.loops`: koordd's own
in plugins/ (the package koordd_plugins), a third party's in a package of its own
(docs/plugins.md). The core calls, in this order:

- `problems(settings)` when the config loads: options that do not fit together,
  each named with why; the loop's section is then refused like a bad value.
- `writes(settings)` when the config loads: the (class, knob) pairs the loop
  may write (NODE instead of a class for a node-wide target: the sched_ext state,
  a network device); two enabled loops may not claim the same pair (a command,
  COMMANDS, excepted).
- `watches(settings)`: cgroups it needs sampled although no class names them.
- `members_of(settings)`: classes whose roots' children it needs sampled one by one.
- `needs(settings)`: the CgroupSample fields decide() reads, and the optional
  sensors (`gpus`, see sensors/contract.py) whose snapshot sections it reads:
  only what the enabled loops need is read each tick, and an optional sensor runs
  only while a loop names it; `member_needs(settings)` the fields it reads of
  members (default: the same); `class_needs(settings)` fields it reads only of
  the class roots of its own classes (members_of), beyond needs(): a file too
  costly to read of every class root (memory.stat), read of those alone.
- `member_fields(snapshot, settings, state)` before decide(), on a snapshot whose
  members are listed but not read: which member fields this tick needs (default:
  all of member_needs). A loop that acts on members only now and then (memory_evict,
  under memory pressure) says "none" the rest of the time, and hundreds of pods
  cost a directory listing instead of hundreds of file reads. Pure, like decide().
- `initial_state(settings)` when the loop starts or its settings change.
- `decide(snapshot, settings, state)` every `interval`: returns the actions
  for this tick. It may update `state` (windows, timers) but does no I/O:
  everything it knows comes from the snapshot.
- `report(settings, state)` after each round: what the loop wants shown beside its
  counters in status.json and the metrics (plain JSON values; default none). Pure.
- `settle(actions, decisions, settings, state)` right after the actuator
  applied them: a loop that counts its own acts (a kill budget) keeps only
  those the actuator carried out (decision applied or dry-run). No I/O either.
  Actions held back behind a command that runs beside the round (a prekill hook
  and the kill after it: KnobSpec.beside) are left out, and settled on their own
  once that command is done or out of time, or never if it was cancelled.

The class docstring is the loop's user documentation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from koordd.core.decisions import APPLIED, DRY_RUN
from koordd.core.options import Option
from koordd.core.settings import Settings, loop_options, settings_type
from koordd.core.snapshot import CGROUP_FIELDS


NODE = "node"      # the owner of node-wide targets in writes(); no class has this name
# Knobs that are commands (the backends' oneshot knobs: an act, never read or restored): two loops
# asking for one leave no value to fight over, so writes() may name them in more than one enabled loop
# (memory_evict's reclaim of a victim next to proactive_reclaim's steps).
COMMANDS = frozenset({"memory.reclaim", "cgroup.kill"})


@dataclass(frozen=True)
class Action:
    """Set `knob` of `target` to `value` (canonical text), or back to its original when value is None.
    The knob names the backend, the backend what a target is: for cgroup knobs, a cgroup path."""
    target: str
    knob: str
    value: str | None
    reason: Mapping[str, Any] = field(default_factory=dict)   # the numbers behind the decision
    message: str = ""                                          # one short sentence for the journal
    # On record even where the knob already holds `value` (a KEPT decision): a verdict the loop must put in
    # the journal although nothing changes (be_suppress: a cut judged to have helped stays as it is).
    say: bool = False


def restore(target: str, knob: str, message: str, **reason: Any) -> Action:
    return Action(target, knob, None, reason, message)


def release_unasked(held, actions: list[Action], knobs: frozenset[str], message: str) -> list[Action]:
    """A restore for every (target, knob) among `knobs` in `held` (snapshot.held) that `actions`, this
    round's, neither set nor give back: a loop whose decide() asks every round for every knob it wants
    ends with `actions + release_unasked(...)`, and no knob it holds outlives the condition it was written
    for (an empty BE root that gained pods, a pod that is no unit any more), whichever case decide() forgot.
    A restore of a knob another loop holds is ignored by the actuator, so `knobs` may be the loop's own."""
    asked = {(a.target, a.knob) for a in actions}
    return [restore(target, knob, message) for target, knob in sorted(held)
            if knob in knobs and (target, knob) not in asked]


class Loop:
    name: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()

    @classmethod
    def settings_type(cls) -> type[Settings]:
        """The frozen dataclass every method below is handed as `settings` (koordd/core/settings.py): a
        field for `enabled`, `interval` and each of `options`, generated from them."""
        return settings_type(loop_options(cls))

    @staticmethod
    def problems(settings) -> dict[str, str]:
        """Option -> why its value does not fit with the others (each option alone is already valid)."""
        return {}

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        return frozenset()

    @staticmethod
    def watches(settings) -> frozenset[str]:
        """Cgroups to sample even when no class rule names them (e.g. a scope to protect)."""
        return frozenset()

    @staticmethod
    def members_of(settings) -> frozenset[str]:
        """Classes whose roots' children (pods, jobs) the loop acts on one by one: they are sampled
        too and reach the loop as `snapshot.units(cls)`."""
        return frozenset()

    @staticmethod
    def needs(settings) -> frozenset[str]:
        """CgroupSample fields (snapshot.CGROUP_FIELDS) and optional sensors ("gpus") that decide() reads.
        The default, every cgroup field, suits a loop that does not say; every file read costs, every
        tick. Optional sensors are never a default: they load drivers or programs, so a loop names them."""
        return CGROUP_FIELDS

    @classmethod
    def member_needs(cls, settings) -> frozenset[str]:
        """The fields decide() reads of members (members_of); a pod costs what is read of it, every tick."""
        return cls.needs(settings)

    @staticmethod
    def class_needs(settings) -> frozenset[str]:
        """Fields decide() reads of the class roots of members_of(settings)'s classes only, on top of needs()
        (a root without children is a unit of its own): the other classes' roots do not pay for them."""
        return frozenset()

    @classmethod
    def member_fields(cls, snapshot, settings, state) -> frozenset[str]:
        """Of member_needs(settings), what this tick's decide() will read of members, judged from a
        snapshot whose members carry only their paths; the rest stay None. No I/O, no state change."""
        return cls.member_needs(settings)

    @staticmethod
    def initial_state(settings) -> Any:
        return None

    @staticmethod
    def decide(snapshot, settings, state) -> list[Action]:
        raise NotImplementedError

    @staticmethod
    def report(settings, state) -> Mapping[str, Any]:
        """What the loop wants shown in status.json and the metrics beside its counters (JSON values): a
        summary of its state, read after each round. No I/O, no state change."""
        return {}

    @staticmethod
    def settle(actions: list[Action], decisions: list, settings, state) -> None:
        """Correct `state` for actions the actuator did not carry out (refused, cgroup gone)."""


def carried_out(decisions) -> set[tuple[str, str]]:
    """(target, knob) of the decisions that wrote (or would have, in dry-run)."""
    return {(d.target, d.knob) for d in decisions if d.outcome in (APPLIED, DRY_RUN)}
