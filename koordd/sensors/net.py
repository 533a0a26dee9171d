"""Egress rates per class on each device koordd shapes: the "net" section.

A device is shaped when its root qdisc is koordd's HTB tree (koordd/tc_backend.py); for each, the
bytes its LS, BE and other classes sent since the last round, as bit/s, and BE's ceil as it is.
The tree itself says which devices these are, so the sensor needs no configuration.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..snapshot import NET
from ..tc_backend import BE_CLASS, LINK, LS_CLASS, OTHER_CLASS, ROOT, TC_ROOT_PARENT, htb_rates
from .contract import OptionalSensor, SensorContext, SensorUnavailable


@dataclass(frozen=True)
class NetSample:
    link_bps: int                   # the tree's link rate
    be_ceil_bps: int
    ls_bps: float | None            # sent since the last round; None on a device's first round
    be_bps: float | None
    other_bps: float | None


class NetSensor(OptionalSensor):
    name = NET

    def __init__(self, ipr=None):
        self.ipr = ipr
        self.last: dict[str, tuple[float, dict[int, int]]] = {}    # device -> (time, bytes per class)

    def start(self) -> None:
        if self.ipr is None:
            try:
                from pyroute2 import IPRoute
            except ImportError:
                raise SensorUnavailable("pyroute2 is not installed") from None
            self.ipr = IPRoute()

    def sample(self, context: SensorContext | None = None) -> dict[str, NetSample]:
        now = context.now if context is not None else 0.0
        out, seen = {}, {}
        # One dump of every qdisc, then only the devices with koordd's tree: a node with hundreds of
        # pod veths pays one netlink round trip, not one per device.
        shaped = [m["index"] for m in self.ipr.get_qdiscs()
                  if m["parent"] == TC_ROOT_PARENT and m["handle"] == ROOT and m.get_attr("TCA_KIND") == "htb"]
        for index in shaped:
            links = self.ipr.get_links(index)
            if not links:
                continue            # gone meanwhile
            device = links[0].get_attr("IFLA_IFNAME")
            rates, sent = {}, {}
            for m in self.ipr.get_classes(index):
                if (r := htb_rates(m)) is not None:
                    rates[m["handle"]] = r
                stats = m.get_attr("TCA_STATS2")
                if stats is not None:
                    sent[m["handle"]] = stats.get_attr("TCA_STATS_BASIC")["bytes"]
            if not {LINK, BE_CLASS} <= rates.keys():
                continue
            seen[device] = (now, sent)
            prev = self.last.get(device)
            dt = now - prev[0] if prev else 0.0

            def bps(handle: int) -> float | None:
                if prev is None or dt <= 0 or handle not in sent or handle not in prev[1]:
                    return None
                return max(sent[handle] - prev[1][handle], 0) * 8 / dt
            out[device] = NetSample(rates[LINK][0], rates[BE_CLASS][1], bps(LS_CLASS), bps(BE_CLASS), bps(OTHER_CLASS))
        self.last = seen
        return out

    def stop(self) -> None:
        if self.ipr is not None:
            self.ipr.close()
            self.ipr = None
