"""Eviction and throttling never reach SYSTEM/LS/LSR/LSE cgroups, PID 1's or koordd's, whatever
the loops ask: the actuator's guard (koordd/act/protect.py), unit- and property-tested."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.protect import harm, process_cgroups
from koordd.backends.host_backends import builtin_classes
from koordd.core.backend import Harm, KnobSpec
from koordd.core.decisions import APPLIED, DRY_RUN, REFUSED
from koordd.core.loop import Action
from koordd.core.protected import PROTECTED_CLASSES, Protected, _ancestry
from unit.act.test_actuator import make_rig

NAMES = ("a", "b", "c")
CGROUPS = ["/".join(p) for depth in (1, 2, 3) for p in itertools.product(NAMES, repeat=depth)]
CLASSES = ("SYSTEM", "LSE", "LSR", "LS", "BE", None)

# Values that harm whatever the original (the fake tree's defaults: no cap, all CPUs, not idle).
HARMFUL = {"cgroup.kill": "1", "memory.reclaim": "1048576", "cgroup.freeze": "1", "cpu.max": "10000 100000",
           "memory.max": "1048576", "memory.high": "1048576", "cpu.idle": "1", "cpuset.cpus": "0"}


# Every knob of koordd's own backends, by name: each declares the harm a write of it can do (KnobSpec.harm).
SPECS = {name: spec for cls in builtin_classes() for name, spec in cls.knobs.items()}


def test_harm_is_about_tighter_caps_and_evictions():
    def said(knob, new, original):
        return harm(SPECS[knob], new, original)
    assert said("cgroup.kill", "1", None) == "kill"
    assert said("cgroup.freeze", "0", "1") is None                 # thawing helps
    assert said("cpu.max", "50000 100000", "max 100000") == "cap the CPU of"
    assert said("cpu.max", "200000 100000", "100000 100000") is None   # cpu_burst raising LS quota
    assert said("cpu.max", "garbage", "max 100000") == "cap the CPU of"   # cannot compare: refused
    assert said("cpuset.cpus", "0-1", "0-3") and said("cpuset.cpus", "0-7", "0-3") is None
    assert said("cpuset.cpus", "0", "")                            # empty: the parent's, all of them
    assert said("cpu.idle", "1", "0") and said("cpu.idle", "0", "1") is None
    assert said("sched_policy", "ext", "normal") is None and said("sched_policy", "idle", "normal")
    assert said("cpu.weight", "1", "100") is None                  # a share, not a cap


# What the guard's table (koordd/act/protect.py EVICTING and THROTTLING) said before each knob declared it.
DECLARED = {"cgroup.kill": "kill", "memory.reclaim": "reclaim memory of", "cgroup.freeze": "freeze",
            "cgroup.prekill": "run the prekill hook of", "cpu.max": "cap the CPU of",
            "cpu.max.burst": "cut the CPU burst of", "cpuset.cpus": "shrink the CPUs of",
            "memory.max": "cap the memory of", "memory.high": "throttle the memory of",
            "memory.swap.max": "cap the swap of", "cpu.idle": "make idle", "io.max": "cap the IO of",
            "oom_score_adj": "raise the OOM score of", "memory.oom.group": "make the OOM killer take all of",
            "sched_policy": "demote the threads of", "scheduler_class": "put in the BE class",
            "net_class": "shape the egress of", "resctrl_group": "confine the cache of"}


def test_the_knobs_that_can_harm_are_the_ones_the_guard_knew_and_say_so_in_its_words():
    assert {k: s.harm.what for k, s in SPECS.items() if getattr(s, "harm", None)} == DECLARED


def test_a_knob_that_declares_no_harm_does_none():
    """A backend that says nothing of harm (a third party's, or one written before KnobSpec.harm) keeps
    today's default: the guard lets its writes through."""
    assert harm(KnobSpec("vendor.knob", "a third party's knob"), "0", "1") is None
    assert harm(type("OwnSpec", (), {"name": "own.knob"})(), "0", "1") is None    # a spec class of its own
    acts = Harm("kill")
    assert acts.of("1", None) == acts.of("1", "0") == "kill"
    assert Harm("freeze", lifts="0").of("0", "1") is None


def test_why_names_class_holders_and_processes():
    p = Protected.of({"ls.slice": "LS", "be.slice": "BE", "kube/ls-pod": "LSR"},
                     {"init.scope": "PID 1", "system.slice/koordd.service": "koordd"})
    assert p.why("ls.slice") == "is of class LS"
    assert p.why("ls.slice/pod") == "lies below ls.slice, of class LS"
    assert p.why("kube") == "holds kube/ls-pod, of class LSR"
    assert p.why("init.scope") == "is the cgroup of PID 1"
    assert p.why("system.slice") == "holds system.slice/koordd.service, the cgroup of koordd"
    assert p.why("") and p.why("/")                                  # the root holds everything
    assert p.why("be.slice") is None and p.why("be.slice/job") is None


def _why_by_ancestry(p: Protected, target: str) -> str | None:
    """why() as it was written before it walked the ancestry in place (the reference)."""
    target = target.strip("/")
    if target in p.holders:
        return p.holders[target]
    for up in _ancestry(target):
        if up in p.classes:
            cls = p.classes[up]
            return f"is of class {cls}" if up == target else f"lies below {up}, of class {cls}"
    return None


_PATHS = st.lists(st.sampled_from(["a", "b", "pod1"]), max_size=4).map("/".join)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_PATHS, st.sampled_from(["LS", "BE", "SYSTEM", "LSR"]), max_size=5),
       st.dictionaries(_PATHS, st.sampled_from(["PID 1", "koordd"]), max_size=2), _PATHS)
def test_why_says_what_the_ancestry_walk_says(classes, processes, target):
    p = Protected.of(classes, processes)
    for t in (target, "/" + target, target + "/"):
        assert p.why(t) == _why_by_ancestry(p, t)


def test_process_cgroups_reads_every_hierarchy(tmp_path):
    for pid, text in ((1, "1:cpu,cpuacct:/init.scope\n0::/init.scope\n"),
                      (42, "4:memory:/system.slice/koordd.service\n0::/system.slice/koordd.service\n")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    assert process_cgroups(tmp_path, {"PID 1": 1, "koordd": 42, "gone": 7}) == \
        {"init.scope": "PID 1", "system.slice/koordd.service": "koordd", "": "gone"}


def test_a_be_kill_reaching_an_ls_pod_below_is_refused_and_the_reason_recorded(tmp_path):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add("kube/ls-pod").add("kube/be-pod"))
    rig.act.protect({"kube": "BE", "kube/ls-pod": "LS", "kube/be-pod": "BE"})
    kill_root, kill_pod = rig.act.apply("memory_evict", [Action("kube", "cgroup.kill", "1"),
                                                         Action("kube/be-pod", "cgroup.kill", "1")])
    assert kill_root.outcome == REFUSED
    assert kill_root.error == "protected: would kill kube, which holds kube/ls-pod, of class LS"
    assert kill_pod.outcome == APPLIED


def test_restores_are_never_blocked(tmp_path):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add("ls.slice"))
    [d] = rig.act.apply("be_suppress", [Action("ls.slice", "cpu.max", "10000 100000")])
    assert d.outcome == APPLIED                       # not protected yet: the config said BE
    rig.act.protect({"ls.slice": "LS"})               # relabelled LS: the cap must be able to go
    [back] = rig.act.restore_all("relabelled")
    assert back.outcome == "restored" and rig.tree.read("ls.slice", "cpu", "cpu.max") == "max 100000"


# --- the property ------------------------------------------------------------------------------------

def protected_oracle(target: str, classes: dict[str, str | None], processes: set[str]) -> bool:
    """Written apart from koordd/act/protect.py: on or below a protected class, or holding one or a process."""
    def within(inner: str, outer: str) -> bool:
        return outer == "" or inner == outer or inner.startswith(outer + "/")
    return (any(cls in PROTECTED_CLASSES and within(target, cg) for cg, cls in classes.items())
            or any(cls in PROTECTED_CLASSES and within(cg, target) for cg, cls in classes.items())
            or any(within(p, target) for p in processes))


@pytest.fixture(scope="module")
def universe(tmp_path_factory):
    tree = FakeCgroups(tmp_path_factory.mktemp("universe"), "v2")
    for cg in CGROUPS:
        tree.add(cg)
    return tree


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(classes=st.dictionaries(st.sampled_from(CGROUPS), st.sampled_from(CLASSES), max_size=8),
       processes=st.sets(st.sampled_from(CGROUPS), max_size=2),
       actions=st.lists(st.tuples(st.sampled_from([""] + CGROUPS), st.sampled_from(sorted(HARMFUL))),
                        min_size=1, max_size=12))
def test_no_harmful_write_reaches_a_protected_cgroup(universe, tmp_path_factory, classes, processes, actions):
    rig = make_rig(tmp_path_factory.mktemp("rig"), universe, dry_run=True)   # the tree stays as it is
    rig.act.processes = {p: "a process" for p in processes}
    rig.act.protect(classes)
    decisions = rig.act.apply("any_loop", [Action(t, k, HARMFUL[k]) for t, k in actions])
    for d in decisions:
        if protected_oracle(d.target.strip("/"), classes, processes):
            # The root lacks some knobs (cgroup.freeze): refused before the guard is asked.
            assert d.outcome == REFUSED and (d.error.startswith("protected: ") or d.target == ""), d
        else:
            assert d.outcome in (DRY_RUN, REFUSED) and not (d.error or "").startswith("protected"), d
    assert all(SPECS[k].harm is not None for k in HARMFUL)
