"""net_shaping under systemd on pure cgroup v2: koordd as the service shapes a veth whose peer is in a
network namespace, with iperf3 senders as transient units in ls.slice (UDP, 8 Mbit/s) and be.slice
(TCP, as fast as it may). BE stays within 10% of a ceiling that follows LS's measured rate (link 20
Mbit/s: 20 - LS - max(1, LS/10)); `systemctl stop koordd` leaves the device with the kernel's
default root qdisc and no clsact. Rates are the kernel's HTB class counters.
"""
from __future__ import annotations

import time

import pytest

from . import vm

pytestmark = vm.only_in_vm

NS, HOST, PEER = "kdsys", "kdsys0", "kdsys1"
LINK, LS_RATE = 20_000_000, 8_000_000
UNITS = ("netls", "netbe")

CONFIG = f"""\
[daemon]
cgroup_root = ""
state_dir = "{vm.STATE_DIR}"
log_level = "info"

[[classes]]
name = "BE"
cgroups = ["be.slice"]

[[classes]]
name = "LS"
cgroups = ["ls.slice"]

[loops.be_suppress]
enabled = false

[loops.net_shaping]
enabled = true
interval = "1s"
devices = ["{HOST}:{LINK}"]
"""


@pytest.fixture
def link(koordd_stopped):
    vm.sh("ip", "netns", "add", NS)
    try:
        vm.sh("ip", "link", "add", HOST, "type", "veth", "peer", "name", PEER, "netns", NS)
        vm.sh("ip", "addr", "add", "10.78.0.1/24", "dev", HOST)
        vm.sh("ip", "link", "set", HOST, "up")
        vm.sh("ip", "-n", NS, "addr", "add", "10.78.0.2/24", "dev", PEER)
        vm.sh("ip", "-n", NS, "link", "set", PEER, "up")
        for port in (5201, 5202):
            vm.sh("ip", "netns", "exec", NS, "iperf3", "-s", "-D", "-p", str(port))
        yield
    finally:
        vm.stop_units(*UNITS)
        vm.sh("sh", "-c", f"ip netns pids {NS} | xargs -r kill", check=False)
        vm.sh("ip", "link", "del", HOST, check=False)
        vm.sh("ip", "netns", "del", NS, check=False)


def rates(seconds: float) -> dict:
    """The net sensor's view of HOST over `seconds` (the installed koordd's code, as koordd reads it)."""
    from koordd.sensors.contract import SensorContext
    from koordd.sensors.net import NetSensor
    sensor = NetSensor()
    sensor.start()
    try:
        sensor.sample(SensorContext(time.monotonic(), {}))
        time.sleep(seconds)
        return sensor.sample(SensorContext(time.monotonic(), {})).get(HOST)
    finally:
        sensor.stop()


def root_qdiscs() -> str:
    return vm.sh("tc", "qdisc", "show", "dev", HOST).stdout


def test_be_follows_a_ceiling_set_by_ls_traffic_and_stop_removes_the_shaping(link):
    vm.write_config(CONFIG)
    cursor = vm.journal_cursor()
    vm.systemctl("start", vm.UNIT)
    assert vm.wait_for(lambda: "htb 1:" in root_qdiscs() and "clsact" in root_qdiscs(), 60), \
        root_qdiscs() + vm.journal_text(cursor)
    vm.sh("systemd-run", f"--slice={vm.BE}", "--unit=netbe", "iperf3", "-c", "10.78.0.2", "-p", "5201", "-t", "60")
    vm.sh("systemd-run", f"--slice={vm.LS}", "--unit=netls", "iperf3", "-c", "10.78.0.2", "-p", "5202", "-u",
          "-b", str(LS_RATE), "-t", "60")
    time.sleep(12)                                   # the ceiling settles, BE's TCP ramps up
    got = rates(5)
    assert got is not None, root_qdiscs()
    report = f"LS {got.ls_bps / 1e6:.1f} Mbit/s, BE {got.be_bps / 1e6:.1f} under {got.be_ceil_bps / 1e6:.1f}"
    print(f"[system] {report}")
    rule = LINK - got.ls_bps - max(0.05 * LINK, 0.10 * got.ls_bps)
    assert got.ls_bps >= 0.9 * LS_RATE, report
    assert abs(got.be_ceil_bps - rule) <= 0.05 * LINK, report     # the ceiling is a round behind LS
    assert abs(got.be_bps - got.be_ceil_bps) <= 0.10 * got.be_ceil_bps, report
    decisions = vm.journal(cursor, "KOORDD_LOOP=net_shaping", "KOORDD_KNOB=tc.be_ceil")
    assert decisions, vm.journal_text(cursor)
    vm.stop_units(*UNITS)
    vm.systemctl("stop", vm.UNIT)
    shown = root_qdiscs()
    assert "htb" not in shown and "clsact" not in shown, shown
    assert vm.held() == []
