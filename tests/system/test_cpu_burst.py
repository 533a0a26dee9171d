"""cpu_burst under systemd on pure cgroup v2: ls.slice with a CPU quota (CPUQuota=50%) gets a burst and,
while the node is idle and it is throttled, a higher quota; a loaded node takes the quota back to the
base; stop restores both knobs; after kill -9 the restarted koordd re-adopts them and still knows the
base quota.

On the VM's 2 CPUs: lsburst (ls.slice) runs 1 busy stress-ng worker, always throttled at half a CPU;
behog (be.slice) runs 2 and is kept stopped (SIGSTOP) until the node should be loaded, so that no
unit starts or stops while koordd holds ls.slice's cpu.max (systemd would not rewrite it then, but
there is no reason to find out). be_suppress is disabled for these tests, so BE really loads the node.
The pool threshold is 75% here, not 50%: under TCG the guest's own daemons and koordd take a good
part of a CPU, which must not read as load.
"""
from __future__ import annotations

import json
import os
import re
import signal

import pytest

from . import vm

pytestmark = vm.only_in_vm

BASE = "50000 100000"
BASE_QUOTA = 50000
RAISED = int(BASE_QUOTA * 1.2)       # the first step up
TIMEOUT = 60                         # seconds for koordd to raise or lower the quota under TCG
UNITS = {"lsburst": (vm.LS, 1), "behog": (vm.BE, 2)}


def burst(cgroup: str = vm.LS) -> str | None:
    try:
        return (vm.CGROUP / cgroup / "cpu.max.burst").read_text().strip()
    except OSError:
        return None


def config_text() -> str:
    """The shipped config with be_suppress and qos_baseline off and cpu_burst on (replacing a shipped
    cpu_burst section)."""
    text = vm.without_qos_baseline(vm.shipped_config())      # BE's cpu.idle is not under test here
    text = re.sub(r"(?ms)^\[loops\.cpu_burst\]\n.*?(?=^\[|\Z)", "", text)
    text, n = re.subn(r"(\[loops\.be_suppress\][^\[]*?)enabled = true", r"\1enabled = false", text, count=1)
    assert n == 1, "shipped config has no enabled be_suppress section to turn off"
    # max 140%: LS's own raised usage (0.7 of 2 CPUs) stays well below the overload threshold, so the
    # quota stays raised on the idle node instead of pushing the pool into overload by itself.
    return text + ('\n[loops.cpu_burst]\nenabled = true\ninterval = "1s"\nburst_percent = 1000\n'
                   'dynamic_quota = true\npool_overload_percent = 75\nmax_quota_percent = 140\n')


def decisions(cursor: str, knob: str, outcome: str | None = None) -> list[dict]:
    matches = ["KOORDD_LOOP=cpu_burst", f"KOORDD_CGROUP={vm.LS}", f"KOORDD_KNOB={knob}"]
    if outcome:
        matches.append(f"KOORDD_OUTCOME={outcome}")
    return vm.journal(cursor, *matches)


def reason(entry: dict) -> dict:
    return json.loads(entry["KOORDD_REASON"])


def load_node(on: bool) -> None:
    vm.systemctl("kill", f"--signal={'SIGCONT' if on else 'SIGSTOP'}", "behog")


@pytest.fixture
def ls_quota(cpu_controller, koordd_stopped):
    """ls.slice capped at half a CPU with one busy worker in it; behog ready but stopped."""
    vm.stop_units(*UNITS)
    try:
        # The slice's cgroup exists once a unit runs in it: set the quota, then start the units.
        vm.systemctl("set-property", "--runtime", vm.LS, "CPUQuota=50%")
        for unit, (slice_, n) in UNITS.items():
            vm.start_stress(unit, slice_, n)
        load_node(False)
        idle_be = vm.measure(2, vm.BE)[vm.BE]
        assert idle_be < 0.1, f"behog still runs after SIGSTOP: {idle_be:.2f} CPUs"
        assert vm.wait_for(lambda: vm.cpu_max(vm.LS) == BASE, 30), f"{vm.LS}/cpu.max is {vm.cpu_max(vm.LS)}"
        if burst() is None:
            pytest.fail(f"{vm.LS}/cpu.max.burst missing: the VM's kernel should have CFS burst (5.14+)")
        assert burst() == "0", burst()
        yield
    finally:
        # koordd first: stopping it restores its knobs, which must happen before the quota is removed.
        vm.systemctl("stop", vm.UNIT, check=False)
        vm.stop_units(*UNITS)
        vm.systemctl("set-property", "--runtime", vm.LS, "CPUQuota=")
        reset = vm.wait_for(lambda: vm.cpu_max(vm.LS) in (None, vm.MAX), 30)
    assert reset, f"{vm.LS} keeps cpu.max {vm.cpu_max(vm.LS)} after CPUQuota="


def start_and_wait_raised() -> str:
    """Start koordd with cpu_burst; returns the journal cursor from before the start."""
    cursor = vm.journal_cursor()
    vm.write_config(config_text())
    vm.systemctl("start", vm.UNIT)
    assert vm.is_active() == "active"
    assert vm.wait_for(lambda: burst() == str(BASE_QUOTA), TIMEOUT), \
        f"no burst on {vm.LS}: {burst()}\n{vm.journal_text(cursor)}"
    assert vm.wait_for(lambda: (vm.quota(vm.LS) or 0) >= RAISED, TIMEOUT), \
        f"{vm.LS} quota never raised on an idle node: {vm.cpu_max(vm.LS)}\n{vm.journal_text(cursor)}"
    return cursor


def restored_just_before(cursor) -> bool:
    """Whether koordd's last word on ls.slice's cpu.max since `cursor` put it back to its base: in journald,
    or in its restore journal, whose release line is written right after the restore, before the decision
    is logged. A kill between the two leaves no "restored" in journald (seen in CI: the kill 1.1 s after the
    raise, as the round that put the quota back came; the restarted koordd had no cpu.max to re-adopt)."""
    said = [d.get("KOORDD_OUTCOME") for d in vm.journal(cursor, "KOORDD_LOOP=cpu_burst", "KOORDD_KNOB=cpu.max")]
    return (bool(said) and said[-1] == "restored") or journal_last_word_on_quota() == "release"


def journal_last_word_on_quota() -> str | None:
    """"hold" or "release": the restore journal's last line about ls.slice's cpu.max (None: none, or
    compacted away; a compaction keeps holds only)."""
    from koordd.act.journal import RestoreJournal      # the installed koordd (/opt/koordd) runs these tests
    last = None
    for line in (vm.STATE_DIR / RestoreJournal.FILE).read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        for word in ("hold", "release"):
            entry = record.get(word) if isinstance(record, dict) else None
            if isinstance(entry, dict) and entry.get("target") == vm.LS and entry.get("knob") == "cpu.max":
                last = word
    return last


def wait_back_at_base() -> None:
    load_node(True)
    assert vm.wait_for(lambda: vm.cpu_max(vm.LS) == BASE, TIMEOUT), \
        f"{vm.LS} quota not back at base under load: {vm.cpu_max(vm.LS)}\n{vm.journal_text()}"
    samples = []
    for _ in range(6):                       # stays there while the node is loaded
        vm.wait_ticks("cpu_burst", 1)
        samples.append(vm.cpu_max(vm.LS))
    assert set(samples) == {BASE}, samples


def test_ls_gets_burst_and_quota_on_an_idle_node_and_gives_it_back_under_load(ls_quota):
    cursor = start_and_wait_raised()
    raised = vm.quota(vm.LS)
    wait_back_at_base()
    # Only the burst is held now: back at base, koordd released cpu.max.
    assert [(h["target"], h["knob"], h["original"]) for h in vm.held()] == [(vm.LS, "cpu.max.burst", "0")], \
        vm.held()

    bursts = vm.wait_journal(lambda: decisions(cursor, "cpu.max.burst", "applied"))
    assert bursts and (bursts[0]["KOORDD_OLD"], bursts[0]["KOORDD_NEW"]) == ("0", str(BASE_QUOTA)), bursts
    ups = vm.wait_journal(lambda: decisions(cursor, "cpu.max", "applied"))
    assert ups and ups[0]["KOORDD_OLD"] == BASE and ups[0]["KOORDD_NEW"] == f"{RAISED} 100000", ups[0]
    r = reason(ups[0])
    assert r["pool_state"] == "idle" and r["throttled"] > 0 and r["base_quota_us"] == BASE_QUOTA, r
    back = vm.wait_journal(lambda: decisions(cursor, "cpu.max", "restored"))
    assert back and back[-1]["KOORDD_NEW"] == BASE and reason(back[-1])["pool_state"] == "overload", back
    print(f"{vm.LS}: burst {burst()} µs, quota raised to {raised} µs on the idle node, "
          f"back to {BASE} under load ({len(ups)} raises, {len(back)} restores)")

    # systemctl stop: the burst goes back too.
    vm.systemctl("stop", vm.UNIT)
    assert vm.cpu_max(vm.LS) == BASE and burst() == "0"
    assert vm.held() == []
    assert not vm.journal(cursor, "KOORDD_LOOP=cpu_burst", "KOORDD_OUTCOME=refused")


def test_kill_9_while_raised_then_the_restart_still_knows_the_base(ls_quota):
    start_and_wait_raised()
    for attempt in range(3):
        pid, restarts = vm.main_pid(), vm.n_restarts()
        cursor = vm.journal_cursor()
        # Each systemctl/journalctl above takes seconds under TCG: kill at a moment koordd holds a raised
        # quota (it may have dipped back to base meanwhile and released it, then raised it again).
        assert vm.wait_for(lambda: "cpu.max" in {h["knob"] for h in vm.held()}, TIMEOUT, 0.05), vm.held()
        os.kill(pid, signal.SIGKILL)
        assert vm.wait_for(lambda: not vm.pid_alive(pid), 10)
        # The raised quota itself may not survive the crash: systemd re-applies ls.slice's CPUQuota= as
        # soon as it handles the dead unit (it re-realizes the cgroups around it), as seen in this VM.
        # What must survive is the journal: the originals, not what the crashed run had set.
        held = {h["knob"]: h["original"] for h in vm.held() if h["target"] == vm.LS}
        if "cpu.max" in held or not restored_just_before(cursor):
            break
        # koordd put the quota back to its base and let go of it between the look above and the kill
        # (seen once, 67 ms apart): nothing of cpu.max to keep. The restarted koordd raises it again.
        assert vm.wait_for(lambda: vm.is_active() == "active" and vm.n_restarts() > restarts, 60)
        assert vm.wait_for(lambda: (vm.quota(vm.LS) or 0) >= RAISED, TIMEOUT), vm.journal_text(cursor)
    assert held == {"cpu.max": BASE, "cpu.max.burst": "0"}, vm.held()

    assert vm.wait_for(lambda: vm.is_active() == "active" and vm.main_pid() not in (0, pid)
                       and vm.n_restarts() > restarts, 60), vm.journal_text(cursor)
    readopted = re.compile(r"re-adopting ls\.slice cpu\.max \(original '50000 100000'\)")
    assert vm.wait_journal(lambda: readopted.search(vm.journal_text(cursor))), vm.journal_text(cursor)
    # The restarted koordd starts from the raised quota, but its base is the journal's original:
    # under load it goes back to 50000, not to what the crashed run left.
    wait_back_at_base()
    assert [h["knob"] for h in vm.held()] == ["cpu.max.burst"], vm.held()
    vm.systemctl("stop", vm.UNIT)
    assert vm.cpu_max(vm.LS) == BASE and burst() == "0" and vm.held() == []
