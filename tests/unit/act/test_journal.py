"""The restore journal: append-only (one fsynced line a change), compacted, a torn last line survived,
a 0.1 journal (originals.json) read and converted at the first change, a broken one moved aside."""
from __future__ import annotations

import json
import os

import pytest

from koordctl.cli import main as koordctl
from koordd.act import journal as state_mod
from koordd.act.journal import Held, RestoreJournal, read_held


def held(cgroup: str, knob: str = "cpu.max", original: str = "max 100000") -> Held:
    return Held(cgroup, knob, original, "be_suppress", 1.0)


def lines(d) -> list[dict]:
    return [json.loads(line) for line in (d / RestoreJournal.FILE).read_text().splitlines()]


def test_each_change_appends_one_fsynced_line(tmp_path, monkeypatch):
    j = RestoreJournal(tmp_path)
    j.add(held("a"))
    syncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(state_mod.os, "fsync", lambda fd: syncs.append(fd) or real_fsync(fd))
    monkeypatch.setattr(state_mod, "write_atomic", lambda *a, **k: pytest.fail("rewrote the whole file"))
    j.add(held("b"))
    j.remove("a", "cpu.max")
    j.remove("a", "cpu.max")                        # not held: nothing written
    assert len(syncs) == 2
    assert lines(tmp_path) == [{"version": 4}, {"hold": {**vars(held("a")), "written": []}},
                               {"hold": {**vars(held("b")), "written": []}},
                               {"release": {"kind": "cgroup", "target": "a", "knob": "cpu.max"}}]
    again = RestoreJournal(tmp_path)
    assert again.entries() == [held("b")]
    assert read_held(tmp_path) == ([vars(held("b"))], tmp_path / RestoreJournal.FILE)


def test_compaction_keeps_only_the_live_entries(tmp_path):
    j = RestoreJournal(tmp_path)
    j.add(held("keep"))
    for i in range(100):
        j.add(held(f"x{i}"))
        j.remove(f"x{i}", "cpu.max")
    assert len(lines(tmp_path)) <= RestoreJournal.COMPACT_MIN + 1
    assert RestoreJournal(tmp_path).entries() == [held("keep")]


def test_a_hold_whose_append_sets_off_a_compaction_is_in_the_compacted_file(tmp_path):
    """What is on disk after each add is what a kill -9 right after the knob write leaves: the new hold
    must be there also when its own append made the file due for compaction."""
    j = RestoreJournal(tmp_path)
    j.add(held("keep"))         # one live entry: the lines then come due on an add as well as on a remove
    for i in range(3 * RestoreJournal.COMPACT_MIN):
        j.add(held(f"x{i}"))
        assert RestoreJournal(tmp_path).get(f"x{i}", "cpu.max") == held(f"x{i}"), f"hold {i} lost on disk"
        j.remove(f"x{i}", "cpu.max")
    assert len(lines(tmp_path)) <= RestoreJournal.COMPACT_MIN + 1


def test_a_torn_last_line_is_dropped_and_the_rest_kept(tmp_path):
    j = RestoreJournal(tmp_path)
    j.add(held("a"))
    j.close()
    with open(tmp_path / RestoreJournal.FILE, "a") as f:
        f.write('{"hold": {"cgroup": "b", "kn')          # the crash came mid-append
    again = RestoreJournal(tmp_path)
    assert again.entries() == [held("a")]
    again.add(held("c"))                                   # appends after a torn line still parse
    assert [h.target for h in RestoreJournal(tmp_path).entries()] in (["a", "c"],)


def test_a_damaged_line_before_the_end_loses_only_itself(tmp_path, caplog):
    """Every other original still read: knobs they hold are not left changed with nobody to explain them."""
    j = RestoreJournal(tmp_path)
    for name in ("a", "b", "c"):
        j.add(held(name))
    j.close()
    text = (tmp_path / RestoreJournal.FILE).read_text().splitlines()
    text[2] = "{damaged"                                    # b's hold
    (tmp_path / RestoreJournal.FILE).write_text("\n".join(text) + "\n")
    again = RestoreJournal(tmp_path)
    assert again.entries() == [held("a"), held("c")]
    [aside] = tmp_path.glob("originals.jsonl.corrupt.*")
    assert "{damaged" in aside.read_text() and f"{RestoreJournal.FILE}:3: damaged record set aside" in caplog.text
    again.add(held("d"))                                    # rewritten without the damage before appending
    assert [line.get("hold", {}).get("target") for line in lines(tmp_path)] == [None, "a", "c", "d"]


def test_a_0_1_journal_is_read_and_converted_at_the_first_change(tmp_path):
    old = tmp_path / RestoreJournal.V1_FILE
    old.write_text(json.dumps({"version": 1, "held": [
        {"cgroup": "a", "knob": "cpu.max", "original": "max 100000", "owner": "be_suppress", "since": 1.0}]}))
    j = RestoreJournal(tmp_path)
    assert j.entries() == [held("a")]
    assert old.exists() and not (tmp_path / RestoreJournal.FILE).exists()     # reading writes nothing
    assert read_held(tmp_path) == ([vars(held("a"))], old)
    j.add(held("b"))
    assert not old.exists()
    assert RestoreJournal(tmp_path).entries() == [held("a"), held("b")]


def test_koordctl_status_reads_the_journal(tmp_path, capsys):
    j = RestoreJournal(tmp_path)
    j.add(held("be.slice"))
    (tmp_path / "status.json").write_text(json.dumps({"pid": os.getpid(), "started": 0, "updated": 0,
                                                     "loops": {}, "held": []}))
    assert koordctl(["status", "--json", "--state-dir", str(tmp_path)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["held_source"] == RestoreJournal.FILE and [h["target"] for h in got["held"]] == ["be.slice"]


def test_a_version_2_journal_of_cgroups_loads_and_is_rewritten_at_the_first_change(tmp_path):
    """Version 2 named targets "cgroup" (every target was one): it still loads, and the next change
    rewrites the file in the current format before appending to it."""
    path = tmp_path / RestoreJournal.FILE
    path.write_text("\n".join(json.dumps(r) for r in (
        {"version": 2},
        {"hold": {"cgroup": "a", "knob": "cpu.max", "original": "max 100000", "owner": "be_suppress",
                  "since": 1.0, "kind": "cgroup"}},
        {"hold": {"cgroup": "x", "knob": "cpu.max", "original": "max 100000", "owner": "be_suppress",
                  "since": 1.0, "kind": "cgroup"}},
        {"release": {"kind": "cgroup", "cgroup": "x", "knob": "cpu.max"}})) + "\n")
    j = RestoreJournal(tmp_path)
    assert j.entries() == [held("a")]
    j.add(held("b"))
    assert lines(tmp_path)[0] == {"version": RestoreJournal.VERSION}
    assert RestoreJournal(tmp_path).entries() == [held("a"), held("b")]


def test_an_atomic_write_never_writes_through_a_name_planted_beside_it(tmp_path, monkeypatch):
    # The temporary file's name is predictable (pid and a counter, no tempfile module): one taken already,
    # by a file or by a link to a file elsewhere, is skipped, and nothing is written through the link.
    target, outside = tmp_path / "status.json", tmp_path / "elsewhere"
    outside.write_text("untouched")
    monkeypatch.setattr(state_mod, "_tmp_counter", iter(range(10)))
    (tmp_path / f".status.json.{os.getpid()}.0").write_text("left by a koordd killed with this pid")
    (tmp_path / f".status.json.{os.getpid()}.1").symlink_to(outside)
    state_mod.write_atomic(target, "new")
    assert target.read_text() == "new" and outside.read_text() == "untouched"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["status.json", "elsewhere", f".status.json.{os.getpid()}.0", f".status.json.{os.getpid()}.1"])


def test_an_atomic_write_that_finds_no_free_name_raises_and_leaves_the_file(tmp_path, monkeypatch):
    target = tmp_path / "status.json"
    target.write_text("old")
    monkeypatch.setattr(state_mod, "_tmp_counter", iter([0] * 1000))
    (tmp_path / f".status.json.{os.getpid()}.0").write_text("taken")
    with pytest.raises(FileExistsError):
        state_mod.write_atomic(target, "new")
    assert target.read_text() == "old"
