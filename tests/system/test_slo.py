"""Per-class SLOs under systemd on pure cgroup v2: ls.slice promises 1 ms at the p99 and a TCP service in it
answers every request after 5 ms. No BE work runs and nothing else is wrong: koordd (be_suppress, rule
slack) measures the service's own response times in the kernel (the app_latency sensor, started for the
SLO), cuts be.slice on the SLO's slack (the SLO is the signal it acts on), sees the cut buy the service
nothing (its lateness is its own), undoes it and lets that lever rest (docs/be-control.md), says so in
the journal, and puts be.slice's cpu.max back at stop."""
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


@pytest.mark.xfail(strict=False, reason=(
    "issue 36, open: in the VM (TCG) the SLO cut went on to the floor and BE stayed there for 120 s with no "
    "undo decision (run of 2026-11-28; whether the floor was judged 'helped' or the run-queue guard then held "
    "it is not known). The kernel tier's SLO and undo tests pass. Kept running, so a fix shows as XPASS."))
def test_a_late_service_gets_a_cut_on_its_slo_which_is_undone_when_it_buys_nothing(slow_service):
    vm.write_config(CONFIG)
    cursor = vm.journal_cursor()
    vm.systemctl("start", vm.UNIT)
    stop = threading.Event()
    client = threading.Thread(target=_drive, args=(stop,), daemon=True)
    client.start()

    def undone():
        return [e for e in vm.decisions(cursor, "applied")
                if json.loads(e["KOORDD_REASON"]).get("step", "").startswith("undo: cut bought nothing")]
    try:
        found = vm.wait_for(undone, 120)
        assert found, f"no cut undone: cpu.max={vm.cpu_max()}\n{vm.journal_text(cursor)}"
    finally:
        stop.set()
        client.join(timeout=10)
    steps = [json.loads(e["KOORDD_REASON"]) for e in vm.decisions(cursor, "applied")]
    cuts = [r for r in steps if r.get("step") in ("shrink", "shrink (below zero)", "floor")]
    # The SLO is the signal acted on: the service's own p99 against its 1 ms.
    assert cuts and cuts[0]["worst"]["signal"] == "app_p99_us" and cuts[0]["worst"]["cgroup"] == vm.LS, steps
    assert cuts[0]["worst"]["target"] == 1000 and cuts[0]["worst"]["value"] > 1000, cuts[0]
    undo = json.loads(found[0]["KOORDD_REASON"])
    e = undo["experiment"]
    assert e["verdict"] == "bought nothing" and e["signal"] == "app_p99_us" and e["cgroup"] == vm.LS, undo
    assert found[0]["KOORDD_NEW"] == vm.MAX, found[0]          # BE got back what it had: no cap
    sensors = vm.koordd_status().get("sensors") or {}
    assert "the SLO of class LS" in sensors.get("app_latency", {}).get("loops", []), sensors
    vm.systemctl("stop", vm.UNIT)
    assert vm.cpu_max() == vm.MAX, vm.cpu_max()
