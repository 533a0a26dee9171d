"""koordd as a process on a fake cgroup tree: start-up, sd_notify, reloads, stop and crash recovery."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.notify import NotifySocket
from koordctl.top import write_request
from koordd.act.journal import read_held
from koordd.core.feeds import REQUEST_FILE, TOP_FILE, TopRequest

CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"

[[classes]]
name = "BE"
cgroups = ["be.slice"]

[[classes]]
name = "LS"
cgroups = ["ls.slice"]

[loops.be_suppress]
enabled = {enabled}
interval = "200ms"
rule = "threshold"
threshold_percent = {threshold}
"""


class Node:
    """A fake tree, a config file next to it, and helpers to run koordd against them."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.tree = FakeCgroups(tmp, "v2").add("be.slice").add("ls.slice")
        self.state = tmp / "state"
        self.config = tmp / "etc" / "koordd.toml"
        self.config.parent.mkdir()
        self.stderr = tmp / "koordd.stderr"
        self.write_config()

    def write_config(self, enabled=True, threshold=65, extra="", replace=True):
        text = CONFIG.format(root=self.tree.root, state=self.state, enabled=str(enabled).lower(),
                             threshold=threshold) + extra
        if replace:       # the way editors save: write a new file, rename it over the old one
            tmp = self.config.with_suffix(".swp")
            tmp.write_text(text)
            os.replace(tmp, self.config)
        else:
            self.config.write_text(text)

    def cpu_max(self) -> str:
        return self.tree.read("be.slice", "cpu", "cpu.max").strip()

    def run(self, *args, env=None, wait=True):
        cmd = [sys.executable, "-m", "koordd.runtime.daemon", "--config", str(self.config), *args]
        with open(self.stderr, "ab") as err:
            proc = subprocess.Popen(cmd, stderr=err, env={**os.environ, **(env or {})})
        if wait:
            proc.wait(timeout=60)
        return proc

    def start(self, *args, env=None, sock="notify.sock") -> tuple[subprocess.Popen, NotifySocket]:
        """koordd started as systemd starts it (NOTIFY_SOCKET at a NotifySocket `sock` beside the tree, more
        of `env`), once it said READY=1; killed, and the test failed with its log, if it did not."""
        notify = NotifySocket(self.tmp / sock)
        proc = self.run(*args, env={"NOTIFY_SOCKET": str(notify.path), **(env or {})}, wait=False)
        if not notify.wait("READY=1"):
            proc.kill()
            proc.wait(timeout=30)
            raise AssertionError(f"koordd never said READY=1:\n{self.log()[-3000:]}")
        return proc, notify

    def log(self) -> str:
        return self.stderr.read_text()

    def decisions(self) -> list[dict]:
        path = self.state / "decisions.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def held(self) -> list[dict]:
        got = read_held(self.state)
        return got[0] if got else []


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def wait_for(predicate, timeout=15.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_once_caps_be_and_records_the_decision(node):
    assert node.run("--once").returncode == 0, node.log()
    quota, period = node.cpu_max().split()
    assert period == "100000" and quota != "max"
    [d] = node.decisions()
    assert (d["loop"], d["cgroup"], d["knob"], d["old"], d["outcome"]) == \
        ("be_suppress", "be.slice", "cpu.max", "max 100000", "applied")
    assert d["new"] == node.cpu_max() and "allowance" in d["reason"]
    assert node.held() == [{"target": "be.slice", "knob": "cpu.max", "original": "max 100000",
                            "owner": "be_suppress", "since": pytest.approx(time.time(), abs=60), "kind": "cgroup",
                            "identity": f"inode {node.tree.dir('be.slice', 'cpu').stat().st_ino}",
                            "written": (node.cpu_max(),)}]


def test_dry_run_writes_nothing(node):
    assert node.run("--once", "--dry-run").returncode == 0, node.log()
    assert node.cpu_max() == "max 100000"
    assert [d["outcome"] for d in node.decisions()] == ["dry-run"]
    assert not (node.state / "originals.jsonl").exists() and not (node.state / "originals.json").exists()


def test_invalid_config_refuses_to_start(node):
    node.config.write_text(node.config.read_text().replace("threshold_percent", "treshold_percent"))
    assert node.run("--once").returncode == 78
    assert f"{node.config}:18: loops.be_suppress.treshold_percent: unknown key" in node.log()
    assert "did you mean 'threshold_percent'" in node.log()
    assert node.cpu_max() == "max 100000"


def test_lifecycle_notify_reload_and_stop(node):
    proc, notify = node.start(env={"WATCHDOG_USEC": "1000000"})
    try:
        wait_for(lambda: node.cpu_max() != "max 100000", what="BE capped")
        notify.expect("WATCHDOG=1")

        # A broken edit is refused; the running config stays and keeps acting.
        node.write_config(extra="bogus = 1\n")
        wait_for(lambda: "reload refused" in node.log(), what="refused reload")
        assert "bogus" in node.log() and proc.poll() is None
        assert node.cpu_max() != "max 100000"

        # The loop disabled by a file edit (noticed without a signal): BE gets its original back.
        node.write_config(enabled=False)
        wait_for(lambda: node.cpu_max() == "max 100000", what="restore on disable")
        notify.expect("RELOADING=1")

        # Enabled again, applied through SIGHUP (in-place write, as `systemctl reload` after an edit).
        node.write_config(enabled=True, replace=False)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: node.cpu_max() != "max 100000", what="BE capped again")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, node.log()
    notify.expect("STOPPING=1")
    assert node.cpu_max() == "max 100000"
    assert node.held() == []
    outcomes = [d["outcome"] for d in node.decisions()]
    assert outcomes[0] == "applied" and outcomes[-1] == "restored" and outcomes.count("restored") == 2


def test_a_signal_storm_neither_hangs_nor_loses_the_stop(node):
    # Signal handlers run between two bytecodes of the main thread, wherever it is: one that takes
    # a lock the main thread holds (threading.Event's) deadlocks the daemon for good.
    proc, _ = node.start()
    try:
        for _ in range(2000):
            os.kill(proc.pid, signal.SIGHUP)
            time.sleep(0.0005)
        assert proc.poll() is None, node.log()
        wait_for(lambda: node.cpu_max() != "max 100000", what="BE capped through the reloads")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, node.log()[-4000:]
    assert node.cpu_max() == "max 100000" and node.held() == []


def test_after_a_crash_an_enabled_loop_re_adopts_and_a_disabled_one_restores(node):
    node.tree.set("be.slice", "cpu", "cpu.max", "5000 100000\n")          # left by a killed koordd
    node.state.mkdir()
    (node.state / "originals.json").write_text(json.dumps({"version": 1, "held": [
        {"cgroup": "be.slice", "knob": "cpu.max", "original": "max 100000", "owner": "be_suppress",
         "since": 1.0}]}))
    assert node.run("--once").returncode == 0, node.log()
    assert "re-adopting be.slice cpu.max" in node.log()
    assert [h["original"] for h in node.held()] == ["max 100000"]         # the true original survives

    node.write_config(enabled=False)
    assert node.run("--once").returncode == 0, node.log()
    assert node.cpu_max() == "max 100000" and node.held() == []
    assert node.decisions()[-1]["outcome"] == "restored"


@pytest.mark.parametrize("enabled", [True, False], ids=["loop-enabled", "loop-disabled"])
def test_dry_run_after_a_crash_writes_nothing_and_keeps_the_journal(node, enabled):
    # A dry-run start must not restore what a crashed run left: not at start, not at stop.
    node.tree.set("be.slice", "cpu", "cpu.max", "5000 100000\n")          # left by a killed koordd
    node.state.mkdir()
    held = [{"cgroup": "be.slice", "knob": "cpu.max", "original": "max 100000", "owner": "be_suppress",
             "since": 1.0}]
    (node.state / "originals.json").write_text(json.dumps({"version": 1, "held": held}))
    node.write_config(enabled=enabled)
    assert node.run("--once", "--dry-run").returncode == 0, node.log()
    assert node.cpu_max() == "5000 100000"
    assert node.held() == [{"target": "be.slice", "knob": "cpu.max", "original": "max 100000",
                            "owner": "be_suppress", "since": 1.0, "kind": "cgroup", "identity": None, "written": ()}]
    assert (node.state / "originals.json").exists() and not (node.state / "originals.jsonl").exists()
    restores = [d for d in node.decisions() if d["knob"] == "cpu.max" and d["new"] == "max 100000"]
    assert all(d["outcome"] == "dry-run" for d in restores), restores
    if not enabled:     # what a real start would do is said, as a dry-run decision
        assert [(d["old"], d["outcome"]) for d in restores] == [("5000 100000", "dry-run")], node.decisions()
    assert "left as it is (dry-run)" in node.log()


def test_koordctl_top_is_answered_with_no_loop_enabled_and_nothing_is_left_when_it_goes(node):
    node.write_config(enabled=False)
    proc = node.run(wait=False)
    top = node.state / TOP_FILE
    try:
        write_request(node.state, TopRequest(interval=0.5))
        wait_for(top.exists, what="top.json")
        assert {r["path"] for r in json.loads(top.read_text())["cgroups"]} == {"be.slice", "ls.slice"}
        old = time.time() - 60
        os.utime(node.state / REQUEST_FILE, (old, old))           # the view went away
        wait_for(lambda: not top.exists(), what="top.json removed")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, node.log()


def test_a_sigterm_while_starting_stops_koordd_in_order(node, monkeypatch):
    """The stop signal is handled from the first moment of run(): one that comes while start() restores
    or takes the first snapshot ends the run through stop() (exit 0, knobs restored), not by the
    signal's default action."""
    from koordd.core.config import load_config
    from koordd.runtime.daemon import Daemon
    from koordd.core.catalogue import load_registry
    registry = load_registry()
    daemon = Daemon(load_config(node.config, registry), registry)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    seen = []
    start = daemon.start

    def start_then_sigterm():
        start()
        handler = signal.getsignal(signal.SIGTERM)
        seen.append(handler)
        if callable(handler):
            handler(signal.SIGTERM, None)       # what the kernel would deliver here
    monkeypatch.setattr(daemon, "start", start_then_sigterm)
    try:
        assert daemon.run() == 0
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert callable(seen[0]) and seen[0] not in (signal.SIG_DFL, signal.SIG_IGN, handlers[signal.SIGTERM])
    assert node.cpu_max() == "max 100000" and node.held() == []
