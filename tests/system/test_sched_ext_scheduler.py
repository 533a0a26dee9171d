"""koordd's own sched_ext scheduler (koordd/bpf/koordd_sched.bpf.o) on a kernel with sched_ext, loaded by
`python -m koordd.kernel.sched_ext_scheduler` (koordd/kernel/sched_ext_scheduler.py's safe switch) with ls.slice as LS and be.slice as BE:
- it loads: state "enabled", root/ops "koordd", enable_seq one higher;
- it serves the LS class: a busy loop in ls.slice with SCHED_EXT runs; with a BE busy loop (also
  SCHED_EXT) on the same single CPU, LS gets most of it, where the fair class would split it evenly,
  and BE still runs a little (the guard that keeps the kernel's watchdog from ejecting it);
- it unloads cleanly on SIGTERM ("disabled", the threads back in the fair class and running), and
  the kernel unloads it when its loader is killed with SIGKILL (its BPF link dies with it).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from . import vm

pytestmark = vm.only_in_vm

SCHED_EXT, SCHED_EXT_DIR = vm.SCHED_EXT, vm.SCHED_EXT_DIR
read = vm.sched_ext_file
LOOPS = {"scxls": vm.LS, "scxbe": vm.BE}
CPU = 1                         # both loops share it; the VM has 2


def busy_loop(unit: str) -> int:
    return vm.pinned_busy_loop(unit, LOOPS[unit], CPU)


def shares(pids: dict[str, int], seconds: float) -> dict[str, int]:
    before = {unit: vm.cpu_ticks(pid) for unit, pid in pids.items()}
    time.sleep(seconds)
    return {unit: vm.cpu_ticks(pid) - before[unit] for unit, pid in pids.items()}


class Loader:
    """`python -m koordd.kernel.sched_ext_scheduler --ls ls.slice --be be.slice`, started; `first_line` is the switch's
    result. libbpf's log (the verifier's, when loading fails) goes to a file: it can outgrow a pipe."""

    def __init__(self):
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "koordd.kernel.sched_ext_scheduler", "--ls", str(vm.CGROUP / vm.LS), "--be", str(vm.CGROUP / vm.BE)],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.first_line = self.proc.stdout.readline().strip()

    def output(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        self.log.seek(0)
        return f"{self.first_line}\n{self.proc.stdout.read()}\nstderr:\n{self.log.read()[-20000:]}"


@pytest.fixture
def loops(koordd_stopped):
    if not os.path.isfile(f"{SCHED_EXT_DIR}/state"):
        pytest.fail(f"this kernel has no {SCHED_EXT_DIR}/state (CONFIG_SCHED_CLASS_EXT)")
    assert read("state") == "disabled", f"a BPF scheduler is loaded already: {read('root/ops')}"
    vm.stop_units(*LOOPS)
    loaders: list[Loader] = []
    yield {unit: busy_loop(unit) for unit in LOOPS}, loaders
    for loader in loaders:
        if loader.proc.poll() is None:
            loader.proc.kill()
            loader.proc.wait()
    vm.stop_units(*LOOPS)
    assert vm.wait_for(lambda: read("state") == "disabled", 30), read("state")


def test_loads_serves_ls_first_and_unloads(loops):
    pids, loaders = loops
    fair = shares(pids, 3)
    seq = int(read("enable_seq"))
    for pid in pids.values():
        os.sched_setscheduler(pid, SCHED_EXT, os.sched_param(0))

    loader = Loader()
    loaders.append(loader)
    assert loader.first_line.startswith("koordd's scheduler runs"), loader.output()
    assert (read("state"), read("root/ops"), int(read("enable_seq"))) == ("enabled", "koordd", seq + 1)
    assert {unit: os.sched_getscheduler(pid) for unit, pid in pids.items()} == \
        {"scxls": SCHED_EXT, "scxbe": SCHED_EXT}

    ext = shares(pids, 5)
    print(f"CPU ticks of the busy loops on one CPU: fair class {fair} (3 s), koordd's scheduler {ext} (5 s)")
    assert ext["scxls"] > 0, ext                         # LS runs under koordd's scheduler
    assert ext["scxls"] > 5 * max(ext["scxbe"], 1), (ext, fair)  # and BE waits (fair: about even)
    assert ext["scxbe"] > 0, ext                         # but not for ever: the starvation guard
    assert read("state") == "enabled", "the kernel ejected the scheduler (see dmesg)"

    loader.proc.send_signal(signal.SIGTERM)
    assert loader.proc.wait(30) == 0, loader.output()
    assert read("state") == "disabled" and read("root/ops") == ""
    after = shares(pids, 3)
    assert min(after.values()) > 0, after                # both back in the fair class, running


def test_killing_the_loader_unloads_the_scheduler(loops):
    pids, loaders = loops
    loader = Loader()
    loaders.append(loader)
    assert loader.first_line.startswith("koordd's scheduler runs"), loader.output()
    assert read("state") == "enabled" and read("root/ops") == "koordd"

    loader.proc.send_signal(signal.SIGKILL)
    loader.proc.wait(30)
    assert vm.wait_for(lambda: read("state") == "disabled", 30, step=0.1), read("state")
    assert read("root/ops") == ""
