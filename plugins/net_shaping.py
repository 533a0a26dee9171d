"""net_shaping: egress bandwidth for LS first, what is left to BE, by cgroup (Heracles' network rule).

For each device in `devices` ("eth0:10gbit": the name and its link rate), koordd attaches its
egress classifier (a BPF program on clsact egress: a packet's socket cgroup, or its class-root
ancestor, picks the class), puts the class roots of LS, LSR and LSE in the LS class and those of BE
in the BE class, and enforces BE's ceiling as `enforce` says: "htb", its HTB tree as the device's
root qdisc (LS class 1:10, BE 1:20, everything else 1:30, the root at the link rate); "edt", an fq
root qdisc and BE's packets stamped with departure times at BE's ceiling. A root qdisc someone else
made is refused and left alone, unless `take_over` says to delete it (on stop the device then gets
the kernel's default root qdisc: koordd cannot rebuild another's).

Every round BE's ceiling follows what LS sends: BE = link − LS − max(5% of the link, 10% of LS),
at least `be_min_percent` of the link. It drops at once when LS needs more, and rises by at most
`max_step_percent` of the link per round, so a lull in LS traffic does not hand BE the link all at
once. With `follow_health` (default) LS's health gates it as Heracles' top controller gates every
BE resource: no rise while LS slack (the LS classes' `[classes.health]` targets, as be_suppress reads
them) is under 10%, the floor while LS misses a target. LS may use the whole link at any time (under htb BE borrows only what LS leaves, priority 7).

Limits: a socket keeps the cgroup it was created in; traffic forwarded from another network
namespace (pods behind a veth) has no local socket on the host device: shape it on the pod's veth.
Needs libbpf, pyroute2 and a cgroup v2 tree (the unified one on hybrid hosts) or else a mounted v1
net_cls hierarchy (koordd then moves the class roots' threads into net_cls cgroups with its classids;
see docs/net-shaping.md). On stop, the tree, the classifier and the map entries go, and the
device gets the kernel's default root qdisc back (a clsact qdisc koordd did not add stays).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from koordd.core.health import LATENCY_SENSITIVE, RunqWindow, ls_signals, worst_slack
from koordd.core.slo import SloWindow
from koordd.core.loop import Action, Loop, NODE, restore
from koordd.core.options import Option
from koordd.core.snapshot import NET, RUNQ_LATENCY, Snapshot
from koordd.core.units import parse_rate

HEADROOM_LINK, HEADROOM_LS = 0.05, 0.10        # Heracles: max(5% of the link, 10% of LC traffic)
GROW_AT = 0.10                                 # Heracles: BE grows only at 10% LS slack or more
# The fastest link rate taken: far above any NIC, and bounded so that a rate of hundreds of digits (finite
# as a float) never reaches the tick's arithmetic or tc's 64-bit rate fields.
MAX_LINK_RATE = 10 ** 13                       # bit/s: 10tbit


class DeviceRates(Option):
    """An array of "device:rate" (rate in tc's units), kept as a tuple of "device:bit/s"."""

    def convert(self, value):
        if not isinstance(value, (list, tuple)) or not all(isinstance(d, str) for d in value):
            raise ValueError("expected an array of \"device:rate\" strings, e.g. [\"eth0:10gbit\"]")
        out = []
        for d in value:
            name, sep, rate = d.partition(":")
            if not sep or not name or "/" in name or len(name) > 15:
                raise ValueError(f"expected \"device:rate\", e.g. \"eth0:10gbit\", got {d!r}")
            try:
                bits = parse_rate(rate)
            except ValueError as e:
                raise ValueError(f"{d!r}: {e}") from None
            if bits > MAX_LINK_RATE:
                raise ValueError(f"{d[:40]!r}{'...' if len(d) > 40 else ''}: a link rate is at most 10tbit")
            out.append(f"{name}:{bits}")
        return tuple(out)


@dataclass
class State:
    ceil: dict[str, int] = field(default_factory=dict)    # device -> BE ceil asked last round
    runq: RunqWindow = field(default_factory=RunqWindow)
    slo: SloWindow = field(default_factory=SloWindow)      # LS slack: recent rounds' responses per SLO


class NetShaping(Loop):
    __doc__ = __doc__
    name = "net_shaping"
    options = (
        DeviceRates("devices", tuple, (), "devices to shape, each \"name:link rate\" (e.g. \"eth0:10gbit\")"),
        Option("enforce", str, "htb", "how BE's ceiling is enforced: htb (koordd's HTB tree at the link rate) or "
               "edt (BE's packets paced by the classifier, an fq root qdisc holds them; see docs/net-shaping.md)",
               choices=("htb", "edt")),
        Option("take_over", bool, False, "replace a root qdisc someone else made on a device in devices (on stop "
               "the device gets the kernel's default root qdisc, not the one replaced); false: leave it, shape nothing there"),
        Option("follow_health", bool, True, "LS health (the LS classes' [classes.health] targets) gates BE's "
               "ceiling as in Heracles: no rise under 10% slack, the floor while LS misses a target"),
        Option("be_min_percent", float, 1.0, "BE's ceiling never goes below this, percent of the link",
               min=0.01, max=100),
        Option("max_step_percent", float, 10.0, "how much BE's ceiling may rise per round, percent of the link",
               min=0.1, max=100),
    )

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        return frozenset({(NODE, knob) for knob in ("tc.shaping", "tc.be_ceil", "tc.classifier", "tc.replace_root")}
                         | {(cls, "net_class") for cls in (*LATENCY_SENSITIVE, "BE")})

    @staticmethod
    def needs(settings) -> frozenset[str]:
        return frozenset({NET, RUNQ_LATENCY, "cpu_pressure"} if settings.follow_health else {NET})

    @staticmethod
    def initial_state(settings) -> State:
        return State()

    @staticmethod
    def decide(snapshot: Snapshot, settings, state: State) -> list[Action]:
        net = snapshot.section(NET) or {}
        actions: list[Action] = []
        health = worst_slack(ls_signals(snapshot, snapshot.section(RUNQ_LATENCY), state.runq, state.slo)) \
            if settings.follow_health and settings.devices else None
        for entry in settings.devices:
            device, _, rate = entry.partition(":")
            link = int(rate)
            sample = net.get(device)
            if settings.take_over and sample is not None and sample.mode.startswith("foreign "):
                actions.append(Action(device, "tc.replace_root", sample.mode[8:], {"take_over": True},
                                      f"{device}: someone else's root qdisc ({sample.mode[8:]}) replaced by koordd's "
                                      "(take_over)"))
            if settings.enforce == "edt":
                actions.append(Action(device, "tc.shaping", "edt", {"link_bps": link},
                                      f"{device}: fq root, BE paced by departure time"))
            else:
                actions.append(Action(device, "tc.shaping", f"htb {link}", {"link_bps": link},
                                      f"{device}: koordd's HTB tree at {link / 1e6:g} Mbit/s"))
            actions.append(Action(device, "tc.classifier", "attached", {}, f"{device}: packets classed by cgroup"))
            ceil, reason = _be_ceil(device, link, sample, health, settings, state)
            if ceil is not None:
                actions.append(Action(device, "tc.be_ceil", str(ceil), reason,
                                      f"{device}: BE up to {ceil / 1e6:.1f} Mbit/s"
                                      + (f" (LS sends {reason['ls_bps'] / 1e6:.1f})" if "ls_bps" in reason else "")))
        # A device taken out of `devices`: what koordd put on it goes (BE's ceil, classifier, then the tree).
        names = {d.partition(":")[0] for d in settings.devices}
        order = {"tc.be_ceil": 0, "tc.classifier": 1, "tc.shaping": 2}
        for target, knob in sorted(snapshot.held, key=lambda k: (k[0], order.get(k[1], 9))):
            if knob in order and target not in names:
                actions.append(restore(target, knob, f"{target} is no longer in devices", step="release"))
        if settings.devices:
            for c in snapshot.of_class(*LATENCY_SENSITIVE):
                actions.append(Action(c.path, "net_class", "ls", {"class": c.cls}, f"{c.path}: LS egress"))
            for c in snapshot.of_class("BE"):
                actions.append(Action(c.path, "net_class", "be", {"class": "BE"}, f"{c.path}: BE egress"))
        return actions


def _be_ceil(device: str, link: int, sample, health: tuple[float, dict] | None, settings,
             state: State) -> tuple[int | None, dict]:
    """BE's ceiling on `device` this round (None until the tree is there), and the numbers behind it.
    `health`: LS's worst slack and what set it, None without a signal (or with follow_health off)."""
    if sample is None or sample.mode != settings.enforce or (sample.mode == "htb" and sample.link_bps != link):
        return None, {}                 # the qdisc is being made or re-rated: next round
    floor = max(int(link * settings.be_min_percent / 100), 8)
    last = state.ceil.get(device, sample.be_ceil_bps or link)
    if sample.ls_bps is None:
        target, step = last, "hold (first round: no LS rate yet)"
    else:
        target = int(link - sample.ls_bps - max(HEADROOM_LINK * link, HEADROOM_LS * sample.ls_bps))
        step = "heracles"
    if health is not None and health[0] < 0:
        target, step = floor, "floor: LS misses a health target"
    elif health is not None and health[0] < GROW_AT and target > last:
        target, step = last, step + ", held: LS slack under 10%"
    target = max(floor, min(link, target))
    if target > last:
        target = min(target, last + int(link * settings.max_step_percent / 100))
        step += ", rising by at most max_step_percent"
    state.ceil[device] = target
    reason = {"link_bps": link, "be_ceil_bps": target, "previous_bps": last, "step": step, "floor_bps": floor}
    if health is not None:
        reason.update(slack=round(health[0], 3), worst=health[1])
    if sample.ls_bps is not None:
        reason.update(ls_bps=round(sample.ls_bps), be_bps=round(sample.be_bps or 0))
    return target, reason
