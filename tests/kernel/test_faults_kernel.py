"""Faults on the real kernel (issue 14), the actuator in this process on the test's own cgroups: a cgroup
rmdir'd between koordd's read and its write (before the open, and between the open and the write), a
real EINVAL (a v1 child quota above its parent's, the parent lowered by another writer after koordd
checked it), and the state_dir on a tiny tmpfs that fills up. For each: the fault is said (or is
churn), the other write of the round lands, and every knob changed has its original in the restore
journal a fresh start reads (koordtest/journaled.py's assert_every_change_journaled); all is restored.

Needs root and a hybrid host (v1 cpu hierarchy: v1 is where a child quota above its parent's is an
error); mounts a tmpfs under the test's tmp dir and unmounts it.
"""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog, read_decisions
from koordd.act.journal import Held, RestoreJournal, read_held
from koordd.core.decisions import APPLIED, REFUSED
from koordd.core.loop import Action
from koordd.kernel.cgroupfs import CgroupFS, detect_layout
from koordtest.journaled import assert_every_change_journaled, knob_values

from koordtest.kernel import CGROUP_ROOT

pytestmark = pytest.mark.kernel


@pytest.fixture
def v1(cgroups):
    if cgroups.mode != "hybrid":
        pytest.skip("needs the v1 cpu hierarchy (hybrid host)")
    return cgroups


def rig(cgroups, state: Path):
    fs = CgroupFS(detect_layout(CGROUP_ROOT))
    actuator = Actuator(fs, RestoreJournal(state), DecisionLog(state, send=lambda *a, **k: None))
    targets = [("cgroup", cgroups.cgroup(c)) for c in ("ls", "be")]
    return actuator, knob_values(actuator, targets)


def weight(actuator: Actuator, cgroup: str) -> str:
    return actuator.backends.of_kind("cgroup").read(cgroup, "cpu.weight")


def mkcgroup(cgroups, child: str) -> list[Path]:
    dirs = [root / cgroups.name / child for root in cgroups.roots]
    for d in dirs:
        d.mkdir()
    return dirs


def rmdir_all(dirs: list[Path]) -> None:
    for d in dirs:
        if d.is_dir():
            d.rmdir()


@pytest.mark.parametrize("when", ["before the open", "between the open and the write"])
def test_a_cgroup_rmdired_between_read_and_write_is_churn(v1, tmp_path, monkeypatch, when):
    state = tmp_path / "state"
    actuator, before = rig(v1, state)
    gone = v1.cgroup("gone")
    dirs = mkcgroup(v1, "gone")
    real_open = os.open

    def open_then_rmdir(path, flags, *args, **kwargs):
        victim = f"/{gone}/" in str(path) and flags & os.O_WRONLY
        if victim and when == "before the open":
            rmdir_all(dirs)
        fd = real_open(path, flags, *args, **kwargs)
        if victim:
            rmdir_all(dirs)
        return fd

    try:
        monkeypatch.setattr(os, "open", open_then_rmdir)
        got = actuator.apply("qos", [Action(gone, "cpu.weight", "50"), Action(v1.cgroup("ls"), "cpu.weight", "200")])
        monkeypatch.undo()
        assert [(d.target, d.outcome) for d in got] == [(v1.cgroup("ls"), APPLIED)]     # nothing said of churn
        assert not any(d.is_dir() for d in dirs)
        assert actuator.journal.get(gone, "cpu.weight") is None
        assert_every_change_journaled(before, actuator, state)
        assert [h["target"] for h in read_held(state)[0]] == [v1.cgroup("ls")]
    finally:
        monkeypatch.undo()
        rmdir_all(dirs)
        actuator.restore_all("test done")
    assert knob_values(actuator, sorted({(k, t) for k, t, _ in before})) == before


def test_a_child_quota_the_kernel_refuses_after_the_parent_was_lowered(v1, tmp_path, monkeypatch):
    """koordd checks a v1 child's quota against its parent's; another writer lowers the parent between the
    check and the write, and the kernel says EINVAL: refused with it, nothing held, the round goes on."""
    state = tmp_path / "state"
    parent = v1.dir("cpu")
    (parent / "cpu.cfs_quota_us").write_text("200000")
    actuator, before = rig(v1, state)
    real_write = CgroupFS.write

    def another_writer_first(self, controller, cgroup, filename, text):
        if cgroup == v1.cgroup("be") and filename == "cpu.cfs_quota_us":
            (parent / "cpu.cfs_quota_us").write_text("50000")
        real_write(self, controller, cgroup, filename, text)

    monkeypatch.setattr(CgroupFS, "write", another_writer_first)
    try:
        got = actuator.apply("qos", [Action(v1.cgroup("be"), "cpu.max", "80000 100000"),
                                     Action(v1.cgroup("ls"), "cpu.weight", "200")])
        monkeypatch.undo()
        by_target = {d.target: d for d in got}
        refused = by_target[v1.cgroup("be")]
        assert refused.outcome == REFUSED and refused.error.startswith("EINVAL")
        assert by_target[v1.cgroup("ls")].outcome == APPLIED and weight(actuator, v1.cgroup("ls")) == "200"
        assert v1.raw_quota("be") == "-1"                                 # the kernel kept the old quota
        assert actuator.journal.get(v1.cgroup("be"), "cpu.max") is None
        assert_every_change_journaled(before, actuator, state)
    finally:
        monkeypatch.undo()
        actuator.restore_all("test done")
        (parent / "cpu.cfs_quota_us").write_text("-1")


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs under tmp_path, unmounted afterwards."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "koordd-test", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def fill(where: Path) -> Path:
    """Fill the tmpfs to its last byte; returns the filler to remove for space again."""
    filler = where / "filler"
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                if f.write(b"x" * 512) == 0:
                    break
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
    return filler


def test_the_state_dir_on_a_full_tmpfs(v1, tiny_tmpfs):
    state = tiny_tmpfs / "state"
    actuator, before = rig(v1, state)
    ls, be = v1.cgroup("ls"), v1.cgroup("be")
    try:
        [d] = actuator.apply("qos", [Action(ls, "cpu.weight", "200")])          # the journal file exists
        assert d.outcome == APPLIED
        filler = fill(tiny_tmpfs)
        # A change and its restore, again and again: each needs a journal record; the kernel takes what
        # fits in the file's last page (a short write), then nothing. The knob is then refused, not
        # written, and the file is never left with half a record.
        for _ in range(200):
            [d] = actuator.apply("qos", [Action(be, "cpu.weight", "300")])
            if d.outcome == REFUSED:
                break
            actuator.restore_all("again")
        assert d.outcome == REFUSED, "the full tmpfs never refused a journal record"
        assert "cannot save the original in the restore journal" in d.error and "ENOSPC" in d.error
        assert weight(actuator, be) == before[("cgroup", be, "cpu.weight")]                # not written
        assert_every_change_journaled(before, actuator, state)
        assert (state / RestoreJournal.FILE).read_bytes().endswith(b"\n")

        actuator.restore_all("stopping on a full disk")                          # all of it, no exception
        assert knob_values(actuator, sorted({(k, t) for k, t, _ in before})) == before

        filler.unlink()                                                          # space again
        [d] = actuator.apply("qos", [Action(be, "cpu.weight", "300")])
        assert d.outcome == APPLIED and [h.target for h in RestoreJournal(state).entries()] == [be]
        assert [r["outcome"] for r in read_decisions(state)][-1] == APPLIED
    finally:
        actuator.restore_all("test done")
        actuator.journal.close()                # the tmpfs can be unmounted
    assert knob_values(actuator, sorted({(k, t) for k, t, _ in before})) == before


def test_a_record_a_full_tmpfs_cuts_short_is_taken_back(tiny_tmpfs):
    """tmpfs takes what fits in the file's last page and says so with a short count, not ENOSPC: the half
    record is cut off the file, so the records before it are read at the next start."""
    state = tiny_tmpfs / "state"
    journal = RestoreJournal(state)
    try:
        journal.add(Held("kept", "cpu.weight", "100", "qos", 1.0))
        fill(tiny_tmpfs)
        with pytest.raises(OSError) as refused:
            for n in range(100):
                journal.add(Held(f"t{n}", "cpu.weight", "100", "qos", 1.0))
        assert refused.value.errno == errno.ENOSPC and "bytes written" in str(refused.value)  # a short write
        assert refused.value.filename == str(state / RestoreJournal.FILE)
        assert RestoreJournal(state).entries() == journal.entries() and len(journal.entries()) == n + 1
    finally:
        journal.close()
