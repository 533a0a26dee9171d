"""Issue 35 item 2, the slow receiver's half: koordd as a process on a fake tree, under a fake systemd
(NOTIFY_SOCKET, WATCHDOG_USEC), its network peers all hostile servers on 127.0.0.1 (koordtest/hostile.py):
the node report's receiver (a trickled head, then an endless run of `100 Continue`, then silence), an SLO
scraped from a Prometheus endpoint (an endless `100 Continue`, then a trickled head) and an SLO probe at
a silent server. systemd's watchdog must be fed the whole time, through two reloads that move [report]
(timeout = "10s", the most it takes) while a push is in flight, and a SIGTERM with a push in flight must
end koordd at once, every peer's thread with it.

The prekill hook's half: tests/unit/backends/test_prekill.py::test_the_watchdog_is_fed_while_a_hook_sleeps_and_sigterm_kills_no_victim
(and tests/kernel/test_memory_evict_kernel.py's, on a real victim).
"""
from __future__ import annotations

import os
import signal
import time

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.hostile import HostileServer
from koordtest.notify import NotifySocket, start_koordd

MiB = 1 << 20
WATCHDOG_USEC = 4_000_000           # systemd kills at 4 s without a ping; koordd pings every 2 s
WATCHDOG_S = WATCHDOG_USEC / 1e6
PHASE = 1.5 * WATCHDOG_S            # each stage of the test: at least two pings due

CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"

[[classes]]
name = "LS"
cgroups = ["k/api"]
[classes.slo]
latency_p99 = "20ms"
source = "prometheus"
url = "{scrape}"
metric = "http_request_duration_seconds"

[[classes]]
name = "LS"
cgroups = ["k/cache"]
[classes.slo]
latency_p99 = "2ms"
source = "probe"
probe = "{probe}"
probe_interval = "100ms"
probe_timeout = "5s"

[[classes]]
name = "BE"
cgroups = ["k/be"]

[loops.memory_evict]
enabled = true
interval = "100ms"
scope = "k"
reclaim = false

[report]
url = "{report}"
interval = "100ms"
timeout = "10s"
"""


def wait_for(predicate, timeout=30.0, what="condition", log=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}\n{log.read_text() if log and log.exists() else ''}")


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def threads_after(pid: int, settled: int, timeout: float = 5.0) -> int:
    """koordd's thread count once it is back to `settled`, or after `timeout` seconds (what it is then)."""
    end = time.monotonic() + timeout
    while (n := threads(pid)) > settled and time.monotonic() < end:
        time.sleep(0.05)
    return n


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


def test_the_watchdog_is_fed_through_slow_peers_and_reloads_and_sigterm_ends_every_peer_thread(tmp_path):
    """The review of issue 35: a reload that changed [report] while a push was trickled waited timeout + 1 s
    (with timeout = "35s", 40.9 s: WatchdogSec=30s kills koordd), a stop waited as long, and each such reload
    left the old thread running. Here pings must come less than WATCHDOG_USEC apart from the first to the
    SIGTERM, the thread count must come back after each reload, and the stop must take less than half of
    WATCHDOG_USEC (with a push in flight to a silent receiver, 10 s timeout)."""
    tree = FakeCgroups(tmp_path, "v2").add("k").add("k/api").add("k/cache").add("k/be", memory_current=40 * MiB)
    tree.set("k", None, "memory.max", f"{512 * MiB}\n")
    tree.stat("k", memory_current=40 * MiB)                 # nothing to evict: the loop only ticks
    trickle, endless, silent = HostileServer("trickle_head"), HostileServer("endless_continue"), \
        HostileServer("silent")
    scrape, scrape2 = HostileServer("endless_continue"), HostileServer("trickle_head")
    probe = HostileServer("silent")
    servers = (trickle, endless, silent, scrape, scrape2, probe)
    config = tmp_path / "etc" / "koordd.toml"
    config.parent.mkdir()

    def write(report: HostileServer, scraped: HostileServer) -> None:
        new = config.with_suffix(".new")
        new.write_text(CONFIG.format(root=tree.root, state=tmp_path / "state", scrape=scraped.url,
                                     probe=probe.address, report=report.url))
        new.rename(config)                  # one whole file: the watcher never reads half of one

    write(trickle, scrape)
    notify = NotifySocket(tmp_path / "notify.sock")
    log = tmp_path / "koordd.log"
    proc = start_koordd(config, log, notify, WATCHDOG_USEC)
    try:
        wait_for(lambda: notify.times("READY=1"), what="READY=1", log=log)
        # Every peer is being asked: a push trickled, a scrape answered by 100 Continues, a probe unanswered.
        wait_for(lambda: trickle.connections and scrape.connections and probe.connections,
                 what="koordd asking its peers", log=log)
        time.sleep(PHASE)
        settled = threads(proc.pid)

        # A reload that moves [report] while a push is in flight, trickled: no wait, the old thread ends.
        assert trickle.connections >= 1
        write(endless, scrape)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: endless.connections, what="the reload to the endless 100 Continue", log=log)
        time.sleep(PHASE)
        counts = [threads_after(proc.pid, settled)]

        # And another, which moves the scrape too; the new receiver is silent: a 10 s push waits there.
        write(silent, scrape2)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: silent.connections and scrape2.connections, what="the reload to the silent receiver",
                 log=log)
        time.sleep(PHASE)
        counts.append(threads_after(proc.pid, settled))
        assert proc.poll() is None, log.read_text()

        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()
        for s in servers:
            s.close()
    text = log.read_text()
    pings = notify.times("WATCHDOG=1")
    reloads = notify.times("RELOADING=1")
    assert len(reloads) >= 2, text
    assert pings and pings[0] < reloads[0], text
    between = gaps(pings + [stopped])
    wrong = []              # all of them, so that a failure on old code says everything that went wrong
    if code != 0:
        wrong.append(f"koordd exited {code}")
    if max(between) >= WATCHDOG_S:
        wrong.append(f"no WATCHDOG=1 for {max(between):.1f}s (systemd kills at {WATCHDOG_S:g}s): gaps "
                     f"{[round(g, 1) for g in between]}, reloads {[round(r - pings[0], 1) for r in reloads]}s in")
    if took >= WATCHDOG_S / 2:
        wrong.append(f"SIGTERM took {took:.1f}s to end koordd")
    if max(counts) > settled:
        wrong.append(f"threads: {settled} before the reloads, {counts} after each (a peer's thread left running)")
    if "did not end within" in text:
        wrong.append("a peer's thread did not end when stopped")
    if "Traceback" in text:
        wrong.append("a traceback in the log")
    assert not wrong, "\n".join(wrong) + "\n" + text
