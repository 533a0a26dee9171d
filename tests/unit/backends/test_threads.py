"""The threads backend (`sched_policy` of a cgroup's threads) on fake trees with a fake scheduler:
which threads it sees, what it reads, which it moves, how it restores, and the actuator's pipeline
around it (skip when nothing is to change, journal, restore)."""
from __future__ import annotations

import errno
import os

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import CgroupBackend
from koordd.backends.threads import ThreadPolicyBackend
from koordd.core.backend import Backends, InvalidValue, PartialWrite, TargetGone, Unsupported
from koordd.core.decisions import APPLIED, REFUSED, RESTORED
from koordd.core.loop import Action

OTHER, BATCH, IDLE, FIFO, EXT = os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE, os.SCHED_FIFO, 7


class FakeSched:
    """Thread policies by tid; a tid in `gone` has exited, one in `refuse` answers EPERM."""

    def __init__(self, policies: dict[int, int]):
        self.policies = dict(policies)
        self.gone: set[int] = set()
        self.refuse: set[int] = set()
        self.calls: list[tuple[int, int]] = []

    def sched_getscheduler(self, tid: int) -> int:
        if tid in self.gone or tid not in self.policies:
            raise ProcessLookupError(tid)
        return self.policies[tid]

    def sched_setscheduler(self, tid: int, policy: int, param) -> None:
        if tid in self.gone:
            raise ProcessLookupError(tid)
        if tid in self.refuse:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        self.calls.append((tid, policy))
        self.policies[tid] = policy


def threads_file(tree: FakeCgroups) -> tuple[str | None, str]:
    return ("cpu", "tasks") if tree.v1 else (None, "cgroup.threads")


def put_threads(tree: FakeCgroups, cgroup: str, tids) -> None:
    controller, name = threads_file(tree)
    tree.set(cgroup, controller, name, "".join(f"{t}\n" for t in tids))


@pytest.fixture(params=["v2", "hybrid", "v1"])
def rig(request, tmp_path):
    tree = FakeCgroups(tmp_path, request.param).add("be").add("be/pod1").add("be/pod1/c1").add("ls")
    for cg in ("be", "be/pod1", "be/pod1/c1", "ls"):
        put_threads(tree, cg, [])
    put_threads(tree, "be/pod1", [11, 12])
    put_threads(tree, "be/pod1/c1", [13])
    put_threads(tree, "ls", [21])
    sched = FakeSched({11: OTHER, 12: OTHER, 13: OTHER, 21: OTHER})
    return tree, sched, ThreadPolicyBackend(tree.fs, sched=sched)


def test_threads_of_a_cgroup_and_everything_below_it(rig):
    tree, sched, b = rig
    assert sorted(b.threads("be")) == [11, 12, 13]
    assert b.threads("ls") == [21]
    with pytest.raises(TargetGone):
        b.threads("nope")


def test_reads_the_shared_policy_mixed_or_none(rig):
    tree, sched, b = rig
    assert b.read("be", "sched_policy") == "normal"
    sched.policies[13] = BATCH
    assert b.read("be", "sched_policy") == "mixed"          # normal and batch
    assert b.read("be/pod1/c1", "sched_policy") == "batch"
    put_threads(tree, "be/pod1/c1", [])
    assert b.read("be/pod1/c1", "sched_policy") == "none"
    # Real-time threads are not koordd's to move, and do not count.
    sched.policies[13] = FIFO
    assert b.read("be/pod1", "sched_policy") == "normal"


def test_write_moves_every_movable_thread_and_skips_rt_and_the_exited(rig):
    tree, sched, b = rig
    sched.policies[12] = FIFO
    b.write("be", "sched_policy", "idle")
    assert sched.policies == {11: IDLE, 12: FIFO, 13: IDLE, 21: OTHER}
    assert b.read("be", "sched_policy") == "idle"
    # A thread that exits between listing and moving is skipped; nothing else fails.
    put_threads(tree, "be/pod1", [11, 14])
    sched.policies[14] = OTHER
    sched.gone.add(14)
    sched.calls.clear()
    b.write("be", "sched_policy", "normal")
    assert sched.calls == [(11, OTHER), (13, OTHER)]


def test_a_refused_thread_is_an_error_naming_it_after_the_others_moved(rig):
    tree, sched, b = rig
    sched.refuse.add(12)
    with pytest.raises(OSError) as e:
        b.write("be", "sched_policy", "idle")
    assert e.value.errno == errno.EPERM and "thread 12" in str(e.value) and "1 thread(s)" in str(e.value)
    assert isinstance(e.value, PartialWrite)                # the others moved
    assert sched.policies[11] == IDLE and sched.policies[13] == IDLE
    sched.refuse = {11, 13}
    with pytest.raises(OSError) as e:
        b.write("be", "sched_policy", "normal")
    assert not isinstance(e.value, PartialWrite)            # none moved


def test_values(rig):
    tree, sched, b = rig
    assert b.validate("be", "sched_policy", " Idle ") == "idle"
    for bad in ("fifo", "mixed", ""):
        with pytest.raises(InvalidValue):
            b.validate("be", "sched_policy", bad)
    # Restoring "mixed" (threads that had several policies) puts them back to normal.
    b.write("be", "sched_policy", "idle")
    b.write("be", "sched_policy", "mixed")
    assert {sched.policies[t] for t in (11, 12, 13)} == {OTHER}
    assert b.same("none", "idle") and b.same("idle", "idle") and not b.same("normal", "idle")


def actuator(tmp_path, tree, backend):
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    act = Actuator(Backends([CgroupBackend(tree.fs), backend]), journal,
                   DecisionLog(state, send=lambda message, **fields: None))
    return act, journal


def test_through_the_actuator_journaled_corrected_and_restored(rig, tmp_path):
    tree, sched, b = rig
    act, journal = actuator(tmp_path, tree, b)
    want = Action("be/pod1", "sched_policy", "idle", {"class": "BE"}, "BE threads idle")
    [d] = act.apply("qos_baseline", [want])
    assert (d.kind, d.target, d.old, d.new, d.outcome) == ("threads", "be/pod1", "normal", "idle", APPLIED)
    assert [(h.kind, h.target, h.knob, h.original) for h in journal.entries()] == \
        [("threads", "be/pod1", "sched_policy", "normal")]
    assert act.apply("qos_baseline", [want]) == []                  # in place: nothing recorded
    # A new thread of the workload (here one that did not inherit the policy) is brought in line.
    put_threads(tree, "be/pod1", [11, 12, 15])
    sched.policies[15] = OTHER
    [d] = act.apply("qos_baseline", [want])
    assert (d.old, d.new) == ("mixed", "idle") and sched.policies[15] == IDLE
    assert journal.entries()[0].original == "normal"                # the first original stays
    [d] = act.restore_all("stopping")
    assert (d.knob, d.new, d.outcome) == ("sched_policy", "normal", RESTORED)
    assert {sched.policies[t] for t in (11, 12, 15)} == {OTHER} and journal.entries() == []


def test_an_empty_cgroup_asks_for_nothing_until_threads_arrive(rig, tmp_path):
    tree, sched, b = rig
    act, journal = actuator(tmp_path, tree, b)
    want = Action("be", "sched_policy", "idle", {}, "BE threads idle")
    put_threads(tree, "be/pod1", [])
    put_threads(tree, "be/pod1/c1", [])
    assert act.apply("qos_baseline", [want]) == [] and journal.entries() == []
    put_threads(tree, "be/pod1", [11])
    [d] = act.apply("qos_baseline", [want])
    assert d.outcome == APPLIED and sched.policies[11] == IDLE


def test_a_refusal_is_recorded_once_with_the_kernels_words(rig, tmp_path):
    tree, sched, b = rig
    act, journal = actuator(tmp_path, tree, b)
    sched.refuse.add(11)
    want = Action("be/pod1", "sched_policy", "idle", {}, "BE threads idle")
    [d] = act.apply("qos_baseline", [want])
    assert d.outcome == REFUSED and "thread 11" in d.error
    assert act.apply("qos_baseline", [want]) == []
    # Threads 12 and 13 did move: the journal keeps the original so a restore can put them back.
    assert [h.original for h in journal.entries()] == ["normal"]
    sched.refuse.clear()
    act.restore_all("stopping")
    assert {sched.policies[t] for t in (11, 12, 13)} == {OTHER}
    # Nothing moved at all: nothing is journaled.
    sched.refuse = {11, 12, 13}
    [d] = act.apply("qos_baseline", [want])
    assert d.outcome == REFUSED and journal.entries() == []


def with_sched_ext(b: ThreadPolicyBackend, tmp_path, state: str | None) -> ThreadPolicyBackend:
    """The backend reading a fake /sys whose kernel has sched_ext in `state`, or none (None)."""
    b.sys_root = tmp_path / "sys"
    if state is not None:
        (b.sys_root / "kernel/sched_ext").mkdir(parents=True)
        (b.sys_root / "kernel/sched_ext/state").write_text(state + "\n")
    return b


def test_ext_is_refused_on_a_kernel_without_sched_ext(rig, tmp_path):
    tree, sched, b = rig
    with_sched_ext(b, tmp_path, None)
    with pytest.raises(Unsupported, match="CONFIG_SCHED_CLASS_EXT"):
        b.validate("ls", "sched_policy", "ext")
    act, journal = actuator(tmp_path, tree, b)
    [d] = act.apply("sched_ext", [Action("ls", "sched_policy", "ext", {}, "LS on sched_ext")])
    assert d.outcome == REFUSED and "sched_ext" in d.error and journal.entries() == []
    assert sched.calls == []


def test_ext_is_set_read_and_restored_with_sched_ext_disabled_or_enabled(rig, tmp_path):
    tree, sched, b = rig
    with_sched_ext(b, tmp_path, "disabled")          # no BPF scheduler yet: the kernel runs them as fair
    assert b.validate("ls", "sched_policy", "ext") == "ext"
    act, journal = actuator(tmp_path, tree, b)
    want = Action("be", "sched_policy", "ext", {}, "BE on sched_ext")
    sched.policies[12] = FIFO
    [d] = act.apply("sched_ext", [want])
    assert (d.old, d.new, d.outcome) == ("normal", "ext", APPLIED)
    assert sched.policies == {11: EXT, 12: FIFO, 13: EXT, 21: OTHER}   # real-time stays
    assert b.read("be", "sched_policy") == "ext"
    sched.policies[13] = OTHER                                      # a new thread that did not inherit it
    assert b.read("be", "sched_policy") == "mixed"
    [d] = act.apply("sched_ext", [want])
    assert (d.old, d.new) == ("mixed", "ext") and sched.policies[13] == EXT
    [d] = act.restore_all("stopping")
    assert (d.new, d.outcome) == ("normal", RESTORED)
    assert sched.policies == {11: OTHER, 12: FIFO, 13: OTHER, 21: OTHER}


def test_ext_refused_by_a_seccomp_filter_says_where_to_look(rig, tmp_path):
    tree, sched, b = rig
    with_sched_ext(b, tmp_path, "disabled")
    sched.refuse.add(21)
    with pytest.raises(OSError, match="RestrictRealtime"):
        b.write("ls", "sched_policy", "ext")
    with pytest.raises(OSError) as e:
        b.write("ls", "sched_policy", "idle")
    assert "RestrictRealtime" not in str(e.value)
