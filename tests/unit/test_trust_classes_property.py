"""Issue 25, defect 1, as a property: for random worlds of class roots at random depths and overlaps (BE
roots holding LS or SYSTEM roots, and the reverse), classified by a real snapshot of a fake tree, no
throttle, freeze or kill sent through the real Actuator lands on a cgroup that is or holds work of a
non-BE class.

The oracle is written apart from koordd: a cgroup's class is that of the first rule matching its
deepest matched ancestor-or-self (the rules as documented), and a target is forbidden when it or a
cgroup below it has an LS, LSR, LSE or SYSTEM class. The actuator writes for real into a fresh fake
tree each example; `sched_policy` acts on a sleeping child of the test's own, listed in every cgroup.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from koordtest.fakes.cgroup import FakeCgroups
from koordd.core.class_rules import ClassRules
from koordd.core.config import CLASS_NAMES, parse_config
from koordd.core.decisions import APPLIED
from koordd.core.loop import Action
from koordd.core.protected import PROTECTED_CLASSES
from koordd.runtime.runner import class_of, classes_of
from koordd.sensors.collect import Sensors, find_classified, find_roots
from unit.act.test_actuator import make_rig

NAMES = ("a", "b")
CGROUPS = ["/".join(p) for depth in (1, 2, 3, 4) for p in itertools.product(NAMES, repeat=depth)]

# Values that harm whatever the original (the fake tree's defaults: no cap, not idle, thawed; the
# child runs SCHED_OTHER).
HARMFUL = {"cpu.max": "2000 100000", "cpu.idle": "1", "cgroup.freeze": "1", "cgroup.kill": "1",
           "memory.max": "4096", "memory.high": "4096", "memory.reclaim": "1048576", "sched_policy": "idle"}

component = st.sampled_from(NAMES + ("*", "?"))
pattern = st.lists(component, min_size=1, max_size=4).map("/".join)
rules = st.lists(st.tuples(st.sampled_from(CLASS_NAMES), st.lists(pattern, min_size=1, max_size=3)),
                 min_size=1, max_size=6)
actions = st.lists(st.tuples(st.sampled_from([""] + CGROUPS), st.sampled_from(sorted(HARMFUL))),
                   min_size=1, max_size=16)


@pytest.fixture(scope="module")
def sleeper():
    """A process of the test's own whose scheduling policy sched_policy may change."""
    p = subprocess.Popen(["sleep", "600"])
    yield p.pid
    p.kill()
    p.wait()


def config_text(world: list[tuple[str, list[str]]]) -> str:
    return "".join(f'[[classes]]\nname = "{cls}"\ncgroups = {patterns!r}\n\n'.replace("'", '"')
                   for cls, patterns in world)


def oracle_class(config, cgroup: str) -> str | None:
    parts = cgroup.split("/")
    for n in range(len(parts), 0, -1):
        cls = config.classify("/".join(parts[:n]))
        if cls is not None:
            return cls
    return None


def forbidden(target: str, classes: dict[str, str | None]) -> bool:
    """`target` is, or holds, a cgroup of a non-BE class."""
    return any(cls in PROTECTED_CLASSES for cg, cls in classes.items()
               if not target or cg == target or cg.startswith(target + "/"))


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(world=rules, todo=actions, mode=st.sampled_from(("v2", "hybrid", "v1")))
def test_no_throttle_freeze_or_kill_lands_on_non_be_work(sleeper, world, todo, mode):
    config = parse_config(config_text(world), "koordd.toml", {})
    patterns = [p for rule in config.classes for p in rule.patterns]
    # On tmpfs where there is one: the journal syncs every append, and a disk makes that the cost here.
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        tree = FakeCgroups(Path(tmp), mode)
        threads = "cgroup.threads" if mode == "v2" else "tasks"
        controller = None if mode == "v2" else "cpu"
        for cg in CGROUPS:
            tree.add(cg)
            tree.set(cg, controller, threads, f"{sleeper}\n")
        os.sched_setscheduler(sleeper, os.SCHED_OTHER, os.sched_param(0))

        sensors = Sensors(tree.fs, config.classes, proc_root="/proc", sys_root="/sys")
        depth = sensors.max_depth
        # Sparing the walk where no pattern reaches changes nothing found.
        assert find_classified(tree.fs, config.classify, depth, patterns) == \
            find_classified(tree.fs, config.classify, depth)
        # The daemon's walk (each cgroup matched once, rule and reach together) finds the same roots, each
        # with the rule that matches it.
        roots = find_roots(tree.fs, ClassRules(config.classes))
        assert {cg: rule.name for cg, rule in roots.items()} == find_classified(tree.fs, config.classify, depth)
        assert all(rule is config.rule_for(cg) for cg, rule in roots.items())
        snapshot = sensors.snapshot(member_classes=set(CLASS_NAMES), fields=frozenset())
        truth = {cg: oracle_class(config, cg) for cg in CGROUPS}
        assert {cg: class_of(cg, snapshot) for cg in CGROUPS} == truth   # the deepest match wins

        if any(cls == "BE" and forbidden(cg, truth) for cg, cls in truth.items()):
            event("a BE cgroup holds non-BE work")         # --hypothesis-show-statistics: how often
        rig = make_rig(Path(tmp), tree)
        rig.act.protect(classes_of(snapshot))              # as the runner does each round
        decisions = rig.act.apply("any_loop", [Action(t, k, HARMFUL[k]) for t, k in todo])
        for d in decisions:
            if d.outcome == APPLIED:
                event(f"applied {d.knob}")
                assert not forbidden(d.target, truth), (d, truth)
