"""The actuator's pipeline, the restore journal and the decision log, on fake cgroup trees."""
from __future__ import annotations

import errno
import json
from types import SimpleNamespace

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog, read_decisions
from koordd.act.journal import JournalUnreadable, RestoreJournal, read_held
from koordd.backends.cgroup_knobs import KNOBS, Knob
from koordd.core.decisions import APPLIED, DEFERRED, DRY_RUN, Decision, KEPT, REFUSED, RESTORED
from koordd.core.loop import Action, restore

JOB = "be.slice/job"


def make_rig(tmp_path, tree, dry_run=False, **log_args):
    state = tmp_path / "state"
    sent = []
    log = DecisionLog(state, send=lambda message, **fields: sent.append((message, fields)), **log_args)
    journal = RestoreJournal(state)
    return SimpleNamespace(tree=tree, state=state, sent=sent, journal=journal,
                           act=Actuator(tree.fs, journal, log, dry_run=dry_run))


@pytest.fixture
def rig(tmp_path):
    return make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add(JOB))


def quota(value="50000 100000", cgroup=JOB, **reason):
    return Action(cgroup, "cpu.max", value, reason or {"be_usage": 1.5}, "BE over its allowance")


def records(rig):
    return list(read_decisions(rig.state))


def on_disk(rig):
    """The restore journal as a fresh reader sees it."""
    got = read_held(rig.state)
    return got[0] if got else []


# --- setting -----------------------------------------------------------------

def test_set_writes_records_and_journals_on_every_layout(tmp_path, tree):
    rig = make_rig(tmp_path, tree)
    [d] = rig.act.apply("be_suppress", [quota()])
    assert (d.outcome, d.loop, d.target, d.knob, d.old, d.new) == (APPLIED, "be_suppress", JOB, "cpu.max",
                                                                   "max 100000", "50000 100000")
    assert d.reason == {"be_usage": 1.5} and d.message == "BE over its allowance" and d.error is None
    if tree.v1:
        assert tree.read(JOB, "cpu", "cpu.cfs_quota_us") == "50000"
    else:
        assert tree.read(JOB, "cpu", "cpu.max") == "50000 100000"
    assert [(h["target"], h["knob"], h["original"], h["owner"]) for h in on_disk(rig)] == [
        (JOB, "cpu.max", "max 100000", "be_suppress")]
    assert [r["outcome"] for r in records(rig)] == [APPLIED]


def test_equal_value_is_skipped(rig):
    assert rig.act.apply("be_suppress", [quota("max 100000")]) == []
    assert rig.sent == [] and records(rig) == [] and rig.journal.entries() == []
    assert not (rig.state / RestoreJournal.FILE).exists()


@pytest.mark.parametrize("dry_run", [False, True])
def test_an_equal_value_asked_on_record_is_a_kept_decision_and_nothing_is_written(tmp_path, dry_run):
    """Action.say: a loop's verdict with nothing to change (be_suppress: a cut judged to have helped stays)
    is one KEPT decision, in the journal and decisions.jsonl; no write, no journal entry, no refusal."""
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add(JOB), dry_run=dry_run)
    said = Action(JOB, "cpu.max", "max 100000", {"experiment": {"verdict": "helped"}}, "the cut helped", say=True)
    [d] = rig.act.apply("be_suppress", [said])
    assert (d.outcome, d.old, d.new, d.reason["experiment"]["verdict"]) == (KEPT, "max 100000", "max 100000", "helped")
    assert "kept" in d.text() and "the cut helped" in d.text()
    assert [r["outcome"] for r in records(rig)] == [KEPT] and rig.journal.entries() == []
    assert rig.tree.read(JOB, "cpu", "cpu.max").strip() == "max 100000"
    assert rig.act.apply("be_suppress", [quota("max 100000")]) == []      # not asked on record: nothing


def test_second_change_keeps_the_first_original(rig):
    rig.act.apply("be_suppress", [quota("50000 100000")])
    [d] = rig.act.apply("be_suppress", [quota("40000 100000")])
    assert (d.old, d.new) == ("50000 100000", "40000 100000")
    assert rig.journal.get(JOB, "cpu.max").original == "max 100000"
    assert rig.act.apply("be_suppress", [quota("40000 100000")]) == []


def test_original_is_on_disk_before_the_write(rig, monkeypatch):
    seen = []
    real = Knob.write

    def write(self, fs, cgroup, value):
        seen.append(on_disk(rig))
        real(self, fs, cgroup, value)

    monkeypatch.setattr(Knob, "write", write)
    rig.act.apply("be_suppress", [quota()])
    assert [[(h["knob"], h["original"]) for h in s] for s in seen] == [[("cpu.max", "max 100000")]]


def test_kernel_error_is_refused_once_and_forgotten(rig, monkeypatch):
    def write(self, fs, cgroup, value):
        assert on_disk(rig) != []              # persisted even though the write will fail
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(Knob, "write", write)
    [d] = rig.act.apply("be_suppress", [quota()])
    assert (d.outcome, d.old, d.new) == (REFUSED, "max 100000", "50000 100000")
    assert d.error.startswith("EINVAL")
    assert rig.journal.entries() == [] and on_disk(rig) == []
    assert rig.act.apply("be_suppress", [quota()]) == []                   # same refusal: recorded once
    assert [d.new for d in rig.act.apply("be_suppress", [quota("60000 100000")])] == ["60000 100000"]
    assert [r["outcome"] for r in records(rig)] == [REFUSED, REFUSED]


def test_partial_v1_write_stays_journaled(tmp_path, monkeypatch):
    """Period landed, quota refused: the knob did change, so its original must be kept."""
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v1").add(JOB))
    real = rig.act.backends.of_kind("cgroup").fs.write

    def write(controller, cgroup, name, text):
        if name == "cpu.cfs_quota_us":
            raise OSError(errno.EINVAL, "Invalid argument")
        real(controller, cgroup, name, text)

    monkeypatch.setattr(rig.act.backends.of_kind("cgroup").fs, "write", write)
    [d] = rig.act.apply("be_suppress", [quota("25000 50000")])
    assert d.outcome == REFUSED
    assert rig.journal.get(JOB, "cpu.max").original == "max 100000"


@pytest.mark.parametrize("action, error", [
    (Action(JOB, "cpu.turbo", "1"), "unknown knob 'cpu.turbo'"),
    (Action(JOB, "cpu.max", "10 100000"), "quota must be >= 1000"),
    (Action(JOB, "cpuset.cpus", "0-99"), "not in the parent's cpuset"),
])
def test_invalid_actions_are_refused_before_reading_or_writing(rig, action, error):
    [d] = rig.act.apply("be_suppress", [action])
    assert d.outcome == REFUSED and error in d.error and rig.journal.entries() == []


def test_unreadable_knob_is_refused(rig):
    (rig.tree.dir(JOB, "cpu") / "cpu.max").unlink()
    (rig.tree.dir(JOB, "cpu") / "cpu.max").mkdir()               # reads fail with EISDIR
    [d] = rig.act.apply("be_suppress", [quota()])
    assert d.outcome == REFUSED and d.error.startswith("cannot read current value: EISDIR")


def test_vanished_cgroup_is_skipped_silently(rig):
    rig.tree.remove(JOB)
    assert rig.act.apply("be_suppress", [quota()]) == [] and rig.sent == []


def test_owner_conflict_is_refused(rig):
    rig.act.apply("be_suppress", [quota()])
    [d] = rig.act.apply("cpu_burst", [quota("70000 100000")])
    assert d.outcome == REFUSED and d.error == "knob is held by loop be_suppress"
    assert rig.tree.read(JOB, "cpu", "cpu.max") == "50000 100000"
    assert rig.act.apply("cpu_burst", [restore(JOB, "cpu.max", "not mine")]) == []
    assert rig.journal.get(JOB, "cpu.max").owner == "be_suppress"


def test_dry_run_writes_nothing_and_records_each_new_value_once(tmp_path):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add(JOB), dry_run=True)
    ticks = [quota("50000 100000"), quota("50000 100000"), quota("40000 100000"), quota("max 100000")]
    got = [[(d.outcome, d.old, d.new) for d in rig.act.apply("be_suppress", [a])] for a in ticks]
    assert got == [[(DRY_RUN, "max 100000", "50000 100000")], [], [(DRY_RUN, "max 100000", "40000 100000")],
                   [(DRY_RUN, "max 100000", "max 100000")]]
    assert rig.tree.read(JOB, "cpu", "cpu.max") == "max 100000\n"
    assert rig.journal.entries() == [] and not (rig.state / RestoreJournal.FILE).exists()
    assert [fields["KOORDD_OUTCOME"] for _, fields in rig.sent] == [DRY_RUN] * 3


def test_dry_run_still_refuses_invalid_values(tmp_path):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add(JOB), dry_run=True)
    [d] = rig.act.apply("be_suppress", [quota("1 100000")])
    assert d.outcome == REFUSED


# --- restoring -------------------------------------------------------------------

def test_restore_action_puts_the_original_back(tmp_path, tree):
    rig = make_rig(tmp_path, tree)
    rig.act.apply("be_suppress", [quota()])
    [d] = rig.act.apply("be_suppress", [restore(JOB, "cpu.max", "BE back under", be_usage=0.2)])
    assert (d.outcome, d.old, d.new, d.reason) == (RESTORED, "50000 100000", "max 100000", {"be_usage": 0.2})
    assert rig.journal.entries() == [] and on_disk(rig) == []
    assert KNOBS["cpu.max"].read(tree.fs, JOB) == "max 100000"
    assert rig.act.apply("be_suppress", [restore(JOB, "cpu.max", "again")]) == []


def test_restore_when_someone_already_put_it_back(rig):
    rig.act.apply("be_suppress", [quota()])
    rig.tree.set(JOB, "cpu", "cpu.max", "max 100000\n")
    assert rig.act.apply("be_suppress", [restore(JOB, "cpu.max", "done")]) == []
    assert rig.journal.entries() == []


def test_restore_of_a_vanished_cgroup_drops_the_entry(rig):
    rig.act.apply("be_suppress", [quota()])
    rig.tree.remove(JOB)
    n = len(rig.sent)
    assert rig.act.restore_all("stopping") == []
    assert rig.journal.entries() == [] and on_disk(rig) == [] and len(rig.sent) == n


def test_failed_restore_keeps_the_entry(rig, monkeypatch):
    rig.act.apply("be_suppress", [quota()])
    monkeypatch.setattr(Knob, "write", lambda *a: (_ for _ in ()).throw(OSError(errno.EBUSY, "Device busy")))
    [d] = rig.act.restore_all("stopping")
    assert d.outcome == REFUSED and d.error.startswith("EBUSY") and d.new == "max 100000"
    assert rig.journal.get(JOB, "cpu.max") is not None


def test_restore_all_newest_first_where_no_parent_and_child_meet(rig):
    """Siblings: newest first. (A parent and its child go in apply_round's order: test_trust_journal.py.)"""
    rig.tree.add("be.slice/other").add("be.slice/first")
    rig.act.apply("be_suppress", [quota(cgroup="be.slice/first")])
    rig.act.apply("cpu_burst", [Action(JOB, "cpu.max.burst", "20000")])
    rig.act.apply("be_suppress", [quota(cgroup="be.slice/other")])
    done = rig.act.restore_all("koordd stopping")
    assert [(d.target, d.knob, d.outcome, d.message) for d in done] == [
        ("be.slice/other", "cpu.max", RESTORED, "koordd stopping"),
        (JOB, "cpu.max.burst", RESTORED, "koordd stopping"),
        ("be.slice/first", "cpu.max", RESTORED, "koordd stopping")]
    assert rig.journal.entries() == []


def test_restore_owner_leaves_other_loops_alone(rig):
    rig.act.apply("be_suppress", [quota(cgroup="be.slice")])
    rig.act.apply("cpu_burst", [Action(JOB, "cpu.max.burst", "20000")])
    assert [d.knob for d in rig.act.restore_owner("be_suppress", "disabled")] == ["cpu.max"]
    assert [h.owner for h in rig.journal.entries()] == ["cpu_burst"]


def test_journal_survives_a_restart(rig, tmp_path):
    rig.act.apply("be_suppress", [quota()])
    again = make_rig(tmp_path, rig.tree)
    assert [(h.target, h.original, h.owner) for h in again.journal.entries()] == [(JOB, "max 100000", "be_suppress")]
    [d] = again.act.restore_all("cleanup after crash")
    assert d.outcome == RESTORED and rig.tree.read(JOB, "cpu", "cpu.max") == "max 100000"


@pytest.mark.parametrize("text", ["{not json", '{"held": [{"cgroup": "a"}]}', "[]", '{"version": 99}\n'])
def test_an_unreadable_journal_is_refused_and_kept_as_it_is(tmp_path, text):
    """Its holds cannot be read, so they cannot be restored: koordd refuses to start (the daemon exits
    78), naming the file, rather than start empty and leave their knobs changed for good."""
    state = tmp_path / "state"
    state.mkdir()
    (state / RestoreJournal.FILE).write_text(text)
    with pytest.raises(JournalUnreadable, match=str(state / RestoreJournal.FILE)):
        RestoreJournal(state)
    assert [p.name for p in state.iterdir()] == [RestoreJournal.FILE]
    assert (state / RestoreJournal.FILE).read_text() == text


# --- decision records ---------------------------------------------------------------

def test_journald_fields_and_jsonl(rig):
    rig.act.apply("be_suppress", [quota()])
    [(message, fields)] = rig.sent
    assert message == "be_suppress: set be.slice/job cpu.max 'max 100000' -> '50000 100000': BE over its allowance"
    assert fields == {"PRIORITY": "5", "SYSLOG_IDENTIFIER": "koordd", "KOORDD_LOOP": "be_suppress",
                      "KOORDD_KIND": "cgroup", "KOORDD_TARGET": JOB, "KOORDD_CGROUP": JOB, "KOORDD_KNOB": "cpu.max",
                      "KOORDD_OLD": "max 100000", "KOORDD_NEW": "50000 100000", "KOORDD_OUTCOME": APPLIED,
                      "KOORDD_REASON": '{"be_usage": 1.5}'}
    [line] = (rig.state / DecisionLog.FILE).read_text().splitlines()
    rec = json.loads(line)
    assert {k: rec[k] for k in ("loop", "kind", "target", "cgroup", "knob", "old", "new", "outcome", "reason",
                                "error")} == {
        "loop": "be_suppress", "kind": "cgroup", "target": JOB, "cgroup": JOB, "knob": "cpu.max",
        "old": "max 100000", "new": "50000 100000", "outcome": APPLIED, "reason": {"be_usage": 1.5}, "error": None}


def test_refusal_fields(rig):
    rig.act.apply("be_suppress", [quota()])
    rig.act.apply("other", [quota("60000 100000")])
    message, fields = rig.sent[-1]
    assert fields["PRIORITY"] == "4" and fields["KOORDD_ERROR"] == "knob is held by loop be_suppress"
    assert fields["KOORDD_OLD"] == "" and message.startswith("other: refused be.slice/job cpu.max None -> ")


def decision(i):
    return Decision(float(i), "loop", "a", "cpu.max", "max 100000", f"{1000 + i} 100000", APPLIED, f"n{i}")


def test_rotation_keeps_the_newest_records(tmp_path):
    log = DecisionLog(tmp_path, max_bytes=600, keep=2, send=lambda *a, **k: None)
    for i in range(40):
        log.record(decision(i))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["decisions.jsonl", "decisions.jsonl.1", "decisions.jsonl.2"]
    assert all(p.stat().st_size <= 600 for p in tmp_path.iterdir())
    got = [r["message"] for r in read_decisions(tmp_path, keep=2)]
    assert got == [f"n{i}" for i in range(40 - len(got), 40)] and len(got) > 2


def test_read_decisions_skips_damaged_lines(tmp_path):
    log = DecisionLog(tmp_path, max_bytes=10**6, send=lambda *a, **k: None)
    log.record(decision(0))
    (tmp_path / "decisions.jsonl").rename(tmp_path / "decisions.jsonl.2")
    (tmp_path / "decisions.jsonl.1").write_bytes(b'{"message": "torn\n\xff\xfe\x00garbage\n')
    log.record(decision(1))
    with open(tmp_path / "decisions.jsonl", "a") as f:
        f.write('{"message": "half a li')
    assert [r["message"] for r in read_decisions(tmp_path)] == ["n0", "n1"]


def test_without_a_state_dir_records_only_go_to_the_journal(tmp_path):
    sent = []
    DecisionLog(None, send=lambda m, **k: sent.append(m)).record(decision(0))
    assert len(sent) == 1 and list(tmp_path.iterdir()) == []


def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path):
    from koordd.core.decisions import Decision
    from koordd.act.decision_log import DecisionLog, read_decisions
    log = DecisionLog(tmp_path)
    (tmp_path / "decisions.jsonl").write_text('{"loop": "x", "cut sho')        # crash mid-write
    log.record(Decision(1.0, "be_suppress", "be", "cpu.max", "max 100000", "5000 100000", "applied"))
    assert [d["loop"] for d in read_decisions(tmp_path)] == ["be_suppress"]


# --- write order and commands ----------------------------------------------------

def test_lowering_goes_child_first_and_raising_parent_first(rig):
    rig.tree.set("be.slice", "cpu", "cpu.max", "80000 100000\n")
    rig.tree.set(JOB, "cpu", "cpu.max", "60000 100000\n")
    down = [quota("40000 100000", "be.slice"), quota("30000 100000", JOB)]
    assert [d.target for d in rig.act.apply("x", down)] == [JOB, "be.slice"]
    up = [quota("90000 100000", JOB), quota("120000 100000", "be.slice")]
    assert [d.target for d in rig.act.apply("x", up)] == ["be.slice", JOB]
    # Restores take the same care: back down to the originals (80000, 60000) goes child first.
    assert [d.target for d in rig.act.apply("x", [restore("be.slice", "cpu.max", ""),
                                                  restore(JOB, "cpu.max", "")])] == [JOB, "be.slice"]


def test_commands_are_written_every_time_and_never_journaled(rig):
    reclaim = Action(JOB, "memory.reclaim", "1048576", {"over_by": 1}, "reclaim before freezing")
    assert [d.outcome for d in rig.act.apply("memory_evict", [reclaim, reclaim])] == [APPLIED, APPLIED]
    assert rig.tree.read(JOB, "memory", "memory.reclaim") == "1048576"
    assert on_disk(rig) == [] and records(rig)[0]["old"] is None
    [bad] = rig.act.apply("memory_evict", [Action(JOB, "cgroup.kill", "2")])
    assert bad.outcome == REFUSED


def test_commands_in_dry_run_write_nothing(tmp_path):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add(JOB), dry_run=True)
    [d] = rig.act.apply("memory_evict", [Action(JOB, "cgroup.kill", "1")])
    assert d.outcome == DRY_RUN and rig.tree.read(JOB, None, "cgroup.kill") == "\n"


def test_freeze_is_a_restorable_state_on_v2_and_v1(tmp_path, tree):
    rig = make_rig(tmp_path, tree)
    [d] = rig.act.apply("memory_evict", [Action(JOB, "cgroup.freeze", "1")])
    assert (d.old, d.new) == ("0", "1")
    frozen = tree.read(JOB, None, "cgroup.freeze") if tree.mode == "v2" else tree.read(JOB, "freezer",
                                                                                      "freezer.state")
    assert frozen.strip() in ("1", "FROZEN")
    rig.act.restore_all("stop")
    thawed = tree.read(JOB, None, "cgroup.freeze") if tree.mode == "v2" else tree.read(JOB, "freezer",
                                                                                      "freezer.state")
    assert thawed.strip() in ("0", "THAWED")


def test_v1_kill_sends_sigkill_to_every_task_of_the_subtree(tmp_path):
    import subprocess
    import sys
    tree = FakeCgroups(tmp_path, "v1").add(JOB).add(JOB + "/inner")
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        tree.set(JOB, "memory", "cgroup.procs", f"{procs[0].pid}\n")
        tree.set(JOB + "/inner", "memory", "cgroup.procs", f"{procs[1].pid}\n")
        rig = make_rig(tmp_path, tree)
        [d] = rig.act.apply("memory_evict", [Action(JOB, "cgroup.kill", "1")])
        assert d.outcome == APPLIED
        assert [p.wait(timeout=10) for p in procs] == [-9, -9]
    finally:
        for p in procs:
            p.kill()


@pytest.mark.parametrize("mode", ["v2", "v1"])
def test_a_knob_the_kernel_rewrites_as_a_side_effect_is_saved_first(tmp_path, mode):
    tree21 = FakeCgroups(tmp_path, mode).add(JOB)
    rig = make_rig(tmp_path, tree21)
    if tree21.v1:
        tree21.set(JOB, "cpu", "cpu.shares", "512\n")
    else:
        tree21.set(JOB, "cpu", "cpu.weight", "50\n")
    rig.act.apply("qos_baseline", [Action(JOB, "cpu.idle", "1")])
    assert [(h["knob"], h["original"]) for h in on_disk(rig)] == [("cpu.weight", "50"), ("cpu.idle", "0")]
    tree21.set(JOB, "cpu", "cpu.shares" if tree21.v1 else "cpu.weight", "1024\n" if tree21.v1 else "100\n")
    restored = rig.act.restore_all("stop")                      # as the kernel does when idle goes back to 0
    assert [d.knob for d in restored] == ["cpu.idle", "cpu.weight"]
    assert KNOBS["cpu.weight"].read(tree21.fs, JOB) == "50"


def test_a_knob_missing_because_its_controller_is_off_is_refused_once_with_the_fix(rig):
    (rig.tree.dir(JOB, "cpu") / "cpu.max").unlink()              # cpu not in the parent's subtree_control
    [d] = rig.act.apply("be_suppress", [quota(), quota()])
    assert d.outcome == REFUSED and "subtree_control" in d.error and "set-property" in d.error


# --- writes that may block: one time budget a round (issue 35 item 2) -------------------------------

class SlowClock:
    """A monotonic clock that only a write moves: each memory.reclaim write "takes" `per_write` seconds."""

    def __init__(self, per_write):
        self.now, self.per_write, self.writes = 0.0, per_write, 0

    def __call__(self):
        return self.now


def slow_rig(tmp_path, monkeypatch, per_write, dry_run=False):
    """An actuator on a fake v2 tree whose memory.reclaim writes advance its (fake) clock."""
    from koordd.backends.cgroup_knobs import CgroupBackend
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add(JOB).add("be.slice/other"), dry_run=dry_run)
    clock = SlowClock(per_write)
    rig.act.clock, rig.clock = clock, clock
    real = CgroupBackend.write

    def write(self, target, knob, value):
        if knob == "memory.reclaim":
            clock.now += clock.per_write
            clock.writes += 1
        real(self, target, knob, value)
    monkeypatch.setattr(CgroupBackend, "write", write)
    return rig


def reclaim(cgroup=JOB, n=32 << 20):
    return Action(cgroup, "memory.reclaim", str(n), {"step": "reclaim"}, "reclaim")


def test_memory_reclaim_is_a_slow_knob_and_the_budget_is_well_under_half_the_watchdog():
    from koordd.act.actuator import SLOW_WRITE_BUDGET
    assert KNOBS["memory.reclaim"].slow and not KNOBS["cgroup.kill"].slow and not KNOBS["cpu.max"].slow
    assert SLOW_WRITE_BUDGET == 1.0           # WatchdogSec=30s: pinged every 15 s, one write in flight past it


def test_slow_writes_past_the_rounds_budget_are_deferred_not_written(tmp_path, monkeypatch):
    # Two loops ask ten reclaim writes in one round, each taking 0.3 s: four are written (the fourth begins at
    # 0.9 s, under the 1 s budget), the other six are deferred, each a decision that says so; the round's
    # other writes go on; the next round has a budget of its own.
    rig = slow_rig(tmp_path, monkeypatch, per_write=0.3)
    out = rig.act.apply_round([("memory_evict", [reclaim() for _ in range(6)] + [quota()]),
                               ("proactive_reclaim", [reclaim("be.slice/other") for _ in range(4)])])
    assert rig.clock.writes == 4 and rig.clock.now == pytest.approx(1.2)    # the budget and the one in flight
    outcomes = [d.outcome for d in out["memory_evict"]]
    assert outcomes == [APPLIED] * 4 + [DEFERRED] * 2 + [APPLIED]         # cpu.max is no slow write
    assert [d.outcome for d in out["proactive_reclaim"]] == [DEFERRED] * 4
    deferred = out["proactive_reclaim"][0]
    assert deferred.error == "this round's budget for slow writes (1 s) is spent: asked again next round"
    assert deferred.text().startswith("proactive_reclaim: deferred be.slice/other memory.reclaim")
    assert [r["outcome"] for r in records(rig)].count(DEFERRED) == 6
    assert [d.outcome for d in rig.act.apply("proactive_reclaim", [reclaim("be.slice/other")])] == [APPLIED]


def test_a_slow_write_that_fails_still_counts_against_the_budget(tmp_path, monkeypatch):
    rig = slow_rig(tmp_path, monkeypatch, per_write=0.6)
    from koordd.backends.cgroup_knobs import CgroupBackend
    slow = CgroupBackend.write

    def eagain(self, target, knob, value):
        slow(self, target, knob, value)
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
    monkeypatch.setattr(CgroupBackend, "write", eagain)
    out = rig.act.apply("memory_evict", [reclaim(), reclaim(n=1 << 20), reclaim(n=2 << 20)])
    assert [d.outcome for d in out] == [REFUSED, REFUSED, DEFERRED]


def test_dry_run_writes_and_times_nothing(tmp_path, monkeypatch):
    rig = slow_rig(tmp_path, monkeypatch, per_write=5.0, dry_run=True)
    out = rig.act.apply("memory_evict", [reclaim() for _ in range(5)])
    assert [d.outcome for d in out] == [DRY_RUN] * 5 and rig.clock.writes == 0


def test_real_slow_writes_end_the_round_near_the_budget(tmp_path, monkeypatch):
    # The same with real sleeps and the real monotonic clock (no timed assertion: what was written is
    # counted). Each write sleeps 0.2 s: five at most fit the 1 s budget, the rest are deferred.
    import time as real_time
    from koordd.backends.cgroup_knobs import CgroupBackend
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add(JOB))
    real = CgroupBackend.write
    writes = []

    def write(self, target, knob, value):
        if knob == "memory.reclaim":
            writes.append(value)
            real_time.sleep(0.2)
        real(self, target, knob, value)
    monkeypatch.setattr(CgroupBackend, "write", write)
    out = rig.act.apply("memory_evict", [reclaim() for _ in range(20)])
    assert 1 <= len(writes) <= 5
    assert [d.outcome for d in out] == [APPLIED] * len(writes) + [DEFERRED] * (20 - len(writes))
