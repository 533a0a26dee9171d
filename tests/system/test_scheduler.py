"""koordd loads its own sched_ext scheduler (`scheduler = "koordd"` of the sched_ext loop), under systemd on
a kernel with sched_ext:
- the loop gives ls.slice and be.slice SCHED_EXT and their classes, then the scheduler loads: state
  "enabled", root/ops "koordd", the switch journalled as a decision;
- it serves LS first: a busy loop in each slice on one CPU, LS gets most of it;
- LS wake-up: a thread of ls.slice that sleeps 2 ms a thousand times, next to BE's busy loop on its
  CPU, is woken late by how much (the fair class with both normal, BE as SCHED_IDLE as the static
  `cpu.idle = 1` gives it, and koordd's scheduler preempting BE at LS's wake-up): figures printed,
  and with koordd's scheduler LS may not wait for BE's 5 ms slices;
- cpu.weight: two LS services at CPUWeight 100 and 300, busy on one CPU, get 1:3 of it under koordd's
  scheduler (weighted virtual time per cgroup), as they do under the fair class;
- kill -9 of koordd: the kernel unloads the scheduler with it, systemd restarts koordd, which loads
  it again; `systemctl stop` unloads it, puts the policies back, and holds nothing.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from . import vm

pytestmark = vm.only_in_vm

SCHED_EXT, SCHED_EXT_DIR = vm.SCHED_EXT, vm.SCHED_EXT_DIR
read = vm.sched_ext_file
CPU = 1                         # the busy loops and the sleeper share it; the VM has 2
UNITS = {"schedls": vm.LS, "schedbe": vm.BE}

CONFIG = vm.SLICES_CONFIG + f"""\
[loops.be_suppress]
enabled = false

[loops.qos_baseline]
enabled = false

[loops.sched_ext]
enabled = true
interval = "1s"
ext_classes = ["LS", "BE"]
scheduler = "koordd"
"""

# Sleeps 2 ms `n` times in ls.slice and prints how late each wake-up came, as JSON quantiles in µs.
# With `ext` it first waits for koordd to give it SCHED_EXT (a normal thread would run in the fair
# class, ahead of every SCHED_EXT one, whatever the scheduler does).
SLEEPER = """
import json, os, sys, time
n, ext = int(sys.argv[1]), sys.argv[2] == "ext"
deadline = time.monotonic() + 30
while ext and os.sched_getscheduler(0) != 7 and time.monotonic() < deadline:
    time.sleep(0.1)
late = []
for _ in range(n):
    t = time.perf_counter()
    time.sleep(0.002)
    late.append((time.perf_counter() - t - 0.002) * 1e6)
late.sort()
q = lambda p: round(late[min(len(late) - 1, int(p * len(late)))])
print(json.dumps({"policy": os.sched_getscheduler(0), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
                  "max": round(late[-1]), "n": n}))
"""


def busy_loop(unit: str) -> int:
    return vm.pinned_busy_loop(unit, UNITS[unit], CPU)


def wakeups(ext: bool, n: int = 1000) -> dict:
    """The sleeper as a transient service in ls.slice, pinned to CPU; its figures."""
    out = vm.sh("systemd-run", f"--slice={vm.LS}", "--unit=schedwake", "--wait", "--pipe", "--quiet",
                f"--property=CPUAffinity={CPU}", "python3", "-c", SLEEPER, str(n), "ext" if ext else "any",
                timeout=180).stdout
    return json.loads(out.strip().splitlines()[-1])


def policy(pid: int) -> int:
    return os.sched_getscheduler(pid)


@pytest.fixture
def busy(koordd_stopped):
    if not os.path.isfile(f"{SCHED_EXT_DIR}/state"):
        pytest.fail(f"this kernel has no {SCHED_EXT_DIR}/state (CONFIG_SCHED_CLASS_EXT)")
    assert read("state") == "disabled", f"a BPF scheduler is loaded already: {read('root/ops')}"
    vm.stop_units(*UNITS, "schedwake")
    yield {unit: busy_loop(unit) for unit in UNITS}
    vm.systemctl("stop", vm.UNIT, check=False)
    vm.stop_units(*UNITS, "schedwake")
    assert vm.wait_for(lambda: read("state") == "disabled", 30), read("state")


def start_koordd() -> int:
    """koordd with CONFIG, once its scheduler runs; the journal cursor from before the start."""
    vm.write_config(CONFIG)
    cursor = vm.journal_cursor()
    vm.systemctl("start", vm.UNIT)
    assert vm.wait_for(lambda: read("root/ops") == "koordd" and read("state") == "enabled", 120), \
        f"{read('state')} {read('root/ops')}\n{vm.journal_text(cursor)}"
    return cursor


def test_koordd_loads_its_scheduler_which_serves_ls_first_and_preempts_be_at_ls_wakeup(busy):
    pids = busy
    fair = wakeups(ext=False)
    os.sched_setscheduler(pids["schedbe"], os.SCHED_IDLE, os.sched_param(0))
    idle = wakeups(ext=False)
    os.sched_setscheduler(pids["schedbe"], os.SCHED_OTHER, os.sched_param(0))

    seq = int(read("enable_seq"))
    cursor = start_koordd()
    assert int(read("enable_seq")) == seq + 1
    assert vm.wait_for(lambda: {policy(p) for p in pids.values()} == {SCHED_EXT}, 30)
    [switch] = vm.journal(cursor, "KOORDD_LOOP=sched_ext", "KOORDD_KNOB=scheduler", "KOORDD_OUTCOME=applied")
    assert (switch["KOORDD_OLD"], switch["KOORDD_NEW"]) == ("none", "koordd"), switch
    classes = vm.journal(cursor, "KOORDD_KNOB=scheduler_class", "KOORDD_OUTCOME=applied")
    assert {(e["KOORDD_TARGET"], e["KOORDD_NEW"]) for e in classes} == {(vm.LS, "LS"), (vm.BE, "BE")}

    before = {unit: vm.cpu_ticks(pid) for unit, pid in pids.items()}
    ext = wakeups(ext=True)
    ticks = {unit: vm.cpu_ticks(pid) - before[unit] for unit, pid in pids.items()}
    print(f"LS wake-up delay after a 2 ms sleep next to BE's busy loop on CPU {CPU}, µs: fair {fair}, "
          f"BE SCHED_IDLE {idle}, koordd's scheduler {ext}; busy loops' CPU ticks meanwhile {ticks}")
    assert ext["policy"] == SCHED_EXT, ext
    assert read("state") == "enabled" and read("root/ops") == "koordd", "the kernel ejected it (dmesg)"
    # Without the preemption at wake-up LS would wait for BE's slice: 5 ms at worst, 2.5 ms on average.
    assert ext["p50"] < 2500, (fair, idle, ext)
    assert ticks["schedls"] > 5 * max(ticks["schedbe"], 1), ticks      # LS first, BE a little (its guard)
    assert ticks["schedbe"] > 0, ticks


def test_kill_9_unloads_it_the_restart_loads_it_again_and_stop_restores(busy):
    pids = busy
    start_koordd()
    seq = int(read("enable_seq"))
    os.kill(vm.main_pid(), signal.SIGKILL)
    assert vm.wait_for(lambda: read("state") == "disabled" or int(read("enable_seq") or 0) > seq, 30, step=0.1)
    # systemd restarts koordd (Restart=on-failure): it loads the scheduler afresh.
    assert vm.wait_for(lambda: read("root/ops") == "koordd" and int(read("enable_seq")) == seq + 1, 120), \
        (read("state"), read("enable_seq"), vm.journal_text())
    assert vm.n_restarts() >= 1

    vm.systemctl("stop", vm.UNIT)
    assert read("state") == "disabled" and read("root/ops") == ""
    assert {policy(p) for p in pids.values()} == {os.SCHED_OTHER}
    assert not [h for h in vm.held() if h["knob"] in ("scheduler", "scheduler_class", "sched_policy")], vm.held()


WEIGHTED = {"weightlo": 100, "weighthi": 300}


def cpu_shares(pids: dict[str, int], seconds: float) -> dict[str, int]:
    """CPU ticks each of `pids` gets over `seconds`."""
    before = {unit: vm.cpu_ticks(pid) for unit, pid in pids.items()}
    time.sleep(seconds)
    return {unit: vm.cpu_ticks(pid) - before[unit] for unit, pid in pids.items()}


@pytest.fixture
def weighted(koordd_stopped):
    if not os.path.isfile(f"{SCHED_EXT_DIR}/state"):
        pytest.fail(f"this kernel has no {SCHED_EXT_DIR}/state (CONFIG_SCHED_CLASS_EXT)")
    assert read("state") == "disabled", f"a BPF scheduler is loaded already: {read('root/ops')}"
    vm.stop_units(*WEIGHTED)
    yield {unit: vm.pinned_busy_loop(unit, vm.LS, CPU, f"CPUWeight={weight}") for unit, weight in WEIGHTED.items()}
    vm.systemctl("stop", vm.UNIT, check=False)
    vm.stop_units(*WEIGHTED)
    assert vm.wait_for(lambda: read("state") == "disabled", 30), read("state")


def test_it_shares_a_contested_cpu_by_cpu_weight(weighted):
    pids = weighted
    weights = {unit: int((vm.CGROUP / vm.LS / f"{unit}.service" / "cpu.weight").read_text()) for unit in pids}
    assert weights == WEIGHTED, weights
    fair = cpu_shares(pids, 15)
    start_koordd()
    assert vm.wait_for(lambda: {policy(p) for p in pids.values()} == {SCHED_EXT}, 30)
    ext = cpu_shares(pids, 30)
    assert read("state") == "enabled" and read("root/ops") == "koordd", "the kernel ejected it (dmesg)"
    ratio = ext["weighthi"] / max(ext["weightlo"], 1)
    print(f"CPU ticks of two busy loops on CPU {CPU} at cpu.weight 100 and 300: fair class {fair} "
          f"({fair['weighthi'] / max(fair['weightlo'], 1):.2f}:1), koordd's scheduler {ext} ({ratio:.2f}:1)")
    assert 2.4 <= ratio <= 3.75, (fair, ext)
