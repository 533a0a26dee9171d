"""Targets that are not cgroups go through the same pipeline as cgroup knobs: validate -> skip if
equal -> journal -> write -> decision -> restore, a crash and a restart included."""
from __future__ import annotations

import errno
import json
from types import SimpleNamespace

import pytest

from koordtest.fakes.backends import FakeNetlink, FakeNetlinkKernel, FakeResctrl, FakeResctrlKernel
from koordtest.fakes.cgroup import FakeCgroups
import koordd.core.catalogue as entry_point_loader
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import CgroupBackend
from koordd.core.backend import Backends, KnobSpec, PartialWrite, TaskBackend, TaskWrite
from koordd.core.config import parse_config
from koordd.core.decisions import APPLIED, DRY_RUN, REFUSED, RESTORED
from koordd.core.loop import Action, Loop, NODE, restore
from koordd.core.catalogue import load_backends
from koordd.core.snapshot import CgroupSample, NodeSample, Snapshot
from koordd.runtime.runner import Runner

FULL = "0=fff;1=fff"


def make_node(tmp_path, kernels=None, dry_run=False, backends=None):
    """A node with a cgroup tree, a resctrl tree and HTB classes; `kernels` carries the fake kernels
    over into a second koordd (a restart after a crash)."""
    if kernels is None:
        kernels = SimpleNamespace(tree=FakeCgroups(tmp_path, "v2").add("be.slice"),
                                  resctrl=FakeResctrlKernel(tmp_path / "resctrl"), tc=FakeNetlinkKernel())
    if backends is None:
        backends = [CgroupBackend(kernels.tree.fs), FakeResctrl(kernels.resctrl), FakeNetlink(kernels.tc)]
    sent = []
    state = tmp_path / "state"
    act = Actuator(Backends(backends), RestoreJournal(state),
                   DecisionLog(state, send=lambda message, **fields: sent.append((message, fields))), dry_run)
    return SimpleNamespace(act=act, sent=sent, state=state, backends=backends, **vars(kernels))


def schemata(node, group="BE") -> str:
    return (node.resctrl.root / group / "schemata").read_text().splitlines()[0]


def test_a_resctrl_knob_goes_through_the_whole_pipeline(tmp_path):
    node = make_node(tmp_path)
    [d] = node.act.apply("llc", [Action("BE", "resctrl.l3", "0=00f;1=00f", {"slack": 0.3}, "BE gets 4 ways")])
    assert (d.outcome, d.kind, d.target, d.old, d.new) == (APPLIED, "resctrl", "BE", FULL, "0=f;1=f")
    assert schemata(node) == "L3:0=f;1=f"
    [(message, fields)] = node.sent
    assert message == "llc: set resctrl BE resctrl.l3 '0=fff;1=fff' -> '0=f;1=f': BE gets 4 ways"
    assert fields["KOORDD_KIND"] == "resctrl" and fields["KOORDD_TARGET"] == "BE" and "KOORDD_CGROUP" not in fields
    [held] = node.act.journal.entries()
    assert (held.kind, held.target, held.knob, held.original, held.owner) == ("resctrl", "BE", "resctrl.l3", FULL, "llc")

    # The same value again: nothing written, nothing recorded.
    assert node.act.apply("llc", [Action("BE", "resctrl.l3", "0=f;1=f")]) == []
    # A value the kernel would refuse is refused before the write, with the rule it breaks.
    [bad] = node.act.apply("llc", [Action("BE", "resctrl.l3", "0=f0f;1=f")])
    assert bad.outcome == REFUSED and "non-consecutive" in bad.error and schemata(node) == "L3:0=f;1=f"
    # Another loop may not take a knob this one holds.
    [taken] = node.act.apply("other", [Action("BE", "resctrl.l3", "0=ff;1=ff")])
    assert taken.outcome == REFUSED and "held by loop llc" in taken.error

    [back] = node.act.apply("llc", [restore("BE", "resctrl.l3", "LS recovered")])
    assert (back.outcome, back.kind, back.new) == (RESTORED, "resctrl", FULL)
    assert schemata(node) == f"L3:{FULL}" and node.act.journal.entries() == []


def test_a_kernel_refusal_keeps_nothing_and_says_what_the_kernel_said(tmp_path):
    node = make_node(tmp_path)
    # Cache id 7 passes the backend's mask rules, but this machine has no such cache: the kernel says so.
    [d] = node.act.apply("llc", [Action("BE", "resctrl.l3", "0=ff;7=ff")])
    assert d.outcome == REFUSED and "EINVAL" in d.error and "last_cmd_status: Unknown domain 7" in d.error
    assert schemata(node) == f"L3:{FULL}" and node.act.journal.entries() == []

    node.tc.refuse_next = 16       # EBUSY
    [d] = node.act.apply("shaper", [Action("eth0/1:20", "tc.htb.ceil", "1000000")])
    assert d.outcome == REFUSED and d.error.startswith("EBUSY") and node.act.journal.entries() == []


def test_a_vanished_target_is_skipped_and_its_entry_dropped(tmp_path):
    node = make_node(tmp_path)
    assert node.act.apply("shaper", [Action("eth9/1:20", "tc.htb.ceil", "1000000")]) == []
    node.act.apply("shaper", [Action("eth0/1:20", "tc.htb.ceil", "1000000")])
    del node.tc.classes[("eth0", "1:20")]                  # the device went away
    assert node.act.restore_all("stopping") == [] and node.act.journal.entries() == []


def test_after_a_crash_a_restart_restores_every_kind(tmp_path):
    first = make_node(tmp_path)
    first.act.apply("llc", [Action("BE", "resctrl.l3", "0=3;1=3")])
    first.act.apply("shaper", [Action("eth0/1:20", "tc.htb.ceil", "2000000000")])
    first.act.apply("be_suppress", [Action("be.slice", "cpu.max", "20000 100000")])
    # koordd is killed here: no restore, the journal on disk is all that is left.
    lines = [json.loads(x) for x in (first.state / RestoreJournal.FILE).read_text().splitlines()]
    assert [rec["hold"]["kind"] for rec in lines[1:]] == ["resctrl", "tc", "cgroup"]

    again = make_node(tmp_path, kernels=SimpleNamespace(tree=first.tree, resctrl=first.resctrl, tc=first.tc))
    assert {(h.kind, h.target) for h in again.act.journal.entries()} == \
        {("resctrl", "BE"), ("tc", "eth0/1:20"), ("cgroup", "be.slice")}
    out = again.act.restore_all("left changed by a previous run")
    assert [(d.kind, d.outcome) for d in out] == [("cgroup", RESTORED), ("tc", RESTORED), ("resctrl", RESTORED)]
    assert schemata(again) == f"L3:{FULL}" and again.tc.classes[("eth0", "1:20")] == again.tc.link_bps
    assert again.tree.read("be.slice", "cpu", "cpu.max").strip() == "max 100000"
    assert again.act.journal.entries() == []


def test_dry_run_writes_no_kind(tmp_path):
    node = make_node(tmp_path, dry_run=True)
    out = node.act.apply("llc", [Action("BE", "resctrl.l3", "0=3;1=3")]) + \
        node.act.apply("shaper", [Action("eth0/1:20", "tc.htb.ceil", "1000")])
    assert [(d.kind, d.outcome) for d in out] == [("resctrl", DRY_RUN), ("tc", DRY_RUN)]
    assert schemata(node) == f"L3:{FULL}" and node.tc.classes[("eth0", "1:20")] == node.tc.link_bps
    assert node.act.journal.entries() == [] and not (node.state / RestoreJournal.FILE).exists()


def test_a_held_target_whose_backend_is_gone_stays_journaled(tmp_path):
    first = make_node(tmp_path)
    first.act.apply("llc", [Action("BE", "resctrl.l3", "0=3;1=3")])
    # Restarted without the package that brought resctrl: the entry is kept for a later start.
    again = make_node(tmp_path, kernels=SimpleNamespace(tree=first.tree, resctrl=first.resctrl, tc=first.tc),
                      backends=[CgroupBackend(first.tree.fs)])
    [d] = again.act.restore_all("stopping")
    assert d.outcome == REFUSED and "no backend of kind 'resctrl'" in d.error
    assert [h.kind for h in again.act.journal.entries()] == ["resctrl"]
    assert again.act.restore_all("stopping") == []          # said once


def test_unknown_knob_is_refused_with_its_name(tmp_path):
    node = make_node(tmp_path)
    [d] = node.act.apply("x", [Action("BE", "resctrl.mba", "50")])
    assert d.outcome == REFUSED and "no backend serves it" in d.error


def test_parents_and_children_of_one_backend_are_ordered(tmp_path):
    """HTB: a child's ceil never above its parent's while both change (same rule as cgroups)."""
    tc = FakeNetlinkKernel(link_bps=100)
    tc.classes = {("eth0", "1:1"): 100, ("eth0", "1:1/1:20"): 100}

    class Tree(FakeNetlink):
        def parent(self, target):
            head, _, _ = target.rpartition("/")
            return head if "/" in head else None

    node = make_node(tmp_path, backends=[Tree(tc)])
    down = [Action("eth0/1:1", "tc.htb.ceil", "50"), Action("eth0/1:1/1:20", "tc.htb.ceil", "40")]
    assert [d.target for d in node.act.apply("x", down)] == ["eth0/1:1/1:20", "eth0/1:1"]


# --- the registry -------------------------------------------------------------------------------------

class Sysfs(FakeNetlink):
    kind = "sysfs"
    knobs = {"sched_ext.ops": KnobSpec("sched_ext.ops", "the node's sched_ext scheduler")}


def test_backends_refuse_a_second_kind_or_a_knob_served_twice(tmp_path):
    tc = FakeNetlinkKernel()
    b = Backends([FakeNetlink(tc)])
    with pytest.raises(ValueError, match="already registered"):
        b.add(FakeNetlink(tc))

    class Clash(Sysfs):
        knobs = {"tc.htb.ceil": KnobSpec("tc.htb.ceil", "again")}
    with pytest.raises(ValueError, match="already served by tc"):
        b.add(Clash(tc))


class Tc(FakeNetlink):
    """As a third-party package ships it: made with no arguments."""

    def __init__(self):
        super().__init__(FakeNetlinkKernel())


class Broken(Sysfs):
    kind = "broken"

    def __init__(self):
        raise RuntimeError("no netlink here")


def test_third_party_backends_come_from_entry_points(tmp_path, monkeypatch, caplog):
    class EP:
        def __init__(self, name, cls):
            self.name, self.value, self._cls = name, f"pkg:{name}", cls

        def load(self):
            return self._cls

    monkeypatch.setattr(entry_point_loader, "entry_points",
                        lambda group: [EP("tc", Tc), EP("broken", Broken), EP("misnamed", Tc)]
                        if group == entry_point_loader.BACKENDS else [])
    tree = FakeCgroups(tmp_path, "v2")
    got = load_backends(CgroupBackend(tree.fs))
    assert got.kinds() == ("cgroup", "tc") and got.for_knob("tc.htb.ceil").kind == "tc"
    assert "no netlink here" in caplog.text and "backend broken" in caplog.text
    assert "backend misnamed: entry point names class pkg:misnamed whose kind is 'tc'" in caplog.text
    got.close()
    assert not got.of_kind("tc").socket_open                     # held resources released on stop


def test_a_backend_that_fails_to_probe_loses_its_knobs_only(tmp_path):
    class Bad(FakeNetlink):
        def probe(self):
            raise OSError("netlink socket refused")
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    got = Backends([CgroupBackend(tree.fs), Bad(FakeNetlinkKernel())]).probe()
    assert "tc.htb.ceil" in got and "failed to probe" in got["tc.htb.ceil"] and "cpu.max" not in got


# --- the runner and ownership ----------------------------------------------------------------------

class Partitioner(Loop):
    """Gives BE's resctrl group 2 ways while BE exists, and the node's BE tc class a ceiling."""
    name = "partitioner"

    @staticmethod
    def writes(settings):
        return frozenset({("BE", "resctrl.l3"), (NODE, "tc.htb.ceil")})

    @staticmethod
    def decide(snapshot, settings, state):
        return [Action("BE", "resctrl.l3", "0=3;1=3"), Action("eth0/1:20", "tc.htb.ceil", "1000000")]


def test_non_cgroup_targets_are_not_released_as_strays(tmp_path):
    """No class "contains" a resctrl group or a tc class: the runner leaves them to the loop that holds
    them (it released every such target on every tick before)."""
    node = make_node(tmp_path)
    runner = Runner({"partitioner": Partitioner}, node.act)
    runner.configure(parse_config("[loops.partitioner]\nenabled = true\n", "k.toml", {"partitioner": Partitioner}))
    snap = Snapshot(1.0, 0.0, NodeSample(2, 0.5), {"be.slice": CgroupSample("be.slice", "BE")})
    runner.tick([runner.runs["partitioner"]], snap)
    runner.tick([runner.runs["partitioner"]], snap)
    assert {h.kind for h in node.act.journal.entries()} == {"resctrl", "tc"}
    assert schemata(node) == "L3:0=3;1=3"
    runner.stop("partitioner", "loop disabled")
    assert node.act.journal.entries() == [] and schemata(node) == f"L3:{FULL}"


def test_two_loops_claiming_a_node_wide_knob_is_a_config_error():
    class Other(Partitioner):
        name = "other"
    registry = {"partitioner": Partitioner, "other": Other}
    with pytest.raises(Exception, match="knob 'tc.htb.ceil' of the node"):
        parse_config("[loops.partitioner]\nenabled = true\n[loops.other]\nenabled = true\n", "k.toml", registry)


# --- the per-task write every TaskBackend makes (koordd/core/backend.py TaskWrite) ---------------------

def _task_write(outcomes, gone=(ProcessLookupError,)):
    """A TaskWrite over tasks 1, 2, ... whose writes end as `outcomes` say: None lands, False is a task
    whose id is another's now, an exception is raised."""
    w = TaskWrite(gone)

    def write(i):
        if isinstance(outcomes[i], BaseException):
            raise outcomes[i]
        return outcomes[i]
    for i in range(len(outcomes)):
        w.put(f"thread {i + 1}", write, i)
    return w


def test_a_task_write_skips_tasks_gone_and_names_the_first_refusal_with_the_count():
    eperm = OSError(errno.EPERM, "Operation not permitted")
    w = _task_write([ProcessLookupError(7), OSError(errno.ESRCH, "No such process"), eperm,
                     OSError(errno.EINVAL, "Invalid argument")])
    assert w.done == 0 and [t for t, _ in w.errors] == ["thread 3", "thread 4"]
    with pytest.raises(OSError) as e:
        w.refused("thread(s) refused sched_policy idle", lambda e: "; why" if e.errno == errno.EPERM else "")
    assert not isinstance(e.value, PartialWrite) and e.value.errno == errno.EPERM
    assert e.value.strerror == "2 thread(s) refused sched_policy idle (first: thread 3: Operation not permitted; why)"


def test_a_task_write_that_landed_somewhere_before_a_refusal_is_a_partial_write():
    w = _task_write([None, OSError(errno.EACCES, "Permission denied")])
    with pytest.raises(PartialWrite, match=r"^\[Errno 13\] 1 x \(first: thread 2: Permission denied\)$"):
        w.refused("x")
    # A write that says it did not happen (False: the pid is another process's now) is not one that landed.
    with pytest.raises(OSError) as e:
        _task_write([False, OSError(errno.EACCES, "Permission denied")]).refused("x")
    assert not isinstance(e.value, PartialWrite)


def test_a_task_write_with_no_refusal_raises_nothing_and_gone_may_name_more_errors():
    _task_write([None, ProcessLookupError(1)]).refused("x")
    w = _task_write([FileNotFoundError(errno.ENOENT, "gone"), None], gone=(FileNotFoundError, ProcessLookupError))
    assert w.done == 1 and w.errors == []
    w.refused("x")
    assert [t for t, _ in _task_write([FileNotFoundError(errno.ENOENT, "gone")]).errors] == ["thread 1"]


def test_tasks_read_their_one_value_mixed_where_they_differ_and_empty_where_there_is_none():
    class Tasks(TaskBackend):
        kind, knobs = "tasks", {"k": KnobSpec("k", "a task's knob")}

    assert Tasks().common([]) == "none" and Tasks().common(["a", "a"]) == "a" and Tasks().common(["a", "b"]) == "mixed"
