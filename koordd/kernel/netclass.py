"""Egress classification by cgroup: koordd/bpf/net_classify.bpf.o (a CO-RE object, loaded by koordd's
loader, koordd/kernel/libbpf.py) on the egress hook of each device koordd shapes.

The program puts a packet whose socket is in (or below) a class root into that class's tc class:
skb->priority = class id, which HTB takes as the packet's class directly. koordd keeps the map of
class roots (v2 cgroup ids, the inode numbers of their directories in the unified tree) as cgroups
come and go. Sockets keep the cgroup they were created in; traffic from another network namespace
(pods behind a veth) has no socket here once it is forwarded: classify it on the pod's veth.

On the hook through a tcx link (Linux 6.6+): it belongs to this process's fd, so when koordd stops or
is killed the kernel takes the program off the device. On older kernels a clsact qdisc's filter
(netlink, pyroute2), which outlives the process: a koordd that starts again finds it by its preference
and replaces it. No `tc` or `ip` subprocess: everything is netlink and bpf(2).
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Callable, Iterable, Mapping

from koordd.kernel import bpf_objects
from koordd.kernel.host_probe import installed
from koordd.kernel.libbpf import BpfError, BpfObject, has_tcx, libbpf
from koordd.kernel.netlink import burst_bytes, device_index

log = logging.getLogger("koordd.netclass")     # its name before the move: log lines unchanged
PROGRAM = bpf_objects.NET_CLASSIFY
CLSACT = 0xFFFF0000                 # the clsact qdisc's handle (ffff:)
EGRESS = 0xFFFFFFF3                 # clsact's egress hook (ffff:fff3)
FILTER_PRIO = 0xC0DD                # our filter's preference on the hook: how koordd finds its own


class DevClass(ctypes.Structure):
    """The program's `struct dev_class`: a device and a tc class."""
    _fields_ = [("ifindex", ctypes.c_uint32), ("classid", ctypes.c_uint32)]


class Pace(ctypes.Structure):
    """The program's `struct pace`."""
    _fields_ = [("rate", ctypes.c_uint64), ("t_last", ctypes.c_uint64), ("burst_ns", ctypes.c_uint64)]


class ClassifierError(Exception):
    """The classifier cannot run here (no libbpf, no pyroute2, a device gone): the message says why."""


class DeviceGone(ClassifierError):
    """No network device of that name (any more)."""


def tc_handle(text: str) -> int:
    """"1:20" -> 0x10020 (major:minor, hex as tc writes them)."""
    major, sep, minor = text.partition(":")
    if not sep:
        raise ValueError(f"not a tc class id (major:minor): {text!r}")
    return (int(major or "0", 16) << 16) | int(minor or "0", 16)


class EgressClassifier:
    """One loaded program and its maps for every device; `load` opens and loads the object (koordd's
    loader; unit tests give a fake)."""

    def __init__(self, program: Path = PROGRAM, v1_classids: Iterable[int] = (),
                 load: Callable[[Path], BpfObject] = BpfObject):
        self.program, self.load = program, load
        self.v1_classids = tuple(v1_classids)   # net_cls.classid values taken as the tc class of that id
        self.obj: BpfObject | None = None
        self.maps: dict = {}
        self.ipr = None
        self.attached: dict[str, bool] = {}         # device -> whether koordd added its clsact qdisc
        self.links: dict[int, int] = {}             # device index -> its tcx link's fd
        self.tcx: bool | None = None                # whether to use tcx links (None: as the kernel allows)

    @staticmethod
    def missing() -> str | None:
        """What this host lacks to run the classifier at all (checked without loading it)."""
        try:
            libbpf()
        except BpfError as e:
            return str(e)
        if installed("pyroute2") is not None:     # found, not imported: pyroute2 is some 16 MB of RSS
            return "pyroute2 is not installed (python3-pyroute2)"
        return None

    def open(self) -> None:
        try:
            from pyroute2 import IPRoute
        except ImportError as e:
            raise ClassifierError(f"{e.name} is not installed") from None
        try:
            self.obj = self.load(self.program)
            self.maps = {name: self.obj.map(name, key, value) for name, key, value in (
                ("classes", ctypes.c_uint64, ctypes.c_uint32), ("netcls", ctypes.c_uint32, ctypes.c_uint32),
                ("sent", DevClass, ctypes.c_uint64), ("pace", DevClass, Pace))}
            for classid in self.v1_classids:
                self.maps["netcls"].update(ctypes.c_uint32(classid), ctypes.c_uint32(classid))
            if self.tcx is None:
                self.tcx = has_tcx()
                if not self.tcx:
                    log.info("no tcx links on this kernel (Linux 6.6+): the egress classifier is a clsact "
                             "filter, which a killed koordd leaves behind until it starts again")
        except BpfError as e:
            self.close()
            raise ClassifierError(f"cannot load {self.program.name}: {e}") from None
        self.ipr = IPRoute()

    def index_of(self, device: str) -> int:
        found = device_index(self.ipr, device)
        if found is None:
            raise DeviceGone(f"no network device {device}")
        return found

    def has_clsact(self, index: int) -> bool:
        return any(m.get_attr("TCA_KIND") == "clsact" for m in self.ipr.get_qdiscs(index))

    def has_filter(self, index: int) -> bool:
        """Whether koordd's classifier is on the egress hook: this process's tcx link, or a clsact filter
        with koordd's preference (this process's, or one a koordd before it left)."""
        if index in self.links:
            return True
        return self.has_clsact(index) and any(
            m["info"] >> 16 == FILTER_PRIO for m in self.ipr.get_filters(index, parent=EGRESS))

    def attach(self, device: str) -> None:
        """The program on `device`'s egress hook: a tcx link, or (before Linux 6.6) a clsact filter, the
        clsact qdisc added where there is none."""
        index = self.index_of(device)
        self.detach_filter(index)           # a filter a koordd before this one left
        if index in self.links:
            return
        if self.tcx:
            try:
                self.links[index] = self.obj.attach_tcx_egress("classify", index)
            except BpfError as e:
                raise ClassifierError(str(e)) from None
            self.attached.setdefault(device, False)
            return
        added = not self.has_clsact(index)
        if added:
            self.ipr.tc("add", "clsact", index)
        self.ipr.tc("add-filter", "bpf", index, ":1", fd=self.obj.program_fd("classify"), name="classify",
                    parent=EGRESS, prio=FILTER_PRIO, classid=1, direct_action=True)
        self.attached[device] = added or self.attached.get(device, False)

    def detach_filter(self, index: int) -> None:
        """Our clsact filter off the egress hook (found by its preference), if it is there."""
        if not self.has_clsact(index):
            return
        for m in self.ipr.get_filters(index, parent=EGRESS):
            if m["info"] >> 16 == FILTER_PRIO:
                self.ipr.tc("del-filter", "bpf", index, parent=EGRESS, prio=FILTER_PRIO)
                return

    def detach(self, device: str, drop_clsact: bool | None = None) -> None:
        """Our classifier off `device`, and the clsact qdisc if `drop_clsact` (default: if this classifier
        added it)."""
        added = self.attached.pop(device, False)
        try:
            index = self.index_of(device)
        except DeviceGone:
            return                  # the device went away, and what was on it
        if index in self.links:
            self.obj.detach(self.links.pop(index))
        if self.has_clsact(index):
            self.detach_filter(index)
            if added if drop_clsact is None else drop_clsact:
                self.ipr.tc("del", "clsact", index)

    def set_classes(self, classes: Mapping[int, int]) -> None:
        """The map: v2 cgroup id -> tc class id, exactly `classes` afterwards."""
        table = self.maps["classes"]
        want = {ctypes.c_uint64(k).value: v for k, v in classes.items()}
        for key in table.keys():
            if key.value not in want:
                table.delete(key)
        for cid, classid in want.items():
            table.update(ctypes.c_uint64(cid), ctypes.c_uint32(classid))

    def classes(self) -> dict[int, int]:
        """The map as it is: v2 cgroup id -> tc class id."""
        return {k.value: v.value for k, v in self.maps["classes"].items()}

    def sent(self) -> dict[tuple[int, int], int]:
        """Bytes classified so far, per (device index, tc class id), summed over CPUs."""
        return {(k.ifindex, k.classid): sum(v) for k, v in self.maps["sent"].items()}

    def set_pace(self, index: int, classid: int, rate: int | None) -> None:
        """Pace class `classid` on device `index` to `rate` bit/s (EDT: the program stamps each packet's
        departure time, an fq root qdisc holds it until then); None: not paced."""
        table, key = self.maps["pace"], DevClass(index, classid)
        if rate is None:
            table.delete(key)
            return
        old = table.lookup(key)
        per_second = max(rate // 8, 1)
        # The burst HTB would give this rate, as time: what a class behind its pace may catch up on.
        burst_ns = burst_bytes(rate) * 1_000_000_000 // per_second
        table.update(key, Pace(per_second, old.t_last if old is not None else 0, burst_ns))

    def paces(self, index: int) -> dict[int, int]:
        """tc class id -> rate in bit/s of the classes paced on device `index`."""
        return {k.classid: v.rate * 8 for k, v in self.maps["pace"].items() if k.ifindex == index}

    def clear(self, index: int) -> None:
        """Forget device `index`: its pacing and its byte counts (an index may be reused by another device)."""
        for name in ("pace", "sent"):
            table = self.maps[name]
            for key in [k for k in table.keys() if k.ifindex == index]:
                table.delete(key)

    def close(self) -> None:
        for device in list(self.attached):
            try:
                self.detach(device)
            except Exception:  # noqa: BLE001 - release the rest
                log.exception("cannot detach the egress classifier from %s", device)
        if self.ipr is not None:
            self.ipr.close()
            self.ipr = None
        if self.obj is not None:
            self.obj.close()            # closes the tcx links left: the kernel takes the program off
            self.obj = None
        self.links, self.maps = {}, {}
