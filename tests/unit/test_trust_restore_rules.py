"""Issue 35 item 5: a restore goes through the rules of a write. A journal hold is text anyone with write
access to the state_dir can forge (or an old koordd, or a human, can leave); the value it names is put back
only if a write of it would be let through. A value a write's rule refuses for good (the sysctl backend's
10% bound on vm.min_free_kbytes, any backend's UnsafeValue) is never written: the knob is left as it is, a
decision says why, and the hold is dropped, not retried at every round and every start.

The rule is the actuator's (koordd/act/actuator.py, Actuator._restorable), so it holds for every backend,
a third party's included, whatever its validate_original() lets through."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.sysctl import SysctlBackend
from koordd.core.backend import Backend, Backends, InvalidValue, KnobSpec, UnsafeValue
from koordd.core.decisions import REFUSED, RESTORED
from koordd.core.loop import restore
from koordd.core.targets import SYSCTL_TARGET
from koordtest.fakes.procfs import fake_proc

MIN_FREE = "vm.min_free_kbytes"
MEM_TOTAL_KIB = 8_000_000
FORGED = str(2**31 - 1)          # 2147483647 KiB: 268 x MemTotal of this node


@pytest.fixture
def proc(tmp_path) -> Path:
    return fake_proc(tmp_path, MEM_TOTAL_KIB)


def forge(state: Path, *holds: dict) -> None:
    state.mkdir(exist_ok=True)
    lines = [{"version": 4}] + [{"hold": {"owner": "oom_shaping", "since": 1.0, **h}} for h in holds]
    (state / RestoreJournal.FILE).write_text("".join(json.dumps(r) + "\n" for r in lines))


def start(tmp_path, *backends: Backend) -> tuple[Actuator, RestoreJournal]:
    """A koordd starting on the state_dir: the journal as the file says."""
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    return Actuator(Backends(backends), journal, DecisionLog(state, send=lambda *a, **k: None)), journal


def min_free(proc: Path) -> str:
    return (proc / "sys" / "vm" / "min_free_kbytes").read_text().strip()


@pytest.mark.parametrize("written", [["67584"], []])      # koordd's value named (v4), or not known (older)
def test_a_forged_min_free_kbytes_of_268_times_memory_is_never_written_back(tmp_path, proc, written):
    forge(tmp_path / "state", {"kind": "sysctl", "target": SYSCTL_TARGET, "knob": MIN_FREE, "original": FORGED,
                               "written": written})
    act, journal = start(tmp_path, SysctlBackend(proc))
    [d] = act.restore_all("koordd stopping")
    assert d.outcome == REFUSED and "above 10% of this node's memory" in d.error
    assert "journal entry dropped, nothing written" in d.error
    assert min_free(proc) == "67584"                          # left as it is
    assert journal.entries() == []                            # dropped: not retried
    assert act.restore_all("koordd stopping") == []
    assert RestoreJournal(tmp_path / "state").entries() == []     # nor at the next start


def test_the_loops_own_restore_of_a_forged_hold_is_refused_the_same(tmp_path, proc):
    """oom_shaping with min_free_kbytes = 0 lets the sysctl go (a restore action): the same rule."""
    forge(tmp_path / "state", {"kind": "sysctl", "target": SYSCTL_TARGET, "knob": MIN_FREE, "original": FORGED,
                               "written": ["67584"]})
    act, journal = start(tmp_path, SysctlBackend(proc))
    [d] = act.apply("oom_shaping", [restore(SYSCTL_TARGET, MIN_FREE, "no longer set in oom_shaping")])
    assert d.outcome == REFUSED and "above 10%" in d.error and min_free(proc) == "67584" and journal.entries() == []


def test_an_original_within_the_rule_still_goes_back(tmp_path, proc):
    forge(tmp_path / "state", {"kind": "sysctl", "target": SYSCTL_TARGET, "knob": MIN_FREE, "original": "45056",
                               "written": ["67584"]})
    act, journal = start(tmp_path, SysctlBackend(proc))
    [d] = act.restore_all("koordd stopping")
    assert d.outcome == RESTORED and min_free(proc) == "45056" and journal.entries() == []


class Lenient(Backend):
    """A third party's backend whose validate_original() lets every original through, as the sysctl
    backend's did: its validate() has a rule of koordd's (UnsafeValue) the restore must still meet."""
    kind = "lenient"
    knobs = {"lenient.level": KnobSpec("lenient.level", "a level, 0..100; above 50 unsafe")}

    def __init__(self):
        self.value, self.writes = "10", []

    def read(self, target, knob):
        return self.value

    def validate(self, target, knob, value):
        v = int(value)
        if not 0 <= v <= 100:
            raise InvalidValue(f"{v} is not 0..100")
        if v > 50:
            raise UnsafeValue(f"level {v} is above 50: koordd does not write it")
        return str(v)

    def validate_original(self, target, knob, value):
        return value

    def write(self, target, knob, value):
        self.writes.append(value)
        self.value = value


def test_every_backend_restore_meets_the_write_rules_whatever_validate_original_says(tmp_path):
    forge(tmp_path / "state", {"kind": "lenient", "target": "x", "knob": "lenient.level", "original": "90",
                               "written": ["10"]})
    backend = Lenient()
    act, journal = start(tmp_path, backend)
    [d] = act.restore_all("koordd stopping")
    assert d.outcome == REFUSED and "above 50" in d.error and "journal entry dropped" in d.error
    assert backend.writes == [] and journal.entries() == []
