"""The egress classifier's knobs against a fake classifier and a fake net_cls hierarchy (the real
ones: tests/kernel/test_netclass_kernel.py, test_netcls_kernel.py): what each value reads as, what
restoring does, what is refused."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.netclass import ClassifierBackend, NetClassBackend, NetClsTree, SharedClassifier
from koordd.core.backend import Backends, InvalidValue, PartialWrite, TargetGone, Unsupported
from koordd.core.decisions import APPLIED
from koordd.core.loop import Action
from koordd.kernel.netclass import ClassifierError, DeviceGone
from koordd.kernel.netlink import BE_CLASS, LS_CLASS


class FakeClassifier:
    """Devices -> {"clsact": bool, "filter": bool}; the map as a dict."""

    def __init__(self, fail: str | None = None):
        self.devices = {"eth0": {"clsact": False, "filter": False}}
        self.map: dict[int, int] = {}
        self.fail = fail
        self.closed = False

    @staticmethod
    def missing():
        return None                 # what the host has is not the point of these tests

    def open(self):
        if self.fail:
            raise ClassifierError(self.fail)

    def index_of(self, device):
        if device not in self.devices:
            raise DeviceGone(f"no network device {device}")
        return device

    def has_clsact(self, dev):
        return self.devices[dev]["clsact"]

    def has_filter(self, dev):
        return self.devices[dev]["filter"]

    def attach(self, device):
        self.index_of(device)
        self.devices[device] = {"clsact": True, "filter": True}

    def detach(self, device, drop_clsact=None):
        if device in self.devices:
            self.devices[device]["filter"] = False
            if drop_clsact:
                self.devices[device]["clsact"] = False

    def classes(self):
        return dict(self.map)

    def set_classes(self, classes):
        self.map = dict(classes)

    def close(self):
        self.closed = True


def test_attached_means_by_this_koordd_and_restoring_removes_what_was_not_there():
    fake = FakeClassifier()
    b = ClassifierBackend(SharedClassifier(fake))
    assert b.read("eth0", "tc.classifier") == "none"
    b.write("eth0", "tc.classifier", "attached")
    assert b.read("eth0", "tc.classifier") == "attached"
    # Another koordd process (after kill -9 of this one) sees the filter but not as its own.
    assert ClassifierBackend(SharedClassifier(fake)).read("eth0", "tc.classifier") == "detached"
    b.write("eth0", "tc.classifier", "none")                 # restore: no clsact before koordd
    assert fake.devices["eth0"] == {"clsact": False, "filter": False}
    fake.devices["eth0"]["clsact"] = True                    # someone else's clsact
    b.write("eth0", "tc.classifier", "attached")
    b.write("eth0", "tc.classifier", "detached")             # restore: their clsact stays
    assert fake.devices["eth0"] == {"clsact": True, "filter": False}
    with pytest.raises(TargetGone):
        b.read("eth1", "tc.classifier")
    with pytest.raises(TargetGone):
        b.write("eth1", "tc.classifier", "attached")
    with pytest.raises(InvalidValue):
        b.validate("eth0", "tc.classifier", "on")
    b.close()
    assert fake.closed


def test_a_classifier_that_cannot_load_makes_every_use_say_why_once_tried():
    shared = SharedClassifier(FakeClassifier(fail="cannot load net_classify.bpf.o: boom"))
    b = ClassifierBackend(shared)
    with pytest.raises(Unsupported, match="the egress classifier cannot run: cannot load net_classify.bpf.o: boom"):
        b.read("eth0", "tc.classifier")
    assert b.probe() == {"tc.classifier": "the egress classifier cannot run: cannot load net_classify.bpf.o: boom"}


def test_a_cgroups_class_is_its_entry_in_the_map(tmp_path):
    tree = FakeCgroups(tmp_path, "hybrid").add("be.slice").add("ls.slice")
    fake = FakeClassifier()
    b = NetClassBackend(tree.fs, SharedClassifier(fake))
    ino = os.stat(tree.layout.unified / "be.slice").st_ino
    assert b.read("be.slice", "net_class") == "none"
    b.write("be.slice", "net_class", "be")
    b.write("ls.slice", "net_class", "ls")
    assert fake.map[ino] == BE_CLASS and LS_CLASS in fake.map.values()
    assert b.read("be.slice", "net_class") == "be"
    b.write("be.slice", "net_class", "none")
    assert ino not in fake.map and b.read("ls.slice", "net_class") == "ls"
    with pytest.raises(TargetGone):
        b.read("gone.slice", "net_class")
    assert b.validate("be.slice", "net_class", " BE ") == "be"
    with pytest.raises(InvalidValue):
        b.validate("be.slice", "net_class", "gold")
    shared = SharedClassifier(fake)
    v1 = NetClassBackend(FakeCgroups(tmp_path / "v1", "v1").fs, shared)
    assert v1.probe() == {"net_class": "no cgroup v2 tree and no net_cls hierarchy mounted (sockets are "
                                       "classified by one or the other)"}


class FakeNetCls(NetClsTree):
    """A net_cls hierarchy as the kernel keeps it: each thread in exactly one cgroup (the root's
    `tasks` holds the rest), a new cgroup inherits its parent's classid, rmdir refuses a cgroup with
    threads or children (EBUSY), a thread that is not alive is refused (ESRCH)."""

    def __init__(self, root: Path, alive: set[int]):
        root.mkdir(parents=True)
        (root / "net_cls.classid").write_text("0\n")
        (root / "tasks").write_text("".join(f"{t}\n" for t in sorted(alive)))
        super().__init__(root)
        self.alive = alive

    def groups(self) -> list[str]:
        return [str(p.parent.relative_to(self.root)).replace(".", "", p.parent == self.root)
                for p in self.root.rglob("tasks")]

    def move(self, tid: int, cgroup: str) -> None:
        if tid not in self.alive:
            raise ProcessLookupError(errno.ESRCH, os.strerror(errno.ESRCH))
        for g in self.groups():
            rest = sorted([t for t in self.tasks(g) if t != tid] + ([tid] if g == cgroup else []))
            self.fs.write("net_cls", g, "tasks", "".join(f"{t}\n" for t in rest))

    def exit(self, tid: int) -> None:
        """Thread `tid` exits: it leaves its cgroup."""
        self.move(tid, "")
        self.alive.discard(tid)
        self.fs.write("net_cls", "", "tasks", "".join(f"{t}\n" for t in self.tasks("") if t != tid))

    def mkdir(self, cgroup: str) -> None:
        parent = cgroup.rpartition("/")[0]
        super().mkdir(cgroup)
        (self.root / cgroup / "net_cls.classid").write_text(f"{self.classid(parent)}\n")
        (self.root / cgroup / "tasks").write_text("")

    def rmdir(self, cgroup: str) -> None:
        if self.tasks(cgroup) or self.children(cgroup):
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        for f in (self.root / cgroup).iterdir():
            f.unlink()
        super().rmdir(cgroup)


def net_cls_host(tmp_path, threads: dict[str, list[int]]):
    """A pure v1 host (cpu is the primary hierarchy) with `threads` in its cgroups, and its net_cls
    hierarchy holding them all in the root. Gives (tree, net_cls, backend)."""
    tree = FakeCgroups(tmp_path, "v1")
    for cg, tids in threads.items():
        tree.add(cg).set(cg, "cpu", "tasks", "".join(f"{t}\n" for t in tids))
    net_cls = FakeNetCls(tmp_path / "net_cls", {t for tids in threads.values() for t in tids})
    shared = SharedClassifier(FakeClassifier())
    return tree, net_cls, NetClassBackend(tree.fs, shared, net_cls)


def test_net_cls_be_makes_the_cgroup_writes_the_classid_and_moves_every_thread_below(tmp_path):
    tree, net_cls, b = net_cls_host(tmp_path, {"be.slice": [10], "be.slice/job": [11, 12, 14], "ls.slice": [20]})
    net_cls.exit(14)                              # listed in the cpu hierarchy, gone before it is moved
    assert b.probe() == {}
    assert b.read("be.slice", "net_class") == "none"
    b.write("be.slice", "net_class", "be")
    assert (tmp_path / "net_cls/be.slice/net_cls.classid").read_text() == str(BE_CLASS)      # 65568
    assert net_cls.tasks("be.slice") == [10, 11, 12] and net_cls.tasks("") == [20]
    tree.set("be.slice/job", "cpu", "tasks", "11\n12\n")                          # the kernel drops 14 too
    assert b.read("be.slice", "net_class") == "be" and b.read("ls.slice", "net_class") == "none"
    # A thread started later stays in the net_cls root: "mixed" until the next write moves it.
    net_cls.alive.add(13)
    net_cls.move(13, "")
    tree.set("be.slice/job", "cpu", "tasks", "11\n12\n13\n")
    assert b.read("be.slice", "net_class") == "mixed"
    with pytest.raises(InvalidValue):
        b.validate("be.slice", "net_class", "mixed")
    b.write("be.slice", "net_class", "be")
    assert b.read("be.slice", "net_class") == "be" and 13 in net_cls.tasks("be.slice")


def test_net_cls_restore_moves_threads_back_and_removes_only_empty_unclassed_cgroups(tmp_path):
    tree, net_cls, b = net_cls_host(tmp_path, {"kubepods/be/pod": [30, 31], "kubepods/burstable": [40]})
    b.write("kubepods/be/pod", "net_class", "be")
    assert net_cls.classid("kubepods") == 0 and net_cls.classid("kubepods/be") == 0     # made only to get there
    assert net_cls.tasks("kubepods/be/pod") == [30, 31]
    net_cls.mkdir("kubepods/mine")                                   # an operator's cgroup beside it
    net_cls.exit(31)
    b.write("kubepods/be/pod", "net_class", "none")
    assert net_cls.tasks("") == [30, 40] and b.read("kubepods/be/pod", "net_class") == "none"
    assert not (tmp_path / "net_cls/kubepods/be").exists() and (tmp_path / "net_cls/kubepods/mine").is_dir()
    # A cgroup with a classid that is not koordd's is neither taken over nor removed.
    net_cls.set_classid("kubepods/mine", 0x50001)
    tree.add("kubepods/mine")
    assert b.read("kubepods/mine", "net_class") == "none"
    with pytest.raises(OSError, match="classid 0x50001, not koordd's"):
        b.write("kubepods/mine", "net_class", "ls")
    b.write("kubepods/mine", "net_class", "none")
    assert net_cls.classid("kubepods/mine") == 0x50001


def test_nested_class_roots_keep_their_own_threads(tmp_path):
    tree, net_cls, b = net_cls_host(tmp_path, {"kubepods": [1], "kubepods/be": [2]})
    b.write("kubepods/be", "net_class", "be")
    b.write("kubepods", "net_class", "ls")
    assert net_cls.tasks("kubepods") == [1] and net_cls.tasks("kubepods/be") == [2]
    assert b.read("kubepods", "net_class") == "ls" and b.read("kubepods/be", "net_class") == "be"
    b.write("kubepods", "net_class", "none")                         # the nested root's cgroup stays
    assert net_cls.classid("kubepods") == 0 and net_cls.tasks("kubepods/be") == [2]


def test_a_net_cls_target_gone_from_the_primary_hierarchy(tmp_path):
    tree, net_cls, b = net_cls_host(tmp_path, {"be.slice/job": [50]})
    with pytest.raises(TargetGone):
        b.read("gone.slice", "net_class")
    with pytest.raises(TargetGone):
        b.write("gone.slice", "net_class", "be")
    assert not (tmp_path / "net_cls/gone.slice").exists()
    b.write("be.slice/job", "net_class", "be")
    net_cls.exit(50)                                                 # its last thread
    tree.remove("be.slice/job")
    # Its net_cls cgroup is still koordd's to remove: restoring does, then the target is gone.
    assert b.read("be.slice/job", "net_class") == "be"
    b.write("be.slice/job", "net_class", "none")
    assert not (tmp_path / "net_cls/be.slice").exists()
    with pytest.raises(TargetGone):
        b.read("be.slice/job", "net_class")


def test_net_cls_threads_that_refuse_to_move_are_a_partial_write(tmp_path):
    tree, net_cls, b = net_cls_host(tmp_path, {"be.slice": [60, 61]})
    real_move = net_cls.move

    def move(tid, cgroup):
        if tid == 61:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        real_move(tid, cgroup)
    net_cls.move = move
    with pytest.raises(PartialWrite, match="1 thread.s. refused net_cls cgroup be.slice .first: thread 61"):
        b.write("be.slice", "net_class", "be")
    assert b.read("be.slice", "net_class") == "mixed"


def test_the_mode_follows_the_layout_or_the_constructor(tmp_path):
    shared = SharedClassifier(FakeClassifier())
    hybrid = FakeCgroups(tmp_path / "h", "hybrid")
    assert NetClassBackend(hybrid.fs, shared).net_cls is None                 # a v2 tree: v2 ids
    forced = NetClassBackend(hybrid.fs, shared, tmp_path / "nc")
    assert forced.net_cls.root == tmp_path / "nc" and forced.probe() == {}
    v1 = FakeCgroups(tmp_path / "v1", "v1")
    (v1.root / "net_cls,net_prio").mkdir()
    (v1.root / "net_cls,net_prio" / "cgroup.procs").write_text("1\n")
    found = NetClassBackend(v1.fs, shared)
    assert found.net_cls.root == v1.root / "net_cls,net_prio" and found.probe() == {}


def test_net_cls_through_the_actuator_restores_what_it_moved(tmp_path):
    tree, net_cls, b = net_cls_host(tmp_path, {"be.slice": [70]})
    act = Actuator(Backends([b]), RestoreJournal(tmp_path / "state"),
                   DecisionLog(tmp_path / "state", send=lambda message, **f: None))
    [d] = act.apply("net_shaping", [Action("be.slice", "net_class", "be", {}, "BE egress")])
    assert (d.old, d.new, d.outcome) == ("none", "be", APPLIED)
    assert act.apply("net_shaping", [Action("be.slice", "net_class", "be", {}, "BE egress")]) == []
    act.restore_all("stopping")
    assert net_cls.tasks("") == [70] and not (tmp_path / "net_cls/be.slice").exists()
