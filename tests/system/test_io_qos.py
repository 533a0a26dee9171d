"""io_qos under systemd on pure cgroup v2: be.slice gets io.max on a loop device and io.weight, ls.slice
its io.weight and no limit; iocost is switched on for the disk where the VM's kernel has it; a limit
someone else set on another disk comes through koordd's writes and its restore untouched, and
`systemctl stop` gives back every line koordd wrote, device by device.

The disks are two loop devices over files in /tmp (made and detached here). A direct-IO read of 2 MiB
in be.slice at rbps 1 MiB/s takes about 2 s, in ls.slice a fraction of that.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from . import vm

pytestmark = vm.only_in_vm


def config(dev: str, iocost: bool) -> str:
    return vm.SLICES_CONFIG + f"""\
[loops.be_suppress]
enabled = false

[loops.qos_baseline]
enabled = false

[loops.io_qos]
enabled = true
interval = "1s"
devices = ["{dev}"]
be_io_max = "rbps=1M wiops=100"
ls_io_weight = 500
be_io_weight = 50
iocost_qos = "{'enable=1 ctrl=auto' if iocost else ''}"
"""


@pytest.fixture
def loop_devices(tmp_path):
    made = []
    try:
        for i in range(2):
            backing = tmp_path / f"disk{i}.img"
            backing.write_bytes(os.urandom(1 << 20) * 8)
            dev = vm.sh("losetup", "-f", "--show", str(backing)).stdout.strip()
            made.append((dev, Path(f"/sys/block/{Path(dev).name}/dev").read_text().strip()))
        yield made
    finally:
        for dev, _ in made:
            vm.sh("losetup", "-d", dev, check=False)


HOLDERS = {vm.BE: "ioqos-be-hold", vm.LS: "ioqos-ls-hold"}


@pytest.fixture
def io_slices(koordd_stopped):
    """systemd enables the io controller down to a unit that asks for IO accounting, and only while one
    runs: a sleeping unit in each slice that does."""
    vm.stop_units(*HOLDERS.values())
    for slice_, unit in HOLDERS.items():
        vm.sh("systemd-run", f"--slice={slice_}", f"--unit={unit}", "--property=IOAccounting=yes", "sleep", "600")
    assert vm.wait_for(lambda: all(vm.knob(s, "io.max") is not None for s in HOLDERS), 30), \
        f"no {vm.BE}/io.max: {(vm.CGROUP / 'cgroup.subtree_control').read_text()}"
    yield
    vm.stop_units(*HOLDERS.values())


def read_seconds(slice_: str, dev: str) -> float:
    t0 = time.monotonic()
    vm.sh("systemd-run", f"--slice={slice_}", "--wait", "--quiet", "dd", f"if={dev}", "of=/dev/null", "bs=64k",
          "count=32", "iflag=direct")
    return time.monotonic() - t0


def test_be_limited_ls_weighted_iocost_on_and_stop_restores_per_device(io_slices, loop_devices):
    (dev, mine), (_, other) = loop_devices
    iocost = (vm.CGROUP / "io.cost.qos").is_file()
    (vm.CGROUP / vm.BE / "io.max").write_text(f"{other} riops=7777")          # someone else's limit
    theirs = f"{other} rbps=max wbps=max riops=7777 wiops=max"
    weights = {s: vm.knob(s, "io.weight") for s in (vm.BE, vm.LS)}
    qos_before = (vm.CGROUP / "io.cost.qos").read_text() if iocost else ""
    free = read_seconds(vm.BE, dev)

    vm.write_config(config(dev, iocost))
    cursor = vm.journal_cursor()
    vm.systemctl("enable", "--now", vm.UNIT)
    want = f"{mine} rbps=1048576 wbps=max riops=max wiops=100"
    assert vm.wait_for(lambda: want in (vm.knob(vm.BE, "io.max") or ""), 60), vm.journal_text(cursor)
    assert theirs in vm.knob(vm.BE, "io.max")
    assert vm.knob(vm.LS, "io.max") == ""
    if weights[vm.LS] is not None:          # io.weight exists where the kernel has iocost
        assert vm.wait_for(lambda: vm.knob(vm.LS, "io.weight").startswith("default 500")
                           and vm.knob(vm.BE, "io.weight").startswith("default 50"), 30), vm.journal_text(cursor)
    if iocost:
        assert vm.wait_for(lambda: f"{mine} enable=1 ctrl=auto" in (vm.CGROUP / "io.cost.qos").read_text(), 30), \
            vm.journal_text(cursor)
    limited, ls_time = read_seconds(vm.BE, dev), read_seconds(vm.LS, dev)
    print(f"2 MiB direct read in be.slice: {free:.2f}s without koordd, {limited:.2f}s at rbps 1M; "
          f"in ls.slice {ls_time:.2f}s; iocost {'on' if iocost else 'not in this kernel'}")
    # The limit (1 MiB/s on 2 MiB) costs at least a second over the unlimited read, however slow the disk is
    # (the VM's unlimited read took 0.91 and 1.08 s in two runs of 2026-11-28: 3 x free was no bound).
    assert limited >= 1.0 and limited > free + 1.0

    vm.systemctl("stop", vm.UNIT)
    assert vm.knob(vm.BE, "io.max") == theirs
    assert {s: vm.knob(s, "io.weight") for s in (vm.BE, vm.LS)} == weights
    if iocost:
        lines = (vm.CGROUP / "io.cost.qos").read_text().splitlines()
        line = next((ln for ln in lines if ln.startswith(mine + " ")), "")
        assert not line or "enable=0" in line, line
        assert [ln for ln in qos_before.splitlines() if not ln.startswith(mine + " ")] == \
            [ln for ln in (vm.CGROUP / "io.cost.qos").read_text().splitlines() if not ln.startswith(mine + " ")]
    assert vm.held() == []
    (vm.CGROUP / vm.BE / "io.max").write_text(f"{other} riops=max")
    subprocess.run(["sync"], check=False)
