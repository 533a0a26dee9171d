"""End to end on the real kernel: memory_evict kills (or freezes) BE cgroups inside a memory-limited
scope before the kernel's OOM killer touches the LS process there, and SIGTERM thaws what it froze.

The test builds a scope cgroup of its own, koordd-test-<pid>-<n>, with a 512 MiB memory limit, and
inside it: `ls` running one process that holds 200 MiB, and be1..be3, each running a process that
grows by 10 MiB every 100 ms up to 140 MiB. Together they want about 650 MiB: more than the scope
allows, so somebody must go. Left to itself, the kernel's memcg OOM killer kills the largest
process -- the LS one (200 MiB against at most 140). koordd's memory_evict (scope = the test scope,
threshold 60% = 307 MiB, lower mark 58%) kills BE cgroups as usage crosses 60%, long before the
limit, so the OOM killer never runs.

Every byte lives inside the test's own memory-limited scope (the limit is set before any process
joins it), so the host is never at risk. On a hybrid host the cgroups exist in the v1 cpu (where
koordd finds them), cpuacct, memory (limit, kill) and freezer (freeze) hierarchies and in the unified
tree (PSI); on a pure v2 host in the v2 tree, with the memory controller enabled for them.
Needs root; skipped elsewhere.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from koordtest.kernel import CGROUP_ROOT, FreezableEnv, Koordd, created, stop_all, unique_name, wait_for
from koordtest.notify import NotifySocket

pytestmark = pytest.mark.kernel

MiB = 1 << 20
LOOP = "memory_evict"
SCOPE_LIMIT = 512 * MiB
LS_MIB = 200
BE_MAX_MIB, BE_STEP_MIB, BE_STEP_S = 140, 10, 0.1
N_BE = 3
BE = tuple(f"be{i}" for i in range(1, N_BE + 1))
CHILDREN = ("ls",) + BE
THRESHOLD = 60
TRIALS = 3

LS_CODE = f"""
import time
blob = b"\\x01" * ({LS_MIB} << 20)       # written, so every page is resident
print("ready", flush=True)
while True:
    time.sleep(60)
"""
BE_CODE = f"""
import time
chunks = []
while len(chunks) < {BE_MAX_MIB // BE_STEP_MIB}:
    chunks.append(b"\\x01" * ({BE_STEP_MIB} << 20))
    time.sleep({BE_STEP_S})
while True:
    time.sleep(60)
"""


def detect() -> tuple[str, dict[str, Path]]:
    """("hybrid" | "v2", {role: hierarchy root}) or pytest.skip with what is missing."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates cgroups under /sys/fs/cgroup with a memory limit")
    if (CGROUP_ROOT / "cgroup.controllers").is_file():
        if "memory" not in (CGROUP_ROOT / "cgroup.subtree_control").read_text().split():
            pytest.skip("needs the memory controller enabled in /sys/fs/cgroup/cgroup.subtree_control (pure v2 "
                        "host); the test does not change the host's root cgroup")
        return "v2", {"v2": CGROUP_ROOT}
    roles = {r: CGROUP_ROOT / r for r in ("cpu", "cpuacct", "memory", "freezer", "unified")}
    if (roles["memory"] / "memory.limit_in_bytes").is_file() and (roles["freezer"] / "tasks").is_file() \
            and (roles["cpu"] / "cpu.shares").is_file() and (roles["unified"] / "cgroup.controllers").is_file():
        return "hybrid", roles
    pytest.skip("needs a hybrid host (v1 cpu, cpuacct, memory and freezer hierarchies and the unified tree "
                "under /sys/fs/cgroup) or a pure cgroup v2 host with the memory controller enabled")


@dataclass
class Scope(FreezableEnv):
    """The test's memory-limited scope `name` with children ls and be1..be3, in every hierarchy."""
    children: tuple[str, ...] = CHILDREN
    by_child: dict[str, list[subprocess.Popen]] = field(default_factory=dict)

    def path(self, child: str | None = None) -> str:
        """koordd's name: relative to the hierarchy root."""
        return f"{self.name}/{child}" if child else self.name

    # --- life cycle -------------------------------------------------------------------

    def create(self) -> None:
        for root in self.roots:
            (root / self.name).mkdir()
        # The limit is in place before anything joins: nothing here can ever use more.
        if self.mode == "v2":
            (self.dir("v2") / "cgroup.subtree_control").write_text("+memory")
            (self.dir("v2") / "memory.max").write_text(str(SCOPE_LIMIT))
            if (self.dir("v2") / "memory.swap.max").exists():
                (self.dir("v2") / "memory.swap.max").write_text("0")     # same behaviour with or without swap
        else:
            (self.dir("memory") / "memory.limit_in_bytes").write_text(str(SCOPE_LIMIT))
            if (self.dir("memory") / "memory.memsw.limit_in_bytes").exists():
                (self.dir("memory") / "memory.memsw.limit_in_bytes").write_text(str(SCOPE_LIMIT))
        assert self.limit() == SCOPE_LIMIT, f"scope limit not applied: {self.limit()}"
        for root in self.roots:
            for child in CHILDREN:
                (root / self.name / child).mkdir()

    def spawn_code(self, child: str, code: str, **popen) -> subprocess.Popen:
        p = self.spawn(child, [sys.executable, "-c", code], **popen)
        self.by_child.setdefault(child, []).append(p)
        return p

    def start_ls(self) -> subprocess.Popen:
        p = self.spawn_code("ls", LS_CODE, stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline().strip()
        assert line == "ready", f"LS process did not come up (said {line!r}, exit {p.poll()})"
        return p

    def start_be(self) -> list[subprocess.Popen]:
        return [self.spawn_code(c, BE_CODE) for c in BE]

    # --- readings -----------------------------------------------------------------------

    def _memory(self, child: str | None, v1: str, v2: str) -> str:
        return (self.dir("memory", child) / (v2 if self.mode == "v2" else v1)).read_text()

    def limit(self) -> int:
        return int(self._memory(None, "memory.limit_in_bytes", "memory.max"))

    def oom_kills(self, child: str) -> int:
        """Kernel OOM kills of tasks of `child` (v1 memory.oom_control, v2 memory.events)."""
        text = self._memory(child, "memory.oom_control", "memory.events")
        return int(dict(line.split() for line in text.splitlines())["oom_kill"])

    def usage(self, child: str) -> int:
        return int(self._memory(child, "memory.usage_in_bytes", "memory.current"))

    def peak(self) -> int | None:
        try:
            return int(self._memory(None, "memory.max_usage_in_bytes", "memory.peak"))
        except (OSError, ValueError):
            return None

    def frozen(self, child: str) -> bool:
        if self.mode == "v2":
            return "frozen 1" in (self.dir("v2", child) / "cgroup.events").read_text()
        return (self.dir("freezer", child) / "freezer.state").read_text().strip() == "FROZEN"

    def be_alive(self) -> list[str]:
        return [c for c in BE if any(p.poll() is None for p in self.by_child.get(c, []))]


@pytest.fixture
def scope():
    mode, roles = detect()
    yield from created(Scope(mode, roles, unique_name("m")))


@pytest.fixture
def koordd(tmp_path, scope):
    """koordd runs for one test; torn down (SIGTERM, then SIGKILL) before the scope goes away."""
    k = Koordd(tmp_path, scope)
    yield k
    stop_all(k)


def write_config(koordd: Koordd, scope: Scope, action: str, extra: str = "") -> Path:
    return koordd.config_file(f"""
[[classes]]
name = "LS"
cgroups = [{json.dumps(scope.path("ls"))}]

[[classes]]
name = "BE"
cgroups = [{json.dumps(scope.path("be*"))}]

[loops.memory_evict]
enabled = true
interval = "100ms"
scope = {json.dumps(scope.path())}
threshold_percent = {THRESHOLD}
action = "{action}"
cooldown = "250ms"
max_kills_per_minute = 20
# The usage rule alone; and no reclaim step: without swap it cannot free anon memory, and the test
# wants the kill/freeze path. Both are covered by the decision tests (and reclaim by the VM test).
pressure_full_percent = 0
reclaim = false
thaw_delay = "10m"
{extra}""")


def start_koordd(koordd: Koordd, scope: Scope, action: str) -> subprocess.Popen:
    proc = koordd.start(write_config(koordd, scope, action))

    def ticking():
        status = koordd.status() or {}
        return status.get("pid") == proc.pid and status.get("loops", {}).get(LOOP, {}).get("ticks", 0) >= 3

    assert wait_for(ticking, timeout=30, step=0.05), f"koordd did not start ticking\n{koordd.log_text()}"
    return proc


def records(koordd: Koordd, knob: str | None = None, outcome: str | None = None) -> list[dict]:
    return [d for d in koordd.decisions() if d.get("loop") == LOOP and (knob is None or d["knob"] == knob)
            and (outcome is None or d["outcome"] == outcome)]


def report(capsys, text: str) -> None:
    with capsys.disabled():
        print(f"\n[kernel] {text}")


def test_without_koordd_the_oom_killer_takes_the_ls_process(scope, capsys):
    """The control trial: the same workload with nothing watching it."""
    ls = scope.start_ls()
    scope.start_be()
    oom = wait_for(lambda: sum(scope.oom_kills(c) for c in CHILDREN), timeout=30)
    time.sleep(1.0)
    kills = {c: scope.oom_kills(c) for c in CHILDREN}
    report(capsys, f"koordd off: kernel OOM kills {kills}, LS alive {ls.poll() is None}, "
                   f"peak {scope.peak() and scope.peak() // MiB} MiB of {SCOPE_LIMIT // MiB}")
    assert oom, f"the kernel's OOM killer never ran: the workload should not fit in {SCOPE_LIMIT // MiB} MiB"
    # The largest process in the scope is the LS one: that is whom the OOM killer picks.
    assert kills["ls"] >= 1 and ls.wait(timeout=10) == -signal.SIGKILL, kills


@pytest.mark.parametrize("trial", range(1, TRIALS + 1))
def test_koordd_kills_be_before_the_oom_killer_touches_ls(scope, koordd, capsys, trial):
    ls = scope.start_ls()
    proc = start_koordd(koordd, scope, "kill")
    scope.start_be()
    # Every BE cgroup has to go (one alone at 140 MiB takes the scope over 60%), and then it is quiet.
    ended = wait_for(lambda: not scope.be_alive(), timeout=30)
    time.sleep(1.0)
    kills = records(koordd, "cgroup.kill", "applied")
    oom = {c: scope.oom_kills(c) for c in CHILDREN}
    numbers = (f"trial {trial}: koordd killed {[d['cgroup'].rpartition('/')[2] for d in kills]} at scope usage "
               f"{[d['reason']['effective_usage'] // MiB for d in kills]} MiB (threshold "
               f"{SCOPE_LIMIT * THRESHOLD // 100 // MiB} MiB, limit {SCOPE_LIMIT // MiB}); peak "
               f"{scope.peak() and scope.peak() // MiB} MiB; kernel OOM kills {oom}; LS alive {ls.poll() is None}")
    report(capsys, numbers)
    assert proc.poll() is None, f"koordd exited with {proc.returncode}\n{koordd.log_text()}"
    assert ended, f"BE still running: {scope.be_alive()}; {numbers}\n{koordd.log_text()}"
    assert ls.poll() is None, f"the LS process died: {numbers}"
    assert oom["ls"] == 0, f"the kernel OOM-killed in LS: {numbers}"
    assert sum(oom.values()) == 0, f"the kernel's OOM killer ran: {numbers}"
    assert kills, numbers
    for d in records(koordd):
        assert d["cgroup"] in {scope.path(c) for c in BE}, d            # never anything but BE
        assert d["outcome"] == "applied" and d["error"] is None, d
        assert d["reason"]["effective_usage"] >= SCOPE_LIMIT * THRESHOLD // 100, d
        assert d["reason"]["capacity"] == SCOPE_LIMIT and d["reason"]["scope"] == scope.path(), d
    assert koordd.stop(proc) == 0, koordd.log_text()
    assert not koordd.held(), koordd.held()             # kills leave nothing to restore


def test_koordd_freezes_be_then_sigterm_thaws_it(scope, koordd, capsys):
    ls = scope.start_ls()
    proc = start_koordd(koordd, scope, "freeze")
    scope.start_be()
    # Frozen BE stops growing but keeps its memory: koordd freezes more until what is left fits.
    # Settled = every BE cgroup frozen, or stopped at its full size, and no new freeze for 2 s.
    def settled():
        n = len(records(koordd, "cgroup.freeze", "applied"))
        time.sleep(2.0)
        return n and n == len(records(koordd, "cgroup.freeze", "applied"))

    assert wait_for(settled, timeout=40), f"koordd froze nothing\n{koordd.log_text()}"
    frozen = [c for c in BE if scope.frozen(c)]
    oom = {c: scope.oom_kills(c) for c in CHILDREN}
    freezes = records(koordd, "cgroup.freeze", "applied")
    numbers = (f"freeze: frozen {frozen} at scope usage {[d['reason']['effective_usage'] // MiB for d in freezes]} "
               f"MiB; peak {scope.peak() and scope.peak() // MiB} MiB of {SCOPE_LIMIT // MiB}; kernel OOM kills "
               f"{oom}; LS alive {ls.poll() is None}")
    report(capsys, numbers)
    assert frozen and set(frozen) == {d["cgroup"].rpartition("/")[2] for d in freezes}, numbers
    assert ls.poll() is None and sum(oom.values()) == 0, numbers
    assert set(scope.be_alive()) == set(BE), f"a BE process died: {numbers}"
    held = koordd.held()
    assert sorted(h["target"] for h in held) == sorted(scope.path(c) for c in frozen), held
    assert {(h["knob"], h["original"], h["owner"]) for h in held} == {("cgroup.freeze", "0", LOOP)}, held

    # Make room (the BE processes will grow again once thawed), then stop koordd: it thaws them.
    ls.kill()
    ls.wait(timeout=10)
    since = time.time()
    assert koordd.stop(proc) == 0, koordd.log_text()
    assert [c for c in BE if scope.frozen(c)] == [], "still frozen after koordd stopped"
    assert koordd.held() == [], koordd.held()
    restored = [d for d in records(koordd, "cgroup.freeze", "restored") if d["time"] >= since]
    assert sorted(d["cgroup"] for d in restored) == sorted(scope.path(c) for c in frozen), restored
    assert all(d["new"] == "0" and d["old"] == "1" for d in restored), restored
    # Thawed processes run again: those frozen short of their full size grow on to it.
    grown = wait_for(lambda: all(scope.usage(c) >= BE_MAX_MIB * MiB for c in BE), timeout=15)
    assert grown, f"BE did not resume after the thaw: {[scope.usage(c) // MiB for c in BE]} MiB"
    assert set(scope.be_alive()) == set(BE)


WATCHDOG_USEC = 2_000_000         # systemd's WatchdogSec, here 2 s: koordd pings every 1 s
PREKILL_BUDGET = "8s"


def test_the_watchdog_is_fed_while_a_prekill_hook_sleeps_and_sigterm_kills_no_victim(scope, koordd, capsys):
    """Issue 35: a prekill hook ran inside the round, so a slow one starved systemd's watchdog (koordd was
    killed mid-eviction), and a SIGTERM during it still let the kill through. Here a real hook that
    sleeps (exec sleep, in its own session) holds be1's eviction: koordd, started as systemd would
    (NOTIFY_SOCKET, WATCHDOG_USEC), keeps pinging while it sleeps, and a SIGTERM then ends the hook and
    kills nothing: be1's process lives on."""
    hook = koordd.tmp / "prekill.sh"
    pidfile = koordd.tmp / "prekill.pid"
    hook.write_text(f"#!/bin/sh\necho $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 600\n")
    hook.chmod(0o755)
    notify = NotifySocket(koordd.tmp / "notify.sock")
    base = koordd._env()
    koordd._env = lambda: {**base, "NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    ls = scope.start_ls()
    proc = koordd.start(write_config(koordd, scope, "kill", f"prekill_command = [{json.dumps(str(hook))}]\n"
                                                            f"prekill_timeout = \"{PREKILL_BUDGET}\"\n"))
    assert notify.wait("READY=1", timeout=30), koordd.log_text()
    be1 = scope.spawn_code("be1", BE_CODE)          # 200 + 140 MiB: 66% of the scope, over the 60% threshold
    try:
        assert wait_for(pidfile.exists, timeout=30), f"no prekill hook ran\n{koordd.log_text()}"
        hook_pid, since = int(pidfile.read_text()), time.monotonic()
        # While the hook sleeps: pings keep coming (one a second), and be1 is not killed yet.
        fed = notify.wait("WATCHDOG=1", count=4, since=since, timeout=6)
        pings = notify.times("WATCHDOG=1", since)
        gaps = [round(b - a, 2) for a, b in zip([since] + pings, pings)]
        report(capsys, f"prekill hook sleeping: {len(pings)} WATCHDOG=1 in {time.monotonic() - since:.1f}s, "
                       f"gaps {gaps} s (systemd's interval {WATCHDOG_USEC / 1e6:g}s)")
        assert fed, f"the watchdog starved while the hook slept: pings {gaps}\n{koordd.log_text()}"
        assert Path(f"/proc/{hook_pid}").exists() and be1.poll() is None
    finally:
        since_stop = time.monotonic()
        code = koordd.stop(proc)
        stopped_in = time.monotonic() - since_stop
        notify.close()
    report(capsys, f"SIGTERM during the hook: koordd exited {code} in {stopped_in:.2f}s")
    assert code == 0, koordd.log_text()
    assert wait_for(lambda: not Path(f"/proc/{hook_pid}").exists(), timeout=10), "the hook outlived the stop"
    assert be1.poll() is None and "be1" in scope.be_alive(), "the victim was killed after the stop was asked"
    assert ls.poll() is None
    assert records(koordd, "cgroup.kill", "applied") == [], records(koordd)
    [pre] = records(koordd, "cgroup.prekill")
    assert pre["outcome"] == "refused" and "koordd stopping" in pre["error"], pre
