"""Issue 25 on the real kernel, the restore journal's part, in cgroups of the test's own:
- 3: a cgroup koordd capped, left held by a crash, then removed and made again with another quota:
  the next start leaves the new quota, and a decision says why;
- 5: on the v1 cpu hierarchy a parent and its child both capped, the child's cap the newer: stopping
  raises the parent first, so the kernel takes the child's own quota back (newest first it refused it
  with EINVAL and left the child at 0.01 CPU).
The knobs are written by koordd's actuator in this process (the "crash" leaves its journal as a kill -9
does); the start after the crash is koordd itself.
"""
from __future__ import annotations

import pytest

from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.core.loop import Action
from koordd.kernel.cgroupfs import CgroupFS, detect_layout

from koordtest.kernel import CGROUP_ROOT

pytestmark = pytest.mark.kernel


def actuator(state) -> Actuator:
    return Actuator(CgroupFS(detect_layout(CGROUP_ROOT)), RestoreJournal(state),
                    DecisionLog(state, send=lambda *a, **k: None))


def quota(cgroups, child: str | None = None) -> str:
    d = cgroups.dir("cpu", child)
    if cgroups.mode == "v2":
        return (d / "cpu.max").read_text().split()[0]
    return (d / "cpu.cfs_quota_us").read_text().strip()


def set_quota(cgroups, child: str | None, us: int) -> None:
    d = cgroups.dir("cpu", child)
    if cgroups.mode == "v2":
        (d / "cpu.max").write_text(f"{us} 100000")
    else:
        (d / "cpu.cfs_quota_us").write_text(str(us))


def test_a_cgroup_made_again_after_a_crash_keeps_its_new_quota(koordd, cgroups):
    be = cgroups.cgroup("be")
    state = koordd.state_dir
    [d] = actuator(state).apply("be_suppress", [Action(be, "cpu.max", "2000 100000")])
    assert d.outcome == "applied" and quota(cgroups, "be") == "2000"
    # kill -9: nothing more from that actuator. systemd removes the slice and makes it again, CPUQuota=50%.
    for root in cgroups.roots:
        (root / be).rmdir()
    for root in cgroups.roots:
        (root / be).mkdir()
    set_quota(cgroups, "be", 50000)
    done = koordd.run_once(koordd.write_config(enabled=False))      # its loop off: the start restores
    assert done.returncode == 0, done.stderr
    assert quota(cgroups, "be") == "50000"
    [left] = [r for r in koordd.decisions() if r["outcome"] == "left"]
    assert (left["target"], left["knob"], left["old"], left["new"]) == (be, "cpu.max", "50000 100000", "max 100000")
    assert "made anew" in left["error"], left
    assert koordd.held() == []


def test_stopping_raises_a_v1_parent_before_its_capped_child(cgroups, tmp_path):
    if cgroups.mode != "hybrid":
        pytest.skip("the child-above-parent rule (EINVAL) is v1's; v2 caps a child by its parent instead")
    parent, child = cgroups.name, cgroups.cgroup("ls")
    set_quota(cgroups, "ls", 80000)                    # the pod's own limit: 0.8 CPU
    act = actuator(tmp_path / "state")
    for target, value in ((parent, "90000 100000"), (child, "1000 100000"), (parent, "20000 100000")):
        [d] = act.apply("be_suppress", [Action(target, "cpu.max", value)])
        assert d.outcome == "applied", d
    assert (quota(cgroups), quota(cgroups, "ls")) == ("20000", "1000")
    done = act.restore_all("koordd stopping")
    assert [(d.target, d.outcome) for d in done] == [(parent, "restored"), (child, "restored")], done
    assert (quota(cgroups), quota(cgroups, "ls")) == ("-1", "80000")
    assert act.journal.entries() == []
