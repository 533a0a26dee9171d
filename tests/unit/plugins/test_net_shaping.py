"""net_shaping: what it asks for on each device, BE's ceiling by Heracles' rule (falling at once,
rising in steps), devices leaving the config, options; and the net sensor on a fake netlink."""
from __future__ import annotations


import pytest

from koordtest.fakes.netlink import Msg
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.snapshot import CgroupSample, NET, NodeSample, RUNQ_LATENCY, RunqLatency, Snapshot
from koordd.kernel.netlink import BE_CLASS, LINK, LS_CLASS, OTHER_CLASS, ROOT
from koordd_plugins.net_shaping import NetShaping
from koordd.sensors.contract import SensorContext
from koordd.sensors.net import NetSample, NetSensor

G = 10**9


def settings(**kw):
    return make_settings(loop_options(NetShaping), {"enabled": True, "devices": ["eth0:1gbit"], **kw})


def snap(ls_bps=None, be_ceil=G, link=G, held=(), net=True, mode="htb", web_p99=None):
    section = {"eth0": NetSample(mode, link if mode == "htb" else None, be_ceil, ls_bps,
                                 0.0 if ls_bps is not None else None, None)} if net else {}
    runq = {"web": RunqLatency("ebpf", 1000, web_p99 / 2, web_p99 / 2, web_p99, web_p99)} if web_p99 else {}
    return Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.5),
                    cgroups={"web": CgroupSample(path="web", cls="LS"), "db": CgroupSample(path="db", cls="LSR"),
                             "batch": CgroupSample(path="batch", cls="BE")},
                    sections={NET: section, RUNQ_LATENCY: runq}, held={k: "none" for k in held})


def ceil_of(actions):
    return next((int(a.value) for a in actions if a.knob == "tc.be_ceil"), None)


def test_each_device_gets_the_tree_the_classifier_and_the_classes_their_cgroups():
    s = settings()
    got = [(a.target, a.knob, a.value) for a in NetShaping.decide(snap(net=False), s, NetShaping.initial_state(s))]
    assert got == [("eth0", "tc.shaping", "htb 1000000000"), ("eth0", "tc.classifier", "attached"),
                   ("web", "net_class", "ls"), ("db", "net_class", "ls"), ("batch", "net_class", "be")]
    # No devices: nothing at all, not even classes.
    s = settings(devices=[])
    assert NetShaping.decide(snap(), s, NetShaping.initial_state(s)) == []


def test_be_ceiling_is_link_minus_ls_minus_headroom_falling_at_once_rising_in_steps():
    s = settings(max_step_percent=10)
    state = NetShaping.initial_state(s)
    assert ceil_of(NetShaping.decide(snap(None), s, state)) == G              # first round: holds
    # LS sends 600 Mbit/s: 1000 - 600 - max(50, 60) = 340, at once.
    assert ceil_of(NetShaping.decide(snap(600e6), s, state)) == 340_000_000
    # LS drops to 100: the target is 1000 - 100 - 50 = 850, reached 100 Mbit/s a round.
    assert [ceil_of(NetShaping.decide(snap(100e6), s, state)) for _ in range(6)] == \
        [440_000_000, 540_000_000, 640_000_000, 740_000_000, 840_000_000, 850_000_000]
    # LS takes the whole link: BE keeps its floor (1%).
    [a] = [a for a in NetShaping.decide(snap(990e6), s, state) if a.knob == "tc.be_ceil"]
    assert int(a.value) == 10_000_000 and a.reason["ls_bps"] == 990_000_000 and "LS sends 990.0" in a.message


def test_ls_health_gates_the_ceiling_as_heracles_top_controller_does():
    s = settings()
    assert NetShaping.needs(s) == {NET, RUNQ_LATENCY, "cpu_pressure"}
    state = NetShaping.initial_state(s)
    NetShaping.decide(snap(600e6), s, state)                                  # 340 Mbit/s
    # LS waits 1.9 ms of its 2 ms p99 target (5% slack): the rule would give BE 850, it holds.
    [a] = [a for a in NetShaping.decide(snap(100e6, web_p99=1900), s, state) if a.knob == "tc.be_ceil"]
    assert int(a.value) == 340_000_000 and a.reason["slack"] == 0.05 and "held" in a.reason["step"]
    # LS needs more: the ceiling still falls at once.
    assert ceil_of(NetShaping.decide(snap(700e6, web_p99=1900), s, state)) == 230_000_000
    # LS misses its target: BE to its floor; healthy again (20% slack): rising in steps.
    assert ceil_of(NetShaping.decide(snap(100e6, web_p99=2500), s, state)) == 10_000_000
    assert ceil_of(NetShaping.decide(snap(100e6, web_p99=1600), s, state)) == 110_000_000
    # Without follow_health the network rule alone decides (and no health sensor is needed).
    s = settings(follow_health=False)
    assert NetShaping.needs(s) == {NET}
    state = NetShaping.initial_state(s)
    NetShaping.decide(snap(600e6), s, state)
    assert ceil_of(NetShaping.decide(snap(100e6, web_p99=2500), s, state)) == 440_000_000


def test_a_tree_being_made_or_re_rated_waits_a_round_for_the_ceiling():
    s = settings()
    assert ceil_of(NetShaping.decide(snap(100e6, link=2 * G), s, NetShaping.initial_state(s))) is None
    # Switching enforcement: no ceiling until the device has the new root qdisc.
    assert ceil_of(NetShaping.decide(snap(100e6, mode="edt"), s, NetShaping.initial_state(s))) is None


def test_edt_asks_for_the_fq_root_and_paces_be_by_the_same_rule():
    s = settings(enforce="edt")
    state = NetShaping.initial_state(s)
    got = [(a.knob, a.value) for a in NetShaping.decide(snap(net=False), s, state)][:2]
    assert got == [("tc.shaping", "edt"), ("tc.classifier", "attached")]
    assert ceil_of(NetShaping.decide(snap(None, be_ceil=None, mode="edt"), s, state)) == G    # unpaced: the link
    assert ceil_of(NetShaping.decide(snap(600e6, be_ceil=G, mode="edt"), s, state)) == 340_000_000
    assert ceil_of(NetShaping.decide(snap(600e6, mode="htb"), s, state)) is None


def test_a_device_leaving_the_config_loses_what_koordd_put_on_it_in_order():
    s = settings(devices=["eth1:1gbit"])
    held = [("eth0", "tc.shaping"), ("eth0", "tc.classifier"), ("eth0", "tc.be_ceil"), ("web", "net_class")]
    released = [(a.target, a.knob) for a in NetShaping.decide(snap(net=False, held=held), s,
                                                              NetShaping.initial_state(s)) if a.value is None]
    assert released == [("eth0", "tc.be_ceil"), ("eth0", "tc.classifier"), ("eth0", "tc.shaping")]


def test_devices_are_checked_when_the_config_loads():
    registry = {"net_shaping": NetShaping}
    with pytest.raises(ConfigError) as e:
        parse_config('[loops.net_shaping]\ndevices = ["eth0", "eth1:fast", 3]\n', "koordd.toml", registry)
    assert e.value.errors == ['koordd.toml:2: loops.net_shaping.devices: expected an array of "device:rate" '
                              'strings, e.g. ["eth0:10gbit"]']
    with pytest.raises(ConfigError) as e:
        parse_config('[loops.net_shaping]\ndevices = ["eth0"]\n', "koordd.toml", registry)
    assert 'expected "device:rate"' in e.value.errors[0]
    with pytest.raises(ConfigError) as e:
        parse_config('[loops.net_shaping]\ndevices = ["eth1:fast"]\n', "koordd.toml", registry)
    assert "'eth1:fast': not a rate" in e.value.errors[0]
    c = parse_config('[loops.net_shaping]\ndevices = ["eth0:10gbit", "veth1:250mbit"]\n', "koordd.toml", registry)
    assert c.loops["net_shaping"].devices == ("eth0:10000000000", "veth1:250000000")


# --- the sensor ---------------------------------------------------------------------------------------

def htb_class(handle, rate, ceil, sent):
    opts = Msg({"TCA_HTB_PARMS": {"rate": rate // 8, "ceil": ceil // 8}})
    stats = Msg({"TCA_STATS_BASIC": {"bytes": sent}})
    return Msg({"TCA_OPTIONS": opts, "TCA_STATS2": stats}, handle=handle)


class FakeNetlink:
    def __init__(self):
        self.sent = {LINK: 0, LS_CLASS: 0, BE_CLASS: 0, OTHER_CLASS: 0}
        self.root = {"eth0": (ROOT, "htb"), "lo": (0, "noqueue")}

    def get_links(self, index):
        return [Msg({"IFLA_IFNAME": name}, index=i) for i, name in enumerate(self.root) if i == index]

    def get_qdiscs(self):
        return [Msg({"TCA_KIND": kind}, index=i, handle=handle, parent=0xFFFFFFFF)
                for i, (handle, kind) in enumerate(self.root.values())]

    def get_classes(self, index):
        if index != 0:
            return []
        return [htb_class(h, G if h != BE_CLASS else 10**7, G if h != BE_CLASS else 3 * 10**8, n)
                for h, n in self.sent.items()]

    def close(self):
        pass


class Clock:
    """When the sensor reads its counters: set by the test."""
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_sensor_reports_rates_per_class_on_the_devices_koordd_shapes():
    nl, clock = FakeNetlink(), Clock(10.0)
    sensor = NetSensor(nl, clock=clock)
    sensor.start()
    first = sensor.sample(SensorContext(10.0, {}))
    assert first == {"eth0": NetSample("htb", G, 3 * 10**8, None, None, None)}   # lo is not shaped
    nl.sent.update({LS_CLASS: 25_000_000, BE_CLASS: 5_000_000, OTHER_CLASS: 1000})
    clock.now = 12.0
    second = sensor.sample(SensorContext(12.0, {}))["eth0"]
    assert (second.ls_bps, second.be_bps, second.other_bps) == (100e6, 20e6, 4000.0)
    nl.root["eth0"] = (0x50000, "htb")                                         # someone else's tree
    assert sensor.sample(SensorContext(13.0, {})) == {"eth0": NetSample("foreign htb 5:", None, None, None, None, None)}


class FakeClassifier:
    def __init__(self):
        self.counts, self.pace = {}, {}

    def sent(self):
        return dict(self.counts)

    def paces(self, index):
        return {c: r for (i, c), r in self.pace.items() if i == index}


class Opened:
    def __init__(self, classifier):
        self.classifier = classifier

    def opened_classifier(self):
        return self.classifier


def test_under_edt_rates_come_from_the_classifier_and_the_rest_of_fq_is_other_traffic():
    nl, classifier = FakeNetlink(), FakeClassifier()
    fq_bytes = [0]
    nl.root["eth0"] = (0xC0DD0000, "fq")
    nl.get_qdiscs = lambda: [Msg({"TCA_KIND": kind, "TCA_STATS2": Msg({"TCA_STATS_BASIC": {"bytes": fq_bytes[0]}})},
                                 index=i, handle=handle, parent=0xFFFFFFFF)
                             for i, (handle, kind) in enumerate(nl.root.values())]
    # The classifier not opened by this process (the loop is off): edt devices are not counted.
    sensor = NetSensor(nl, Opened(None))
    sensor.start()
    assert sensor.sample(SensorContext(10.0, {})) == {}
    clock = Clock(10.0)
    sensor = NetSensor(nl, Opened(classifier), clock=clock)
    assert sensor.sample(SensorContext(10.0, {})) == {"eth0": NetSample("edt", None, None, None, None, None)}
    classifier.counts = {(0, LS_CLASS): 2_500_000, (0, BE_CLASS): 500_000, (7, BE_CLASS): 99}   # 7: another device
    classifier.pace = {(0, BE_CLASS): 3 * 10**8}
    fq_bytes[0] = 3_000_100
    clock.now = 11.0
    second = sensor.sample(SensorContext(11.0, {}))["eth0"]
    assert second == NetSample("edt", None, 3 * 10**8, 20e6, 4e6, 800.0)


@pytest.mark.parametrize("mode", ["htb", "edt"])
def test_rates_divide_by_the_time_between_reads_not_between_round_starts(mode):
    # Rounds start 1 s apart, but the first round's read came 0.5 s late (a busy CPU): 1 MB sent
    # between the reads is 16 Mbit/s over their 0.5 s, not 8 over the rounds' 1 s.
    nl, classifier, clock = FakeNetlink(), FakeClassifier(), Clock(10.5)
    if mode == "edt":
        nl.root["eth0"] = (0xC0DD0000, "fq")
    sensor = NetSensor(nl, Opened(classifier), clock=clock)
    sensor.start()
    sensor.sample(SensorContext(10.0, {}))
    if mode == "edt":
        classifier.counts = {(0, LS_CLASS): 1_000_000}
    else:
        nl.sent[LS_CLASS] = nl.sent.get(LS_CLASS, 0) + 1_000_000
    clock.now = 11.0
    assert sensor.sample(SensorContext(11.0, {}))["eth0"].ls_bps == 16e6


def test_take_over_replaces_someone_elses_root_before_shaping_and_only_when_asked():
    s = settings()
    foreign = snap(mode="foreign htb 5:")
    assert [a.knob for a in NetShaping.decide(foreign, s, NetShaping.initial_state(s))][:2] == \
        ["tc.shaping", "tc.classifier"]                          # asked, and refused by the backend
    s = settings(take_over=True)
    got = [(a.knob, a.value) for a in NetShaping.decide(foreign, s, NetShaping.initial_state(s))][:2]
    assert got == [("tc.replace_root", "htb 5:"), ("tc.shaping", "htb 1000000000")]
    assert "tc.replace_root" not in [a.knob for a in NetShaping.decide(snap(), s, NetShaping.initial_state(s))]


def test_the_sensor_reports_someone_elses_root_qdisc():
    nl = FakeNetlink()
    nl.root["lo"] = (0x80010000, "fq_codel")
    sensor = NetSensor(nl, Opened(None))
    sensor.start()
    assert sensor.sample(SensorContext(1.0, {}))["lo"] == NetSample("foreign fq_codel 8001:", None, None, None, None, None)
    nl.root["eth0"] = (ROOT, "htb")
    nl.get_classes = lambda index: []                             # HTB 1: without koordd's classes
    assert sensor.sample(SensorContext(2.0, {}))["eth0"].mode == "foreign htb 1:"
