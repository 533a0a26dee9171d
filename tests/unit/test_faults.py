"""Fault injection on fake trees (issue 14): each fault injected at its boundary (a cgroup write, the
restore journal's and the decision log's file writes, a config read), and for each four properties:
the runner (or daemon) keeps running, the affected loop says why, the other loop still acts in the
same round, and no knob is left changed without a journal entry a fresh start would read.

Faults already covered elsewhere are not repeated here: an unreadable knob, a missing controller and a
vanished cgroup in tests/unit/act/test_actuator.py; a torn journal line in tests/unit/act/test_journal.py; garbled PSI and
proc files in tests/unit/sensors/test_sensors.py; perf_event_open failing per CPU in tests/unit/sensors/test_cgroup_counters.py;
a BPF program that fails to load in tests/unit/sensors/test_runq.py and tests/unit/backends/test_netclass.py; a
failing optional sensor in tests/unit/sensors/test_lifecycle.py. The real-kernel forms are in
tests/kernel/test_faults_kernel.py.
"""
from __future__ import annotations

import errno
import json
import logging
import os
from types import SimpleNamespace

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.journaled import assert_every_change_journaled, knob_values
from koordd.act import journal as state_mod
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog, read_decisions
from koordd.act.journal import Held, RestoreJournal, read_held
from koordd.core.config import parse_config
from koordd.core.decisions import APPLIED, REFUSED
from koordd.core.loop import Action, Loop
from koordd.core.snapshot import CgroupSample, NodeSample, Snapshot
from koordd.kernel.cgroupfs import CgroupFS
from koordd.runtime.runner import Runner

VICTIM, BYSTANDER = "be.slice/job", "ls.slice"


# --- a runner with two loops: one hit by the fault, one that must go on ---------------------------

class Capper(Loop):
    """Caps the BE job's quota."""
    name = "capper"

    @staticmethod
    def writes(settings):
        return frozenset({("BE", "cpu.max")})

    @staticmethod
    def initial_state(settings):
        return {}

    @staticmethod
    def decide(snapshot, settings, state):
        return [Action(VICTIM, "cpu.max", state.get("quota", "20000 100000"), {"be_usage": 1.2}, "cap BE")]


class Burster(Loop):
    """Gives LS a burst allowance; it never touches the victim."""
    name = "burster"

    @staticmethod
    def writes(settings):
        return frozenset({("LS", "cpu.max.burst")})

    @staticmethod
    def initial_state(settings):
        return {}

    @staticmethod
    def decide(snapshot, settings, state):
        return [Action(BYSTANDER, "cpu.max.burst", state.get("burst", "20000"), {}, "LS burst")]


REGISTRY = {"capper": Capper, "burster": Burster}
CONFIG = """
[[classes]]
name = "BE"
cgroups = ["be.slice"]
[[classes]]
name = "LS"
cgroups = ["ls.slice"]
[loops.capper]
enabled = true
interval = "1s"
[loops.burster]
enabled = true
interval = "1s"
"""


def snapshot(t: float) -> Snapshot:
    return Snapshot(t, 0.0, NodeSample(2, 0.5), {"be.slice": CgroupSample("be.slice", "BE"),
                                                 VICTIM: CgroupSample(VICTIM, "BE"),
                                                 BYSTANDER: CgroupSample(BYSTANDER, "LS")})


def make_rig(tmp_path, mode="v2"):
    tree = FakeCgroups(tmp_path, mode).add(VICTIM).add(BYSTANDER)
    tree.set(BYSTANDER, "cpu", "cpu.max" if mode == "v2" else "cpu.cfs_quota_us",
             "50000 100000\n" if mode == "v2" else "50000\n")        # a burst needs a quota to be under
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    actuator = Actuator(tree.fs, journal, DecisionLog(state, send=lambda *a, **k: None))
    runner = Runner(REGISTRY, actuator)
    runner.configure(parse_config(CONFIG, "koordd.toml", REGISTRY), now=0.0)
    before = knob_values(actuator, [("cgroup", VICTIM), ("cgroup", BYSTANDER)])
    return SimpleNamespace(tree=tree, state=state, journal=journal, actuator=actuator, runner=runner,
                           before=before, t=1.0)


def tick(rig):
    """One round of both loops; the runner must come back from it whatever the fault."""
    rig.runner.tick(list(rig.runner.runs.values()), snapshot(rig.t))
    rig.t += 1.0


def decisions(rig, loop: str) -> list[dict]:
    return [d for d in read_decisions(rig.state) if d["loop"] == loop]


def bystander_acted(rig, burst="20000") -> bool:
    return rig.actuator.backends.of_kind("cgroup").read(BYSTANDER, "cpu.max.burst") == burst


def fail_writes_to(monkeypatch, cgroup: str, err: int, then=None):
    """CgroupFS.write of `cgroup` raises `err` (after `then()`, if given); other cgroups are written."""
    real = CgroupFS.write

    def write(self, controller, cg, filename, text):
        if cg == cgroup:
            if then is not None:
                then()
            if err:
                raise OSError(err, os.strerror(err))
        real(self, controller, cg, filename, text)

    monkeypatch.setattr(CgroupFS, "write", write)


def fail_fd_writes(monkeypatch, which, err=errno.ENOSPC, short=False):
    """os.write (and os.fsync) on the fds which() names fail with `err`, or write only half (short)."""
    real_write, real_fsync = os.write, os.fsync

    def write(fd, data):
        if fd in which():
            if short:
                return real_write(fd, data[:len(data) // 2])
            raise OSError(err, os.strerror(err))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return real_write, real_fsync


# --- kernel errors from a knob write ------------------------------------------------------------

@pytest.mark.parametrize("mode", ["v2", "v1"])
@pytest.mark.parametrize("err", [errno.EINVAL, errno.EBUSY, errno.ENOSPC, errno.EACCES, errno.ENODEV],
                         ids=lambda e: errno.errorcode[e])
def test_a_write_error_refuses_that_knob_with_its_errno_and_the_rest_goes_on(tmp_path, monkeypatch, mode, err):
    rig = make_rig(tmp_path, mode)
    fail_writes_to(monkeypatch, VICTIM, err)
    tick(rig)
    [refusal] = decisions(rig, "capper")
    assert refusal["outcome"] == REFUSED and refusal["error"].startswith(errno.errorcode[err] + ":")
    assert bystander_acted(rig)
    assert {name: r.failures for name, r in rig.runner.runs.items()} == {"capper": 0, "burster": 0}
    assert rig.journal.get(VICTIM, "cpu.max") is None                     # the refused write is not held
    assert_every_change_journaled(rig.before, rig.actuator, rig.state)

    tick(rig)                                                             # the same refusal is said once
    assert len(decisions(rig, "capper")) == 1
    monkeypatch.undo()                                                    # the fault goes: the knob is set
    tick(rig)
    assert decisions(rig, "capper")[-1]["outcome"] == APPLIED
    assert_every_change_journaled(rig.before, rig.actuator, rig.state)


@pytest.mark.parametrize("mode", ["v2", "v1"])
def test_a_cgroup_removed_between_read_and_write_is_skipped_and_not_held(tmp_path, monkeypatch, mode):
    rig = make_rig(tmp_path, mode)
    fail_writes_to(monkeypatch, VICTIM, 0, then=lambda: rig.tree.remove(VICTIM))
    tick(rig)
    assert decisions(rig, "capper") == []                 # normal churn: nothing to say
    assert rig.journal.get(VICTIM, "cpu.max") is None and bystander_acted(rig)
    assert all(r.failures == 0 for r in rig.runner.runs.values())
    assert_every_change_journaled(rig.before, rig.actuator, rig.state)
    assert [h["target"] for h in read_held(rig.state)[0]] == [BYSTANDER]


def test_a_write_the_kernel_half_took_keeps_its_journal_entry(tmp_path, monkeypatch):
    """v1 cpu.max is two files: the period lands, the quota is refused; the knob did change."""
    rig = make_rig(tmp_path, "v1")
    real = CgroupFS.write

    def write(self, controller, cg, filename, text):
        if cg == VICTIM and filename == "cpu.cfs_quota_us":
            raise OSError(errno.EINVAL, "Invalid argument")
        real(self, controller, cg, filename, text)

    monkeypatch.setattr(CgroupFS, "write", write)
    rig.runner.runs["capper"].state["quota"] = "20000 50000"
    tick(rig)
    assert decisions(rig, "capper")[0]["outcome"] == REFUSED and bystander_acted(rig)
    assert_every_change_journaled(rig.before, rig.actuator, rig.state)


# --- the restore journal on a full disk ------------------------------------------------------------

def hold_bystander_then_ask_both(rig):
    """The bystander's knob is held before the disk fills; then the capper asks for a first change (a
    new journal entry) and the bystander for another value of its held knob (a "wrote" record: a
    restore puts the original back only over a value koordd wrote, so that one must be on disk too)."""
    rig.runner.runs["capper"].state["quota"] = "max 100000"          # equal to the original: no write
    tick(rig)
    assert bystander_acted(rig) and rig.journal.get(BYSTANDER, "cpu.max.burst") is not None
    rig.runner.runs["capper"].state["quota"] = "20000 100000"
    rig.runner.runs["burster"].state["burst"] = "30000"


def journal_fd(rig):
    return lambda: {rig.journal._fd}


@pytest.mark.parametrize("fault", ["ENOSPC", "short write", "fsync EIO"])
def test_a_knob_whose_original_cannot_be_saved_is_not_written(tmp_path, monkeypatch, fault):
    rig = make_rig(tmp_path)
    hold_bystander_then_ask_both(rig)
    if fault == "fsync EIO":
        real_fsync = os.fsync
        monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error"))
                            if fd == rig.journal._fd else real_fsync(fd))
    else:
        fail_fd_writes(monkeypatch, journal_fd(rig), short=fault == "short write")
    tick(rig)
    assert rig.tree.read(VICTIM, "cpu", "cpu.max").strip() == "max 100000"      # not written
    [refusal] = decisions(rig, "capper")          # refused, not failed: its other actions still go on
    assert refusal["outcome"] == REFUSED and rig.runner.runs["capper"].failures == 0
    assert refusal["error"].startswith(f"cannot save the original in the restore journal {rig.journal.path}: "
                                       f"{'EIO' if fault == 'fsync EIO' else 'ENOSPC'}: ")
    # Nor another value of a held knob, that is not journaled (its record is not fsynced: see
    # RestoreJournal.wrote; a failing fsync does not stop it).
    if fault == "fsync EIO":
        assert bystander_acted(rig, "30000")
    else:
        refusal = decisions(rig, "burster")[-1]
        assert refusal["outcome"] == REFUSED and bystander_acted(rig, "20000")
    assert_every_change_journaled(rig.before, rig.actuator, rig.state)

    monkeypatch.undo()                                  # space again: the change is made, and journaled
    tick(rig)
    assert rig.tree.read(VICTIM, "cpu", "cpu.max").strip() == "20000 100000" and bystander_acted(rig, "30000")
    assert RestoreJournal(rig.state).get(BYSTANDER, "cpu.max.burst").written[-1] == "30000"
    assert_every_change_journaled(rig.before, rig.actuator, rig.state)
    assert {h.target for h in RestoreJournal(rig.state).entries()} == {VICTIM, BYSTANDER}


def test_restores_on_a_full_disk_all_happen_and_the_file_catches_up_later(tmp_path, monkeypatch, caplog):
    """A release that cannot be written leaves its hold on disk: safe (a fresh start finds the knob at its
    original), so a full disk at stop must not cut the restores short."""
    rig = make_rig(tmp_path)
    tick(rig)
    assert {h.target for h in rig.journal.entries()} == {VICTIM, BYSTANDER}
    fail_fd_writes(monkeypatch, journal_fd(rig))
    rig.actuator.restore_all("koordd stopping")
    assert rig.tree.read(VICTIM, "cpu", "cpu.max").strip() == "max 100000" and not bystander_acted(rig)
    assert rig.journal.entries() == []
    assert RestoreJournal.FILE in caplog.text and "No space left" in caplog.text
    assert_every_change_journaled(rig.before, rig.actuator, rig.state)

    monkeypatch.undo()
    rig.journal.add(Held("be.slice", "cpu.weight", "100", "capper", 1.0))      # the next change rewrites it
    assert [h.target for h in RestoreJournal(rig.state).entries()] == ["be.slice"]


def test_a_side_effect_whose_original_cannot_be_saved_stops_the_write(tmp_path, monkeypatch):
    """cpu.idle rewrites cpu.weight: when cpu.weight's original cannot be saved, cpu.idle is not written."""
    rig = make_rig(tmp_path)
    rig.tree.set(VICTIM, "cpu", "cpu.weight", "50\n")
    before = knob_values(rig.actuator, [("cgroup", VICTIM)])
    real = CgroupFS.write

    def write(self, controller, cg, filename, text):        # the kernel: idle forces the weight
        real(self, controller, cg, filename, text)
        if filename == "cpu.idle" and text.strip() == "1":
            real(self, controller, cg, "cpu.weight", "1")

    monkeypatch.setattr(CgroupFS, "write", write)
    real_write, attempts = os.write, []

    def first_journal_write_fails(fd, data):
        if fd == rig.journal._fd and not attempts:
            attempts.append(data)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    rig.journal.add(Held("be.slice", "cpu.max", "max 100000", "capper", 1.0))   # the file is open
    monkeypatch.setattr(os, "write", first_journal_write_fails)
    [refusal] = rig.actuator.apply("qos", [Action(VICTIM, "cpu.idle", "1")])
    assert attempts and b"cpu.weight" in attempts[0]
    assert refusal.outcome == REFUSED and "ENOSPC" in refusal.error
    assert_every_change_journaled(before, rig.actuator, rig.state)


# --- the decision log on a full disk -------------------------------------------------------------

class FullDisk:
    """open() of the decision log's module: files opened for writing fail at their first write."""

    def __init__(self, err=errno.ENOSPC):
        self.err, self.real = err, open

    def __call__(self, path, mode="r", *args, **kwargs):
        f = self.real(path, mode, *args, **kwargs)
        if any(c in mode for c in "aw+"):
            err = self.err

            def write(data):
                raise OSError(err, os.strerror(err))
            f.write = write
        return f


def test_a_full_decision_log_drops_records_with_one_line_and_the_writes_go_on(tmp_path, monkeypatch, caplog):
    from koordd.act import decision_log as decisions_mod
    rig = make_rig(tmp_path)
    monkeypatch.setattr(decisions_mod, "open", FullDisk(), raising=False)
    for quota in ("20000 100000", "30000 100000", "40000 100000"):
        rig.runner.runs["capper"].state["quota"] = quota
        tick(rig)
    assert rig.tree.read(VICTIM, "cpu", "cpu.max").strip() == "40000 100000" and bystander_acted(rig)
    assert all(r.failures == 0 for r in rig.runner.runs.values())
    assert_every_change_journaled(rig.before, rig.actuator, rig.state)
    said = [r.getMessage() for r in caplog.records if "decisions.jsonl" in r.getMessage()]
    assert len(said) == 1 and "No space left" in said[0] and "dropped" in said[0]

    monkeypatch.undo()
    rig.runner.runs["capper"].state["quota"] = "50000 100000"
    tick(rig)
    assert [d["new"] for d in decisions(rig, "capper")] == ["50000 100000"]
    said = [r.getMessage() for r in caplog.records if "decisions.jsonl" in r.getMessage()]
    assert len(said) == 2 and "4 records" in said[1]           # 3 of the capper's, 1 of the burster's


def test_journald_refusing_a_record_does_not_fail_the_loop(tmp_path, caplog):
    tree = FakeCgroups(tmp_path, "v2").add(VICTIM)
    state = tmp_path / "state"

    def send(message, **fields):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    actuator = Actuator(tree.fs, RestoreJournal(state), DecisionLog(state, send=send))
    [d] = actuator.apply("capper", [Action(VICTIM, "cpu.max", "20000 100000")])
    [d2] = actuator.apply("capper", [Action(VICTIM, "cpu.max", "30000 100000")])
    assert d.outcome == d2.outcome == APPLIED
    assert [r["new"] for r in read_decisions(state)] == ["20000 100000", "30000 100000"]   # kept on disk
    assert len([r for r in caplog.records if "journald" in r.getMessage()]) == 1


# --- the config deleted, emptied, half-written or replaced during a reload ------------------------

@pytest.fixture
def daemon(tmp_path):
    """koordd in this process on test_daemon's fake node, started, with be_suppress capping BE."""
    from unit.runtime.test_daemon import Node
    from koordd.core.config import load_config
    from koordd.runtime.daemon import Daemon
    from koordd.core.catalogue import load_registry
    node = Node(tmp_path)
    registry = load_registry()
    d = Daemon(load_config(node.config, registry), registry)
    d.start()
    d.node = node
    yield d
    d.stop()


@pytest.mark.parametrize("fault", ["deleted", "emptied", "cut mid-table", "unreadable bytes"])
def test_a_config_broken_at_reload_keeps_the_running_one_and_says_why(daemon, caplog, fault):
    config, loops = daemon.node.config, dict(daemon.runner.runs)
    text = config.read_text()
    if fault == "deleted":
        config.unlink()
    elif fault == "emptied":
        config.write_text("")
    elif fault == "cut mid-table":
        config.write_text(text[:text.index("threshold_percent") + 5])
    else:
        config.write_bytes(text.encode()[:40] + b"\xff\xfe" + text.encode()[40:])
    daemon.reload()
    assert daemon.runner.runs == loops and daemon.config.loops["be_suppress"].enabled
    said = [r.getMessage() for r in caplog.records if "reload refused" in r.getMessage()]
    assert len(said) == 1 and str(config) in said[0]
    assert {"emptied": "empty", "deleted": "No such file"}.get(fault, str(config)) in said[0]


def test_a_config_written_while_it_is_read_is_read_again(daemon, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="koordd")
    from koordd.runtime import reload as daemon_mod
    config, loops = daemon.node.config, dict(daemon.runner.runs)
    text = config.read_text()
    real = daemon_mod.load_config
    reads = []

    def load_config(path, registry):            # the editor has written half when koordd reads it
        reads.append(path)
        if len(reads) == 1:
            config.write_text(text[:text.index("[loops.be_suppress]")])
            got = real(path, registry)
            config.write_text(text + "\n# saved\n")             # ...and finishes right after
            return got
        return real(path, registry)

    monkeypatch.setattr(daemon_mod, "load_config", load_config)
    daemon.reload()
    assert daemon.runner.runs == loops                          # the half file was not applied
    assert daemon.reload_at is not None and "changed while it was read" in caplog.text
    daemon.reload()
    assert daemon.runner.runs == loops and len(reads) == 2 and "reloaded" in caplog.text


def test_a_reload_that_fails_midway_leaves_the_daemon_running(daemon, monkeypatch, caplog):
    def reprobe():
        raise RuntimeError("a sensor's bug")
    monkeypatch.setattr(daemon.sensors, "reprobe", reprobe)
    daemon.reload()                                             # raised out of run(): koordd stopped
    assert "be_suppress" in daemon.runner.runs
    assert "reload" in caplog.text and "a sensor's bug" in caplog.text


# --- kernel files truncated, emptied or garbled under a running daemon --------------------------------

@pytest.mark.parametrize("text", ["", "usage_usec 12", "usage_usec 1\nnr_periods", "\xff\xfe garbage\n",
                                  "some avg10=x total=1\n"], ids=["empty", "truncated", "cut-mid-key",
                                                                  "garbled", "garbled-psi"])
def test_a_round_survives_garbled_cgroup_files(daemon, text):
    """Every counter and pressure file of BE garbled: the round completes and the loop runs without those
    values (the sensors give None for them); LS is still read."""
    tree = daemon.node.tree
    before = knob_values(daemon.actuator, [("cgroup", "be.slice"), ("cgroup", "ls.slice")])
    for name in ("cpu.stat", "cpu.pressure", "memory.pressure", "io.pressure", "memory.stat", "memory.current"):
        (tree.dir("be.slice", None) / name).write_text(text)
    daemon.round(list(daemon.runner.runs.values()))
    status = json.loads((daemon.state_dir / "status.json").read_text())
    assert status["loops"]["be_suppress"]["failures"] == 0 and status["loops"]["be_suppress"]["ticks"] == 1
    fields = frozenset({"throttling", "cpu_pressure"})
    be, ls = (daemon.sensors.snapshot(set(), fields=fields).cgroups[cg] for cg in ("be.slice", "ls.slice"))
    assert (be.throttling, be.cpu_pressure) == (None, None)
    assert None not in (ls.throttling, ls.cpu_pressure)
    assert_every_change_journaled(before, daemon.actuator, daemon.state_dir)


def test_a_garbled_cgroup_file_is_said_once_per_field_and_a_missing_one_not_at_all(tmp_path, caplog):
    """Unknown and not offered read alike (None), but only the garbled file is a warning, once per field,
    naming the cgroup and what did not parse: a kernel format koordd does not know is worth one line."""
    from koordd.sensors.cgroup_stats import CgroupSensor
    tree = FakeCgroups(tmp_path, "v2").add("be.slice/a").add("be.slice/b").add("ls.slice")
    for cg in ("be.slice/a", "be.slice/b"):
        tree.set(cg, None, "cpu.pressure", "some avg10=x avg60=0 avg300=0 total=1\n")
        tree.set(cg, "cpu", "cpu.stat", "usage_usec 12x\nnr_periods 1\nnr_throttled 0\nthrottled_usec 0\n")
    (tree.dir("ls.slice", None) / "cpu.pressure").unlink()           # not there: no warning
    sensor = CgroupSensor(tree.fs)
    with caplog.at_level(logging.WARNING, logger="koordd.sensors"):
        for t in (1.0, 2.0):
            samples = [sensor.sample(cg, "BE", t) for cg in ("be.slice/a", "be.slice/b", "ls.slice")]
    assert all(s.cpu_pressure is None for s in samples)
    assert samples[0].throttling is not None and samples[1].cpu_usage is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert any("cpu_pressure of be.slice/a does not parse" in w and "'x'" in w for w in warned)
    assert any("cpu_usage of be.slice/a does not parse" in w and "usage_usec" in w for w in warned)


@pytest.mark.parametrize("listing", ["12\nabc\n", "1_0\n", "\xb2\n", "9" * 4400 + "\n", "\udcff\n"],
                         ids=["word", "underscore", "superscript", "huge", "not-utf8"])
def test_a_garbled_thread_list_refuses_the_knob_and_the_round_goes_on(tmp_path, listing):
    """sched_policy reads and writes every thread the cgroup lists: a listing that is not thread ids is an
    unreadable current value (a refused decision naming the file), not a ValueError out of the loop."""
    tree = FakeCgroups(tmp_path, "v2").add(VICTIM)
    (tree.dir(VICTIM, None) / "cgroup.threads").write_bytes(os.fsencode(listing))
    state = tmp_path / "state"
    actuator = Actuator(tree.fs, RestoreJournal(state), DecisionLog(state, send=lambda *a, **k: None))
    [d] = actuator.apply("capper", [Action(VICTIM, "sched_policy", "idle", {}, "BE idle"),
                                    Action(VICTIM, "cpu.max", "20000 100000", {}, "cap BE")])[:1]
    assert d.outcome == REFUSED and d.knob == "sched_policy"
    assert f"{VICTIM}/cgroup.threads is not a list of thread ids" in d.error
    assert actuator.backends.of_kind("cgroup").read(VICTIM, "cpu.max") == "20000 100000"   # the rest went on
    assert [h["knob"] for h in read_held(state)[0]] == ["cpu.max"]
