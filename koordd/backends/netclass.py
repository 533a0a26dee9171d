"""The egress classifier's knobs: where it is attached, and which class each cgroup's packets get.

Both backends share one EgressClassifier (koordd/kernel/netclass.py): one BPF program and one map for all
devices, loaded at first use.

Kind "tc_filter", a target is a device name; knob `tc.classifier`:
- "attached": koordd's classifier, loaded by this koordd process, on the device's egress hook (a tcx link,
  or a clsact filter before Linux 6.6);
- "detached": a clsact qdisc is there, without it (a clsact filter a previous koordd left after kill -9
  counts as detached: its maps are koordd's no more, so it is replaced; a tcx link goes with its process);
- "none": neither.
Restoring "detached" removes koordd's filter; restoring "none" removes the clsact qdisc too.

Kind "tc_class", a target is a cgroup (a class root); knob `net_class`: "ls", "be" or "none". With a
cgroup v2 tree it is the cgroup's entry in the classifier's map (its v2 cgroup id -> HTB class 1:10
or 1:20): a socket in the cgroup or below it sends its packets to that class on every device the
classifier is attached to.

Where there is no v2 tree but a v1 net_cls hierarchy (net_cls or net_cls,net_prio), the class is a
net_cls classid (0x10010 LS, 0x10020 BE) the classifier also honours. systemd makes no net_cls
cgroups, so koordd makes `<net_cls>/<target>`, writes its classid and moves every thread of the
target and below (in koordd's primary hierarchy) into it; the kernel reclassifies their open sockets
as they move. It reads "mixed" while some thread is elsewhere (new ones are moved the next round).
Restoring "none" moves the threads back to the net_cls root, writes classid 0 and removes the
cgroup, then each parent while it is empty with classid 0: koordd keeps no record of the dirs it
made, and an empty classid-0 cgroup classifies nothing, so one an operator made may go too. A
net_cls cgroup with a classid that is not koordd's is left alone (writing it is refused).
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

from koordd.backends.threads import cgroup_threads
from koordd.core.backend import Backend, BackendSet, Harm, InvalidValue, KnobSpec, TargetGone, TaskBackend, TaskWrite, \
    Unsupported
from koordd.core.cgroup_text import parent_of
from koordd.kernel.cgroupfs import CgroupFS, CgroupGone, Layout, thread_ids
from koordd.kernel.netclass import ClassifierError, DeviceGone, EgressClassifier
from koordd.kernel.netlink import BE_CLASS, LS_CLASS

NET_CLASSES = {"ls": LS_CLASS, "be": BE_CLASS}
_NAMES = {v: k for k, v in NET_CLASSES.items()}
MIXED = "mixed"        # what a net_cls target reads while some of its threads are elsewhere; never set


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
        """What this host lacks to run the classifier at all (the classifier's own check: no load)."""
        return self.failed or self.classifier.missing()

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
        if target in self.here and c.has_filter(index):
            return "attached"           # a tcx link needs no clsact qdisc
        return "detached" if c.has_clsact(index) else "none"

    def still_koordds(self, target: str, knob: str, current: str, values) -> bool:
        # "attached" is this process's filter: the one a run before a kill attached reads "detached".
        if current == "detached" and "attached" in values:
            c = self.shared.get()
            try:
                return c.has_filter(c.index_of(target))
            except DeviceGone:
                raise TargetGone(target) from None
        return super().still_koordds(target, knob, current, values)

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


class NetClsTree:
    """A v1 net_cls hierarchy mounted at `root`, its cgroups named as in CgroupFS ("" is the root)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.fs = CgroupFS(Layout(self.root, "v1", v1={"net_cls": self.root}))

    def classid(self, cgroup: str) -> int | None:
        """net_cls.classid (the kernel prints it as a decimal u32); None when there is no such cgroup."""
        try:
            return int(self.fs.read("net_cls", cgroup, "net_cls.classid"))
        except CgroupGone:
            return None

    def set_classid(self, cgroup: str, classid: int) -> None:
        self.fs.write("net_cls", cgroup, "net_cls.classid", str(classid))

    def tasks(self, cgroup: str) -> list[int]:
        try:
            return thread_ids(self.fs.read("net_cls", cgroup, "tasks"), f"{cgroup}/tasks")
        except CgroupGone:
            return []

    def move(self, tid: int, cgroup: str) -> None:
        """One thread into `cgroup`: one id per write, as `tasks` takes it."""
        self.fs.write("net_cls", cgroup, "tasks", f"{tid}\n")

    def children(self, cgroup: str) -> list[str]:
        return self.fs.children("net_cls", cgroup)

    def mkdir(self, cgroup: str) -> None:
        os.mkdir(self.root / cgroup)

    def rmdir(self, cgroup: str) -> None:
        os.rmdir(self.root / cgroup)


class NetClassBackend(TaskBackend):
    """On net_cls (v1) a knob of each thread, the net_cls cgroup it is in: "mixed" while some are elsewhere.
    On v2 the cgroup's own entry in the classifier's map, which reads no "mixed"."""
    kind = "tc_class"
    empty = None                # "none" is a value: no class
    knobs = {"net_class": KnobSpec("net_class", "the egress class of the cgroup's sockets: ls, be or none",
                                   _net_class_value,
                                   harm=Harm("shape the egress of", lambda new, old: new == "be" and new != old))}

    def __init__(self, fs: CgroupFS, shared: SharedClassifier, net_cls: NetClsTree | Path | None = None):
        """net_cls: the v1 net_cls hierarchy to use instead of the v2 tree; found in the layout when
        there is no v2 tree."""
        self.fs = fs
        self.shared = shared
        if net_cls is None and fs.layout.unified is None:
            net_cls = fs.layout.v1.get("net_cls")
        self.net_cls = net_cls if net_cls is None or isinstance(net_cls, NetClsTree) else NetClsTree(net_cls)

    def probe(self) -> dict[str, str]:
        why = self.shared.missing()
        if why is None and self.net_cls is None and self.fs.layout.unified is None:
            why = "no cgroup v2 tree and no net_cls hierarchy mounted (sockets are classified by one or the other)"
        return {"net_class": why} if why else {}

    def _id(self, target: str) -> int:
        tree = self.fs.layout.unified
        if tree is None:
            raise Unsupported("no cgroup v2 tree and no net_cls hierarchy mounted")
        try:
            return os.stat(Path(tree) / target).st_ino
        except FileNotFoundError:
            raise TargetGone(target) from None

    def read(self, target: str, knob: str) -> str:
        if self.net_cls is not None:
            return self._read_net_cls(target)
        classid = self.shared.get().classes().get(self._id(target))
        return _NAMES.get(classid, "none")

    def write(self, target: str, knob: str, value: str) -> None:
        if self.net_cls is not None:
            self._write_net_cls(target, value)
            return
        c = self.shared.get()
        cid = self._id(target)
        current = c.classes()
        if value == "none":
            current.pop(cid, None)
        else:
            current[cid] = NET_CLASSES[value]
        c.set_classes(current)

    # --- net_cls (v1) ---------------------------------------------------------------------------------

    def _threads(self, target: str) -> list[int] | None:
        """The threads of `target` and below in the primary hierarchy; None when it is gone."""
        try:
            return cgroup_threads(self.fs, target)
        except TargetGone:
            return None

    def _read_net_cls(self, target: str) -> str:
        threads = self._threads(target)
        name = _NAMES.get(self.net_cls.classid(target))
        if threads is None:
            # Gone from the primary hierarchy: while koordd's net_cls cgroup is left, restoring removes it.
            if name is None:
                raise TargetGone(target)
            return name
        if name is None:
            return "none"
        return name if set(threads) <= self._held(target) else MIXED

    def _held(self, target: str) -> set[int]:
        """Threads in the net_cls cgroup of `target` or in a class root of koordd's below it (a nested
        class root keeps its own threads)."""
        held, stack = set(self.net_cls.tasks(target)), self.net_cls.children(target)
        while stack:
            cg = stack.pop()
            if self.net_cls.classid(cg) in _NAMES:
                held.update(self.net_cls.tasks(cg))
            stack += self.net_cls.children(cg)
        return held

    def _write_net_cls(self, target: str, value: str) -> None:
        if value not in NET_CLASSES:            # "none", or a restore of "mixed": no classifier needed
            self._leave(target)
            return
        self.shared.get()                       # a classid counts only while the classifier runs
        threads = self._threads(target)
        if threads is None:
            raise TargetGone(target)
        self._join(target, NET_CLASSES[value], threads)

    def _join(self, target: str, classid: int, threads: list[int]) -> None:
        current = self.net_cls.classid(target)
        if current not in (None, 0, *_NAMES):
            raise OSError(errno.EBUSY, f"net_cls cgroup {target} has classid {current:#x}, not koordd's: left alone")
        if current is None:
            self._make(target)
        if current != classid:
            self.net_cls.set_classid(target, classid)   # before the moves: a thread takes its new cgroup's id
        held = self._held(target)
        self._move([t for t in threads if t not in held], target)

    def _make(self, target: str) -> None:
        """mkdir -p; a parent made only to reach `target` gets classid 0 (a new cgroup inherits its
        parent's), so it classifies nothing and restoring may remove it."""
        parts = target.split("/")
        for i in range(1, len(parts) + 1):
            cg = "/".join(parts[:i])
            if self.net_cls.classid(cg) is not None:
                continue
            try:
                self.net_cls.mkdir(cg)
            except FileExistsError:
                continue                        # made meanwhile
            if cg != target and self.net_cls.classid(cg):
                self.net_cls.set_classid(cg, 0)

    def _leave(self, target: str) -> None:
        if self.net_cls.classid(target) not in _NAMES:
            return                              # not koordd's (or gone): nothing to undo
        self._move(self.net_cls.tasks(target), "")
        self.net_cls.set_classid(target, 0)
        cg: str | None = target
        while cg and self.net_cls.classid(cg) == 0:
            try:
                self.net_cls.rmdir(cg)
            except OSError:
                break                           # threads or child cgroups in it (EBUSY): it stays
            cg = parent_of(cg)

    def _move(self, tids: list[int], cgroup: str) -> None:
        """Each thread into net_cls `cgroup`; one that exited meanwhile is skipped."""
        w = TaskWrite()
        for tid in tids:
            w.put(f"thread {tid}", self.net_cls.move, tid, cgroup)
        w.refused(f"thread(s) refused net_cls cgroup {cgroup or '/'}")


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends: where the egress
    classifier is attached, and which class a cgroup's packets get."""
    shared = process_classifier()
    return [ClassifierBackend(shared), NetClassBackend(fs, shared)]


BACKENDS = BackendSet((ClassifierBackend, NetClassBackend), backends)     # koordd/core/catalogue.py BUILTIN
