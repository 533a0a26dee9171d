"""memory_evict's prekill hook (koordd/backends/prekill.py), run with real scripts: what a hook gets and
how its failures are told; and that it runs BESIDE the round, never in it (issue 35): a round returns
while its hooks sleep, one round's hooks share one budget, a kill waits for its hook or the budget, and
a stop (or the loop disabled) ends the hooks and makes none of the kills that waited for them. The last
test runs koordd as a process on a fake tree, under a fake systemd, and reads its watchdog pings."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.notify import NotifySocket, start_koordd
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog, read_decisions
from koordd.act.journal import RestoreJournal
from koordd.backends import prekill
from koordd.backends.cgroup_knobs import KNOBS, CgroupBackend
from koordd.backends.prekill import PrekillBackend, hook_value
from koordd.core.backend import Backends, InvalidValue
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.decisions import APPLIED, DRY_RUN, REFUSED
from koordd.core.loop import Action
from koordd.core.snapshot import CgroupSample, NodeSample, Snapshot
from koordd_plugins.memory_evict import MemoryEvict
from koordd.runtime.runner import Runner

MiB = 1 << 20
REGISTRY = {"memory_evict": MemoryEvict}
SUPPORTED = frozenset(KNOBS) | {"cgroup.prekill"}


def script(tmp_path, body, name="hook.sh"):
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return str(p)


def actuator(tmp_path, tree, dry_run=False):
    state = tmp_path / "state"
    return Actuator(Backends([CgroupBackend(tree.fs), PrekillBackend(tree.fs)]), RestoreJournal(state),
                    DecisionLog(state, send=lambda message, **f: None), dry_run=dry_run)


def wait_for(predicate, timeout=30.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def finish_all(act):
    """The decisions of everything beside the round, once done (a hook, then the kill that waited)."""
    out = []

    def done():
        out.extend(d for _, _, ds in act.finish() for d in ds)
        return not act.beside
    wait_for(done, what="the hooks and their kills")
    return out


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def victims_snapshot(*names, t=100.0):
    ms = tuple(CgroupSample(path=f"be/{n}", cls=None, memory_anon=200 << 20, memory_current=200 << 20, frozen=False)
               for n in names)
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=1.0, memory_total=1 << 30,
                                                      memory_anon=950 << 20),
                    cgroups={"be": CgroupSample(path="be", cls="BE")}, members={"be": ms}, supported=SUPPORTED)


def evict_round(tmp_path, tree, hook_argv, timeout=2.0):
    """memory_evict's kill actions, through the real actuator with the prekill backend, to the end."""
    s = make_settings(loop_options(MemoryEvict), {"enabled": True, "reclaim": False,
                                                  "prekill_command": hook_argv, "prekill_timeout": timeout})
    actions = MemoryEvict.decide(victims_snapshot("job"), s, MemoryEvict.initial_state(s))
    assert [a.knob for a in actions] == ["cgroup.prekill", "cgroup.kill"]
    act = actuator(tmp_path, tree)
    kills = []
    act.backends.for_knob("cgroup.kill").write = lambda target, knob, value: kills.append((target, time.time()))
    decisions = act.apply("memory_evict", actions)
    return decisions + finish_all(act), kills


def runner_for(tmp_path, tree, hook, timeout="1s", dry_run=False):
    conf = parse_config(f'[[classes]]\nname = "BE"\ncgroups = ["be"]\n[loops.memory_evict]\nenabled = true\n'
                        f'reclaim = false\nprekill_command = [{json.dumps(hook)}]\nprekill_timeout = "{timeout}"\n',
                        "k.toml", REGISTRY)
    act = actuator(tmp_path, tree, dry_run=dry_run)
    runner = Runner(REGISTRY, act)
    runner.configure(conf, now=0.0)
    return runner, act


def killed(tree, cg):
    return tree.read(cg, None, "cgroup.kill").strip() == "1"


# The pid file appears whole (written aside, then renamed): a test that sees it reads the pid, never an empty file.
SLEEPER = 'echo $$ > "$KOORDD_CGROUP_DIR/hook.pid.tmp"; mv "$KOORDD_CGROUP_DIR/hook.pid.tmp" "$KOORDD_CGROUP_DIR/hook.pid"; ' \
          'exec sleep 600\n'


# --- what a hook gets, and how its failures are told ---------------------------------------------------

def test_prekill_runs_before_the_kill_with_the_victims_cgroup(tmp_path, monkeypatch):
    tree = FakeCgroups(tmp_path, "v2").add("be/job")
    out = tmp_path / "out"
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")       # koordd's, not the hook's
    hook = script(tmp_path, f'echo "$@|$KOORDD_CGROUP|$KOORDD_CGROUP_DIR|$NOTIFY_SOCKET" > {out}; '
                            f'date +%s.%N >> {out}\n')
    decisions, kills = evict_round(tmp_path, tree, [hook, "--dump"])
    assert [(d.knob, d.outcome) for d in decisions] == [("cgroup.prekill", APPLIED), ("cgroup.kill", APPLIED)]
    line, ran_at = out.read_text().splitlines()
    assert line == f"--dump be/job|be/job|{tree.root / 'be' / 'job'}|"
    assert kills == [("be/job", kills[0][1])] and float(ran_at) <= kills[0][1]


def test_a_failing_hook_is_one_refusal_and_the_kill_goes_ahead(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be/job")
    decisions, kills = evict_round(tmp_path, tree, [script(tmp_path, "echo boom >&2; exit 3\n")])
    [pre, kill] = decisions
    assert pre.outcome == REFUSED and "exited with status 3" in pre.error and "boom" in pre.error
    assert kill.outcome == APPLIED and len(kills) == 1


def test_a_hook_that_floods_stderr_leaves_only_its_end_in_the_refusal(tmp_path):
    # 32 MiB of stderr: koordd keeps the end of it (prekill.STDERR_KEEP bytes), not all of it.
    tree = FakeCgroups(tmp_path, "v2").add("be/job")
    hook = script(tmp_path, "head -c 33554432 /dev/zero | tr '\\0' x >&2; echo THE-END >&2; exit 3\n")
    decisions, kills = evict_round(tmp_path, tree, [hook], timeout=10)
    [pre, kill] = decisions
    assert pre.outcome == REFUSED and "exited with status 3" in pre.error and pre.error.endswith("xxxxTHE-END")
    assert len(pre.error) < 1000 and kill.outcome == APPLIED and len(kills) == 1
    # What is held while the hook runs is bounded too, whatever it writes.
    proc = subprocess.Popen([hook], stderr=subprocess.PIPE)
    kept = prekill._stderr_tail(proc, time.monotonic() + 30)
    assert kept.endswith(b"THE-END\n") and len(kept) == prekill.STDERR_KEEP and proc.returncode == 3


def test_a_hook_that_hangs_is_killed_at_its_timeout_and_the_kill_goes_ahead(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be/job")
    pidfile = tmp_path / "child"
    hook = script(tmp_path, f"sleep 30 & echo $! > {pidfile}; wait\n")
    decisions, kills = evict_round(tmp_path, tree, [hook], timeout=0.5)
    [pre, kill] = decisions
    assert pre.outcome == REFUSED and "timed out after 0.5s" in pre.error
    assert kill.outcome == APPLIED and len(kills) == 1
    child = int(pidfile.read_text())
    wait_for(lambda: not alive(child), timeout=10, what="the hook's child gone")   # its whole process group


def test_a_hook_that_cannot_start_is_one_refusal(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be/job")
    decisions, kills = evict_round(tmp_path, tree, [str(tmp_path / "missing")])
    assert decisions[0].outcome == REFUSED and "cannot start" in decisions[0].error and len(kills) == 1


def test_prekill_values_and_the_guard(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("ls/job")
    b = PrekillBackend(tree.fs)
    for bad in ('{"argv": ["rel"], "timeout": 1}', '{"argv": [], "timeout": 1}', '{"argv": ["/x"], "timeout": 11}',
                '{"argv": ["/x"]}', "nope"):
        with pytest.raises(InvalidValue, match="cgroup.prekill"):
            b.validate("ls/job", "cgroup.prekill", bad)
    act = actuator(tmp_path, tree)
    act.protect({"ls": "LS"})
    [d] = act.apply("memory_evict", [Action("ls/job", "cgroup.prekill", hook_value(["/bin/true"], 1), {}, "")])
    assert d.outcome == REFUSED and "protected" in d.error and not act.beside
    with pytest.raises(ConfigError, match="absolute path"):
        parse_config('[loops.memory_evict]\nprekill_command = ["dump"]\n', "k.toml", REGISTRY)
    assert json.loads(hook_value(["/bin/true"], 1)) == {"argv": ["/bin/true"], "timeout": 1.0}


def test_prekill_timeout_is_at_most_ten_seconds():
    # Well under half of systemd's WatchdogSec=30s, and inside the 15 s a victim counts as freed.
    with pytest.raises(ConfigError, match="prekill_timeout"):
        parse_config('[loops.memory_evict]\nprekill_command = ["/x"]\nprekill_timeout = "16s"\n', "k.toml", REGISTRY)
    parse_config('[loops.memory_evict]\nprekill_command = ["/x"]\nprekill_timeout = "10s"\n', "k.toml", REGISTRY)


# --- beside the round ---------------------------------------------------------------------------

def test_a_sleeping_hook_does_not_hold_up_the_round_and_its_kill_comes_at_the_budget(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be/a")
    runner, act = runner_for(tmp_path, tree, script(tmp_path, SLEEPER), timeout="1s")
    runner.tick(list(runner.runs.values()), victims_snapshot("a"))
    # The round returned with the hook still running, and the kill waits for it.
    pidfile = tree.root / "be" / "a" / "hook.pid"
    wait_for(pidfile.exists, what="the hook started")
    pid = int(pidfile.read_text())
    assert alive(pid) and not killed(tree, "be/a")
    assert [(a.knob, a.target) for a in act.waiting("memory_evict")] == [("cgroup.prekill", "be/a"),
                                                                          ("cgroup.kill", "be/a")]
    assert list(read_decisions(tmp_path / "state")) == []
    # Nothing is made before the hook is done or the budget ran out; then the kill, through the actuator.
    wait_for(lambda: (runner.finish(), not act.beside)[1], what="the budget to run out")
    assert killed(tree, "be/a") and not alive(pid)
    made = [(d["knob"], d["outcome"]) for d in list(read_decisions(tmp_path / "state"))]
    assert made == [("cgroup.prekill", REFUSED), ("cgroup.kill", APPLIED)]
    # Its own watcher ends it at the deadline ("timed out"), or finish() does if it comes first.
    error = list(read_decisions(tmp_path / "state"))[0]["error"]
    assert "timed out" in error or "its budget ran out" in error, error
    # The loop settled the kill once it was made: it counts in the kill budget.
    assert list(runner.runs["memory_evict"].state.killed) == ["be/a"]


def test_a_hook_that_is_done_early_lets_its_kill_go_at_once(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be/a")
    runner, act = runner_for(tmp_path, tree, script(tmp_path, "exit 0\n"), timeout="10s")
    runner.tick(list(runner.runs.values()), victims_snapshot("a"))
    deadline = act.next_deadline()
    wait_for(lambda: (runner.finish(), not act.beside)[1], what="the hook and its kill")
    assert time.monotonic() < deadline and killed(tree, "be/a")
    assert [(d["knob"], d["outcome"]) for d in list(read_decisions(tmp_path / "state"))] == \
        [("cgroup.prekill", APPLIED), ("cgroup.kill", APPLIED)]


def test_two_slow_hooks_run_side_by_side_within_one_budget(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be/a").add("be/b")
    runner, act = runner_for(tmp_path, tree, script(tmp_path, SLEEPER), timeout="1s")
    runner.tick(list(runner.runs.values()), victims_snapshot("a", "b"))
    pidfiles = [tree.root / "be" / v / "hook.pid" for v in "ab"]
    wait_for(lambda: all(p.exists() for p in pidfiles), what="both hooks started")
    pids = [int(p.read_text()) for p in pidfiles]
    assert all(alive(p) for p in pids) and not killed(tree, "be/a") and not killed(tree, "be/b")
    # One budget for the episode: both end together, not one after the other.
    assert len(act.beside) == 2 and len({b.deadline for b in act.beside}) == 1
    wait_for(lambda: (runner.finish(), not act.beside)[1], what="the budget to run out")
    assert killed(tree, "be/a") and killed(tree, "be/b") and not any(alive(p) for p in pids)


def test_disabling_the_loop_during_a_pending_eviction_cancels_it(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be/a")
    runner, act = runner_for(tmp_path, tree, script(tmp_path, SLEEPER), timeout="10s")
    runner.tick(list(runner.runs.values()), victims_snapshot("a"))
    pidfile = tree.root / "be" / "a" / "hook.pid"
    wait_for(pidfile.exists, what="the hook started")
    runner.stop("memory_evict", "loop disabled")
    assert not act.beside and not alive(int(pidfile.read_text()))
    runner.finish()
    assert not killed(tree, "be/a")
    made = [(d["knob"], d["outcome"], d["error"]) for d in list(read_decisions(tmp_path / "state"))]
    assert [m[:2] for m in made] == [("cgroup.prekill", REFUSED), ("cgroup.kill", REFUSED)]
    assert "cancelled" in made[0][2] and "not made" in made[1][2]


def test_dry_run_runs_no_hook_and_holds_nothing_back(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be/a")
    out = tmp_path / "ran"
    runner, act = runner_for(tmp_path, tree, script(tmp_path, f"touch {out}\n"), dry_run=True)
    runner.tick(list(runner.runs.values()), victims_snapshot("a"))
    assert not act.beside and not killed(tree, "be/a")
    assert [(d["knob"], d["outcome"]) for d in list(read_decisions(tmp_path / "state"))] == \
        [("cgroup.prekill", DRY_RUN), ("cgroup.kill", DRY_RUN)]
    time.sleep(0.2)
    assert not out.exists()


# --- koordd as a process, under a fake systemd ------------------------------------------------------------

DAEMON_CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"

[[classes]]
name = "LS"
cgroups = ["k/ls"]

[[classes]]
name = "BE"
cgroups = ["k/be"]

[loops.memory_evict]
enabled = true
interval = "100ms"
scope = "k"
reclaim = false
pressure_full_percent = 0
prekill_command = ["{hook}"]
prekill_timeout = "10s"
"""


def test_the_watchdog_is_fed_while_a_hook_sleeps_and_sigterm_kills_no_victim(tmp_path):
    """Issue 35: two hooks of 16 s held the round 64.6 s (systemd's watchdog killed koordd mid-eviction),
    and a SIGTERM during them still let another hook run and another cgroup die."""
    tree = FakeCgroups(tmp_path, "v2").add("k").add("k/ls", memory_current=50 * MiB)
    tree.add("k/be", memory_current=400 * MiB)
    tree.set("k", None, "memory.max", f"{512 * MiB}\n")
    tree.stat("k", memory_current=450 * MiB)                     # 88% of the scope's limit: k/be must go
    hook = script(tmp_path, SLEEPER)
    config = tmp_path / "etc" / "koordd.toml"
    config.parent.mkdir()
    config.write_text(DAEMON_CONFIG.format(root=tree.root, state=tmp_path / "state", hook=hook))
    notify = NotifySocket(tmp_path / "notify.sock")
    log = tmp_path / "koordd.log"
    proc = start_koordd(config, log, notify, watchdog_usec=1_000_000)     # a ping every 0.5 s
    pidfile = tree.root / "k" / "be" / "hook.pid"
    try:
        wait_for(pidfile.exists, what=f"the hook started\n{log.read_text() if log.exists() else ''}")
        since = time.monotonic()
        # The hook sleeps (10 s budget): the main loop runs on, and pings systemd's watchdog.
        assert notify.wait("WATCHDOG=1", count=3, since=since, timeout=8), log.read_text()
        assert proc.poll() is None and not killed(tree, "k/be")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
        notify.close()
    assert not alive(int(pidfile.read_text())), "the hook outlived koordd's stop"
    assert not killed(tree, "k/be"), "a victim was killed after the stop was asked"
    made = [(d["knob"], d["outcome"]) for d in list(read_decisions(tmp_path / "state"))]
    assert made == [("cgroup.prekill", REFUSED), ("cgroup.kill", REFUSED)], made
    assert "koordd stopping" in list(read_decisions(tmp_path / "state"))[0]["error"]
