"""sched_ext under systemd on a kernel with sched_ext: with `ext_classes = ["LS"]` the processes of
transient units in ls.slice get SCHED_EXT (7), one started later too, those in be.slice keep
SCHED_OTHER; each decision carries the kernel's sched_ext state; `systemctl stop koordd` puts LS's
back to SCHED_OTHER. No BPF scheduler is loaded here (state "disabled"): the kernel runs SCHED_EXT
tasks in the fair class, so only the policy itself is checked. doctor's line shows the state and
the counters.
"""
from __future__ import annotations

import json
import os

import pytest

from . import vm
from .test_doctor import doctor

pytestmark = vm.only_in_vm

SCHED_EXT = 7
UNITS = {"extls": vm.LS, "extbe": vm.BE, "extls2": vm.LS}
SCHED_EXT_DIR = "/sys/kernel/sched_ext"

CONFIG = vm.SLICES_CONFIG + f"""\
[loops.be_suppress]
enabled = false

[loops.sched_ext]
enabled = true
interval = "1s"
ext_classes = ["LS"]
"""


def sleeper(unit: str) -> int:
    """A `sleep` as the transient service `unit` in its slice; its pid."""
    vm.sh("systemd-run", f"--slice={UNITS[unit]}", f"--unit={unit}", "sleep", "infinity")
    cgroup = f"{UNITS[unit]}/{unit}.service"
    vm.wait_tasks(cgroup, 1)
    return int((vm.CGROUP / cgroup / "cgroup.procs").read_text().split()[0])


def policies(pids: dict[str, int]) -> dict[str, int]:
    return {unit: os.sched_getscheduler(pid) for unit, pid in pids.items()}


@pytest.fixture
def sleepers(koordd_stopped):
    if not os.path.isfile(f"{SCHED_EXT_DIR}/state"):
        pytest.fail(f"this kernel has no {SCHED_EXT_DIR}/state (CONFIG_SCHED_CLASS_EXT)")
    vm.stop_units(*UNITS)
    yield {unit: sleeper(unit) for unit in ("extls", "extbe")}
    vm.stop_units(*UNITS)


def test_ls_threads_get_sched_ext_and_go_back_on_stop(sleepers):
    pids = sleepers
    assert policies(pids) == {"extls": os.SCHED_OTHER, "extbe": os.SCHED_OTHER}

    vm.write_config(CONFIG)
    cursor = vm.journal_cursor()
    vm.systemctl("start", vm.UNIT)
    assert vm.wait_for(lambda: policies(pids)["extls"] == SCHED_EXT, 90), \
        f"{policies(pids)}\n{vm.journal_text(cursor)}"
    # A process started later in LS (from PID 1, so not inherited) is brought in line within a round.
    pids["extls2"] = sleeper("extls2")
    assert vm.wait_for(lambda: policies(pids)["extls2"] == SCHED_EXT, 60), vm.journal_text(cursor)
    vm.wait_ticks("sched_ext", 2)
    assert policies(pids) == {"extls": SCHED_EXT, "extbe": os.SCHED_OTHER, "extls2": SCHED_EXT}

    state = open(f"{SCHED_EXT_DIR}/state").read().strip()
    applied = vm.journal(cursor, "KOORDD_LOOP=sched_ext", "KOORDD_OUTCOME=applied")
    assert applied and {e["KOORDD_TARGET"] for e in applied} == {vm.LS}, vm.journal_text(cursor)
    reason = json.loads(applied[0]["KOORDD_REASON"])
    assert reason["class"] == "LS" and reason["sched_ext_state"] == state, reason
    assert {e["KOORDD_NEW"] for e in applied} == {"ext"}

    vm.systemctl("stop", vm.UNIT)
    assert policies(pids) == {"extls": os.SCHED_OTHER, "extbe": os.SCHED_OTHER, "extls2": os.SCHED_OTHER}


def test_doctor_shows_the_state_and_the_counters():
    detail = doctor()["sched_ext"]["detail"]
    state = open(f"{SCHED_EXT_DIR}/state").read().strip()
    assert detail.startswith(f"state={state}"), detail
    for counter in ("enable_seq", "nr_rejected", "switch_all"):
        path = f"{SCHED_EXT_DIR}/{counter}"
        if os.path.isfile(path):
            assert f"{counter}={open(path).read().strip()}" in detail, (detail, counter)
