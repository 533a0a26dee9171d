"""Issue 25, the restore journal's part: restore only what koordd wrote, on the object it wrote it on
(3), in apply_round's order (5), never crash on a journal line (6), restores checked as writes are (7),
never discard holds (8), notice a journal replaced or removed (12), and what a kill -9 leaves (13).
On fake trees; the real kernel's part is tests/kernel/test_trust_journal_kernel.py."""
from __future__ import annotations

import errno
import itertools
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act import journal as state_mod
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog, read_decisions
from koordd.act.journal import Held, JournalUnreadable, RestoreJournal, note_move, read_held
from koordd.backends.cgroup_knobs import KNOBS, CgroupBackend, Knob
from koordd.core.decisions import APPLIED, LEFT, REFUSED, RESTORED
from koordd.core.loop import Action, restore
from koordd.kernel.cgroupfs import CgroupFS, CgroupGone

BE, JOB = "be.slice", "be.slice/job"
_graves = itertools.count()


def make_rig(tmp_path, tree=None, mode="v2"):
    tree = tree or FakeCgroups(tmp_path, mode).add(JOB)
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    act = Actuator(tree.fs, journal, DecisionLog(state, send=lambda *a, **k: None))
    return SimpleNamespace(tree=tree, state=state, journal=journal, act=act)


def crash_and_start_again(tmp_path, rig):
    """A kill -9: the journal on disk as the dead process left it (no stop, no close); a fresh start."""
    return make_rig(tmp_path, rig.tree)


def recreate(tree: FakeCgroups, cgroup: str) -> None:
    """systemd removes and makes `cgroup` again. The old directories are kept (moved out of the tree) so the
    new ones get new inodes, as kernfs gives a new cgroup a new id, never one used before."""
    graves = tree.root.parent / "graves"
    graves.mkdir(exist_ok=True)
    for h in tree.hierarchies():
        (h / cgroup).rename(graves / str(next(_graves)))
    tree.add(cgroup)


def cpu_max(rig, cgroup=BE) -> str:
    return KNOBS["cpu.max"].read(rig.tree.fs, cgroup)


def cap(value="2000 100000", cgroup=BE) -> Action:
    return Action(cgroup, "cpu.max", value, {}, "cap")


def outcomes(rig) -> list[tuple[str, str, str]]:
    return [(d["target"], d["knob"], d["outcome"]) for d in read_decisions(rig.state)]


# --- 3: restore only what koordd wrote, on the object it wrote it on ------------------------------

@pytest.mark.parametrize("mode", ["v2", "v1"])
def test_a_slice_made_anew_with_its_own_quota_after_a_crash_is_left_with_a_decision(tmp_path, mode):
    """kill -9, then systemd makes be.slice again with CPUQuota=50%: the next start must not write
    koordd's original (max) over the new slice's 50000."""
    rig = make_rig(tmp_path, mode=mode)
    rig.act.apply("be_suppress", [cap()])
    recreate(rig.tree, BE)
    rig.tree.set(BE, "cpu", "cpu.max", "50000 100000\n") if mode == "v2" else \
        rig.tree.set(BE, "cpu", "cpu.cfs_quota_us", "50000\n")
    again = crash_and_start_again(tmp_path, rig)
    [d] = again.act.restore_all("koordd stopping")
    assert cpu_max(again) == "50000 100000"
    assert (d.outcome, d.old, d.new) == (LEFT, "50000 100000", "max 100000") and "made anew" in d.error
    assert again.journal.entries() == [] and read_held(again.state)[0] == []


def test_a_value_an_operator_set_after_a_release_that_could_not_be_appended_is_left(tmp_path, monkeypatch):
    """The release of a restore is lost to a full disk; an operator then sets a quota; the next start
    finds koordd's hold on disk: the operator's value is not koordd's to overwrite."""
    rig = make_rig(tmp_path)
    rig.act.apply("be_suppress", [cap()])
    real_write = os.write
    monkeypatch.setattr(state_mod.os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full"))
                        if fd == rig.journal._fd else real_write(fd, data))
    [d] = rig.act.restore_all("koordd stopping")
    assert d.outcome == RESTORED and [h["target"] for h in read_held(rig.state)[0]] == [BE]   # the hold stays on disk
    monkeypatch.undo()
    rig.tree.set(BE, "cpu", "cpu.max", "30000 100000\n")                  # the operator
    again = crash_and_start_again(tmp_path, rig)
    [d] = again.act.restore_all("koordd stopping")
    assert cpu_max(again) == "30000 100000"
    assert d.outcome == LEFT and "changed by someone else since koordd wrote '2000 100000'" in d.error
    assert "reads '30000 100000'" in d.error


def test_each_new_value_is_journaled_before_it_is_written_and_only_when_it_changes(tmp_path, monkeypatch):
    rig = make_rig(tmp_path)
    rig.act.apply("be_suppress", [cap("2000 100000")])
    records = lambda: (rig.state / RestoreJournal.FILE).read_text().splitlines()   # noqa: E731
    n = len(records())
    seen = []
    original_write = Knob.write
    monkeypatch.setattr(Knob, "write", lambda self, fs, cg, v: (seen.append(read_held(rig.state)[0][0]["written"]),
                                                                original_write(self, fs, cg, v)))
    syncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(state_mod.os, "fsync", lambda fd: syncs.append(fd) or real_fsync(fd))
    rig.act.apply("be_suppress", [cap("3000 100000")])
    assert seen == [("2000 100000", "3000 100000")]       # either may be what a crash right here leaves
    assert len(records()) == n + 1 and syncs == []        # in the page cache: it outlives a kill -9
    rig.tree.set(BE, "cpu", "cpu.max", "max 100000\n")    # someone else; koordd writes its value back
    rig.act.apply("be_suppress", [cap("3000 100000")])
    assert len(records()) == n + 1                        # the same value again: no record


@pytest.mark.parametrize("where", ["after the record, before the write", "after the write"])
def test_a_crash_around_a_new_value_of_a_held_knob_is_still_restored(tmp_path, monkeypatch, where):
    rig = make_rig(tmp_path)
    rig.act.apply("be_suppress", [cap("2000 100000")])
    original_write = Knob.write

    class Killed(BaseException):
        pass

    def write(self, fs, cg, v):
        if where == "after the write":
            original_write(self, fs, cg, v)
        raise Killed()
    monkeypatch.setattr(Knob, "write", write)
    with pytest.raises(Killed):
        rig.act.apply("be_suppress", [cap("3000 100000")])
    monkeypatch.undo()
    again = crash_and_start_again(tmp_path, rig)
    [d] = again.act.restore_all("koordd stopping")
    assert d.outcome == RESTORED and cpu_max(again) == "max 100000"


def test_a_journal_of_version_3_restores_as_before(tmp_path):
    """No identity, no value written: put back wherever the knob differs from the original, as 3 did."""
    rig = make_rig(tmp_path)
    rig.state.mkdir()
    hold = {"target": BE, "knob": "cpu.max", "original": "max 100000", "owner": "be_suppress", "since": 1.0,
            "kind": "cgroup"}
    (rig.state / RestoreJournal.FILE).write_text(json.dumps({"version": 3}) + "\n" + json.dumps({"hold": hold}) + "\n")
    rig.tree.set(BE, "cpu", "cpu.max", "30000 100000\n")
    again = crash_and_start_again(tmp_path, rig)
    [d] = again.act.restore_all("koordd stopping")
    assert d.outcome == RESTORED and cpu_max(again) == "max 100000"


def test_a_target_made_anew_while_koordd_runs_is_held_from_its_own_value(tmp_path):
    rig = make_rig(tmp_path)
    rig.act.apply("be_suppress", [cap("2000 100000")])
    recreate(rig.tree, BE)
    rig.tree.set(BE, "cpu", "cpu.max", "50000 100000\n")
    rig.act.apply("be_suppress", [cap("3000 100000")])
    assert rig.journal.get(BE, "cpu.max").original == "50000 100000"
    rig.act.restore_all("koordd stopping")
    assert cpu_max(rig) == "50000 100000"


def test_a_knob_the_kernel_rewrites_with_another_is_restored_after_a_crash_between_the_two(tmp_path, monkeypatch):
    """koordd set BE's weight, then idle; at stop idle goes back and the kernel resets the weight (100),
    then a kill before the weight's own restore: the next start still puts the weight's original back,
    since the journal said before the idle restore that the weight's value is no longer koordd's to know."""
    rig = make_rig(tmp_path)
    rig.tree.set(BE, "cpu", "cpu.weight", "50\n")
    real = CgroupFS.write

    class Killed(BaseException):
        pass

    def write(self, controller, cg, name, text):        # the kernel: leaving idle sets the default weight
        real(self, controller, cg, name, text)
        if name == "cpu.idle":
            real(self, controller, cg, "cpu.weight", "100" if text == "0" else "1")
            if text == "0":
                raise Killed()
    monkeypatch.setattr(CgroupFS, "write", write)
    rig.act.apply("qos_baseline", [Action(BE, "cpu.weight", "10"), Action(BE, "cpu.idle", "1")])
    with pytest.raises(Killed):
        rig.act.restore_all("koordd stopping")
    monkeypatch.undo()
    again = crash_and_start_again(tmp_path, rig)
    assert [(d.knob, d.outcome) for d in again.act.restore_all("koordd stopping")] == [("cpu.weight", RESTORED)]
    assert KNOBS["cpu.weight"].read(again.tree.fs, BE) == "50"


def test_a_v1_quota_cut_short_between_its_two_files_is_still_koordds(tmp_path, monkeypatch):
    """v1 cpu.max is the period, then the quota: a kill between them leaves the new period with the old
    quota, which is koordd's doing and goes back."""
    rig = make_rig(tmp_path, mode="v1")
    rig.act.apply("be_suppress", [cap("2000 100000")])
    real = CgroupFS.write

    class Killed(BaseException):
        pass

    def write(self, controller, cg, name, text):
        if name == "cpu.cfs_quota_us":
            raise Killed()
        real(self, controller, cg, name, text)
    monkeypatch.setattr(CgroupFS, "write", write)
    with pytest.raises(Killed):
        rig.act.apply("be_suppress", [cap("1500 50000")])
    monkeypatch.undo()
    assert cpu_max(rig) == "2000 50000"
    again = crash_and_start_again(tmp_path, rig)
    [d] = again.act.restore_all("koordd stopping")
    assert d.outcome == RESTORED and cpu_max(again) == "max 100000"


# --- 5: restore order ------------------------------------------------------------------------------

def v1_kernel_rule(monkeypatch, tree):
    """What the fake cannot do alone: v1 refuses a child's quota above its parent's (EINVAL)."""
    real = CgroupFS.write

    def write(self, controller, cg, name, text):
        if name == "cpu.cfs_quota_us" and "/" in cg and int(text) != -1:
            parent = int(tree.read(cg.rpartition("/")[0], "cpu", "cpu.cfs_quota_us"))
            if parent != -1 and int(text) > parent:
                raise OSError(errno.EINVAL, "Invalid argument")
        real(self, controller, cg, name, text)
    monkeypatch.setattr(CgroupFS, "write", write)


def test_restore_all_raises_a_parent_before_its_child(tmp_path, monkeypatch):
    """The parent held first (older), the child capped later (newer), the parent lowered since: newest
    first would put the child's 0.8 CPU back under the parent's 0.2, refused, left at 0.01 CPU."""
    rig = make_rig(tmp_path, mode="v1")
    v1_kernel_rule(monkeypatch, rig.tree)
    rig.tree.set(JOB, "cpu", "cpu.cfs_quota_us", "80000\n")            # the pod's own limit
    rig.act.apply("be_suppress", [cap("90000 100000", BE)])
    rig.act.apply("be_suppress", [cap("1000 100000", JOB)])             # an antagonist
    rig.act.apply("be_suppress", [cap("20000 100000", BE)])
    done = rig.act.restore_all("koordd stopping")
    assert [(d.target, d.outcome) for d in done] == [(BE, RESTORED), (JOB, RESTORED)]
    assert cpu_max(rig, JOB) == "80000 100000" and cpu_max(rig, BE) == "max 100000"


def test_a_restore_and_a_write_in_one_round_go_in_one_order(tmp_path, monkeypatch):
    """An antagonist's cap ends in the round its parent's cap is raised: the parent first."""
    rig = make_rig(tmp_path, mode="v1")
    v1_kernel_rule(monkeypatch, rig.tree)
    rig.tree.set(JOB, "cpu", "cpu.cfs_quota_us", "80000\n")
    rig.act.apply("be_suppress", [cap("90000 100000", BE)])
    rig.act.apply("be_suppress", [cap("1000 100000", JOB)])
    rig.act.apply("be_suppress", [cap("20000 100000", BE)])
    done = rig.act.apply_round([("be_suppress", [restore(JOB, "cpu.max", "antagonist gone"),
                                                  cap("95000 100000", BE)])])["be_suppress"]
    assert [(d.target, d.outcome) for d in done] == [(BE, APPLIED), (JOB, RESTORED)]
    assert cpu_max(rig, JOB) == "80000 100000"


# --- 6: a journal line of the wrong type --------------------------------------------------------

GOOD = {"target": "a", "knob": "cpu.max", "original": "max 100000", "owner": "be_suppress", "since": 1.0,
        "kind": "cgroup"}


@pytest.mark.parametrize("bad", [
    {"hold": {**GOOD, "target": "b", "original": 0}},
    {"hold": {**GOOD, "target": "b", "original": None}},
    {"hold": {**GOOD, "target": 5}},
    {"hold": {**GOOD, "target": "b", "since": True}},
    {"hold": {**GOOD, "target": "b", "knob": ["cpu.max"]}},
    {"hold": {**GOOD, "target": "b", "written": [1]}},
    {"hold": {**GOOD, "target": "b", "identity": 7}},
    {"hold": None}, None, 5, "hold", [], {},
    {"release": {"kind": "cgroup", "target": 5, "knob": "cpu.max"}},
    {"wrote": {"kind": "cgroup", "target": "a", "knob": "cpu.max", "values": "2000 100000"}},
    {"hold": GOOD, "release": GOOD},
])
def test_a_line_of_the_wrong_shape_is_set_aside_and_the_rest_restored(tmp_path, bad, caplog):
    rig = make_rig(tmp_path)
    rig.tree.add("a").add("c")
    for cg in ("a", "c"):
        rig.tree.set(cg, "cpu", "cpu.max", "2000 100000\n")
    rig.state.mkdir()
    lines = [{"version": 3}, {"hold": GOOD}, bad, {"hold": {**GOOD, "target": "c"}}]
    (rig.state / RestoreJournal.FILE).write_text("".join(json.dumps(r) + "\n" for r in lines))
    again = crash_and_start_again(tmp_path, rig)
    assert [h.target for h in again.journal.entries()] == ["a", "c"]
    assert f"{RestoreJournal.FILE}:3: " in caplog.text
    assert len(list(again.state.glob(f"{RestoreJournal.FILE}.corrupt.*"))) == 1
    assert [d.outcome for d in again.act.restore_all("stop")] == [RESTORED, RESTORED]
    assert cpu_max(again, "a") == cpu_max(again, "c") == "max 100000"


def test_a_last_line_of_the_wrong_shape_is_damage_not_a_torn_write(tmp_path):
    """Only a line that does not parse can be a write cut short; one that parses is set aside."""
    rig = make_rig(tmp_path)
    rig.state.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in ({"version": 4}, {"hold": GOOD}, {"hold": {**GOOD, "original": 0}}))
    (rig.state / RestoreJournal.FILE).write_text(text)
    assert [h.target for h in RestoreJournal(rig.state).entries()] == ["a"]
    assert len(list(rig.state.glob(f"{RestoreJournal.FILE}.corrupt.*"))) == 1


def test_a_journal_that_does_not_end_in_a_newline_is_rewritten_before_the_next_append(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / RestoreJournal.FILE).write_text(json.dumps({"version": 4}) + "\n" + json.dumps({"hold": GOOD}))
    j = RestoreJournal(state)
    j.add(Held("c", "cpu.max", "max 100000", "be_suppress", 1.0))
    assert [h.target for h in RestoreJournal(state).entries()] == ["a", "c"]


# --- 7: restores are checked as writes are -----------------------------------------------------------

def forge(rig, *holds: dict) -> None:
    """Holds as one with write access to the state_dir would forge them: with the target's current identity
    and value, so that only the checks a write goes through stand in the way."""
    rig.state.mkdir(exist_ok=True)
    backend = rig.act.backends.of_kind("cgroup")
    lines = [{"version": 4}]
    for h in holds:
        current = backend.read(h["target"], h["knob"])
        lines.append({"hold": {"owner": "be_suppress", "since": 1.0, "kind": "cgroup", "written": [current],
                               "identity": backend.identity(h["target"], h["knob"]), **h}})
    (rig.state / RestoreJournal.FILE).write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.mark.parametrize("hold, why", [
    ({"target": "system.slice", "knob": "memory.max", "original": "4096"}, "protected: would cap the memory of"),
    ({"target": "system.slice", "knob": "cgroup.freeze", "original": "1"}, "protected: would freeze"),
    ({"target": "system.slice/koordd.service", "knob": "cpu.max", "original": "1000 100000"}, "protected: would cap"),
    ({"target": BE, "knob": "cpu.max", "original": "10 100000"}, "is no value of cpu.max"),
    ({"target": BE, "knob": "memory.max", "original": "lots"}, "is no value of memory.max"),
    ({"target": "../../etc", "knob": "cpu.max", "original": "1000 100000"}, "leads out of"),
])
def test_a_forged_hold_is_never_written(tmp_path, hold, why):
    tree = FakeCgroups(tmp_path, "v2").add(JOB).add("system.slice/koordd.service")
    if hold["target"].startswith(".."):
        (tmp_path / "etc").mkdir()
        (tmp_path / "etc" / "cpu.max").write_text("max 100000\n")
    rig = make_rig(tmp_path, tree)
    if not hold["target"].startswith(".."):
        forge(rig, hold)
    else:
        rig.state.mkdir()
        (rig.state / RestoreJournal.FILE).write_text(json.dumps({"version": 4}) + "\n" + json.dumps(
            {"hold": {**hold, "owner": "be_suppress", "since": 1.0}}) + "\n")
    again = crash_and_start_again(tmp_path, rig)
    again.act.processes = {"system.slice/koordd.service": "koordd", "init.scope": "PID 1"}
    before = {p: p.read_bytes() for p in tree.root.rglob("*") if p.is_file()}
    [d] = again.act.restore_all("koordd stopping")
    assert d.outcome == REFUSED and why in d.error and "nothing written" in d.error
    assert {p: p.read_bytes() for p in tree.root.rglob("*") if p.is_file()} == before
    assert again.journal.entries() == []


def test_a_protected_classs_own_raised_limit_still_goes_back(tmp_path):
    """cpu_burst raised an LS pod's quota: putting its base back lowers it, and that is a restore, not a cap."""
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add("ls.slice/pod"))
    rig.tree.set("ls.slice/pod", "cpu", "cpu.max", "50000 100000\n")
    rig.act.protect({"ls.slice": "LS", "ls.slice/pod": "LS"})
    rig.act.apply("cpu_burst", [Action("ls.slice/pod", "cpu.max", "80000 100000")])
    [d] = rig.act.restore_all("koordd stopping")
    assert d.outcome == RESTORED and cpu_max(rig, "ls.slice/pod") == "50000 100000"


@pytest.mark.parametrize("target, knob, original, restored", [
    ("kubepods.slice/pod-ls/ctr", "memory.max", "4096", False),        # inside the LS pod
    ("kubepods.slice/pod-ls", "memory.high", "4096", False),
    ("kubepods.slice/pod-ls", "cpuset.cpus", "0", False),
    ("kubepods.slice/pod-ls", "cpu.max", "50000 100000", True),       # cpu_burst gives its quota back
    ("kubepods.slice/pod-ls/ctr", "cpu.max.burst", "0", True),
])
def test_a_forged_hold_lowers_no_limit_of_a_protected_class_but_its_cpu_quota(tmp_path, target, knob, original,
                                                                               restored):
    """An LS class root and what lies inside it: a restore there may lower only the CPU limits a loop raises
    on protected work (cpu_burst); any other limit a hold says to lower is refused and the hold dropped."""
    tree = FakeCgroups(tmp_path, "v2").add("kubepods.slice/pod-ls/ctr")
    tree.set("kubepods.slice/pod-ls", "cpuset", "cpuset.cpus", "0-1\n")
    tree.set("kubepods.slice/pod-ls/ctr", "cpu", "cpu.max.burst", "20000\n")
    rig = make_rig(tmp_path, tree)
    forge(rig, {"target": target, "knob": knob, "original": original})
    again = crash_and_start_again(tmp_path, rig)
    again.act.protect({"kubepods.slice/pod-ls": "LS"})
    before = again.act.backends.of_kind("cgroup").read(target, knob)
    [d] = again.act.restore_all("koordd stopping")
    now = again.act.backends.of_kind("cgroup").read(target, knob)
    if restored:
        assert d.outcome == RESTORED and now == original
    else:
        assert d.outcome == REFUSED and "protected: would" in d.error and now == before
    assert again.journal.entries() == []


def test_a_restore_the_kernel_rules_refuse_now_is_kept_for_later(tmp_path):
    """A kernel rule (v1: child above parent) is the state of the moment, not a forged value: kept."""
    rig = make_rig(tmp_path, mode="v1")
    rig.tree.set(JOB, "cpu", "cpu.cfs_quota_us", "80000\n")
    rig.act.apply("be_suppress", [cap("1000 100000", JOB)])
    rig.tree.set(BE, "cpu", "cpu.cfs_quota_us", "20000\n")                  # someone capped the parent
    [d] = rig.act.restore_all("koordd stopping")
    assert d.outcome == REFUSED and "exceeds the parent's" in d.error
    assert rig.journal.get(JOB, "cpu.max") is not None and cpu_max(rig, JOB) == "1000 100000"


# --- 8: never discard holds ---------------------------------------------------------------------------

def test_a_journal_of_a_newer_koordd_refuses_the_start_and_is_kept(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    text = json.dumps({"version": 5}) + "\n" + json.dumps({"hold": GOOD}) + "\n"
    (state / RestoreJournal.FILE).write_text(text)
    with pytest.raises(JournalUnreadable, match="version"):
        RestoreJournal(state)
    assert sorted(p.name for p in state.iterdir()) == [RestoreJournal.FILE]
    assert (state / RestoreJournal.FILE).read_text() == text


def test_an_unreadable_journal_refuses_the_daemon_start_with_78(tmp_path):
    """78, as an invalid config: systemd's RestartPreventExitStatus=78 stops the restart loop, and the
    message names the file."""
    tree = FakeCgroups(tmp_path, "v2").add(BE)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    text = json.dumps({"version": 5}) + "\n" + json.dumps({"hold": GOOD}) + "\n"
    (state / RestoreJournal.FILE).write_text(text)
    config = tmp_path / "koordd.toml"
    config.write_text(f'[daemon]\ncgroup_root = "{tree.root}"\nstate_dir = "{state}"\n')
    done = subprocess.run([sys.executable, "-m", "koordd.runtime.daemon", "--config", str(config), "--once"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 78, done.stderr
    assert f"refusing to start: the restore journal {state / RestoreJournal.FILE}" in done.stderr
    assert (state / RestoreJournal.FILE).read_text() == text


def test_holds_of_the_state_dir_before_a_change_are_carried_over(tmp_path):
    """A reload names a new state_dir, then koordd crashes: the start on the new one restores the old one's."""
    rig = make_rig(tmp_path)
    rig.act.apply("be_suppress", [cap()])
    new = tmp_path / "new-state"
    note_move(new, rig.state)
    journal = RestoreJournal(new)
    assert [(h.target, h.original) for h in journal.entries()] == [(BE, "max 100000")]
    assert (rig.state / RestoreJournal.FILE).exists()                  # nothing moves before the first change
    act = Actuator(rig.tree.fs, journal, DecisionLog(new, send=lambda *a, **k: None))
    [d] = act.restore_all("koordd stopping")
    assert d.outcome == RESTORED and cpu_max(rig) == "max 100000"
    assert not (rig.state / RestoreJournal.FILE).exists() and not (new / RestoreJournal.MOVED_FROM).exists()
    assert len(list(rig.state.glob(f"{RestoreJournal.FILE}.carried-over.*"))) == 1
    assert RestoreJournal(new).entries() == []


def test_holds_are_carried_through_a_state_dir_that_made_no_change(tmp_path):
    """A killed with a hold; a koordd on C carried A's holds into memory but crashed (or stopped) before its
    first change, so C's journal is empty and its moved-from.json names A; the next koordd, on B, is
    told of C only. It follows C's moved-from.json to A."""
    rig = make_rig(tmp_path)
    rig.act.apply("be_suppress", [cap()])
    c, b = tmp_path / "state-c", tmp_path / "state-b"
    note_move(c, rig.state)
    assert [h.target for h in RestoreJournal(c).entries()] == [BE]    # read, nothing written to C
    note_move(b, c)
    journal = RestoreJournal(b)
    assert [(h.target, h.original) for h in journal.entries()] == [(BE, "max 100000")]
    act = Actuator(rig.tree.fs, journal, DecisionLog(b, send=lambda *a, **k: None))
    [d] = act.restore_all("koordd stopping")
    assert d.outcome == RESTORED and cpu_max(rig) == "max 100000"


def test_moved_from_files_that_name_each_other_are_read_once(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    note_move(a, b)
    note_move(b, a)
    assert RestoreJournal(a).entries() == [] and RestoreJournal(b).entries() == []


def test_a_crash_while_carrying_over_loses_nothing(tmp_path, monkeypatch):
    rig = make_rig(tmp_path)
    rig.act.apply("be_suppress", [cap()])
    new = tmp_path / "new-state"
    note_move(new, rig.state)
    journal = RestoreJournal(new)
    monkeypatch.setattr(state_mod.Path, "rename", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
    journal.add(Held("c", "cpu.max", "max 100000", "be_suppress", 2.0))     # compacts; moving aside fails
    monkeypatch.undo()
    again = RestoreJournal(new)                                             # read both again: no doubles
    assert sorted((h.target, h.original) for h in again.entries()) == [(BE, "max 100000"), ("c", "max 100000")]


# --- 12: the journal replaced or removed under koordd ---------------------------------------------

def test_a_journal_replaced_by_rename_is_noticed_before_the_next_append(tmp_path):
    j = RestoreJournal(tmp_path)
    j.add(Held("a", "cpu.max", "max 100000", "be_suppress", 1.0))
    backup = tmp_path / "backup"
    backup.write_text(json.dumps({"version": 4}) + "\n" + json.dumps({"hold": {**GOOD, "target": "b"}}) + "\n")
    backup.rename(tmp_path / RestoreJournal.FILE)                         # an editor, a restore from a backup
    j.add(Held("c", "cpu.max", "max 100000", "be_suppress", 1.0))
    assert sorted(h.target for h in RestoreJournal(tmp_path).entries()) == ["a", "b", "c"]


def test_a_journal_removed_after_a_compaction_is_written_again(tmp_path):
    j = RestoreJournal(tmp_path)
    j.add(Held("a", "cpu.max", "max 100000", "be_suppress", 1.0))
    for i in range(2 * RestoreJournal.COMPACT_MIN):
        j.add(Held(f"x{i}", "cpu.max", "max 100000", "be_suppress", 1.0))
        j.remove(f"x{i}", "cpu.max")
    (tmp_path / RestoreJournal.FILE).unlink()
    j.add(Held("b", "cpu.max", "max 100000", "be_suppress", 1.0))
    assert [h.target for h in RestoreJournal(tmp_path).entries()] == ["a", "b"]


def test_a_journal_replaced_by_one_koordd_cannot_read_keeps_what_koordd_holds(tmp_path):
    j = RestoreJournal(tmp_path)
    j.add(Held("a", "cpu.max", "max 100000", "be_suppress", 1.0))
    (tmp_path / "x").write_text("garbage\n")
    (tmp_path / "x").rename(tmp_path / RestoreJournal.FILE)
    j.add(Held("c", "cpu.max", "max 100000", "be_suppress", 1.0))
    assert [h.target for h in RestoreJournal(tmp_path).entries()] == ["a", "c"]
    [aside] = tmp_path.glob(f"{RestoreJournal.FILE}.replaced.*")
    assert aside.read_text() == "garbage\n"


# --- 13: what a kill -9 leaves -----------------------------------------------------------------------

def test_compaction_temporaries_a_kill_left_are_removed(tmp_path):
    left = tmp_path / f".{RestoreJournal.FILE}.k1ll3d"
    left.write_text('{"version": 4}\n')
    other = tmp_path / ".status.json.abc"                     # another file's: not the journal's to remove
    other.write_text("{}")
    RestoreJournal(tmp_path).add(Held("a", "cpu.max", "max 100000", "be_suppress", 1.0))
    assert not left.exists() and other.exists()


def test_copies_kept_aside_in_one_second_do_not_overwrite_each_other(tmp_path, monkeypatch):
    monkeypatch.setattr(state_mod.time, "time", lambda: 1000.0)
    texts = []
    for n in range(2):
        text = "".join(json.dumps(r) + "\n" for r in ({"version": 4}, {"hold": GOOD}, {"hold": None, "n": n},
                                                      {"hold": {**GOOD, "target": "c"}}))
        (tmp_path / RestoreJournal.FILE).write_text(text)
        RestoreJournal(tmp_path)
        texts.append(text)
    assert sorted(p.read_text() for p in tmp_path.glob(f"{RestoreJournal.FILE}.corrupt.*")) == sorted(texts)


def test_a_cgroup_removed_while_its_identity_is_read_is_gone_not_a_crash(tmp_path, monkeypatch):
    """Removed between finding its directory and stat()ing it: TargetGone (churn), never a NameError."""
    tree = FakeCgroups(tmp_path, "v2").add(BE)
    backend = CgroupBackend(tree.fs)
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: (_ for _ in ()).throw(FileNotFoundError(p))
                        if str(p).endswith(BE) else real_stat(p, *a, **k))
    with pytest.raises(CgroupGone):
        backend.identity(BE, "cpu.max")
