"""koordd cannot be turned against its host: targets never lead out of their root."""
from __future__ import annotations

import os

import pytest

from fakecgroup import FakeCgroups
from koordd.cgroups import OutsideRoot
from koordd.decisions import APPLIED, REFUSED
from koordd.loop import Action
from koordd.state import Held
from test_actuator import make_rig, on_disk, records


@pytest.fixture
def outside(tmp_path):
    """A directory beside the cgroup root that looks like a cgroup: what an escape would write to."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "cpu.max").write_text("max 100000\n")
    return d


def cap(target: str) -> Action:
    return Action(target, "cpu.max", "50000 100000", {}, "cap")


@pytest.mark.parametrize("target", ["../outside", "be.slice/../../outside", "be.slice/../../../etc"])
def test_a_journal_entry_leading_out_of_the_root_is_refused_and_dropped(tmp_path, outside, target):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add("be.slice"))
    rig.journal.add(Held(target, "cpu.max", "1 100000", "be_suppress", 1.0))
    [d] = rig.act.restore_all("koordd stopping")
    assert d.outcome == REFUSED and "leads out of" in d.error and "dropped" in d.error
    assert (outside / "cpu.max").read_text() == "max 100000\n"        # never written
    assert on_disk(rig) == [] and records(rig)[-1]["target"] == target


def test_a_loop_target_leading_out_is_refused_before_any_read(tmp_path, outside):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add("be.slice"))
    [d] = rig.act.apply("be_suppress", [cap("../outside")])
    assert d.outcome == REFUSED and "'..'" in d.error and d.old is None
    assert (outside / "cpu.max").read_text() == "max 100000\n" and on_disk(rig) == []


def test_a_symlinked_cgroup_directory_is_refused_at_the_write(tmp_path, outside):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    os.symlink(outside, tree.root / "be.slice" / "evil")
    rig = make_rig(tmp_path, tree)
    [d] = rig.act.apply("be_suppress", [cap("be.slice/evil")])
    assert d.outcome == REFUSED and str(outside) in d.error
    assert (outside / "cpu.max").read_text() == "max 100000\n" and on_disk(rig) == []


def test_a_symlinked_knob_file_is_not_followed(tmp_path, outside):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    knob = tree.root / "be.slice" / "cpu.max"
    knob.unlink()
    os.symlink(outside / "cpu.max", knob)
    rig = make_rig(tmp_path, tree)
    [d] = rig.act.apply("be_suppress", [cap("be.slice")])
    assert d.outcome == REFUSED and "ELOOP" in d.error
    assert (outside / "cpu.max").read_text() == "max 100000\n" and on_disk(rig) == []


def test_a_leading_slash_stays_below_the_root(tmp_path):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add("be.slice"))
    [d] = rig.act.apply("be_suppress", [cap("/be.slice")])
    assert d.outcome == APPLIED and rig.tree.read("be.slice", "cpu", "cpu.max") == "50000 100000"


def test_reads_refuse_dot_dot_too(tmp_path):
    fs = FakeCgroups(tmp_path, "v2").fs
    with pytest.raises(OutsideRoot):
        fs.read("cpu", "a/../..", "cpu.max")
    assert fs.read("cpu", "", "cgroup.controllers")       # a name merely containing dots is fine
