"""Knobs the kubelet owns (koordd/core/kubelet.py): the pure rule on both cgroup drivers, and the actuator
refusing such a write as a decision that names the rule and the option, unless the config overrides it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.core.config import ConfigError, parse_config
from koordd.core.decisions import APPLIED, REFUSED
from koordd.core.kubelet import CONTAINER, KubeletRule, POD, QOS, ROOT, owner, place
from koordd.core.loop import Action
from koordd.core.catalogue import load_registry

UID = "6a4f2e3b_1c9d_4a5e_8f7b_2d3e4f5a6b7c"
UID_DASHED = UID.replace("_", "-")
CID = "0123456789abcdef" * 4

# (cgroup, level, QoS) for each driver's names; identical on cgroup v1 hierarchies and v2.
SYSTEMD = {
    "root": "kubepods.slice",
    "be_qos": "kubepods.slice/kubepods-besteffort.slice",
    "bu_qos": "kubepods.slice/kubepods-burstable.slice",
    "be_pod": f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID}.slice",
    "bu_pod": f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID}.slice",
    "gu_pod": f"kubepods.slice/kubepods-pod{UID}.slice",
    "be_ctr": f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID}.slice/cri-containerd-{CID}.scope",
    "gu_ctr": f"kubepods.slice/kubepods-pod{UID}.slice/crio-{CID}.scope",
}
CGROUPFS = {
    "root": "kubepods",
    "be_qos": "kubepods/besteffort",
    "bu_qos": "kubepods/burstable",
    "be_pod": f"kubepods/besteffort/pod{UID_DASHED}",
    "bu_pod": f"kubepods/burstable/pod{UID_DASHED}",
    "gu_pod": f"kubepods/pod{UID_DASHED}",
    "be_ctr": f"kubepods/besteffort/pod{UID_DASHED}/{CID}",
    "gu_ctr": f"kubepods/pod{UID_DASHED}/{CID}",
}
PLACES = {"root": (ROOT, None), "be_qos": (QOS, "besteffort"), "bu_qos": (QOS, "burstable"),
          "be_pod": (POD, "besteffort"), "bu_pod": (POD, "burstable"), "gu_pod": (POD, "guaranteed"),
          "be_ctr": (CONTAINER, "besteffort"), "gu_ctr": (CONTAINER, "guaranteed")}


@pytest.mark.parametrize("driver", [SYSTEMD, CGROUPFS], ids=["systemd", "cgroupfs"])
@pytest.mark.parametrize("name", sorted(PLACES))
def test_every_kubelet_cgroup_is_placed_on_both_drivers(driver, name):
    assert place(driver[name]) == PLACES[name]
    assert place("/" + driver[name] + "/") == PLACES[name]


@pytest.mark.parametrize("cgroup", [
    "", "system.slice", "system.slice/kubelet.service", "be.slice/job", "kubepods.slice.bak",
    "kubepods.slice/kubepods-besteffort.slice/not-a-pod", "kubepods/burstable/foo",
    f"{CGROUPFS['gu_ctr']}/nested",                     # a cgroup a container made inside itself
    f"{SYSTEMD['be_ctr']}/init.scope",
])
def test_cgroups_the_kubelet_did_not_name_are_not_its(cgroup):
    assert place(cgroup) is None
    assert owner(cgroup, "cpu.weight") is None


# What koordd writes by default, and what its loops may ask, on each cgroup: (name, knob) -> owned.
EXPECTED = [
    # be_suppress caps the BE QoS cgroup: the kubelet never sets a quota there.
    ("be_qos", "cpu.max", False), ("be_qos", "cpuset.cpus", False),
    # ... but it sets the QoS cgroups' weights (BestEffort: shares 2), every minute.
    ("be_qos", "cpu.weight", True), ("bu_qos", "cpu.weight", True), ("root", "cpu.weight", True),
    # cpu.idle = 1 makes the kernel refuse the kubelet's weight writes.
    ("be_qos", "cpu.idle", True), ("be_pod", "cpu.idle", True), ("root", "cpu.idle", True),
    # A BestEffort pod has no limits: the antagonist cap and memory.max are free there ...
    ("be_pod", "cpu.max", False), ("be_pod", "memory.max", False), ("be_pod", "cpu.max.burst", False),
    # ... a Guaranteed or Burstable pod's limits are the kubelet's, and a burst constrains its quota.
    ("gu_pod", "cpu.max", True), ("bu_pod", "cpu.max", True), ("gu_pod", "memory.max", True),
    ("gu_pod", "cpu.max.burst", True),
    ("be_pod", "cpu.weight", True), ("gu_pod", "pids.max", True), ("gu_pod", "hugetlb.2MB.max", True),
    # Containers: everything the runtime sets from the CRI request, cpusets of the static CPU manager.
    ("be_ctr", "cpu.max", True), ("gu_ctr", "cpuset.cpus", True), ("gu_ctr", "memory.high", True),
    ("be_ctr", "memory.max", True),
    # The node allocatable root: weight, memory and pids limits; no quota.
    ("root", "memory.max", True), ("root", "cpu.max", False), ("root", "pids.max", True),
    # MemoryQoS (cgroup v2): memory.min, and memory.low with TieredReservation.
    ("bu_qos", "memory.min", True), ("bu_qos", "memory.low", True), ("gu_pod", "memory.min", True),
    # memory.high above the containers, and the commands, are never the kubelet's.
    ("be_qos", "memory.high", False), ("be_pod", "memory.high", False),
    ("be_pod", "cgroup.kill", False), ("be_pod", "memory.reclaim", False), ("be_pod", "cgroup.freeze", False),
    ("be_qos", "sched_policy", False), ("be_qos", "net_class", False), ("bu_qos", "cpu.max.burst", False),
]


@pytest.mark.parametrize("driver", [SYSTEMD, CGROUPFS], ids=["systemd", "cgroupfs"])
@pytest.mark.parametrize("name, knob, owned", EXPECTED)
def test_which_knobs_are_the_kubelets(driver, name, knob, owned):
    o = owner(driver[name], knob)
    assert (o is not None) == owned, (driver[name], knob, o)
    if o is not None:
        assert (o.level, o.qos) == PLACES[name] and o.why


def test_other_roots_from_the_config():
    # kind and other setups with --cgroup-root: kubelet.slice/kubelet-kubepods.slice/...
    kind = "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
    assert owner(kind, "cpu.weight") is None
    roots = ("kubelet.slice/kubelet-kubepods.slice",)
    assert place(kind, roots) == (QOS, "besteffort")
    assert owner(kind, "cpu.weight", roots).level == QOS
    assert owner(f"{kind}/kubelet-kubepods-besteffort-pod{UID}.slice", "cpu.max", roots) is None
    assert owner("k8s/*", "cpu.weight", ("k8s/*",)).level == ROOT


def test_the_refusal_names_the_rule_and_the_option():
    rule = KubeletRule()
    why = rule.refusal(SYSTEMD["bu_qos"], "cpu.weight")
    assert why.startswith("kubelet-owned: cpu.weight of kubepods.slice/kubepods-burstable.slice")
    assert "QoS cgroup, burstable" in why and 'kubelet_owned = "override"' in why and 'kubelet_override = ["cpu.weight"]' in why
    assert rule.refusal(SYSTEMD["be_qos"], "cpu.max") is None
    assert KubeletRule("override").refusal(SYSTEMD["bu_qos"], "cpu.weight") is None
    assert KubeletRule(override=frozenset({"cpu.weight"})).refusal(SYSTEMD["bu_qos"], "cpu.weight") is None
    assert KubeletRule(override=frozenset({"cpu.weight"})).refusal(SYSTEMD["gu_pod"], "cpu.max") is not None
    assert KubeletRule(override=frozenset({"hugetlb"})).refusal(SYSTEMD["gu_pod"], "hugetlb.1GB.max") is None


# --- the config options ---------------------------------------------------------

def parse(text):
    return parse_config(text, "k.toml", load_registry())


def test_options_load_with_their_defaults_and_make_the_rule():
    c = parse("")
    assert (c.daemon.kubelet_owned, c.daemon.kubelet_override, c.daemon.kubelet_cgroups) == \
        ("respect", (), ("kubepods.slice", "kubepods"))
    rule = KubeletRule.of(parse('[daemon]\nkubelet_owned = "respect"\nkubelet_override = ["cpu.max", "cpu.max"]\n'
                                'kubelet_cgroups = ["/k8s/kubepods/"]\n').daemon)
    assert rule == KubeletRule("respect", frozenset({"cpu.max"}), ("k8s/kubepods",))


@pytest.mark.parametrize("text, error", [
    ('kubelet_owned = "fight"', "kubelet_owned: must be one of 'respect', 'override'"),
    ('kubelet_override = ["cpu.wieght"]', "'cpu.wieght' is not a knob the kubelet owns"),
    ('kubelet_override = "cpu.max"', "expected an array of knob names"),
    ('kubelet_cgroups = ["kubepods/../x"]', "may not contain '..'"),
])
def test_bad_options_are_errors_at_their_line(text, error):
    with pytest.raises(ConfigError) as e:
        parse(f"[daemon]\n{text}\n")
    assert "k.toml:2:" in str(e.value) and error in str(e.value)


# --- through the actuator ---------------------------------------------------------

@pytest.fixture(params=["v2", "v1"])
def rig(request, tmp_path):
    tree = FakeCgroups(tmp_path, request.param)
    for name in ("be_qos", "bu_qos", "be_pod", "gu_pod"):
        tree.add(SYSTEMD[name])
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    act = Actuator(tree.fs, journal, DecisionLog(state, send=lambda message, **fields: None))
    act.kubelet = KubeletRule()
    return SimpleNamespace(tree=tree, journal=journal, act=act)


def test_the_actuator_refuses_a_kubelet_owned_knob_and_writes_nothing(rig):
    before = rig.tree.fs.read("cpu", SYSTEMD["bu_qos"], "cpu.weight" if not rig.tree.v1 else "cpu.shares")
    [d] = rig.act.apply("avx_weight", [Action(SYSTEMD["bu_qos"], "cpu.weight", "108", {}, "AVX next door")])
    assert d.outcome == REFUSED and d.error.startswith("kubelet-owned: cpu.weight of kubepods.slice/kubepods-burstable.slice")
    assert "kubelet_override" in d.error
    assert rig.tree.fs.read("cpu", SYSTEMD["bu_qos"], "cpu.weight" if not rig.tree.v1 else "cpu.shares") == before
    assert rig.journal.entries() == []
    # Asked again every tick: recorded once.
    assert rig.act.apply("avx_weight", [Action(SYSTEMD["bu_qos"], "cpu.weight", "108", {}, "AVX next door")]) == []


def test_be_suppress_still_caps_the_besteffort_qos_cgroup_and_besteffort_pods(rig):
    [d] = rig.act.apply("be_suppress", [Action(SYSTEMD["be_qos"], "cpu.max", "50000 100000", {}, "slack")])
    assert d.outcome == APPLIED
    [d] = rig.act.apply("be_suppress", [Action(SYSTEMD["be_pod"], "cpu.max", "1000 100000", {}, "antagonist")])
    assert d.outcome == APPLIED
    [d] = rig.act.apply("cpu_burst", [Action(SYSTEMD["gu_pod"], "cpu.max", "300000 100000", {}, "throttled")])
    assert d.outcome == REFUSED and "the kubelet's pod cgroup, guaranteed" in d.error


def test_override_lets_the_write_through_and_restores_go_through_anyway(rig):
    rig.act.kubelet = KubeletRule(override=frozenset({"cpu.max"}))
    [d] = rig.act.apply("cpu_burst", [Action(SYSTEMD["gu_pod"], "cpu.max", "300000 100000", {}, "throttled")])
    assert d.outcome == APPLIED
    # Back to respect (a reload): the loop's next raise is refused, but putting the original back is not.
    rig.act.kubelet = KubeletRule()
    [d] = rig.act.apply("cpu_burst", [Action(SYSTEMD["gu_pod"], "cpu.max", "320000 100000", {}, "throttled")])
    assert d.outcome == REFUSED
    [d] = rig.act.apply("cpu_burst", [Action(SYSTEMD["gu_pod"], "cpu.max", None, {}, "back to base")])
    assert d.outcome == "restored" and rig.journal.entries() == []
    rig.act.kubelet = KubeletRule("override")
    [d] = rig.act.apply("avx_weight", [Action(SYSTEMD["bu_qos"], "cpu.weight", "108", {}, "AVX next door")])
    assert d.outcome == APPLIED


def test_thread_policies_of_kubelet_cgroups_are_not_the_kubelets(rig):
    # qos_baseline's way on kubepods: SCHED_IDLE threads, never cpu.idle on the group.
    assert rig.act.kubelet.refusal(SYSTEMD["be_qos"], "sched_policy") is None
    [d] = rig.act.apply("qos_baseline", [Action(SYSTEMD["be_qos"], "cpu.idle", "1", {}, "BE idle")])
    assert d.outcome == REFUSED and "cpu.idle = 1 makes the kernel refuse every cpu.weight write" in d.error


# --- through the daemon: the [daemon] options reach the actuator ----------------------

DAEMON_CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"
{extra}

[[classes]]
name = "BE"
cgroups = ["kubepods.slice/kubepods-besteffort.slice"]

[[classes]]
name = "LS"
cgroups = ["kubepods.slice/kubepods-burstable.slice"]

[loops.be_suppress]
enabled = true
interval = "100ms"
rule = "threshold"

[loops.qos_baseline]
enabled = true
interval = "100ms"
ls_cpu_weight = 200
"""


@pytest.mark.parametrize("extra, weight", [("", REFUSED), ('kubelet_override = ["cpu.weight"]', APPLIED),
                                           ('kubelet_owned = "override"', APPLIED)])
def test_koordd_once_on_a_kubelet_tree(tmp_path, extra, weight):
    from koordd.core.config import load_config
    from koordd.runtime.daemon import Daemon
    from koordd.act.decision_log import read_decisions
    tree = FakeCgroups(tmp_path, "v2").add(SYSTEMD["be_qos"]).add(SYSTEMD["bu_qos"])
    config = tmp_path / "koordd.toml"
    config.write_text(DAEMON_CONFIG.format(root=tree.root, state=tmp_path / "state", extra=extra))
    registry = load_registry()
    assert Daemon(load_config(config, registry), registry).run(once=True) == 0
    got = {(d["loop"], d["target"], d["knob"]): d for d in read_decisions(tmp_path / "state")}
    ls_weight = got[("qos_baseline", SYSTEMD["bu_qos"], "cpu.weight")]
    assert ls_weight["outcome"] == weight
    if weight == REFUSED:
        assert ls_weight["error"].startswith("kubelet-owned: cpu.weight")
        assert tree.read(SYSTEMD["bu_qos"], "cpu", "cpu.weight").strip() == "100"
    # be_suppress's cap of the BestEffort QoS cgroup is koordd's to write either way.
    assert got[("be_suppress", SYSTEMD["be_qos"], "cpu.max")]["outcome"] == APPLIED
