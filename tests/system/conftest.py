"""Fixtures for the system tests (inside scripts/vmtest's VM only; see vm.py for the skip rule).

`koordd_stopped` gives every test a stopped, disabled koordd with the shipped config and no test
drop-in, and puts that back afterwards (stopping koordd restores its knobs). `hogs` runs stress-ng
in ls.slice (1 CPU) and be.slice (2 CPUs) as transient systemd units.
"""
from __future__ import annotations

import os
import signal

import pytest

from . import vm


def _reset_koordd() -> None:
    """Stopped (so its knobs are restored), disabled, shipped config, no test drop-in. Only what
    differs is changed: under TCG each daemon-reload (also implied by enable/disable) takes seconds."""
    if vm.is_active() not in ("inactive", "failed"):
        vm.systemctl("stop", vm.UNIT, check=False)
    if vm.sh("systemctl", "is-enabled", vm.UNIT, check=False).stdout.strip() != "disabled":
        vm.systemctl("disable", vm.UNIT, check=False)
    if vm.is_active() == "failed":
        vm.systemctl("reset-failed", vm.UNIT, check=False)
    if vm.DROPIN.exists():
        vm.DROPIN.unlink()
        vm.systemctl("daemon-reload")
    if not vm.CONFIG.exists() or vm.CONFIG.read_text() != vm.shipped_config():
        vm.write_config(vm.shipped_config())


@pytest.fixture
def koordd_stopped():
    _reset_koordd()
    assert vm.is_active() in ("inactive", "failed"), vm.is_active()
    yield
    pid = vm.main_pid()
    if pid and vm.pid_alive(pid):
        os.kill(pid, signal.SIGCONT)     # in case a test left it stopped
    _reset_koordd()


@pytest.fixture(scope="session")
def cpu_controller():
    """The cpu controller for the QoS slices.

    systemd enables the cpu controller only for units that set a CPU property: a bare
    `systemd-run --slice=be.slice` leaves be.slice without cpu.max (root's cgroup.subtree_control is
    "memory pids"), and be_suppress has nothing to write. An operator enables it on the slices.
    """
    for s in (vm.BE, vm.LS):
        vm.systemctl("set-property", "--runtime", s, "CPUWeight=100")
    yield


@pytest.fixture
def hogs(cpu_controller, koordd_stopped):
    """stress-ng: 1 CPU worker in ls.slice (lshog), 2 in be.slice (behog), on the VM's 2 CPUs."""
    units = {"lshog": (vm.LS, 1), "behog": (vm.BE, 2)}
    vm.stop_units(*units)
    for unit, (slice_, n) in units.items():
        vm.start_stress(unit, slice_, n)
    assert vm.wait_for(lambda: vm.cpu_max(vm.BE) is not None, 30), \
        f"{vm.BE}/cpu.max did not appear; root subtree_control: {(vm.CGROUP / 'cgroup.subtree_control').read_text()}"
    assert vm.cpu_max(vm.BE) == vm.MAX, f"be.slice starts capped: {vm.cpu_max(vm.BE)}"
    yield
    vm.stop_units(*units)


# --- tests that need a kernel build option ------------------------------------------------------------------
# `@pytest.mark.kernel_config("CONFIG_SCHED_CORE")`: the test needs the guest kernel built with that option.
# Inside scripts/vmtest's VM, a kernel whose own build config says it has not got the option ("# ... is not
# set", or no line at all) leaves the test out at collection -- deselected, said in one line per option
# after pytest's "collected" line -- instead of running it into a skip, which the VM counts as a failure:
# the kernel was chosen to lack it (Debian's has no CONFIG_SCHED_CORE), koordd did nothing wrong. Only
# the config file decides, never the test's own probing: a kernel whose config HAS the option runs the
# test, and a refusal there fails it. Where no config is readable the test runs too.

def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "kernel_config(option): a system test that needs the guest kernel "
                            "built with OPTION; left out (deselected, said so) on a kernel whose config lacks it")


def pytest_collection_modifyitems(config, items) -> None:
    if vm.SKIP_REASON:
        return          # outside the VM every system test skips anyway (vm.only_in_vm)
    keep, left_out, why = [], {}, {}
    for item in items:
        marker = item.get_closest_marker("kernel_config")
        if marker is not None:
            option = marker.args[0]
            value, said = vm.kernel_config(option)
            if value == "":
                left_out.setdefault(option, []).append(item)
                why[option] = said
                continue
        keep.append(item)
    if left_out:
        config.hook.pytest_deselected(items=[i for its in left_out.values() for i in its])
        items[:] = keep
        config._koordd_left_out = [
            f"tests/system: left out {len(its)} test(s) that need {option}, which kernel {os.uname().release} "
            f"lacks ({why[option]}): {', '.join(i.nodeid.rsplit('::', 1)[-1] for i in its)}"
            for option, its in left_out.items()]


def pytest_report_collectionfinish(config, start_path, items) -> list[str]:
    return getattr(config, "_koordd_left_out", [])
