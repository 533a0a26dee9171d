"""Per-class SLOs under systemd on pure cgroup v2: ls.slice promises 1 ms at the p99 and a TCP service in it
answers every request after 5 ms. No BE work runs and nothing else is wrong: koordd (be_suppress, rule
slack) measures the service's own response times in the kernel (the app_latency sensor, started for the
SLO), sends be.slice to its floor on the SLO's slack, says so in the journal, lets BE grow again once
the service is quiet, and puts be.slice's cpu.max back at stop."""
from __future__ import annotations

import json
import socket
import threading

import pytest

from . import vm

pytestmark = vm.only_in_vm

PORT = 17878
SERVER = f"""
import socket, threading, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PORT}))
s.listen(8)

def answer(c):
    with c, c.makefile("rb") as requests:
        for _ in requests:
            time.sleep(0.005)
            c.sendall(b"ok\\n")

while True:
    threading.Thread(target=answer, args=(s.accept()[0],), daemon=True).start()
"""
CONFIG = vm.SLICES_CONFIG + """\
[classes.slo]
latency_p99 = "1ms"

[loops.be_suppress]
enabled = true
interval = "1s"
rule = "slack"
policy = "cfs_quota"
"""


@pytest.fixture
def slow_service(cpu_controller, koordd_stopped):
    vm.stop_units("slowsrv")
    vm.sh("systemd-run", f"--slice={vm.LS}", "--unit=slowsrv", "/opt/koordd/bin/python", "-c", SERVER)
    assert vm.wait_for(lambda: _connects(), 30), "the service in ls.slice did not listen"
    yield
    vm.stop_units("slowsrv")


def _connects() -> bool:
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
        return True
    except OSError:
        return False


def _drive(stop: threading.Event) -> None:
    with socket.create_connection(("127.0.0.1", PORT)) as c:
        while not stop.is_set():
            c.sendall(b"request\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = c.recv(64)
                if not chunk:
                    return
                answer += chunk


def test_a_late_service_sends_be_to_its_floor_on_its_slo_and_stop_restores(slow_service):
    vm.write_config(CONFIG)
    cursor = vm.journal_cursor()
    vm.systemctl("start", vm.UNIT)
    stop = threading.Event()
    client = threading.Thread(target=_drive, args=(stop,), daemon=True)
    client.start()
    try:
        floored = vm.wait_for(lambda: vm.quota() == 2000, 90)
        assert floored, f"be.slice not at its floor: cpu.max={vm.cpu_max()}\n{vm.journal_text(cursor)}"
    finally:
        stop.set()
        client.join(timeout=10)
    steps = [json.loads(e["KOORDD_REASON"]) for e in vm.decisions(cursor, "applied")]
    worst = [r["worst"] for r in steps if r.get("step") == "floor"]
    assert worst and worst[0]["signal"] == "app_p99_us" and worst[0]["cgroup"] == vm.LS, steps
    assert worst[0]["target"] == 1000 and worst[0]["value"] > 1000, worst[0]
    sensors = vm.koordd_status().get("sensors") or {}
    assert "the SLO of class LS" in sensors.get("app_latency", {}).get("loops", []), sensors
    # Quiet: no response is neither late nor healthy; the run queue and PSI are calm, so BE grows again.
    grown = vm.wait_for(lambda: (q := vm.quota()) is None or q >= 50000, 90)
    assert grown, f"be.slice did not grow back: cpu.max={vm.cpu_max()}\n{vm.journal_text(cursor)}"
    vm.systemctl("stop", vm.UNIT)
    assert vm.cpu_max() == vm.MAX, vm.cpu_max()
