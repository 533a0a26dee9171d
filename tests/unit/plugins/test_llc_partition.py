"""llc_partition: which groups, masks and thread moves it asks for (static and adaptive), its
options, and a run through the actuator on a fake resctrl tree. Verified on a fake tree only."""
from __future__ import annotations

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.fakes.resctrl import FakeResctrl
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import CgroupBackend
from koordd.backends.resctrl import ResctrlGroupBackend, ResctrlTasksBackend
from koordd.core.backend import Backends
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.decisions import APPLIED
from koordd.core.schemata import L3Info, MBInfo, ResctrlInfo
from koordd.core.snapshot import CgroupSample, NodeSample, RESCTRL, RUNQ_LATENCY, RunqLatency, Snapshot
from koordd.kernel.resctrl import read_info
from koordd_plugins.llc_partition import LlcPartition
from koordd.sensors.resctrl import ResctrlSection, ResctrlSensor

INFO = ResctrlInfo(L3Info(0x7FF, 2, 8, 0, (0, 1)), MBInfo(10, 10, 8, (0, 1), "intel"), "intel")
FILESYSTEMS = "nodev\tsysfs\nnodev\tcgroup2\nnodev\tresctrl\n"
CPUINFO = "vendor_id\t: GenuineIntel\nflags\t\t: fpu cat_l3 mba\n"


def settings(**kw):
    return make_settings(loop_options(LlcPartition), {"enabled": True, **kw})


def snap(t=1.0, info=INFO, groups=None, held=(), ls_p99=None, classes=(("ls", "LS"), ("be", "BE"))):
    runq = {"ls": RunqLatency("ebpf", 1000, ls_p99 / 2, ls_p99 / 2, ls_p99, ls_p99)} if ls_p99 else {}
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.5),
                    cgroups={p: CgroupSample(path=p, cls=c) for p, c in classes},
                    sections={RESCTRL: ResctrlSection(info, groups or {"default": {}}), RUNQ_LATENCY: runq},
                    held={k: "absent" for k in held})


def asked(actions):
    return [(a.target, a.knob, a.value) for a in actions]


def test_static_each_class_with_cgroups_gets_its_group_ways_bandwidth_and_threads():
    s = settings(be_mb=25)
    got = asked(LlcPartition.decide(snap(), s, LlcPartition.initial_state(s)))
    assert got == [("koordd-LS", "resctrl.group", "present"), ("koordd-LS", "schemata.L3", "0=7ff;1=7ff"),
                   ("koordd-LS", "schemata.MB", "0=100;1=100"), ("ls", "resctrl_group", "koordd-LS"),
                   ("koordd-BE", "resctrl.group", "present"), ("koordd-BE", "schemata.L3", "0=f;1=f"),
                   ("koordd-BE", "schemata.MB", "0=30;1=30"), ("be", "resctrl_group", "koordd-BE")]
    # LSR has no cgroups here: no group for it.


def test_without_resctrl_nothing_and_without_mba_only_the_cache():
    s = settings()
    no_section = Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.5),
                          cgroups={"be": CgroupSample(path="be", cls="BE")})
    assert LlcPartition.decide(no_section, s, LlcPartition.initial_state(s)) == []
    l3_only = ResctrlInfo(INFO.l3, None, "intel")
    knobs = {k for _, k, _ in asked(LlcPartition.decide(snap(info=l3_only), s, LlcPartition.initial_state(s)))}
    assert knobs == {"resctrl.group", "schemata.L3", "resctrl_group"}


def test_with_the_mount_option_an_unmounted_resctrl_is_mounted():
    unmounted = Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.5),
                         cgroups={"be": CgroupSample(path="be", cls="BE")},
                         supported=frozenset({"resctrl.mount", "resctrl.group"}))
    assert LlcPartition.decide(unmounted, settings(), LlcPartition.initial_state(settings())) == []
    s = settings(mount=True)
    assert asked(LlcPartition.decide(unmounted, s, LlcPartition.initial_state(s))) == \
        [("resctrl", "resctrl.mount", "mounted")]
    # Where the host cannot have resctrl the knob is not offered: nothing is asked.
    no_resctrl = Snapshot(time=1.0, wall=0.0, node=unmounted.node, cgroups=unmounted.cgroups)
    assert LlcPartition.decide(no_resctrl, s, LlcPartition.initial_state(s)) == []


def test_a_group_koordd_did_not_make_is_left_alone_and_an_unwanted_one_of_its_own_removed():
    s = settings(classes=["BE"])
    foreign = {"default": {}, "koordd-BE": {"L3": {0: "7ff"}}}
    assert LlcPartition.decide(snap(groups=foreign), s, LlcPartition.initial_state(s)) == []
    mine = asked(LlcPartition.decide(snap(groups=foreign, held=[("koordd-BE", "resctrl.group")]), s,
                                     LlcPartition.initial_state(s)))
    assert ("koordd-BE", "schemata.L3", "0=f;1=f") in mine
    # LS left `classes`: the group koordd made for it goes (its threads back to the default group).
    gone = LlcPartition.decide(snap(held=[("koordd-LS", "resctrl.group")]), s, LlcPartition.initial_state(s))
    assert [(a.target, a.knob, a.value, a.reason["step"]) for a in gone if a.value is None] == \
        [("koordd-LS", "resctrl.group", None, "remove")]


def test_adaptive_be_gains_one_way_per_round_with_slack_and_loses_them_at_once():
    s = settings(mode="adaptive", adaptive_cooldown="30s")
    state = LlcPartition.initial_state(s)

    def be_mask(t, p99):
        acts = LlcPartition.decide(snap(t=t, ls_p99=p99), s, state)
        [a] = [a for a in acts if a.target == "koordd-BE" and a.knob == "schemata.L3"]
        return a.value.split(";")[0], a.reason["step"]
    # 11 ways, min_cbm_bits 2: least max(2, ceil(1.1)) = 2 ways, most ceil(3.3) = 4 (be_l3 0-30).
    assert [be_mask(t, 500) for t in (1, 2, 3, 4)] == [("0=7", "grow one way"), ("0=f", "grow one way"),
                                                      ("0=f", "hold"), ("0=f", "hold")]
    assert be_mask(5, 1950) == ("0=3", "back to least")          # 2.5% slack: back at once
    assert be_mask(6, 500) == ("0=3", "hold")                    # cooling down for 30 s
    assert be_mask(36, 500) == ("0=7", "grow one way")
    assert be_mask(37, 1850) == ("0=7", "hold")                  # 7.5%: neither
    [a] = [a for a in LlcPartition.decide(snap(t=38, ls_p99=500), s, state)
           if a.target == "koordd-BE" and a.knob == "schemata.L3"]
    assert a.reason["slack"] == 0.75 and a.reason["worst"]["signal"] == "runq_p99_us" and a.reason["most_ways"] == 4
    # LS's range is not moved by BE's.
    ls = [a.value for a in LlcPartition.decide(snap(t=39, ls_p99=500), s, state) if a.target == "koordd-LS"
          and a.knob == "schemata.L3"]
    assert ls == ["0=7ff;1=7ff"]


def test_options_are_checked_when_the_config_loads():
    registry = {"llc_partition": LlcPartition}
    with pytest.raises(ConfigError) as e:
        parse_config('[loops.llc_partition]\nbe_l3 = "30-10"\nls_l3 = 5\nclasses = ["BE", "SYSTEM"]\n',
                     "koordd.toml", registry)
    assert e.value.errors == [
        "koordd.toml:2: loops.llc_partition.be_l3: expected start-end with 0 <= start < end <= 100, got '30-10'",
        "koordd.toml:3: loops.llc_partition.ls_l3: expected a range such as \"0-30\" (percent), got int",
        "koordd.toml:4: loops.llc_partition.classes: 'SYSTEM' is not one of the classes this option takes "
        "(LSE, LSR, LS, BE)"]
    c = parse_config('[loops.llc_partition]\nbe_l3 = "0-25.0"\n', "koordd.toml", registry)
    assert c.loops["llc_partition"].be_l3 == "0-25"
    assert LlcPartition.needs(settings()) == {RESCTRL}
    assert LlcPartition.needs(settings(mode="adaptive")) == {RESCTRL, RUNQ_LATENCY, "cpu_pressure"}


def test_on_a_fake_tree_through_the_sensor_and_the_actuator(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(CPUINFO)
    (proc / "filesystems").write_text(FILESYSTEMS)
    cg = FakeCgroups(tmp_path / "cg", "v2").add("ls").add("be")
    cg.set("ls", None, "cgroup.threads", "21\n")
    cg.set("be", None, "cgroup.threads", "11\n12\n")
    rc = FakeResctrl(tmp_path / "resctrl", cbm_mask=0x7FF, min_cbm_bits=2, alive={1, 11, 12, 21}, mounted=False)
    sensor = ResctrlSensor(rc, proc)
    sensor.start()
    assert sensor.sample() is None                                # not mounted: no section
    state_dir = tmp_path / "state"
    journal = RestoreJournal(state_dir)
    groups, tasks = ResctrlGroupBackend(rc, proc), ResctrlTasksBackend(cg.fs, rc, proc)
    groups.probe()
    act = Actuator(Backends([CgroupBackend(cg.fs), groups, tasks]), journal,
                   DecisionLog(state_dir, send=lambda message, **fields: None))
    s = settings(mount=True)
    state = LlcPartition.initial_state(s)

    def tick(t):
        section = sensor.sample()
        snapshot = Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.5),
                            cgroups={"ls": CgroupSample(path="ls", cls="LS"), "be": CgroupSample(path="be", cls="BE")},
                            sections={RESCTRL: section}, held={(h.target, h.knob): h.original for h in journal.entries()},
                            supported=frozenset({"resctrl.mount", "resctrl.group", "schemata.L3", "schemata.MB",
                                                 "resctrl_group"}))
        return act.apply("llc_partition", LlcPartition.decide(snapshot, s, state))
    [d] = tick(0.5)
    assert (d.target, d.knob, d.old, d.new, d.outcome) == ("resctrl", "resctrl.mount", "unmounted", "mounted",
                                                           APPLIED)
    assert sensor.sample().info == read_info(rc, "intel")
    first = tick(1.0)
    assert {d.outcome for d in first} == {APPLIED}
    assert rc.groups() == ["koordd-BE", "koordd-LS"]
    assert rc.tasks_of("koordd-BE") == [11, 12] and rc.tasks_of("koordd-LS") == [21]
    assert "  L3:0=00f;1=00f" in rc.read("koordd-BE/schemata")
    assert tick(2.0) == []                                        # all in place
    cg.set("be", None, "cgroup.threads", "11\n12\n13\n")          # a new BE thread
    rc.alive.add(13)
    [d] = tick(3.0)
    assert (d.target, d.knob, d.old, d.new) == ("be", "resctrl_group", "mixed", "koordd-BE")
    assert sensor.sample().groups["koordd-BE"]["L3"] == {0: "00f", 1: "00f"}
    restored = act.restore_all("stopping")
    assert restored[-1].knob == "resctrl.mount"                     # the groups first, then the mount
    assert not rc.mounted() and journal.entries() == []
