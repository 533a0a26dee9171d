"""Issue 25, defect 1: class roots nested in one another (an LS cgroup below a BE root, and the reverse).

Every class root is found at any depth, the deepest match giving a cgroup its class; no throttle, freeze
or kill lands on a cgroup that is or holds an LS, LSR, LSE or SYSTEM cgroup; usage is counted once; a
nested class root is never a member (a pod) of the root above it; and the config says at validate time
where a BE pattern can hold a cgroup of another class.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from koordtest.fakes.cgroup import LAYOUTS, FakeCgroups
from koordtest.fakes.resctrl import FakeResctrl
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import CgroupBackend
from koordd.backends.resctrl import ResctrlGroupBackend, ResctrlTasksBackend
from koordd.core.backend import Backends
from koordd.core.config import can_hold, loop_options, make_settings, parse_config
from koordd.core.decisions import APPLIED, REFUSED
from koordd.core.feeds import TopRequest
from koordd.core.loop import Action, Loop
from koordd.core.protected import Protected
from koordd.core.reclaimable import RECLAIMABLE_OPTIONS, ReclaimableState, observe
from koordd.core.catalogue import load_registry
from koordd.core.snapshot import CgroupSample, NodeSample, Snapshot, own_usage
from koordd.core.trust import SKIP_ENV
from koordd_plugins.be_suppress import BeSuppress
from koordd_plugins.memory_evict import MemoryEvict
from koordd.runtime.runner import Runner, class_of
from koordd.runtime.topfeed import document
from koordd.sensors.collect import Sensors, find_classified
from unit.runtime.test_metrics import published, samples

MiB = 1 << 20
GiB = 1 << 30

CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"

[[classes]]
name = "BE"
cgroups = {be}

[[classes]]
name = "LS"
cgroups = {ls}

[loops.be_suppress]
enabled = true
interval = "200ms"
rule = "threshold"
threshold_percent = 65

[loops.memory_evict]
enabled = true
interval = "200ms"
scope = "{scope}"
threshold_percent = 50
reclaim = false
cooldown = "0s"
"""


def run_once(tmp: Path, tree: FakeCgroups, be: list[str], ls: list[str], scope: str) -> list[dict]:
    """koordd --once with be_suppress and memory_evict on; its decisions."""
    state, config = tmp / "state", tmp / "etc" / "koordd.toml"
    config.parent.mkdir()
    config.write_text(CONFIG.format(root=tree.root, state=state, be=json.dumps(be), ls=json.dumps(ls), scope=scope))
    done = subprocess.run([sys.executable, "-m", "koordd.runtime.daemon", "--config", str(config), "--once"],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    path = state / "decisions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def harmful(decisions: list[dict], cgroup: str) -> list[dict]:
    """Writes koordd carried out on `cgroup` that cap, freeze or kill it."""
    return [d for d in decisions if d["cgroup"] == cgroup and d["outcome"] == "applied"
            and d["knob"] in ("cpu.max", "cgroup.kill", "cgroup.freeze") and d["new"] not in ("0", None)
            and not d["new"].startswith("max")]


def test_an_ls_job_below_a_be_root_is_neither_capped_nor_killed_nor_is_its_parent(tmp_path):
    # be.slice holds ls-job (LS by the config) beside batch (BE). The scope is over its memory mark, and
    # ls-job is the largest BE member by the old reading: memory_evict's first victim.
    tree = FakeCgroups(tmp_path, "v2")
    tree.add("be.slice/ls-job", memory_current=600 * MiB).add("be.slice/batch", memory_current=300 * MiB)
    tree.stat("be.slice", memory_current=900 * MiB)
    tree.set("be.slice", "memory", "memory.max", f"{1000 * MiB}\n")
    decisions = run_once(tmp_path, tree, ["be.slice"], ["be.slice/ls-job"], "be.slice")

    assert not harmful(decisions, "be.slice/ls-job"), decisions
    assert not harmful(decisions, "be.slice"), decisions          # capping it would cap ls-job too
    assert tree.read("be.slice/ls-job", "cgroup", "cgroup.kill").strip() == ""
    assert tree.read("be.slice", "cpu", "cpu.max").strip() == "max 100000"
    # Not a test of nothing: memory_evict acted, on the BE job beside the LS one.
    assert [(d["cgroup"], d["knob"]) for d in decisions if d["outcome"] == "applied"] == \
        [("be.slice/batch", "cgroup.kill")], decisions


def test_the_docs_kubepods_example_leaves_kubepods_uncapped(tmp_path):
    # BE kubepods.slice with LS guaranteed pods right below it: kubepods.slice holds LS.
    tree = FakeCgroups(tmp_path, "v2")
    tree.add("kubepods.slice/kubepods-pod1.slice").add("kubepods.slice/kubepods-besteffort.slice")
    tree.stat("kubepods.slice")          # its cpu.stat: be_suppress sizes what it can read
    decisions = run_once(tmp_path, tree, ["kubepods.slice"], ["kubepods.slice/kubepods-pod*.slice"], "")

    assert not harmful(decisions, "kubepods.slice"), decisions
    assert tree.read("kubepods.slice", "cpu", "cpu.max").strip() == "max 100000"


# --- classification: every class root at any depth, on every layout, by the config's own rules ------------

NESTED = """
[[classes]]
name = "BE"
cgroups = ["kubepods.slice", "kubepods", "be.slice", "ls.slice/*/batch"]

[[classes]]
name = "LS"
cgroups = ["kubepods.slice/kubepods-pod*.slice", "kubepods/pod*", "be.slice/ls-job", "ls.slice"]

[[classes]]
name = "SYSTEM"
cgroups = ["be.slice/ls-job/agent"]
"""
TREE = ("kubepods.slice/kubepods-pod1.slice/cri-containerd-a.scope",
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod2.slice",
        "kubepods/pod3/c0ffee", "kubepods/besteffort/pod4",
        "be.slice/ls-job/agent", "be.slice/ls-job/worker", "be.slice/batch", "ls.slice/web/batch")
ROOTS = {"kubepods.slice": "BE", "kubepods.slice/kubepods-pod1.slice": "LS", "kubepods": "BE",
         "kubepods/pod3": "LS", "be.slice": "BE", "be.slice/ls-job": "LS", "be.slice/ls-job/agent": "SYSTEM",
         "ls.slice": "LS", "ls.slice/web/batch": "BE"}


def nested_config():
    return parse_config(NESTED, "koordd.toml", {})


def nested_tree(tmp_path, mode) -> FakeCgroups:
    tree = FakeCgroups(tmp_path, mode)
    for cg in TREE:
        tree.add(cg)
    return tree


def sensors_of(tree, config) -> Sensors:
    return Sensors(tree.fs, config.classes)


@pytest.mark.parametrize("mode", LAYOUTS)
def test_every_class_root_is_found_at_any_depth(tmp_path, mode):
    tree, config = nested_tree(tmp_path, mode), nested_config()
    sensors = sensors_of(tree, config)
    assert find_classified(tree.fs, config.classify, sensors.max_depth, sensors.patterns) == ROOTS
    snapshot = sensors.snapshot(fields=frozenset())
    # The deepest match gives a cgroup its class (the kubelet's names of both drivers among them).
    assert {cg: class_of(cg, snapshot) for cg in TREE} == {
        TREE[0]: "LS", TREE[1]: "BE", TREE[2]: "LS", TREE[3]: "BE",
        "be.slice/ls-job/agent": "SYSTEM", "be.slice/ls-job/worker": "LS", "be.slice/batch": "BE",
        "ls.slice/web/batch": "BE"}


@pytest.mark.parametrize("mode", ["v2", "hybrid"])
def test_a_nested_class_root_is_no_member_of_the_root_above_it(tmp_path, mode):
    tree, config = nested_tree(tmp_path, mode), nested_config()
    snapshot = sensors_of(tree, config).snapshot(member_classes={"BE", "LS"}, fields=frozenset())
    members = {root: [m.path for m in ms] for root, ms in snapshot.members.items()}
    assert members["be.slice"] == ["be.slice/batch"]                 # not be.slice/ls-job: a root of its own
    assert members["be.slice/ls-job"] == ["be.slice/ls-job/worker"]  # not agent (SYSTEM)
    assert members["kubepods.slice"] == ["kubepods.slice/kubepods-besteffort.slice"]
    # A member is found under its own root, not under a root further up whose path is a prefix of it.
    assert snapshot.find("be.slice/ls-job/worker").cls == "LS"


def test_the_guard_of_a_classified_tree_refuses_what_holds_or_lies_inside_non_be_work(tmp_path):
    tree, config = nested_tree(tmp_path, "v2"), nested_config()
    guard = Protected.of_snapshot(sensors_of(tree, config).snapshot(fields=frozenset()))
    assert guard.why("be.slice") == "holds be.slice/ls-job, of class LS"
    assert guard.why("kubepods.slice") == "holds kubepods.slice/kubepods-pod1.slice, of class LS"
    assert guard.why("ls.slice/web/batch") == "lies below ls.slice, of class LS"     # BE inside LS: not ours
    assert guard.why("be.slice/batch") is None and guard.why(TREE[1]) is None


# --- usage counted once -------------------------------------------------------------------------------------

def sample(path, cls, usage, memory=None, **kw):
    return CgroupSample(path, cls, cpu_usage=usage, memory_current=memory, **kw)


NESTED_USAGE = (sample("be.slice", "BE", 1.5, 3 * GiB), sample("be.slice/ls-job", "LS", 1.0, 2 * GiB),
                sample("be.slice/ls-job/agent", "SYSTEM", 0.25, GiB // 2), sample("batch.slice", "BE", 0.5, GiB))


def usage_snapshot(node_used=2.5, members=None, held=()) -> Snapshot:
    node = NodeSample(cpu_count=4, cpu_used=node_used, memory_total=16 * GiB, memory_available=10 * GiB)
    return Snapshot(time=100.0, wall=0.0, node=node, cgroups={c.path: c for c in NESTED_USAGE},
                    members=members or {}, held=dict(held))


def test_own_usage_counts_a_nested_root_once_in_its_own_class():
    s = usage_snapshot()
    assert own_usage(s, s.of_class("BE")) == pytest.approx(1.0)          # 0.5 of be.slice, 0.5 of batch.slice
    assert own_usage(s, s.of_class("LS")) == pytest.approx(0.75)
    assert own_usage(s, s.of_class("SYSTEM")) == pytest.approx(0.25)
    assert own_usage(s, s.of_class("BE", "LS", "SYSTEM")) == pytest.approx(2.0)   # be.slice + batch.slice
    assert own_usage(s, s.of_class("BE"), "memory_current") == 2 * GiB


def test_be_suppress_caps_only_be_roots_free_of_other_classes_and_counts_usage_once():
    s = usage_snapshot(held={("be.slice", "cpu.max"): "max 100000"})
    settings = make_settings(loop_options(BeSuppress), {"enabled": True, "rule": "threshold"})
    actions = BeSuppress.decide(s, settings, BeSuppress.initial_state(settings))
    caps = [a for a in actions if a.knob == "cpu.max" and a.value is not None]
    assert [a.target for a in caps] == ["batch.slice"]
    # A cap this loop holds on be.slice (from before ls-job started there) is lifted.
    assert [(a.target, a.knob) for a in actions if a.value is None and a.target == "be.slice"] == \
        [("be.slice", "cpu.max"), ("be.slice", "cpuset.cpus")]
    r = caps[0].reason
    # LS 0.75 + SYSTEM 0.25, BE batch.slice 0.5; be.slice's own 0.5 is the system's (node 2.5 - 1.0 - 0.5).
    assert (r["non_be_usage"], r["be_usage"], r["system_usage"]) == (1.0, 0.5, 1.0)


def test_reclaimable_counts_a_nested_roots_usage_once():
    settings = make_settings(RECLAIMABLE_OPTIONS, {"window": "60s", "margin_percent": 0})
    got = observe(usage_snapshot(node_used=2.5), settings, ReclaimableState())
    # node 2.5 - LS own 0.75 - BE own 1.0 (SYSTEM is the system's): 0.75; counting ls-job inside
    # be.slice too would leave 0.
    assert got.cpu.system == pytest.approx(0.75)
    assert got.cpu.peak == pytest.approx(0.75)


def test_class_metrics_count_a_nested_roots_usage_once():
    s = usage_snapshot()
    got = samples(published(s), "koordd_class_cpu_usage_cores")
    assert got == {(("class", "BE"),): 1.0, (("class", "LS"),): 0.75, (("class", "SYSTEM"),): 0.25}


# --- memory_evict: victims are never, and never hold, another class's work ----------------------------------

def test_memory_evict_takes_no_victim_holding_ls_and_thaws_one_it_froze():
    be = CgroupSample("be.slice", "BE", memory_anon=900 * MiB)
    ls = CgroupSample("be.slice/pod-x/ls", "LS", memory_anon=500 * MiB)
    pod_x = CgroupSample("be.slice/pod-x", "BE", memory_anon=600 * MiB)     # a BE pod, an LS root inside
    batch = CgroupSample("be.slice/batch", "BE", memory_anon=300 * MiB)
    node = NodeSample(cpu_count=2, cpu_used=0.5, memory_total=1000 * MiB, memory_anon=950 * MiB)
    s = Snapshot(time=100.0, wall=0.0, node=node, cgroups={"be.slice": be, ls.path: ls},
                 members={"be.slice": (pod_x, batch)}, held={("be.slice/pod-x", "cgroup.freeze"): "0"},
                 supported=frozenset({"cgroup.freeze", "cgroup.kill"}))
    settings = make_settings(loop_options(MemoryEvict), {"enabled": True, "threshold_percent": 70})
    actions = MemoryEvict.decide(s, settings, MemoryEvict.initial_state(settings))
    assert [(a.target, a.knob, a.value) for a in actions] == [
        ("be.slice/pod-x", "cgroup.freeze", None),          # frozen before ls started in it: thawed
        ("be.slice/batch", "cgroup.kill", "1")]             # the largest victim that holds no LS


# --- the config says where this can happen ------------------------------------------------------------------

def test_validate_warns_where_a_be_pattern_can_hold_or_lie_inside_another_class(tmp_path):
    warnings = nested_config().warnings
    assert "koordd.toml:4: warning: BE pattern 'be.slice' can hold cgroups of LS pattern 'be.slice/ls-job' " \
           "(classes[1]): a BE cgroup holding one is never capped, frozen or killed" in warnings
    assert any("BE pattern 'kubepods.slice' can hold cgroups of LS pattern 'kubepods.slice/kubepods-pod*.slice'"
               in w for w in warnings)
    assert any("BE pattern 'be.slice' can hold cgroups of SYSTEM pattern 'be.slice/ls-job/agent'" in w
               for w in warnings)
    assert any("BE pattern 'ls.slice/*/batch' can match inside LS pattern 'ls.slice'" in w for w in warnings)
    path = tmp_path / "koordd.toml"
    path.write_text(NESTED)
    out = subprocess.run([sys.executable, "-m", "koordctl.cli", "validate", str(path)], capture_output=True,
                         text=True, env={**os.environ, SKIP_ENV: "1"})
    assert out.returncode == 0 and f"{path}:4: warning: BE pattern 'be.slice'" in out.stdout, out


def test_the_shipped_configs_have_no_nesting_warning():
    shipped = {"config/koordd.toml": Path("config/koordd.toml").read_text(),
               "configmap.yaml": yaml.safe_load(Path("deploy/kubernetes/configmap.yaml").read_text())["data"]["koordd.toml"]}
    for path, text in shipped.items():
        assert parse_config(text, path, load_registry()).warnings == (), path


@pytest.mark.parametrize("outer, inner, holds", [
    ("be.slice", "be.slice/ls-job", True),
    ("be.slice", "be.slice", False),                                    # the same cgroup: the first rule wins
    ("kubepods.slice/kubepods-besteffort.slice", "kubepods.slice/kubepods-pod*.slice/x", False),
    ("kubepods.slice/*", "kubepods.slice/kubepods-pod*.slice/x", True),
    ("*.slice", "be.slice/job", True),
    ("a*b", "*c/x", False),                                             # a*b ends in b, *c in c
    ("a*", "*b/x", True),                                               # "ab"
    ("[ab]x", "cx/y", False),
    ("[!a]x", "bx/y", True),
    ("job?", "job/x", False),
    ("be.slice/ls-job", "be.slice", False),                             # outer deeper than inner
])
def test_can_hold(outer, inner, holds):
    assert can_hold(outer, inner) is holds


def test_no_be_cache_partition_for_a_be_root_holding_ls(tmp_path):
    """llc_partition moves every thread of a BE root and below into the BE resctrl group (a few cache
    ways): for a BE root holding an LS job that would confine LS's cache too."""
    proc = tmp_path / "proc"
    proc.mkdir()
    cg = FakeCgroups(tmp_path / "cg", "v2").add("be.slice/ls-job").add("be.slice/batch")
    cg.set("be.slice/ls-job", None, "cgroup.threads", "21\n")
    cg.set("be.slice/batch", None, "cgroup.threads", "11\n")
    rc = FakeResctrl(tmp_path / "resctrl", alive={1, 11, 21})
    groups, tasks = ResctrlGroupBackend(rc, proc), ResctrlTasksBackend(cg.fs, rc, proc)
    act = Actuator(Backends([CgroupBackend(cg.fs), groups, tasks]), RestoreJournal(tmp_path / "state"),
                   DecisionLog(tmp_path / "state", send=lambda message, **fields: None))
    act.protect({"be.slice": "BE", "be.slice/ls-job": "LS"})
    made, root, batch = act.apply("llc_partition", [Action("koordd-BE", "resctrl.group", "present"),
                                                    Action("be.slice", "resctrl_group", "koordd-BE"),
                                                    Action("be.slice/batch", "resctrl_group", "koordd-BE")])
    assert made.outcome == APPLIED and batch.outcome == APPLIED
    assert root.outcome == REFUSED and root.error == \
        "protected: would confine the cache of be.slice, which holds be.slice/ls-job, of class LS"
    assert rc.tasks_of("koordd-BE") == [11]


# --- a throttle standing when its cgroup comes to hold LS work is lifted ------------------------------------

class Idler(Loop):
    """Makes every BE root idle (as qos_baseline does)."""
    name = "idler"

    @staticmethod
    def writes(settings):
        return frozenset({("BE", "cpu.idle")})

    @staticmethod
    def decide(snapshot, settings, state):
        return [Action(c.path, "cpu.idle", "1", {}, "idle") for c in snapshot.of_class("BE")]


def test_a_throttle_held_on_a_be_root_is_lifted_once_ls_work_starts_below_it(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    runner = Runner({"idler": Idler}, Actuator(tree.fs, RestoreJournal(tmp_path / "state"),
                                               DecisionLog(tmp_path / "state")))
    runner.configure(parse_config('[[classes]]\nname = "BE"\ncgroups = ["be.slice"]\n[[classes]]\nname = "LS"\n'
                                  'cgroups = ["be.slice/ls-job"]\n[loops.idler]\nenabled = true\ninterval = "1s"\n',
                                  "koordd.toml", {"idler": Idler}), now=0.0)
    idler = runner.runs["idler"]

    def tick(t, classes):
        runner.tick([idler], Snapshot(t, 0.0, NodeSample(2, 0.5), {p: CgroupSample(p, c) for p, c in classes.items()}))
        return tree.read("be.slice", "cpu", "cpu.idle").strip()

    assert tick(1.0, {"be.slice": "BE"}) == "1"
    tree.add("be.slice/ls-job")                                        # an LS job starts in the idle slice
    assert tick(2.0, {"be.slice": "BE", "be.slice/ls-job": "LS"}) == "0"
    assert tick(3.0, {"be.slice": "BE", "be.slice/ls-job": "LS"}) == "0"     # and the guard keeps it so
    assert runner.actuator.journal.entries() == []


def test_koordctl_top_shows_a_nested_root_with_its_own_class(tmp_path):
    tree, config = nested_tree(tmp_path, "hybrid"), nested_config()
    snapshot = sensors_of(tree, config).snapshot(member_classes={"BE", "LS"}, fields=frozenset())
    doc = document(snapshot, TopRequest(members=True), [], lambda h: None, {})
    rows = {r["path"]: (r["class"], r["member_of"]) for r in doc["cgroups"]}
    assert rows["be.slice"] == ("BE", None) and rows["be.slice/ls-job"] == ("LS", None)
    assert rows["be.slice/ls-job/agent"] == ("SYSTEM", None)
    assert rows["be.slice/batch"] == ("BE", "be.slice") and rows["be.slice/ls-job/worker"] == ("LS", "be.slice/ls-job")


def test_a_watched_scope_inside_a_class_root_leaves_its_cgroups_their_class():
    """memory_evict's scope is sampled without a class: what lies below it is still of the root above
    (else the runner takes the scope's cgroups for unclassified and puts back every freeze held there)."""
    s = Snapshot(1.0, 0.0, NodeSample(2, 0.5), {"be.slice": CgroupSample("be.slice", "BE"),
                                                "be.slice/jobs": CgroupSample("be.slice/jobs", "")})
    assert class_of("be.slice/jobs/x", s) == "BE" and class_of("be.slice/jobs", s) == "BE"
    assert class_of("other.slice", s) is None
