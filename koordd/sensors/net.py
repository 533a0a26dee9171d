"""Egress rates per class on each device koordd shapes: the "net" section.

A device is shaped when its root qdisc is koordd's (koordd/backends/tc.py): for each, the bytes its
LS, BE and other traffic sent since the last round, as bit/s, and BE's ceiling as it is. Under
"htb" both come from the HTB classes; under "edt" from the egress classifier's counters and BE's
pace (the classifier this process's tc backends opened; none opened, no sample) and the root qdisc's
byte count. The qdiscs themselves say which devices these are: the sensor needs no configuration.

A rate is bytes over the time between two reads of the counters, each timed when it is read, not
when its round began: a round whose read comes late (a busy or emulated CPU) would otherwise divide
more bytes by the nominal interval, and net_shaping lowers BE's ceiling at once on an LS rate that
is too high but raises it only in steps, so that noise held BE below its ceiling.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from koordd.backends.netclass import process_classifier
from koordd.core.snapshot import NET
from koordd.kernel.netlink import (BE_CLASS, EDT_ROOT, EDT_ROOT_KINDS, LINK, LS_CLASS, OTHER_CLASS, ROOT,
    TC_ROOT_PARENT, device_links, htb_rates)
from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable


@dataclass(frozen=True)
class NetSample:
    mode: str                       # "htb" or "edt": how koordd shapes it; "foreign <kind> <handle>": a root
                                    # qdisc of someone else's (rates None)
    link_bps: int | None            # the HTB tree's link rate (None under edt: the device's own)
    be_ceil_bps: int | None         # None: BE has no ceiling (edt, not paced yet)
    ls_bps: float | None            # sent since the last round; None on a device's first round
    be_bps: float | None
    other_bps: float | None


class NetSensor(OptionalSensor):
    name = NET

    def __init__(self, ipr=None, classifier=None, clock: Callable[[], float] = time.monotonic):
        self.ipr = ipr
        self.classifier = classifier    # a SharedClassifier; the process's own by default
        self.clock = clock              # when counters are read
        self.last: dict[str, tuple[float, dict[int, int]]] = {}    # device -> (read at, bytes per class)

    def start(self) -> None:
        if self.ipr is None:
            try:
                from pyroute2 import IPRoute
            except ImportError:
                raise SensorUnavailable("pyroute2 is not installed") from None
            self.ipr = IPRoute()
        if self.classifier is None:
            self.classifier = process_classifier()

    def sample(self, context: SensorContext | None = None) -> dict[str, NetSample]:
        out, seen = {}, {}
        # One dump of every qdisc, then only the devices koordd shapes: a node with hundreds of pod
        # veths pays one netlink round trip, not one per device.
        roots = [m for m in self.ipr.get_qdiscs() if m["parent"] == TC_ROOT_PARENT and m["handle"]]
        shaped = {m["index"]: m for m in roots if (m["handle"], m.get_attr("TCA_KIND")) == (ROOT, "htb")
                  or (m["handle"] == EDT_ROOT and m.get_attr("TCA_KIND") in EDT_ROOT_KINDS)}
        for m in roots:
            # Someone else's root qdisc (the kernel's defaults have handle 0:): net_shaping's take_over needs it.
            if m["index"] not in shaped and (links := device_links(self.ipr, m["index"])):
                out[links[0].get_attr("IFLA_IFNAME")] = _foreign(m)
        classifier = self.classifier.opened_classifier() if self.classifier is not None else None
        counted: dict[tuple[int, int], int] | None = None      # the classifier's counters, read once a round
        counted_at = 0.0
        for index, root in shaped.items():
            links = device_links(self.ipr, index)
            if not links:
                continue            # gone meanwhile
            device = links[0].get_attr("IFLA_IFNAME")
            if root["handle"] == ROOT:
                found = self._htb(index)        # an HTB 1: without koordd's classes is someone else's too
                read_at = self.clock()
            elif classifier is not None:
                if counted is None:
                    counted, counted_at = classifier.sent(), self.clock()
                found, read_at = self._edt(index, root, classifier, counted), counted_at
            else:
                continue            # edt without this process's classifier: nothing to count
            if found is None:           # HTB 1: without koordd's classes
                out[device] = _foreign(root)
                continue
            mode, link, ceil, sent = found
            seen[device] = (read_at, sent)
            prev = self.last.get(device)
            dt = read_at - prev[0] if prev else 0.0

            def bps(handle: int) -> float | None:
                if prev is None or dt <= 0 or handle not in sent or handle not in prev[1]:
                    return None
                return max(sent[handle] - prev[1][handle], 0) * 8 / dt
            out[device] = NetSample(mode, link, ceil, bps(LS_CLASS), bps(BE_CLASS), bps(OTHER_CLASS))
        self.last = seen
        return out

    def _htb(self, index: int):
        rates, sent = {}, {}
        for m in self.ipr.get_classes(index):
            if (r := htb_rates(m)) is not None:
                rates[m["handle"]] = r
            sent[m["handle"]] = _bytes(m)
        if not {LINK, BE_CLASS} <= rates.keys():
            return None
        return "htb", rates[LINK][0], rates[BE_CLASS][1], sent

    @staticmethod
    def _edt(index: int, root, classifier, counted: dict[tuple[int, int], int]):
        sent = {LS_CLASS: counted.get((index, LS_CLASS), 0), BE_CLASS: counted.get((index, BE_CLASS), 0)}
        # The rest of what fq sent is other traffic (fq counts at dequeue, the classifier at
        # enqueue: the difference of a round's packets in flight is noise).
        sent[OTHER_CLASS] = max(_bytes(root) - sent[LS_CLASS] - sent[BE_CLASS], 0)
        return "edt", None, classifier.paces(index).get(BE_CLASS), sent

    def stop(self) -> None:
        if self.ipr is not None:
            self.ipr.close()
            self.ipr = None


def _bytes(msg) -> int:
    stats = msg.get_attr("TCA_STATS2")
    basic = stats.get_attr("TCA_STATS_BASIC") if stats is not None else None
    return basic["bytes"] if basic is not None else 0


def _foreign(root) -> NetSample:
    return NetSample(f"foreign {root.get_attr('TCA_KIND')} {root['handle'] >> 16:x}:", None, None, None, None, None)
