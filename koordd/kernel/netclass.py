"""Egress classification by cgroup: koordd/bpf/net_classify.c on the clsact egress hook of each device
koordd shapes, through bcc (compile, load, maps) and pyroute2 (netlink: qdisc and filter).

The program puts a packet whose socket is in (or below) a class root into that class's tc class:
skb->priority = class id, which HTB takes as the packet's class directly. koordd keeps the map of
class roots (v2 cgroup ids, the inode numbers of their directories in the unified tree) as cgroups
come and go. Sockets keep the cgroup they were created in; traffic from another network namespace
(pods behind a veth) has no socket here once it is forwarded: classify it on the pod's veth.

No `tc` or `ip` subprocess: everything is netlink and bpf(2).
"""
from __future__ import annotations

import ctypes
import logging
from importlib.resources import files
from pathlib import Path
from typing import Iterable, Mapping

from koordd.kernel.netlink import burst_bytes, device_index

log = logging.getLogger("koordd.netclass")     # its name before the move: log lines unchanged
PROGRAM = Path(str(files("koordd.bpf") / "net_classify.c"))
CLSACT = 0xFFFF0000                 # the clsact qdisc's handle (ffff:)
EGRESS = 0xFFFFFFF3                 # clsact's egress hook (ffff:fff3)
FILTER_PRIO = 0xC0DD                # our filter's preference on the hook: how koordd finds its own


class ClassifierError(Exception):
    """The classifier cannot run here (no bcc, no pyroute2, a device gone): the message says why."""


class DeviceGone(ClassifierError):
    """No network device of that name (any more)."""


def tc_handle(text: str) -> int:
    """"1:20" -> 0x10020 (major:minor, hex as tc writes them)."""
    major, sep, minor = text.partition(":")
    if not sep:
        raise ValueError(f"not a tc class id (major:minor): {text!r}")
    return (int(major or "0", 16) << 16) | int(minor or "0", 16)


class EgressClassifier:
    def __init__(self, program: Path = PROGRAM, v1_classids: Iterable[int] = ()):
        self.program = program
        self.v1_classids = tuple(v1_classids)   # net_cls.classid values taken as the tc class of that id
        self.bpf = None
        self.fn = None
        self.ipr = None
        self.attached: dict[str, bool] = {}         # device -> whether koordd added its clsact qdisc

    def open(self) -> None:
        try:
            from bcc import BPF
            from pyroute2 import IPRoute
        except ImportError as e:
            raise ClassifierError(f"{e.name} is not installed") from None
        try:
            self.bpf = BPF(src_file=str(self.program).encode())
            self.fn = self.bpf.load_func(b"classify", BPF.SCHED_CLS)
            netcls = self.bpf[b"netcls"]
            for classid in self.v1_classids:
                netcls[ctypes.c_uint32(classid)] = ctypes.c_uint32(classid)
        except Exception as e:  # noqa: BLE001 - bcc raises bare Exceptions for compile and load failures
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
        """Whether a filter with koordd's preference is on the egress hook."""
        return any(m["info"] >> 16 == FILTER_PRIO for m in self.ipr.get_filters(index, parent=EGRESS))

    def attach(self, device: str) -> None:
        """The program on `device`'s egress hook (a clsact qdisc added where there is none)."""
        index = self.index_of(device)
        added = not self.has_clsact(index)
        if added:
            self.ipr.tc("add", "clsact", index)
        self.detach_filter(index)
        self.ipr.tc("add-filter", "bpf", index, ":1", fd=self.fn.fd, name=self.fn.name, parent=EGRESS,
                    prio=FILTER_PRIO, classid=1, direct_action=True)
        self.attached[device] = added or self.attached.get(device, False)

    def detach_filter(self, index: int) -> None:
        """Our filter off the egress hook (found by its preference), if it is there."""
        for m in self.ipr.get_filters(index, parent=EGRESS):
            if m["info"] >> 16 == FILTER_PRIO:
                self.ipr.tc("del-filter", "bpf", index, parent=EGRESS, prio=FILTER_PRIO)
                return

    def detach(self, device: str, drop_clsact: bool | None = None) -> None:
        """Our filter off `device`, and the clsact qdisc if `drop_clsact` (default: if this classifier
        added it)."""
        added = self.attached.pop(device, False)
        try:
            index = self.index_of(device)
        except DeviceGone:
            return                  # the device went away, and what was on it
        if self.has_clsact(index):
            self.detach_filter(index)
            if added if drop_clsact is None else drop_clsact:
                self.ipr.tc("del", "clsact", index)

    def set_classes(self, classes: Mapping[int, int]) -> None:
        """The map: v2 cgroup id -> tc class id, exactly `classes` afterwards."""
        table = self.bpf[b"classes"]
        want = {ctypes.c_uint64(k).value: v for k, v in classes.items()}
        for key in list(table.keys()):
            if key.value not in want:
                del table[key]
        for cid, classid in want.items():
            table[ctypes.c_uint64(cid)] = ctypes.c_uint32(classid)

    def classes(self) -> dict[int, int]:
        """The map as it is: v2 cgroup id -> tc class id."""
        return {k.value: v.value for k, v in self.bpf[b"classes"].items()}

    def sent(self) -> dict[tuple[int, int], int]:
        """Bytes classified so far, per (device index, tc class id), summed over CPUs."""
        return {(k.ifindex, k.classid): sum(v) for k, v in self.bpf[b"sent"].items()}

    def set_pace(self, index: int, classid: int, rate: int | None) -> None:
        """Pace class `classid` on device `index` to `rate` bit/s (EDT: the program stamps each packet's
        departure time, an fq root qdisc holds it until then); None: not paced."""
        table = self.bpf[b"pace"]
        key = table.Key(index, classid)
        if rate is None:
            table.pop(key, None)
            return
        old = table.get(key)
        per_second = max(rate // 8, 1)
        # The burst HTB would give this rate, as time: what a class behind its pace may catch up on.
        burst_ns = burst_bytes(rate) * 1_000_000_000 // per_second
        table[key] = table.Leaf(per_second, old.t_last if old is not None else 0, burst_ns)

    def paces(self, index: int) -> dict[int, int]:
        """tc class id -> rate in bit/s of the classes paced on device `index`."""
        return {k.classid: v.rate * 8 for k, v in self.bpf[b"pace"].items() if k.ifindex == index}

    def clear(self, index: int) -> None:
        """Forget device `index`: its pacing and its byte counts (an index may be reused by another device)."""
        for name in (b"pace", b"sent"):
            table = self.bpf[name]
            for key in [k for k in table.keys() if k.ifindex == index]:
                table.pop(key, None)

    def close(self) -> None:
        for device in list(self.attached):
            try:
                self.detach(device)
            except Exception:  # noqa: BLE001 - release the rest
                log.exception("cannot detach the egress classifier from %s", device)
        if self.ipr is not None:
            self.ipr.close()
            self.ipr = None
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None
