"""koordd's scheduler as knobs (koordd/backends/sched_ext.py) and the sched_ext loop that asks for it, on a fake
/sys/kernel/sched_ext, a fake cgroup tree and a fake scheduler: loading with the classes already in
its map, the classes kept in line while it runs, another program's scheduler left alone, the kernel
ejecting ours, restore, and when the loop wants it. (The real object: tests/system/, in the VM.)"""
from __future__ import annotations

import errno

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.sched_ext import OwnScheduler, SchedulerBackend, SchedulerClassBackend, TARGET
from koordd.core.backend import Backends, TargetGone
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.decisions import APPLIED, REFUSED, RESTORED
from koordd.core.health import DEFAULT_HEALTH
from koordd.core.loop import Action
from koordd.core.snapshot import CgroupSample, NodeSample, Pressure, PressureStat, SCHED_EXT, Snapshot
from koordd_plugins.sched_ext import SchedExt
from unit.kernel.test_sched_ext_scheduler import FakeScheduler, write_status


@pytest.fixture
def rig(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("ls.slice").add("be.slice")
    sys_root = tmp_path / "sys"
    write_status(sys_root, "disabled", enable_seq=3)
    fake = FakeScheduler(sys_root)
    own = OwnScheduler(sys_root, load=fake, timeout=0.2)
    return tree, own, fake, SchedulerBackend(own), SchedulerClassBackend(tree.fs, own)


def ids(tree, *cgroups):
    return [tree.dir(cg, None).stat().st_ino for cg in cgroups]


def test_loads_with_the_classes_already_in_its_map(rig):
    tree, own, fake, scheduler, classes = rig
    ls, be = ids(tree, "ls.slice", "be.slice")
    assert classes.read("ls.slice", "scheduler_class") == "none"
    classes.write("ls.slice", "scheduler_class", "LSR")
    classes.write("be.slice", "scheduler_class", "BE")
    assert scheduler.read(TARGET, "scheduler") == "none" and not fake.calls     # nothing loaded yet
    scheduler.write(TARGET, "scheduler", "koordd")
    assert fake.calls == ["load", ("classes", {ls: "LSR", be: "BE"}), "attach"]
    assert scheduler.read(TARGET, "scheduler") == "koordd"
    assert classes.read("be.slice", "scheduler_class") == "BE"


def test_a_class_change_while_it_runs_goes_into_its_map(rig):
    tree, own, fake, scheduler, classes = rig
    ls, be = ids(tree, "ls.slice", "be.slice")
    classes.write("ls.slice", "scheduler_class", "LS")
    scheduler.write(TARGET, "scheduler", "koordd")
    classes.write("be.slice", "scheduler_class", "BE")
    assert fake.calls[-1] == ("classes", {ls: "LS", be: "BE"})
    classes.write("ls.slice", "scheduler_class", "none")
    assert fake.calls[-1] == ("classes", {be: "BE"})


def test_a_cgroup_made_again_under_the_same_name_is_not_the_one_classed(rig):
    tree, own, fake, scheduler, classes = rig
    classes.write("be.slice", "scheduler_class", "BE")
    scheduler.write(TARGET, "scheduler", "koordd")
    tree.remove("be.slice")
    with pytest.raises(TargetGone):
        classes.read("be.slice", "scheduler_class")
    assert own.classes == {} and fake.calls[-1] == ("classes", {})    # its id left the map with it
    tree.add("be.slice")
    assert classes.read("be.slice", "scheduler_class") == "none"


def test_another_programs_scheduler_is_named_never_stopped_and_counts_as_none(rig, tmp_path):
    tree, own, fake, scheduler, classes = rig
    write_status(tmp_path / "sys", "enabled", "flatcg_1.0", enable_seq=3)
    assert scheduler.read(TARGET, "scheduler") == "flatcg_1.0"
    with pytest.raises(OSError) as e:
        scheduler.write(TARGET, "scheduler", "koordd")
    assert e.value.errno == errno.EBUSY and "flatcg_1.0" in e.value.strerror and fake.calls == []
    assert scheduler.same("flatcg_1.0", "none") and not scheduler.same("koordd", "none")


def test_a_scheduler_the_kernel_ejected_reads_none_and_is_loaded_afresh(rig, tmp_path):
    tree, own, fake, scheduler, classes = rig
    scheduler.write(TARGET, "scheduler", "koordd")
    write_status(tmp_path / "sys", "disabled", enable_seq=4)           # the watchdog ejected it
    assert scheduler.read(TARGET, "scheduler") == "none"
    fake.on_attach = ("enabled", "koordd", 5)
    scheduler.write(TARGET, "scheduler", "koordd")
    assert fake.calls[-4:] == ["unload", "load", ("classes", {}), "attach"]   # ours released first


def test_a_load_the_kernel_does_not_confirm_leaves_the_kernels_scheduler(rig):
    tree, own, fake, scheduler, classes = rig
    fake.on_attach = ("enabled", "koordd", 3)                          # enable_seq did not rise
    with pytest.raises(OSError) as e:
        scheduler.write(TARGET, "scheduler", "koordd")
    assert e.value.errno == errno.EIO and "enable_seq" in e.value.strerror
    assert own.running is None and fake.calls[-1] == "unload"


def test_without_sched_ext_both_knobs_say_why(tmp_path):
    tree = FakeCgroups(tmp_path, "v2")
    own = OwnScheduler(tmp_path / "nosys")
    why = {**SchedulerBackend(own).probe(), **SchedulerClassBackend(tree.fs, own).probe()}
    assert set(why) == {"scheduler", "scheduler_class"} and all("CONFIG_SCHED_CLASS_EXT" in w for w in why.values())


# --- through the actuator ----------------------------------------------------------------------------

def actuator_of(rig, tmp_path, dry_run=False):
    tree, own, fake, scheduler, classes = rig
    state = tmp_path / "state"
    return Actuator(Backends([scheduler, classes]), RestoreJournal(state),
                    DecisionLog(state, send=lambda message, **fields: None), dry_run=dry_run)


ACTIONS = [Action("ls.slice", "scheduler_class", "LS", {}, ""), Action("be.slice", "scheduler_class", "BE", {}, ""),
           Action(TARGET, "scheduler", "koordd", {}, "")]


def test_journalled_once_and_restored_on_stop(rig, tmp_path):
    tree, own, fake, scheduler, classes = rig
    actuator = actuator_of(rig, tmp_path)
    first = actuator.apply("sched_ext", ACTIONS)
    assert [(d.knob, d.old, d.new, d.outcome) for d in first] == [
        ("scheduler_class", "none", "LS", APPLIED), ("scheduler_class", "none", "BE", APPLIED),
        ("scheduler", "none", "koordd", APPLIED)]
    assert actuator.apply("sched_ext", ACTIONS) == []                  # all in place: nothing written
    assert fake.calls.count("load") == 1
    restored = actuator.restore_all("koordd stopping")
    assert [(d.knob, d.new, d.outcome) for d in restored] == [
        ("scheduler", "none", RESTORED), ("scheduler_class", "none", RESTORED), ("scheduler_class", "none", RESTORED)]
    assert fake.calls[-1] == "unload" and own.running is None and actuator.journal.entries() == []


def test_a_refused_load_is_recorded_once_and_leaves_no_journal_entry(rig, tmp_path):
    tree, own, fake, scheduler, classes = rig
    write_status(tmp_path / "sys", "enabled", "flatcg_1.0", enable_seq=3)
    actuator = actuator_of(rig, tmp_path)
    [d] = actuator.apply("sched_ext", ACTIONS[2:])
    assert d.outcome == REFUSED and "another BPF scheduler is loaded" in d.error and "flatcg_1.0" in d.error
    assert actuator.apply("sched_ext", ACTIONS[2:]) == [] and actuator.journal.entries() == []


def test_dry_run_loads_nothing(rig, tmp_path):
    tree, own, fake, scheduler, classes = rig
    actuator_of(rig, tmp_path, dry_run=True).apply("sched_ext", ACTIONS)
    assert fake.calls == [] and own.classes == {}


# --- the loop ------------------------------------------------------------------------------------------

def settings(**kw):
    return make_settings(loop_options(SchedExt), {"enabled": True, "ext_classes": ["LS", "BE"],
                                                  "scheduler": "koordd", **kw})


def snap(t=1.0, ls_pressure=None, held=()):
    ls = CgroupSample(path="ls.slice", cls="LS",
                      cpu_pressure=PressureStat(Pressure(ls_pressure, 0, 0, 0), None) if ls_pressure is not None else None)
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.5),
                    cgroups={"ls.slice": ls, "be.slice": CgroupSample(path="be.slice", cls="BE")},
                    supported=frozenset({"sched_policy"}), held={k: "none" for k in held},
                    health={"ls.slice": DEFAULT_HEALTH})


def plan(actions):
    return [(a.target, a.knob, a.value) for a in actions]


def test_always_classes_first_then_the_scheduler():
    s = settings()
    assert plan(SchedExt.decide(snap(), s, SchedExt.initial_state(s))) == [
        ("ls.slice", "sched_policy", "ext"), ("be.slice", "sched_policy", "ext"),
        ("ls.slice", "scheduler_class", "LS"), ("be.slice", "scheduler_class", "BE"), (TARGET, "scheduler", "koordd")]
    assert SchedExt.writes(s) >= {("node", "scheduler"), ("BE", "scheduler_class"), ("LS", "scheduler_class")}


def test_ls_slack_loads_it_while_ls_is_short_and_holds_it_after():
    s = settings(scheduler_when="ls_slack", scheduler_slack=0.1, scheduler_hold="30s")
    state = SchedExt.initial_state(s)
    # cpu.pressure target 20%: 19% is 5% slack (under 10%), 10% is 50%.
    healthy = SchedExt.decide(snap(0.0, ls_pressure=10.0), s, state)
    assert all(a.knob != "scheduler" for a in healthy)                 # not held: nothing to restore
    [load] = [a for a in SchedExt.decide(snap(1.0, ls_pressure=19.0), s, state) if a.knob == "scheduler"]
    assert load.value == "koordd" and load.reason["slack"] == 0.05 and "under 0.1" in load.message
    held = (TARGET, "scheduler"),
    [stay] = [a for a in SchedExt.decide(snap(20.0, ls_pressure=10.0, held=held), s, state) if a.knob == "scheduler"]
    assert stay.value == "koordd" and "held 11s more" in stay.message
    [leave] = [a for a in SchedExt.decide(snap(32.0, ls_pressure=10.0, held=held), s, state) if a.knob == "scheduler"]
    assert leave.value is None and leave.reason["slack"] == 0.5       # a restore: koordd's scheduler unloads
    assert not [a for a in SchedExt.decide(snap(33.0), s, state) if a.knob == "scheduler"]   # no signal, not held


def test_scheduler_none_unloads_one_that_is_held():
    s = settings(scheduler="none")
    assert all(a.knob == "sched_policy" for a in SchedExt.decide(snap(), s, SchedExt.initial_state(s)))
    [unload] = [a for a in SchedExt.decide(snap(held=[(TARGET, "scheduler")]), s, None) if a.knob == "scheduler"]
    assert unload.value is None


def test_the_scheduler_needs_ls_and_be_on_sched_ext_said_at_load():
    text = '[loops.sched_ext]\nenabled = true\next_classes = ["LS"]\nscheduler = "koordd"\n'
    with pytest.raises(ConfigError) as e:
        parse_config(text, "koordd.toml", {"sched_ext": SchedExt})
    assert e.value.errors == ["koordd.toml:4: loops.sched_ext.scheduler: koordd's scheduler needs an LS class and "
                              "BE in ext_classes: in partial mode the fair class runs first, so LS on it would wait "
                              "for BE left in the fair class"]
    ok = parse_config(text.replace('["LS"]', '["LSR", "BE"]'), "koordd.toml", {"sched_ext": SchedExt})
    assert ok.loops["sched_ext"].scheduler == "koordd"
