"""qos_baseline: decision tables on hand-built snapshots, config checking of its memory values, and
rounds through the real actuator on fake trees (what is remembered, corrected and restored)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from koordtest.fakes.cgroup import FakeCgroups, rules
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog, read_decisions
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import KNOBS
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.decisions import APPLIED, RESTORED
from koordd.core.loop import Action
from koordd.core.snapshot import CgroupSample, NodeSample, Snapshot
from koordd_plugins.be_suppress import BeSuppress
from koordd_plugins.qos_baseline import QosBaseline, memory_target, parse_memory_value
from koordd.sensors.collect import Sensors

GiB = 1 << 30
V2 = frozenset(KNOBS)                                          # every knob
HYBRID = V2 - {"memory.high", "memory.low", "memory.min", "memory.reclaim", "cgroup.kill"}
OLD_KERNEL = HYBRID - {"cpu.idle"}                             # v1 before 5.15: no cpu.idle


def settings(**kw):
    return make_settings(loop_options(QosBaseline), {"enabled": True, **kw})


def cg(path, cls, memory_max="max"):
    return CgroupSample(path=path, cls=cls, memory_max=memory_max)


def snap(*cgroups, supported=V2, held=(), memory_total=16 * GiB):
    return Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=1.0, memory_total=memory_total),
                    cgroups={c.path: c for c in cgroups}, supported=supported,
                    held={key: "0" for key in held})


def decide(snapshot, **kw):
    s = settings(**kw)
    return QosBaseline.decide(snapshot, s, QosBaseline.initial_state(s))


def triples(actions):
    return [(a.target, a.knob, a.value) for a in actions]


NODE = (cg("be", "BE"), cg("ls", "LS", memory_max=str(4 * GiB)), cg("lsr", "LSR"), cg("lse", "LSE"),
        cg("sys", "SYSTEM"))
ALL_ON = dict(ls_cpu_weight=200, lsr_cpu_weight=400, ls_memory_low="50%", ls_memory_min="256M",
              be_memory_high="2G")


@pytest.mark.parametrize("supported, kw, expect", [
    # Defaults: BE idle (weight 1 first, to save the weight idle overwrites); nothing else.
    (V2, {}, [("be", "cpu.weight", "1"), ("be", "cpu.idle", "1")]),
    # Everything on, cgroup v2: per class; LSE and SYSTEM are never touched.
    (V2, ALL_ON, [("be", "cpu.weight", "1"), ("be", "cpu.idle", "1"),
                  ("ls", "cpu.weight", "200"), ("lsr", "cpu.weight", "400"),
                  ("ls", "memory.low", str(2 * GiB)),                 # 50% of its memory.max
                  ("ls", "memory.min", str(256 << 20)), ("be", "memory.high", str(2 * GiB))]),
    # Hybrid / v1: no memory.low/min/high there, so the memory settings ask for nothing.
    (HYBRID, ALL_ON, [("be", "cpu.weight", "1"), ("be", "cpu.idle", "1"),
                      ("ls", "cpu.weight", "200"), ("lsr", "cpu.weight", "400")]),
    # No cpu.idle on this kernel: BE falls back to the minimum weight.
    (OLD_KERNEL, {}, [("be", "cpu.weight", "1")]),
    (OLD_KERNEL, {"be_cpu_weight": 5}, [("be", "cpu.weight", "5")]),
    # Idle off: the configured BE weight; idle off and weight 0: BE's CPU knobs are left alone.
    (V2, {"be_cpu_idle": False, "be_cpu_weight": 3}, [("be", "cpu.weight", "3")]),
    (V2, {"be_cpu_idle": False, "be_cpu_weight": 0}, []),
    (OLD_KERNEL, {"be_cpu_weight": 0}, []),
    # No cpu controller at all (e.g. v2 without cpu enabled): nothing to ask for.
    (frozenset({"memory.low"}), {"ls_memory_low": "1G"}, [("ls", "memory.low", str(GiB))]),
])
def test_per_class_table(supported, kw, expect):
    actions = decide(snap(*NODE, supported=supported), **kw)
    assert triples(actions) == expect
    for a in actions:
        assert a.message and a.reason["class"] in ("BE", "LS", "LSR"), a


def test_the_fallback_says_why():
    [a] = decide(snap(cg("be", "BE"), supported=OLD_KERNEL))
    assert "no cpu.idle" in a.message and a.reason["cpu_idle_available"] is False
    [a] = decide(snap(cg("be", "BE"), supported=V2), be_cpu_idle=False)
    assert "cpu.idle" not in a.message


def test_every_cgroup_of_a_class_gets_the_value():
    s = snap(cg("be1", "BE"), cg("be2", "BE"), cg("ls1", "LS"), cg("ls2", "LS"))
    assert sorted(triples(decide(s, be_cpu_idle=False, ls_cpu_weight=300))) == [
        ("be1", "cpu.weight", "1"), ("be2", "cpu.weight", "1"), ("ls1", "cpu.weight", "300"),
        ("ls2", "cpu.weight", "300")]


def test_reconciled_every_tick_a_rewrite_is_asked_back():
    # The loop holds no memory of what it wrote: the same snapshot (whatever another agent wrote
    # meanwhile) gives the same request, and the actuator writes the ones that differ.
    s = snap(*NODE)
    assert triples(decide(s, **ALL_ON)) == triples(decide(s, **ALL_ON))
    # Once koordd holds BE's cpu.idle, only idle is asked for: the kernel keeps an idle group's
    # weight at 1 (writing it would fail), and writing idle again also resets the weight.
    held = snap(*NODE, held=[("be", "cpu.idle"), ("be", "cpu.weight")])
    assert triples(decide(held)) == [("be", "cpu.idle", "1")]


def test_idle_turned_off_restores_it_before_the_weight():
    s = snap(cg("be", "BE"), held=[("be", "cpu.idle"), ("be", "cpu.weight")])
    actions = decide(s, be_cpu_idle=False, be_cpu_weight=2)
    assert [(a.knob, a.value) for a in actions] == [("cpu.idle", None), ("cpu.weight", "2")]
    # Not held (never written): no restore action.
    assert triples(decide(snap(cg("be", "BE")), be_cpu_idle=False)) == [("be", "cpu.weight", "1")]


WITH_THREADS = V2 | {"sched_policy"}
KUBELET = (cg("kubepods.slice/kubepods-besteffort.slice", "BE"), cg("kubepods/besteffort", "BE"), cg("be.slice", "BE"))


@pytest.mark.parametrize("supported, kw, expect", [
    # The kubelet's BE groups: SCHED_IDLE threads, their weight left to the kubelet; elsewhere cpu.idle.
    (WITH_THREADS, {}, [("kubepods.slice/kubepods-besteffort.slice", "sched_policy", "idle"),
                        ("kubepods/besteffort", "sched_policy", "idle"),
                        ("be.slice", "cpu.weight", "1"), ("be.slice", "cpu.idle", "1")]),
    # No cpu.idle (Linux < 5.15): threads idle everywhere, the minimum weight where the kubelet is not.
    (OLD_KERNEL | {"sched_policy"}, {}, [("kubepods.slice/kubepods-besteffort.slice", "sched_policy", "idle"),
                                         ("kubepods/besteffort", "sched_policy", "idle"),
                                         ("be.slice", "sched_policy", "idle"), ("be.slice", "cpu.weight", "1")]),
    # An empty list: cpu.idle on every BE group, the kubelet's too (for hosts where no kubelet runs).
    (WITH_THREADS, {"be_thread_idle_cgroups": []}, [
        (c.path, knob, "1") for c in KUBELET for knob in ("cpu.weight", "cpu.idle")]),
    # Idle off: the kubelet's groups get nothing (their weight is the kubelet's), the rest the weight.
    (WITH_THREADS, {"be_cpu_idle": False}, [("be.slice", "cpu.weight", "1")]),
])
def test_kubelet_groups_get_idle_threads(supported, kw, expect):
    assert triples(decide(snap(*KUBELET, supported=supported), **kw)) == expect


def test_a_group_moving_to_idle_threads_gives_back_idle_then_the_weight():
    path = "kubepods/besteffort"
    s = snap(cg(path, "BE"), supported=WITH_THREADS, held=[(path, "cpu.idle"), (path, "cpu.weight")])
    actions = decide(s)
    assert [(a.knob, a.value) for a in actions] == [("cpu.idle", None), ("sched_policy", "idle"),
                                                    ("cpu.weight", None)]
    assert "SCHED_IDLE" in actions[1].message and actions[1].reason["why"] == "the kubelet owns this group's cpu.weight"
    # And back: idle threads are given back once the group is idle itself.
    s = snap(cg(path, "BE"), supported=WITH_THREADS, held=[(path, "sched_policy")])
    assert [(a.knob, a.value) for a in decide(s, be_thread_idle_cgroups=[])] == [
        ("cpu.weight", "1"), ("cpu.idle", "1"), ("sched_policy", None)]
    assert [(a.knob, a.value) for a in decide(s, be_cpu_idle=False)] == [("sched_policy", None)]


@pytest.mark.parametrize("setting, memory_max, node, expect", [
    ("50%", str(4 * GiB), 16 * GiB, str(2 * GiB)),      # of the cgroup's own limit
    ("25%", "max", 16 * GiB, str(4 * GiB)),             # unlimited: of the node's memory
    ("25%", None, 16 * GiB, str(4 * GiB)),              # limit unknown: the same
    ("25%", "max", None, None),                         # nothing to take a percentage of: no action
    ("1.5G", "max", None, str(3 * GiB // 2)),
    ("max", str(GiB), None, "max"),
])
def test_memory_targets(setting, memory_max, node, expect):
    value, why = memory_target(setting, cg("x", "LS", memory_max=memory_max), node)
    assert value == expect
    if value is not None and setting.endswith("%"):
        assert why["base_bytes"] in (4 * GiB, 16 * GiB) and why["base"] in ("memory.max", "node memory")


def test_percent_without_a_base_holds():
    s = snap(cg("ls", "LS"), memory_total=None)
    assert triples(decide(s, be_cpu_idle=False, be_cpu_weight=0, ls_memory_low="10%")) == []


@pytest.mark.parametrize("text, expect", [
    ("512M", ("bytes", 512 << 20)), ("2G", ("bytes", 2 * GiB)), ("2g", ("bytes", 2 * GiB)),
    ("1KiB", ("bytes", 1024)), ("4096", ("bytes", 4096)), (8192, ("bytes", 8192)), ("1T", ("bytes", 1 << 40)),
    ("50%", ("percent", 50)), ("100 %", ("percent", 100)), ("max", ("max", 0)),
    ("", None), ("0", None), (0, None), ("0%", None), ("0M", None),
])
def test_memory_values(text, expect):
    assert parse_memory_value(text) == expect


@pytest.mark.parametrize("text", ["lots", "-1G", "1P", "150%", "12 MB extra", "5%%"])
def test_bad_memory_values(text):
    with pytest.raises(ValueError):
        parse_memory_value(text)


REGISTRY = {"be_suppress": BeSuppress, "qos_baseline": QosBaseline}


def test_memory_values_are_checked_when_the_config_loads(tmp_path):
    text = '[loops.qos_baseline]\nenabled = true\nls_memory_low = "50%"\nbe_memory_high = "lots"\n' \
           'ls_memory_min = true\n'
    with pytest.raises(ConfigError) as e:
        parse_config(text, tmp_path / "k.toml", REGISTRY)
    errors = e.value.errors
    assert len(errors) == 2, errors
    assert errors[0].startswith(f"{tmp_path / 'k.toml'}:4: loops.qos_baseline.be_memory_high: not a memory size")
    assert errors[1].startswith(f"{tmp_path / 'k.toml'}:5: loops.qos_baseline.ls_memory_min: expected a size")
    good = parse_config('[loops.qos_baseline]\nenabled = true\nls_memory_low = " 1G "\nls_memory_min = 0\n',
                        tmp_path / "k.toml", REGISTRY)
    s = good.loops["qos_baseline"]
    assert (s.ls_memory_low, s.ls_memory_min, s.be_memory_high) == ("1G", "", "")


@pytest.mark.parametrize("kw, expect", [
    ({}, {("BE", "cpu.idle"), ("BE", "cpu.weight"), ("BE", "sched_policy")}),
    ({"be_cpu_idle": False}, {("BE", "cpu.weight")}),
    ({"be_cpu_idle": False, "be_cpu_weight": 0}, set()),
    (ALL_ON, {("BE", "cpu.idle"), ("BE", "cpu.weight"), ("BE", "sched_policy"), ("LS", "cpu.weight"),
              ("LSR", "cpu.weight"),
              ("LS", "memory.low"), ("LS", "memory.min"), ("BE", "memory.high")}),
])
def test_writes_claims_only_the_enabled_knobs(kw, expect):
    claimed = QosBaseline.writes(settings(**kw))
    assert claimed == expect
    # Never another loop's: be_suppress, cpu_burst and memory_evict own these.
    assert not claimed & {("BE", "cpu.max"), ("BE", "cpuset.cpus"), ("LS", "cpu.max"), ("LS", "cpu.max.burst"),
                          ("BE", "memory.reclaim"), ("BE", "cgroup.freeze"), ("BE", "cgroup.kill")}


def test_enabled_together_with_be_suppress_loads(tmp_path):
    text = "[loops.be_suppress]\nenabled = true\n[loops.qos_baseline]\nenabled = true\nls_cpu_weight = 500\n"
    assert parse_config(text, tmp_path / "k.toml", REGISTRY).loops["qos_baseline"].enabled


# --- through the actuator on fake trees -----------------------------------------------------------

def kernel_applies_idle(tree: FakeCgroups, cgroup: str) -> None:
    """What the kernel does on a cpu.idle write (and the fake cannot): an idle group's weight becomes
    the minimum (shares 3), leaving idle resets it to the default (shares 1024)."""
    idle = tree.read(cgroup, "cpu", "cpu.idle").strip() == "1"
    if tree.v1:
        tree.set(cgroup, "cpu", "cpu.shares", "3\n" if idle else "1024\n")
    else:
        tree.set(cgroup, "cpu", "cpu.weight", "1\n" if idle else "100\n")


def rig(tmp_path, mode):
    tree = FakeCgroups(tmp_path, mode).add("be").add("ls")
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    act = Actuator(tree.fs, journal, DecisionLog(state, send=lambda message, **fields: None))
    supported = frozenset(n for n, k in KNOBS.items() if k.supported(tree.fs))
    s = settings(ls_cpu_weight=300)

    def tick():
        snapshot = Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=1.0, memory_total=GiB),
                            cgroups={"be": cg("be", "BE"), "ls": cg("ls", "LS")}, supported=supported,
                            held={(h.target, h.knob): h.original for h in journal.entries()})
        out = act.apply("qos_baseline", QosBaseline.decide(snapshot, s, None))
        if any(d.knob == "cpu.idle" for d in out):
            kernel_applies_idle(tree, "be")
        return out

    return SimpleNamespace(tree=tree, journal=journal, act=act, tick=tick, state=state)


def weight_file(tree):
    return ("cpu.shares", "512") if tree.v1 else ("cpu.weight", "50")


@pytest.mark.parametrize("mode", ["v2", "hybrid"])
def test_rewrites_are_corrected_originals_kept_and_restored_in_order(tmp_path, mode):
    r = rig(tmp_path, mode)
    wfile, w_original = weight_file(r.tree)
    r.tree.set("be", "cpu", wfile, w_original + "\n")          # BE's weight before koordd: 50

    first = r.tick()
    assert [(d.target, d.knob, d.old, d.new, d.outcome) for d in first] == [
        ("be", "cpu.weight", "50", "1", APPLIED), ("be", "cpu.idle", "0", "1", APPLIED),
        ("ls", "cpu.weight", "100", "300", APPLIED)]
    assert r.tick() == []                                       # in place: nothing to do, nothing recorded

    # Another agent rewrites: idle back to 0 (the kernel resets BE's weight to 100) and LS's weight.
    r.tree.set("be", "cpu", "cpu.idle", "0\n")
    kernel_applies_idle(r.tree, "be")
    r.tree.set("ls", "cpu", wfile, "2048\n" if r.tree.v1 else "200\n")
    corrected = r.tick()
    assert [(d.target, d.knob, d.old, d.new) for d in corrected] == [
        ("be", "cpu.idle", "0", "1"), ("ls", "cpu.weight", "200", "300")]
    assert r.tree.read("be", "cpu", wfile).strip() == ("3" if r.tree.v1 else "1")
    # The journal keeps the values from before koordd's first write, not the rewrites.
    assert {(h.target, h.knob): h.original for h in r.journal.entries()} == {
        ("be", "cpu.weight"): "50", ("be", "cpu.idle"): "0", ("ls", "cpu.weight"): "100"}

    # Stop: newest first, so BE's idle goes back before its weight (idle 0 would reset the weight).
    restored = []
    for held in reversed(r.journal.entries()):
        d = r.act.restore(held, "koordd stopping")
        if d.knob == "cpu.idle":
            kernel_applies_idle(r.tree, "be")
        restored.append((d.target, d.knob, d.new, d.outcome))
    assert restored == [("ls", "cpu.weight", "100", RESTORED), ("be", "cpu.idle", "0", RESTORED),
                        ("be", "cpu.weight", "50", RESTORED)]
    assert r.tree.read("be", "cpu", "cpu.idle").strip() == "0"
    assert r.tree.read("be", "cpu", wfile).strip() == w_original
    assert r.journal.entries() == []
    applied = [d for d in read_decisions(r.state) if d["outcome"] == APPLIED and d["knob"] == "cpu.idle"]
    assert len(applied) == 2, applied                         # the first write and the correction


def test_memory_knobs_on_v2_and_none_on_hybrid(tmp_path):
    for mode in ("v2", "hybrid"):
        tree = FakeCgroups(tmp_path / mode, mode).add("be").add("ls")
        state = tmp_path / mode / "state"
        act = Actuator(tree.fs, RestoreJournal(state), DecisionLog(state, send=lambda message, **fields: None))
        supported = frozenset(n for n, k in KNOBS.items() if k.supported(tree.fs))
        snapshot = Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=1.0, memory_total=8 * GiB),
                            cgroups={"be": cg("be", "BE"), "ls": cg("ls", "LS")}, supported=supported)
        s = settings(be_cpu_idle=False, be_cpu_weight=0, ls_memory_low="25%", ls_memory_min="64M",
                     be_memory_high="1G")
        out = act.apply("qos_baseline", QosBaseline.decide(snapshot, s, None))
        got = {(d.target, d.knob, d.new, d.outcome) for d in out}
        if mode == "v2":
            assert got == {("ls", "memory.low", str(2 * GiB), APPLIED), ("ls", "memory.min", str(64 << 20), APPLIED),
                           ("be", "memory.high", str(GiB), APPLIED)}
            assert tree.read("ls", "memory", "memory.low").strip() == str(2 * GiB)
        else:
            assert got == set()            # nothing asked for, so nothing refused every tick either


def test_a_kernel_without_cpu_idle_gets_the_weight_fallback_and_a_refusal_that_says_so(tmp_path):
    # Linux before 5.15 (no cpu.idle) and 5.19 (no memory.reclaim): the layout offers both, the files
    # are not there. Support is probed per file, so the loop falls back instead of being refused.
    tree = FakeCgroups(tmp_path, "v2").add("be").add("ls")
    for cgroup in ("be", "ls"):
        (tree.root / cgroup / "cpu.idle").unlink()
        (tree.root / cgroup / "memory.reclaim").unlink()
    sensors = Sensors(tree.fs, rules({"be": "BE", "ls": "LS"}))
    assert "cpu.idle" not in sensors.supported and "memory.reclaim" not in sensors.supported
    assert {"cpu.weight", "cpu.max", "cgroup.kill"} <= sensors.supported

    state = tmp_path / "state"
    act = Actuator(tree.fs, RestoreJournal(state), DecisionLog(state, send=lambda message, **fields: None))
    act.unsupported = act.backends.probe()
    assert "not available on this kernel" in act.unsupported["cpu.idle"]
    snapshot = Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=1.0, memory_total=GiB),
                        cgroups={"be": cg("be", "BE"), "ls": cg("ls", "LS")}, supported=sensors.supported)
    out = act.apply("qos_baseline", QosBaseline.decide(snapshot, settings(), None))
    assert [(d.target, d.knob, d.new, d.outcome) for d in out] == [("be", "cpu.weight", "1", APPLIED)], out
    [refused] = act.apply("qos_baseline", [Action("be", "cpu.idle", "1")])
    assert refused.outcome == "refused" and "not available on this kernel" in refused.error, refused


def test_a_controller_not_enabled_yet_leaves_support_to_the_layout(tmp_path):
    # systemd enables the cpu controller below the root only once a unit asks for it: until then no
    # cgroup has cpu.idle, and that says nothing about the kernel.
    tree = FakeCgroups(tmp_path, "v2").add("be")
    tree.set("", None, "cgroup.subtree_control", "memory pids\n")
    (tree.root / "be" / "cpu.idle").unlink()
    assert "cpu.idle" in Sensors(tree.fs, ()).supported
