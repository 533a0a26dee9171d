"""The resctrl backends on a fake resctrl tree (which refuses what the kernel refuses) and fake
cgroups, alone and through the actuator: groups made and removed, masks checked before they are
written, threads moved one id per write and handed back on restore. Verified on a fake tree only."""
from __future__ import annotations

import errno

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.fakes.resctrl import FakeResctrl
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import CgroupBackend
from koordd.backends.resctrl import ResctrlGroupBackend, ResctrlTasksBackend
from koordd.core.backend import Backends, InvalidValue, PartialWrite, TargetGone, Unsupported
from koordd.core.decisions import APPLIED, REFUSED, RESTORED
from koordd.core.loop import Action

FILESYSTEMS = "nodev\tsysfs\nnodev\tcgroup2\nnodev\tresctrl\n"
CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 cat_l3 cdp_l3 mba rdt_a\n"


def put_threads(tree: FakeCgroups, cgroup: str, tids) -> None:
    controller, name = ("cpu", "tasks") if tree.v1 else (None, "cgroup.threads")
    tree.set(cgroup, controller, name, "".join(f"{t}\n" for t in tids))


@pytest.fixture
def rig(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(CPUINFO)
    (proc / "filesystems").write_text(FILESYSTEMS)
    cg = FakeCgroups(tmp_path / "cg", "v2").add("be").add("be/job").add("ls")
    put_threads(cg, "be", [])
    put_threads(cg, "be/job", [11, 12])
    put_threads(cg, "ls", [21])
    rc = FakeResctrl(tmp_path / "resctrl", cbm_mask=0x7FF, min_cbm_bits=2, num_closids=4,
                     alive={1, 11, 12, 21})
    groups = ResctrlGroupBackend(rc, proc)
    tasks = ResctrlTasksBackend(cg.fs, rc, proc)
    assert groups.probe() == {} and tasks.probe() == {}
    return cg, rc, groups, tasks


def test_without_resctrl_every_knob_says_why_and_unmounted_each_use_does(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text("vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2\n")
    (proc / "filesystems").write_text(FILESYSTEMS)
    rc = FakeResctrl(tmp_path / "resctrl", mounted=False)
    b = ResctrlGroupBackend(rc, proc)
    assert set(b.probe().values()) == {"the CPU has no cache or memory bandwidth allocation (no cat_l3 or mba flag)"}
    (proc / "cpuinfo").write_text(CPUINFO)
    (proc / "filesystems").write_text("nodev\tsysfs\n")
    assert set(b.probe().values()) == {"the kernel has no resctrl filesystem (CONFIG_X86_CPU_RESCTRL off)"}
    (proc / "filesystems").write_text(FILESYSTEMS)
    tasks = ResctrlTasksBackend(FakeCgroups(tmp_path / "cg", "v2").add("be").fs, rc, proc)
    assert b.probe() == {} and tasks.probe() == {}             # the host can: mounting is up to a loop
    for use in (lambda: b.read("koordd-BE", "schemata.L3"), lambda: b.write("koordd-BE", "resctrl.group", "present"),
                lambda: tasks.read("be", "resctrl_group")):
        with pytest.raises(Unsupported, match=f"resctrl is not mounted at {rc.root}"):
            use()
    # Mounted on request, and unmounted again (which takes every group with it).
    mount_point = "resctrl"
    assert b.read(mount_point, "resctrl.mount") == "unmounted"
    with pytest.raises(InvalidValue, match="the target of resctrl.mount is 'resctrl'"):
        b.validate("/mnt", "resctrl.mount", "mounted")
    b.write(mount_point, "resctrl.mount", "mounted")
    assert b.read(mount_point, "resctrl.mount") == "mounted" and b.probe() == {}
    b.write("koordd-BE", "resctrl.group", "present")
    b.write(mount_point, "resctrl.mount", "unmounted")
    assert not rc.mounted() and list(rc.root.iterdir()) == []     # the mount point stays, empty


def test_groups_are_made_and_their_masks_checked_before_a_write(rig):
    cg, rc, b, _ = rig
    assert b.read("koordd-BE", "resctrl.group") == "absent"
    b.write("koordd-BE", "resctrl.group", "present")
    assert b.read("koordd-BE", "schemata.L3") == "0=7ff;1=7ff"
    assert b.validate("koordd-BE", "schemata.L3", "0=00F; 1=f") == "0=f;1=f"
    b.write("koordd-BE", "schemata.L3", "0=f;1=f")
    assert b.read("koordd-BE", "schemata.L3") == "0=f;1=f"
    # What the kernel would refuse is refused here first, with the reason.
    for bad, why in (("0=5;1=f", "non-consecutive"), ("0=4;1=f", "min_cbm_bits (2)"), ("0=fff", "cbm_mask 7ff"),
                     ("7=f", "no cache id 7"), ("0=zz", "hex"), ("0f", "not <domain id>=<value>")):
        with pytest.raises(InvalidValue, match=None) as e:
            b.validate("koordd-BE", "schemata.L3", bad)
        assert why in str(e.value)
    # MB: rounded up to the granularity as the kernel does, so it reads back as written.
    assert b.validate("koordd-BE", "schemata.MB", "0=25;1=100") == "0=30;1=100"
    b.write("koordd-BE", "schemata.MB", "0=30;1=100")
    assert b.read("koordd-BE", "schemata.MB") == "0=30;1=100"
    with pytest.raises(InvalidValue, match=r"outside \[10, 100\]"):
        b.validate("koordd-BE", "schemata.MB", "0=5;1=5")
    for name in ("info", "default", "../x", "a/b", ""):
        with pytest.raises(InvalidValue):
            b.validate(name, "resctrl.group", "present")
    with pytest.raises(TargetGone):
        b.read("gone", "schemata.L3")


def test_a_write_the_kernel_refuses_carries_last_cmd_status(rig):
    cg, rc, b, _ = rig
    for g in ("a", "b", "c"):
        b.write(g, "resctrl.group", "present")
    with pytest.raises(OSError) as e:
        b.write("d", "resctrl.group", "present")              # 4 CLOSIDs: the default group and three
    assert e.value.errno == errno.ENOSPC and e.value.strerror == "No space left on device (Out of CLOSIDs)"
    rc.min_cbm_bits = 3                                        # the kernel knows better than info/ said
    with pytest.raises(OSError) as e:
        b.write("a", "schemata.L3", "0=3;1=3")
    assert e.value.strerror == "Invalid argument (Need at least 3 bits in the mask)"


def test_threads_follow_their_cgroup_into_the_group_and_back(rig):
    cg, rc, groups, b = rig
    groups.write("koordd-BE", "resctrl.group", "present")
    assert b.read("be", "resctrl_group") == "default"
    b.write("be", "resctrl_group", "koordd-BE")
    assert rc.tasks_of("koordd-BE") == [11, 12] and b.read("be", "resctrl_group") == "koordd-BE"
    assert [w for w in rc.writes if w[0].endswith("tasks")] == [("koordd-BE/tasks", "11\n"), ("koordd-BE/tasks", "12\n")]
    # A new thread, and one that exits before it is moved: the new one follows, the exit is no error.
    put_threads(cg, "be/job", [11, 12, 13, 14])
    rc.alive |= {13}
    assert b.read("be", "resctrl_group") == "mixed"
    b.write("be", "resctrl_group", "koordd-BE")
    assert rc.tasks_of("koordd-BE") == [11, 12, 13]
    put_threads(cg, "be/job", [])
    assert b.read("be", "resctrl_group") == "none" and b.same("none", "koordd-BE")
    put_threads(cg, "be/job", [11, 12, 13])
    b.write("be", "resctrl_group", "mixed")                   # a restore of "mixed": the default group
    assert rc.tasks_of("koordd-BE") == [] and b.read("be", "resctrl_group") == "default"
    with pytest.raises(InvalidValue, match="does not exist"):
        b.validate("be", "resctrl_group", "nope")
    with pytest.raises(TargetGone):
        b.read("gone", "resctrl_group")


def test_a_refused_thread_names_it_after_the_others_moved(rig, monkeypatch):
    cg, rc, groups, b = rig
    groups.write("g", "resctrl.group", "present")
    real = rc.write

    def refuse_12(rel, text):
        if text == "12\n":
            rc._refuse(errno.EINVAL, "Can't move task 12 to a pseudo-locked group")
        real(rel, text)
    monkeypatch.setattr(rc, "write", refuse_12)
    with pytest.raises(PartialWrite) as e:
        b.write("be", "resctrl_group", "g")
    assert "thread 12" in str(e.value) and "pseudo-locked" in str(e.value) and rc.tasks_of("g") == [11]


def test_through_the_actuator_koordd_removes_only_the_groups_it_made(rig, tmp_path):
    cg, rc, groups, tasks = rig
    rc.mkdir("someone-else")
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    act = Actuator(Backends([CgroupBackend(cg.fs), groups, tasks]), journal,
                   DecisionLog(state, send=lambda message, **fields: None))
    actions = [Action("koordd-BE", "resctrl.group", "present", {}, "BE gets an LLC group"),
               Action("koordd-BE", "schemata.L3", "0=f;1=f", {}, "BE: 30% of the cache"),
               Action("be", "resctrl_group", "koordd-BE", {}, "BE threads into its group"),
               Action("someone-else", "resctrl.group", "present", {}, "exists already")]
    decisions = act.apply("llc_partition", actions)
    assert [(d.target, d.knob, d.old, d.new, d.outcome) for d in decisions] == [
        ("koordd-BE", "resctrl.group", "absent", "present", APPLIED),
        ("koordd-BE", "schemata.L3", "0=7ff;1=7ff", "0=f;1=f", APPLIED),
        ("be", "resctrl_group", "default", "koordd-BE", APPLIED)]
    assert rc.tasks_of("koordd-BE") == [11, 12]
    assert act.apply("llc_partition", actions) == []           # all in place
    bad = act.apply("llc_partition", [Action("koordd-BE", "schemata.L3", "0=5;1=5", {}, "a hole")])
    assert bad[0].outcome == REFUSED and "non-consecutive" in bad[0].error
    restored = act.restore_all("stopping")
    assert {d.outcome for d in restored} == {RESTORED}
    assert rc.groups() == ["someone-else"] and sorted(rc.tasks_of()) == [1, 11, 12, 21]
    assert journal.entries() == []


def test_the_daemon_says_in_one_line_which_knobs_a_missing_feature_takes(tmp_path, caplog):
    from koordd.core.config import parse_config
    from koordd.runtime.daemon import Daemon
    tree = FakeCgroups(tmp_path / "cg", "v2").add("be.slice")
    path = tmp_path / "koordd.toml"
    path.write_text(f'[daemon]\ncgroup_root = "{tree.root}"\nstate_dir = "{tmp_path / "state"}"\n')
    d = Daemon(parse_config(path.read_text(), path, {}), {})
    d.actuator.unsupported = {"schemata.L3": "no cat_l3", "schemata.MB": "no cat_l3", "resctrl_group": "no cat_l3",
                              "sched_policy": "no threads here"}
    caplog.set_level("INFO", logger="koordd")
    d._log_missing_knobs()
    assert [r.getMessage() for r in caplog.records] == [
        "knobs resctrl_group, schemata.L3, schemata.MB unavailable: no cat_l3",
        "knob sched_policy unavailable: no threads here"]
