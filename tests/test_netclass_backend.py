"""The egress classifier's knobs against a fake classifier (the real one: tests/kernel/
test_netclass_kernel.py): what each value reads as, what restoring does, what is refused."""
from __future__ import annotations

import os

import pytest

from fakecgroup import FakeCgroups
from koordd.backend import InvalidValue, TargetGone, Unsupported
from koordd.netclass import ClassifierError, DeviceGone
from koordd.netclass_backend import ClassifierBackend, NetClassBackend, SharedClassifier
from koordd.tc_backend import BE_CLASS, LS_CLASS


class FakeClassifier:
    """Devices -> {"clsact": bool, "filter": bool}; the map as a dict."""

    def __init__(self, fail: str | None = None):
        self.devices = {"eth0": {"clsact": False, "filter": False}}
        self.map: dict[int, int] = {}
        self.fail = fail
        self.closed = False

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
    shared = SharedClassifier(FakeClassifier(fail="cannot load net_classify.c: boom"))
    b = ClassifierBackend(shared)
    with pytest.raises(Unsupported, match="the egress classifier cannot run: cannot load net_classify.c: boom"):
        b.read("eth0", "tc.classifier")
    assert b.probe() == {"tc.classifier": "the egress classifier cannot run: cannot load net_classify.c: boom"}


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
    shared.missing = lambda: None                            # bcc and pyroute2 there or not: not the point
    v1 = NetClassBackend(FakeCgroups(tmp_path / "v1", "v1").fs, shared)
    assert "no cgroup v2 tree" in v1.probe()["net_class"]
