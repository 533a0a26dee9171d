"""The egress classifier's knobs: where it is attached, and which class each cgroup's packets get.

Both backends share one EgressClassifier (koordd/netclass.py): one BPF program and one map for all
devices, loaded at first use.

Kind "tc_filter", a target is a device name; knob `tc.classifier`:
- "attached": koordd's classifier, loaded by this koordd process, on the device's clsact egress hook;
- "detached": a clsact qdisc is there, without it (a classifier a previous koordd left after kill -9
  counts as detached: its map is gone with that process, so it is replaced);
- "none": no clsact qdisc at all.
Restoring "detached" removes koordd's filter; restoring "none" removes the clsact qdisc too.

Kind "tc_class", a target is a cgroup (a class root); knob `net_class`: "ls", "be" or "none", its
entry in the classifier's map (its v2 cgroup id -> HTB class 1:10 or 1:20). A socket in the cgroup
or below it sends its packets to that class on every device the classifier is attached to.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .backend import Backend, InvalidValue, KnobSpec, TargetGone, Unsupported
from .cgroups import CgroupFS
from .netclass import ClassifierError, DeviceGone, EgressClassifier
from .tc_backend import BE_CLASS, LS_CLASS

NET_CLASSES = {"ls": LS_CLASS, "be": BE_CLASS}
_NAMES = {v: k for k, v in NET_CLASSES.items()}


def _classifier_value(value: str) -> str:
    v = value.strip()
    if v not in ("attached", "detached", "none"):
        raise InvalidValue(f"tc.classifier must be attached, detached or none, got {value!r}")
    return v


def _net_class_value(value: str) -> str:
    v = value.strip().lower()
    if v not in (*NET_CLASSES, "none"):
        raise InvalidValue(f"net_class must be ls, be or none, got {value!r}")
    return v


class SharedClassifier:
    """The one EgressClassifier of this process, opened at first use; why not, once it failed."""

    def __init__(self, classifier: EgressClassifier | None = None):
        self.classifier = classifier or EgressClassifier(v1_classids=NET_CLASSES.values())
        self.opened = False
        self.failed: str | None = None

    def missing(self) -> str | None:
        """What this host lacks to run the classifier at all (checked without loading it)."""
        for module, package in (("bcc", "python3-bpfcc"), ("pyroute2", "pyroute2")):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed ({package})"
        return self.failed

    def get(self) -> EgressClassifier:
        if self.failed:
            raise Unsupported(self.failed)
        if not self.opened:
            try:
                self.classifier.open()
            except ClassifierError as e:
                self.failed = f"the egress classifier cannot run: {e}"
                raise Unsupported(self.failed) from None
            self.opened = True
        return self.classifier

    def opened_classifier(self) -> EgressClassifier | None:
        """The classifier if a backend has opened it (the net sensor reads it, never loads it)."""
        return self.classifier if self.opened else None

    def close(self) -> None:
        if self.opened:
            self.classifier.close()
            self.opened = False


_process_classifier: SharedClassifier | None = None


def process_classifier() -> SharedClassifier:
    """The classifier shared by this process's tc backends and its net sensor."""
    global _process_classifier
    if _process_classifier is None:
        _process_classifier = SharedClassifier()
    return _process_classifier


class ClassifierBackend(Backend):
    kind = "tc_filter"
    knobs = {"tc.classifier": KnobSpec("tc.classifier", "koordd's egress classifier on the device: attached, "
                                       "detached (clsact there without it) or none (no clsact)", _classifier_value)}

    def __init__(self, shared: SharedClassifier):
        self.shared = shared
        self.here: set[str] = set()         # devices this process attached the classifier to

    def probe(self) -> dict[str, str]:
        why = self.shared.missing()
        return {"tc.classifier": why} if why else {}

    def read(self, target: str, knob: str) -> str:
        c = self.shared.get()
        try:
            index = c.index_of(target)
        except DeviceGone:
            raise TargetGone(target) from None
        if not c.has_clsact(index):
            return "none"
        return "attached" if target in self.here and c.has_filter(index) else "detached"

    def write(self, target: str, knob: str, value: str) -> None:
        c = self.shared.get()
        try:
            if value == "attached":
                c.attach(target)
                self.here.add(target)
            else:
                c.detach(target, drop_clsact=value == "none")
                self.here.discard(target)
        except DeviceGone:
            raise TargetGone(target) from None

    def close(self) -> None:
        self.shared.close()


class NetClassBackend(Backend):
    kind = "tc_class"
    cgroup_targets = True
    knobs = {"net_class": KnobSpec("net_class", "the egress class of the cgroup's sockets: ls, be or none",
                                   _net_class_value)}

    def __init__(self, fs: CgroupFS, shared: SharedClassifier):
        self.fs = fs
        self.shared = shared

    def probe(self) -> dict[str, str]:
        why = self.shared.missing() or (None if self.fs.layout.unified else "no cgroup v2 tree (sockets are "
                                        "classified by their v2 cgroup; net_cls on v1 is not built yet)")
        return {"net_class": why} if why else {}

    def _id(self, target: str) -> int:
        tree = self.fs.layout.unified
        if tree is None:
            raise Unsupported("no cgroup v2 tree: sockets are classified by their v2 cgroup")
        try:
            return os.stat(Path(tree) / target).st_ino
        except FileNotFoundError:
            raise TargetGone(target) from None

    def read(self, target: str, knob: str) -> str:
        classid = self.shared.get().classes().get(self._id(target))
        return _NAMES.get(classid, "none")

    def write(self, target: str, knob: str, value: str) -> None:
        c = self.shared.get()
        cid = self._id(target)
        current = c.classes()
        if value == "none":
            current.pop(cid, None)
        else:
            current[cid] = NET_CLASSES[value]
        c.set_classes(current)
