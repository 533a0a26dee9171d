"""Issue 25's property, the journal's half: for random sequences of koordd's writes and restores, kills
at random points around a knob write (after its journal line, before or after the write itself),
writes by someone else to knobs koordd holds and cgroups made anew, after the last stop every knob
holds its original or a value someone other than koordd wrote, and a decision says which.

The oracle labels each knob file with who wrote it last: koordd setting it, koordd restoring it, or
someone else (the tree's defaults, an operator, systemd making the cgroup again). Then:
- no file is left as koordd set it;
- a restore writes only over a value koordd set, and writes the value the file had before koordd's
  first set of that stretch;
- when koordd lets go of a knob whose value someone else overwrote, it says so with a "left"
  decision, unless the knob reads its original again (nothing to say).
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings, strategies as st

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.fuzzing import EXAMPLES, PROFILE, counted
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog, read_decisions
from koordd.act.journal import RestoreJournal
from koordd.core.decisions import LEFT
from koordd.core.loop import Action, restore
from koordd.kernel.cgroupfs import CgroupFS

# Few targets, knobs and values: the interesting cases are collisions (someone else on a knob koordd holds).
TARGETS = ("be.slice", "be.slice/a", "be.slice/a/x")
REMADE = {"be.slice/a": ("be.slice/a", "be.slice/a/x"), "be.slice/a/x": ("be.slice/a/x",)}
VALUES = {"cpu.max": ("max 100000", "50000 100000", "2000 100000"), "memory.max": ("max", "409600", "8192000")}
CONTROLLER = {"cpu.max": "cpu", "memory.max": "memory"}
LOOPS = ("l1", "l2")
CRASH = (None, None, "before the write", "after the write")


class Killed(BaseException):
    """kill -9: nothing after it runs, not even an except Exception."""


def knob_value(knob):
    return st.sampled_from(VALUES[knob])


knobs = st.sampled_from(sorted(VALUES))
sets = knobs.flatmap(lambda k: st.tuples(st.just("set"), st.sampled_from(LOOPS), st.sampled_from(TARGETS), st.just(k),
                                         knob_value(k), st.sampled_from(CRASH)))
others = knobs.flatmap(lambda k: st.tuples(st.just("other"), st.sampled_from(TARGETS), st.just(k), knob_value(k)))
op = st.one_of(      # koordd's writes and someone else's weigh more: they make the collisions
    sets, sets, sets, others, others,
    st.tuples(st.just("restore"), st.sampled_from(LOOPS), st.sampled_from(TARGETS), knobs, st.sampled_from(CRASH)),
    st.tuples(st.just("remake"), st.sampled_from(sorted(REMADE))),
    st.tuples(st.just("restart"), st.frozensets(st.sampled_from(LOOPS)), st.sampled_from(CRASH)),
)


@dataclass
class World:
    """The fake tree and who wrote each knob file last."""
    tree: FakeCgroups
    label: dict = field(default_factory=dict)       # (cgroup, knob) -> "koordd", "restore" or "other"
    chain: dict = field(default_factory=dict)       # (cgroup, knob) koordd holds -> its value before koordd
    origin: dict = field(default_factory=dict)      # (cgroup, knob) -> its value before koordd's last stretch
    wrote: dict = field(default_factory=dict)       # (cgroup, knob) -> the values koordd set in this stretch
    overwritten: dict = field(default_factory=dict)  # (cgroup, knob) -> ("left" decisions then, value before koordd)
    bad: list = field(default_factory=list)
    restoring: bool = False
    crash: str | None = None
    graves: itertools.count = field(default_factory=itertools.count)

    def value(self, cg, knob) -> str:
        return self.tree.read(cg, CONTROLLER[knob], knob).strip()

    def others_value(self, key, state) -> None:
        """Someone else's value replaces koordd's: koordd must say so when it lets go. Only while koordd
        holds the knob: after it let go (a restore that found the original there writes nothing, so the
        label still says koordd) the knob is no longer koordd's to speak of."""
        if self.label.get(key) == "koordd" and key in self.chain:
            self.overwritten.setdefault(key, (lefts(state, *key), self.chain.get(key)))
        self.label[key] = "other"

    def koordd_writes(self, real, fs, controller, cg, filename, text) -> None:
        key = (cg, filename)
        if key[1] not in VALUES:
            return real(fs, controller, cg, filename, text)
        before = self.value(cg, filename)
        if not self.restoring:
            # What koordd is about to write is in its journal already: a kill before the write leaves it
            # named there as koordd's, whoever writes that value next.
            if key not in self.chain:
                self.chain[key], self.wrote[key] = before, set()
            self.wrote[key].add(text.strip())
        if self.crash == "before the write":
            self.crash = None
            raise Killed()
        real(fs, controller, cg, filename, text)
        if self.restoring:
            # The journal keeps values, not who wrote them: someone else's value equal to one koordd set
            # reads as koordd's (putting the original back over it is still allowed by the property).
            if self.label.get(key) != "koordd" and before not in self.wrote.get(key, ()):
                self.bad.append(f"restore of {key} over {self.label.get(key)}'s {before!r}")
            elif text.strip() != self.chain.get(key):
                self.bad.append(f"restore of {key} wrote {text!r}, not its value before koordd: "
                                f"{self.chain.get(key)!r}")
            self.label[key] = "restore"       # the stretch ends when the journal lets go (a kill may come first)
        else:
            self.origin[key] = self.chain[key]
            self.label[key] = "koordd"
        self.overwritten.pop(key, None)
        if self.crash == "after the write":
            self.crash = None
            raise Killed()


def start(world: World, state):
    journal = RestoreJournal(state)
    act = Actuator(world.tree.fs, journal, DecisionLog(state, send=lambda *a, **k: None))
    real_restore = act.restore

    def restore_marked(*a, **k):
        world.restoring = True
        try:
            return real_restore(*a, **k)
        finally:
            world.restoring = False
    act.restore = restore_marked
    return act


def lefts(state, cg, knob) -> int:
    return sum(1 for d in read_decisions(state) if d["outcome"] == LEFT and d["target"] == cg and d["knob"] == knob)


def check_let_go(world: World, act: Actuator, state) -> None:
    """Knobs koordd no longer holds: their stretch is over. One whose value someone else overwrote: a
    "left" decision since, or it reads its value before koordd again."""
    for key in [k for k in world.chain if act.journal.get(*k) is None]:
        del world.chain[key]
        world.wrote.pop(key, None)
    for key, (before, original) in list(world.overwritten.items()):
        if act.journal.get(*key) is not None:
            continue
        del world.overwritten[key]
        if lefts(state, *key) == before and world.value(*key) != original:
            world.bad.append(f"{key}: koordd let go of it, someone else's {world.value(*key)!r} is there, "
                             f"and no decision says so")


@given(st.lists(op, max_size=25))
# CI found this one (1 run in about 10): koordd set be.slice/a back to its original, let go of it at a
# restart with nothing to write, then someone else wrote the same value. The oracle asked for a "left".
@example(ops=[("set", "l2", "be.slice/a", "cpu.max", "50000 100000", None),
              ("set", "l2", "be.slice/a", "cpu.max", "max 100000", None),
              ("restart", frozenset(), None),
              ("other", "be.slice/a", "cpu.max", "max 100000")])
# 60 examples found bcc4081's restores over someone else's value in 4 runs of 5; 200 in 5 of 5.
@settings(PROFILE, max_examples=max(EXAMPLES, 200))
@counted
def test_every_knob_ends_at_its_original_or_someone_elses_value_and_a_decision_says_which(tmp_path_factory, ops):
    tmp = tmp_path_factory.mktemp("world")
    tree = FakeCgroups(tmp, "v2")
    for cg in TARGETS:
        tree.add(cg)
    world, state = World(tree), tmp / "state"
    with pytest.MonkeyPatch.context() as mp:
        real = CgroupFS.write
        mp.setattr(CgroupFS, "write", lambda fs, controller, cg, filename, text:
                   world.koordd_writes(real, fs, controller, cg, filename, text))
        act = start(world, state)
        for o in ops:
            world.crash = o[-1] if o[0] in ("set", "restore", "restart") else None
            try:
                with contextlib.suppress(Killed):
                    act = run(o, world, act, state)
                    continue
                act.journal.close()         # what the kernel does for a killed process; nothing is written
                act = start(world, state)
            finally:
                world.crash = None
                check_let_go(world, act, state)
        act.restore_all("koordd stopping")
        check_let_go(world, act, state)
    assert not world.bad, world.bad
    # (Set back to the original by koordd's own loop, a value is the original, whoever wrote it last.)
    left_as_koordd_set = {key: world.value(*key) for key, who in world.label.items()
                          if who == "koordd" and world.value(*key) != world.origin[key]}
    assert not left_as_koordd_set, f"left as koordd set them: {left_as_koordd_set}"
    assert act.journal.entries() == []


def run(o, world: World, act: Actuator, state) -> Actuator:
    if o[0] == "set":
        _, loop, cg, knob, value, _ = o
        act.apply(loop, [Action(cg, knob, value)])
    elif o[0] == "restore":
        _, loop, cg, knob, _ = o
        act.apply(loop, [restore(cg, knob, "done")])
    elif o[0] == "other":
        _, cg, knob, value = o
        world.others_value((cg, knob), state)
        world.tree.set(cg, CONTROLLER[knob], knob, value + "\n")
    elif o[0] == "remake":
        remake(world, o[1], state)
    else:                                   # a clean stop and a start with some loops enabled
        _, enabled, _ = o
        act.restore_all("koordd stopping")
        act.journal.close()
        check_let_go(world, act, state)
        act = start(world, state)
        act.restore_where(lambda h: h.owner in enabled, "its loop is not enabled now")
    return act


def remake(world: World, cg: str, state) -> None:
    """systemd removes the cgroup and makes it again, with its defaults: someone else's values. The old
    directories are kept out of the tree, so the new ones get new inodes (kernfs never reuses a cgroup id)."""
    graves = world.tree.root.parent / "graves"
    graves.mkdir(exist_ok=True)
    for h in world.tree.hierarchies():
        (h / cg).rename(graves / str(next(world.graves)))
    for made in REMADE[cg]:
        world.tree.add(made)
        for knob in VALUES:
            world.others_value((made, knob), state)
            world.chain.pop((made, knob), None)     # koordd's hold is of the object that went
            world.wrote.pop((made, knob), None)
