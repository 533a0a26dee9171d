"""Per-class SLOs under systemd on pure cgroup v2 (be_suppress, rule slack; docs/be-control.md, docs/slo.md).

- A late service: ls.slice promises 1 ms at the p99 and a TCP service in it answers every request after 5 ms.
  No BE work runs and nothing else is wrong: koordd measures the service's own response times in the kernel
  (the app_latency sensor, started for the SLO), cuts be.slice on the SLO's slack (the SLO is the signal it
  acts on), sees the cut buy the service nothing (its lateness is its own), undoes it and lets that lever
  rest, says so in the journal, and puts be.slice's cpu.max back at stop.
- The SLO rules over the run-queue proxy: a service that answers at once meets a generous SLO while its
  threads wait on the run queue far longer than a tiny `runq_p99` health target (BE busy beside it). The run
  queue only guards: at most one bounded cut per 2 x guard_cut_max, each undone within guard_cut_max, BE
  never floored, and cpu.max back to no cap."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from . import vm

pytestmark = vm.only_in_vm

PORT = 17878
# Under TCG the service's windowed p99 wanders by a quarter (21-31 ms) over tens of seconds with nothing
# changed: a useless cut was judged "helped" by chance in about one try of four (4 of 13 VM runs). Such a cut
# is now released for a window to test it (A/B/A, core/experiment.py), and stays released when the release
# costs nothing: that is its undo too. Where the release too reads as a cost by chance ("cut again"), the
# try is started again, up to ATTEMPTS in all; a koordd that never undoes a useless cut still fails.
ATTEMPTS = 3
FAST_PORT = 17879
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
FAST_SERVER = SERVER.replace(str(PORT), str(FAST_PORT)).replace("            time.sleep(0.005)\n", "")
GUARD_CUT_MAX = 15       # seconds
FAST_CONFIG = vm.SLICES_CONFIG.replace(f'cgroups = ["{vm.LS}"]\n', f'''cgroups = ["{vm.LS}"]
[classes.health]
runq_p99 = "20us"
runq_mean = "20us"
[classes.slo]
latency_p99 = "500ms"
''') + f"""\
[loops.be_suppress]
enabled = true
interval = "1s"
rule = "slack"
policy = "cfs_quota"
guard_cut_max = "{GUARD_CUT_MAX}s"
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


@pytest.fixture
def fast_service_beside_be(cpu_controller, koordd_stopped):
    """A service in ls.slice that answers at once, and 2 stress-ng CPU workers in be.slice beside it."""
    vm.stop_units("fastsrv", "behog")
    vm.sh("systemd-run", f"--slice={vm.LS}", "--unit=fastsrv", "/opt/koordd/bin/python", "-c", FAST_SERVER)
    assert vm.wait_for(lambda: _connects(FAST_PORT), 30), "the service in ls.slice did not listen"
    vm.start_stress("behog", vm.BE, 2)
    assert vm.wait_for(lambda: vm.cpu_max(vm.BE) is not None, 30), f"{vm.BE}/cpu.max did not appear"
    assert vm.cpu_max(vm.BE) == vm.MAX, vm.cpu_max(vm.BE)
    yield
    vm.stop_units("fastsrv", "behog")


def _connects(port: int = PORT) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _drive(stop: threading.Event, port: int = PORT) -> None:
    with socket.create_connection(("127.0.0.1", port)) as c:
        while not stop.is_set():
            c.sendall(b"request\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = c.recv(64)
                if not chunk:
                    return
                answer += chunk


# The VM once showed BE at its floor for 120 s with no undo (issue 36): reproduced on fake snapshots and fixed,
# tests/unit/plugins/test_be_suppress_slo_rounds.py (the run-queue guard cut BE, cut by cut, in rounds between
# two SLO values; a cut judged against the one high sample that prompted it looked helpful).
def test_a_late_service_gets_a_cut_on_its_slo_which_is_undone_when_it_buys_nothing(slow_service):
    vm.write_config(CONFIG)

    def on_slo(cursor, *steps):
        # be_cap's decisions on the SLO whose step starts with one of `steps` (a run-queue guard's own bounded
        # cut may come and go before them)
        return [e for e in vm.decisions(cursor) if json.loads(e["KOORDD_REASON"]).get("step", "").startswith(steps)
                and (json.loads(e["KOORDD_REASON"]).get("experiment") or {}).get("signal") == "app_p99_us"
                and json.loads(e["KOORDD_REASON"])["experiment"].get("lever") == "be_cap"]

    def undone(cursor):
        # the cut judged to have bought nothing and undone, or judged helped, released to test it, and left
        # released because the release cost nothing
        return on_slo(cursor, "undo: cut bought nothing", "stay released")

    def kept(cursor):
        # the cut judged "helped" and its release judged a cost too: a p99 that wanders by a quarter, by chance
        return on_slo(cursor, "cut again")

    for attempt in range(1, ATTEMPTS + 1):
        cursor = vm.journal_cursor()
        vm.systemctl("start", vm.UNIT)
        stop = threading.Event()
        client = threading.Thread(target=_drive, args=(stop,), daemon=True)
        client.start()
        try:
            vm.wait_for(lambda: undone(cursor) or kept(cursor), 120)
        finally:
            stop.set()
            client.join(timeout=10)
        found = undone(cursor)
        if found:
            break
        chance = kept(cursor)
        assert chance and attempt < ATTEMPTS, f"no cut undone: cpu.max={vm.cpu_max()}\n{vm.journal_text(cursor)}"
        print(f"[system] attempt {attempt}: the cut judged helped by chance: "
              f"{json.loads(chance[0]['KOORDD_REASON'])['experiment']}")
        vm.systemctl("stop", vm.UNIT)
        assert vm.cpu_max() == vm.MAX, vm.cpu_max()
    steps = [json.loads(e["KOORDD_REASON"]) for e in vm.decisions(cursor, "applied")]
    cuts = [r for r in steps if r.get("step") in ("shrink", "shrink (below zero)", "floor")]
    # The SLO is the signal acted on: the service's own p99 against its 1 ms.
    assert cuts and cuts[0]["worst"]["signal"] == "app_p99_us" and cuts[0]["worst"]["cgroup"] == vm.LS, steps
    assert cuts[0]["worst"]["target"] == 1000 and cuts[0]["worst"]["value"] > 1000, cuts[0]
    undo = json.loads(found[0]["KOORDD_REASON"])
    e = undo["experiment"]
    assert e["verdict"] == "bought nothing" and e["signal"] == "app_p99_us" and e["cgroup"] == vm.LS, undo
    print(f"[system] the useless cut's end: {undo['step']}")
    assert found[0]["KOORDD_NEW"] == vm.MAX, found[0]          # BE got back what it had: no cap
    sensors = vm.koordd_status().get("sensors") or {}
    assert "the SLO of class LS" in sensors.get("app_latency", {}).get("loops", []), sensors
    vm.systemctl("stop", vm.UNIT)
    assert vm.cpu_max() == vm.MAX, vm.cpu_max()


def test_with_the_slo_met_the_run_queue_only_guards_one_bounded_cut_never_the_floor(fast_service_beside_be):
    vm.write_config(FAST_CONFIG)
    cursor = vm.journal_cursor()
    vm.systemctl("start", vm.UNIT)
    stop = threading.Event()
    client = threading.Thread(target=_drive, args=(stop, FAST_PORT), daemon=True)
    client.start()
    try:
        # Long enough for a guard cut (after two rounds over), its end within guard_cut_max, and BE's growth:
        # only cgroup files are read meanwhile (a journalctl is expensive under TCG).
        quotas = []
        for _ in range(2 * GUARD_CUT_MAX + 10):
            vm.wait_ticks("be_suppress", 1)
            quotas.append(vm.quota())
        # BE grows back: no cap once the guard's cut ends. Waited for with the client still sending (the SLO
        # keeps its values) and before the journal is read, so that a cut taken near the end of the rounds
        # above, held as long as guard_cut_max allows, shows its end too.
        grew_back = vm.wait_for(lambda: vm.cpu_max() == vm.MAX, GUARD_CUT_MAX + 10)
        uncapped_at = time.time()
    finally:
        stop.set()
        client.join(timeout=10)
    entries = vm.decisions(cursor, "applied")
    steps = [(int(e["__REALTIME_TIMESTAMP"]) / 1e6, e["KOORDD_NEW"], json.loads(e["KOORDD_REASON"])) for e in entries]
    brief = [(round(t - steps[0][0], 1), new, r.get("step")) for t, new, r in steps] if steps else []
    # The SLO decided: no cut on it (it was met), never the floor.
    assert all(q is None or q > 4000 for q in quotas), (quotas, brief)
    assert not [r for _, _, r in steps if str(r.get("step", "")).startswith(("shrink", "floor"))], brief
    assert all(r["worst"]["signal"] == "app_p99_us" for _, _, r in steps if r.get("worst")), brief
    # The run queue (over its 20 µs target all along) guarded: a bounded cut, at most one per 2 x guard_cut_max.
    cuts = [t for t, _, r in steps if str(r.get("step", "")).startswith("guard: one cut")]
    assert cuts, (f"no guard cut: was the run queue over its 20 µs target? {brief}\n"
                  f"{vm.journal_text(cursor)[-4000:]}")
    assert all(b - a >= 2 * GUARD_CUT_MAX - 3 for a, b in zip(cuts, cuts[1:])), brief
    for cut in (c for c in cuts if c < uncapped_at):    # one taken after BE was seen uncapped ends later
        back = [t for t, new, _ in steps if t > cut and new == vm.MAX]
        assert back and back[0] - cut <= GUARD_CUT_MAX + 3, (cut, brief)      # undone within guard_cut_max
    assert grew_back, (vm.cpu_max(), brief)
    vm.systemctl("stop", vm.UNIT)
    assert vm.cpu_max() == vm.MAX, vm.cpu_max()
