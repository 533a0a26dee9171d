"""Issue 25, defect 9: cgroup.kill on cgroup v1 (koordd/kernel/v1_kill.py) on fake trees, with real processes
(`sleep`) standing for a cgroup's tasks: frozen before any SIGKILL and thawed after, a cgroup someone
else froze left frozen, passes until no task is left where there is no freezer, and a PID that no longer
names a task of the cgroup when it would be signalled is not signalled. The real kernel with a process
forking successors: tests/kernel/test_trust_limits_kernel.py."""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess

import pytest

import koordd.kernel.v1_kill as v1_kill
from koordtest.fakes.cgroup import FakeCgroups
from koordd.backends.cgroup_knobs import KNOBS

CG = "be.slice"


@pytest.fixture
def v1(tmp_path):
    return FakeCgroups(tmp_path, "hybrid").add(f"{CG}/job")


@pytest.fixture
def sleepers():
    procs = []

    def spawn(n: int = 1) -> list[subprocess.Popen]:
        out = [subprocess.Popen(["sleep", "600"]) for _ in range(n)]
        procs.extend(out)
        return out
    yield spawn
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def list_tasks(tree: FakeCgroups, cgroup: str, procs) -> None:
    tree.set(cgroup, "memory", "cgroup.procs", "".join(f"{p.pid}\n" for p in procs))


def signals_seen(monkeypatch, tree: FakeCgroups | None, on_kill=None) -> list[tuple[int, str | None]]:
    """Every SIGKILL sent, by kill(2) or through a pidfd, as (pid or pidfd, freezer.state at that moment)."""
    seen: list[tuple[int, str | None]] = []
    real_kill, real_pidfd_send = os.kill, signal.pidfd_send_signal

    def state():
        if tree is None:
            return None
        try:
            return tree.read(CG, "freezer", "freezer.state").strip()
        except OSError:
            return None

    def note(target, sig):
        if sig == signal.SIGKILL:
            seen.append((target, state()))
            if on_kill:
                on_kill(target)

    def kill(pid, sig):
        note(pid, sig)
        real_kill(pid, sig)

    def pidfd_send(fd, sig, *rest):
        note(fd, sig)
        real_pidfd_send(fd, sig, *rest)
    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(signal, "pidfd_send_signal", pidfd_send)
    return seen


def killed(p: subprocess.Popen) -> bool:
    return p.wait(timeout=10) == -signal.SIGKILL


def test_every_task_of_the_subtree_is_killed_while_frozen_then_the_cgroup_thawed(v1, sleepers, monkeypatch):
    top, job = sleepers(1), sleepers(2)
    list_tasks(v1, CG, top)
    list_tasks(v1, f"{CG}/job", job)
    seen = signals_seen(monkeypatch, v1)
    KNOBS["cgroup.kill"].write(v1.fs, CG, "1")
    assert all(killed(p) for p in top + job)
    assert len(seen) == 3 and {s for _, s in seen} == {"FROZEN"}, seen     # no SIGKILL before the freeze
    assert v1.read(CG, "freezer", "freezer.state").strip() == "THAWED"     # so that the killed tasks die


def test_a_cgroup_someone_froze_is_killed_and_left_frozen_for_its_owner(v1, sleepers, monkeypatch):
    procs = sleepers(1)
    list_tasks(v1, CG, procs)
    v1.set(CG, "freezer", "freezer.state", "FROZEN\n")
    seen = signals_seen(monkeypatch, v1)
    KNOBS["cgroup.kill"].write(v1.fs, CG, "1")
    assert killed(procs[0]) and len(seen) == 1
    assert v1.read(CG, "freezer", "freezer.state").strip() == "FROZEN"


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "kill(2)"])
def test_without_a_freezer_cgroup_passes_go_on_until_no_successor_is_left(v1, sleepers, monkeypatch, pidfds):
    # Each task killed had forked a successor first (as a fork bomb does): listed only after its kill.
    shutil.rmtree(v1.dir(CG, "freezer"))
    if not pidfds:
        monkeypatch.setattr(os, "pidfd_open", lambda pid, *a: (_ for _ in ()).throw(OSError(errno.ENOSYS, "")))
    generations = [sleepers(1)[0]]

    def fork_successor(_):
        if len(generations) < 6:
            generations.append(sleepers(1)[0])
            list_tasks(v1, CG, generations[-1:])
    list_tasks(v1, CG, generations)
    seen = signals_seen(monkeypatch, None, on_kill=fork_successor)
    KNOBS["cgroup.kill"].write(v1.fs, CG, "1")
    assert len(generations) == 6 and all(killed(p) for p in generations)
    assert len(seen) == 6


def test_a_pid_no_longer_listed_when_it_would_be_signalled_is_left_alone(v1, sleepers, monkeypatch):
    # The listed task exits between the read of cgroup.procs and the signal, and its PID goes to a
    # process elsewhere (here: a sleeper that never was in the cgroup). The kill must not hit it.
    outsider = sleepers(1)[0]
    list_tasks(v1, CG, [outsider])
    real_open = os.pidfd_open

    def open_after_reuse(pid, *a):
        v1.set(CG, "memory", "cgroup.procs", "")     # the listed task is gone from the cgroup
        return real_open(pid, *a)
    monkeypatch.setattr(os, "pidfd_open", open_after_reuse)
    seen = signals_seen(monkeypatch, v1)
    KNOBS["cgroup.kill"].write(v1.fs, CG, "1")
    assert seen == [], "a process outside the cgroup was sent SIGKILL"
    assert outsider.poll() is None


def test_tasks_that_keep_appearing_without_a_freezer_end_in_a_refusal_not_a_hang(v1, monkeypatch):
    shutil.rmtree(v1.dir(CG, "freezer"))
    pids = iter(range(10_000_000, 20_000_000))
    v1.set(CG, "memory", "cgroup.procs", f"{next(pids)}\n")
    monkeypatch.setattr(v1_kill, "_open", lambda pid: ("pid", pid))
    monkeypatch.setattr(v1_kill, "_alive", lambda handle: True)

    def send(handle, sig):          # every kill lands after the task forked the next one
        v1.set(CG, "memory", "cgroup.procs", f"{next(pids)}\n")
        return True
    monkeypatch.setattr(v1_kill, "_send", send)
    with pytest.raises(OSError) as e:
        KNOBS["cgroup.kill"].write(v1.fs, CG, "1")
    assert e.value.errno == errno.EBUSY


def test_a_missing_cgroup_is_gone(v1):
    from koordd.kernel.cgroupfs import CgroupGone
    with pytest.raises(CgroupGone):
        KNOBS["cgroup.kill"].write(v1.fs, "nope", "1")
