"""qos_baseline under systemd on pure cgroup v2: be.slice as SCHED_IDLE (cpu.idle) hands the CPU to
ls.slice; LS cpu.weight and memory.low/min and BE memory.high are set; a systemd rewrite
(`systemctl set-property`) and a hand-written cpu.idle are corrected within a tick, each a decision
in the journal; `systemctl stop` puts back the values from before koordd's first write.

Hogs: stress-ng with 1 worker in ls.slice and 2 in be.slice, all bound to the VM's CPU 1
(CPUAffinity=), so the two slices really contest one CPU: with their equal CPUWeight=100 LS gets
about half of it uncontrolled, nearly all of it with BE idle. Under TCG numbers are noisy, so the
checks compare shares measured within one run. be_suppress is off here (its cpu.max would mix in).
"""
from __future__ import annotations

import json

import pytest

from . import vm

pytestmark = vm.only_in_vm

UNITS = {"qosls": (vm.LS, 1), "qosbe": (vm.BE, 2)}
LS_WEIGHT = 200
LS_LOW, LS_MIN = 256 << 20, 64 << 20

CONFIG = vm.SLICES_CONFIG + f"""\
[[classes]]
name = "SYSTEM"
cgroups = ["system.slice"]

[loops.be_suppress]
enabled = false

[loops.qos_baseline]
enabled = true
interval = "1s"
be_cpu_idle = true
ls_cpu_weight = {LS_WEIGHT}
ls_memory_low = "256M"
ls_memory_min = "64M"
be_memory_high = "50%"
"""


def share(m: dict) -> float:
    return m[vm.LS] / max(m[vm.LS] + m[vm.BE], 1e-6)


def qos_decisions(cursor: str, *matches: str) -> list[dict]:
    return vm.journal(cursor, "KOORDD_LOOP=qos_baseline", *matches)


def brief(entries: list[dict]) -> str:
    return "\n".join(f"{e.get('KOORDD_CGROUP')} {e.get('KOORDD_KNOB')} {e.get('KOORDD_OUTCOME')} "
                     f"{e.get('KOORDD_OLD')!r} -> {e.get('KOORDD_NEW')!r}" for e in entries)


@pytest.fixture
def pinned_hogs(cpu_controller, koordd_stopped):
    vm.stop_units(*UNITS)
    for unit, (slice_, n) in UNITS.items():
        vm.start_stress(unit, slice_, n, "CPUAffinity=1")
    assert vm.wait_for(lambda: vm.knob(vm.BE, "cpu.idle") is not None, 30), \
        f"{vm.BE}/cpu.idle did not appear: {(vm.CGROUP / 'cgroup.subtree_control').read_text()}"
    yield
    vm.stop_units(*UNITS)
    # The runtime property set below must not outlive the test (koordd's restore wrote the old value,
    # but systemd would write its own again on its next realisation of the slice).
    vm.systemctl("set-property", "--runtime", vm.LS, "MemoryLow=0", check=False)


def test_baseline_set_reconciled_and_restored(pinned_hogs):
    originals = {(cg, knob): vm.knob(cg, knob) for cg, knob in (
        (vm.BE, "cpu.idle"), (vm.BE, "cpu.weight"), (vm.BE, "memory.high"),
        (vm.LS, "cpu.weight"), (vm.LS, "memory.low"), (vm.LS, "memory.min"))}
    assert originals[(vm.BE, "cpu.idle")] == "0" and originals[(vm.LS, "cpu.weight")] == "100", originals
    assert None not in originals.values(), f"a knob file is missing on the slices: {originals}"

    before = vm.measure(6, vm.LS, vm.BE)

    vm.write_config(CONFIG)
    cursor = vm.journal_cursor()
    vm.systemctl("enable", "--now", vm.UNIT)
    assert vm.is_active() == "active"
    assert vm.wait_for(lambda: vm.knob(vm.BE, "cpu.idle") == "1", 60), vm.journal_text(cursor)
    high = vm.node_memory() * 50 // 100 // 4096 * 4096
    want = {(vm.BE, "cpu.idle"): "1", (vm.BE, "cpu.weight"): "1", (vm.BE, "memory.high"): str(high),
            (vm.LS, "cpu.weight"): str(LS_WEIGHT), (vm.LS, "memory.low"): str(LS_LOW),
            (vm.LS, "memory.min"): str(LS_MIN)}
    assert vm.wait_for(lambda: {k: vm.knob(*k) for k in want} == want, 30), \
        f"{ {k: vm.knob(*k) for k in want} } != {want}\n{vm.journal_text(cursor)}"
    vm.wait_ticks("qos_baseline", 3)
    after = vm.measure(6, vm.LS, vm.BE)
    summary = (f"uncontrolled LS {before[vm.LS]:.2f} BE {before[vm.BE]:.2f} CPUs (LS share {share(before):.2f}); "
               f"BE idle: LS {after[vm.LS]:.2f} BE {after[vm.BE]:.2f} CPUs (LS share {share(after):.2f})")
    print(summary)
    assert share(before) < 0.75, f"the slices did not contest the CPU: {summary}"
    assert share(after) > 0.85 and share(after) > share(before) + 0.15, summary
    assert after[vm.BE] < 0.5 * before[vm.BE], summary

    # systemd rewrites LS's weight and memory.low (an operator's set-property); a hand resets BE's idle.
    vm.systemctl("set-property", "--runtime", vm.LS, "CPUWeight=100", "MemoryLow=128M")
    (vm.CGROUP / vm.BE / "cpu.idle").write_text("0")
    assert vm.wait_for(lambda: {k: vm.knob(*k) for k in want} == want, 30), \
        f"not corrected: { {k: vm.knob(*k) for k in want} }\n{vm.journal_text(cursor)}"

    def applied(cgroup, knob):
        return qos_decisions(cursor, f"KOORDD_CGROUP={cgroup}", f"KOORDD_KNOB={knob}", "KOORDD_OUTCOME=applied")

    for cgroup, knob, rewrite in ((vm.BE, "cpu.idle", "0"), (vm.LS, "cpu.weight", "100"),
                                  (vm.LS, "memory.low", str(128 << 20))):
        entries = vm.wait_journal(lambda: e if len(e := applied(cgroup, knob)) >= 2 else None)
        assert entries, f"no correction of {cgroup} {knob}:\n{brief(qos_decisions(cursor))}"
        first, second = entries[0], entries[1]
        assert (first["KOORDD_OLD"], first["KOORDD_NEW"]) == (originals[(cgroup, knob)], want[(cgroup, knob)]), first
        assert (second["KOORDD_OLD"], second["KOORDD_NEW"]) == (rewrite, want[(cgroup, knob)]), brief(entries)
        assert json.loads(second["KOORDD_REASON"])["class"] in ("BE", "LS"), second
    # The restore journal keeps the values from before koordd's first write, not systemd's.
    held = {(h["target"], h["knob"]): h["original"] for h in vm.held()}
    assert held == {k: originals[k] for k in want}, held
    assert not qos_decisions(cursor, "KOORDD_OUTCOME=refused"), brief(qos_decisions(cursor))

    # Stop: every knob back to its value before koordd; systemd's MemoryLow=128M was a rewrite koordd
    # overrode, so memory.low goes back to what it was before koordd's first write (0).
    cursor = vm.journal_cursor()
    vm.systemctl("stop", vm.UNIT)
    now = {k: vm.knob(*k) for k in originals}
    assert now == originals, now
    assert vm.held() == []
    restored = vm.wait_journal(lambda: qos_decisions(cursor, "KOORDD_OUTCOME=restored"))
    knobs = [(e["KOORDD_CGROUP"], e["KOORDD_KNOB"]) for e in restored]
    assert (vm.BE, "cpu.idle") in knobs, brief(restored)
    # BE's idle goes back before its weight: leaving idle resets the weight, which is then restored
    # (here to the 100 the kernel already set, so only the idle restore is recorded).
    assert (vm.BE, "cpu.weight") not in knobs or knobs.index((vm.BE, "cpu.idle")) < knobs.index((vm.BE, "cpu.weight"))


def test_the_shipped_config_makes_be_idle_sizes_it_by_ls_slack_and_restores(pinned_hogs):
    # koordd as shipped: qos_baseline makes be.slice idle, be_suppress sizes BE by LS slack from the
    # run-queue latency sensor (eBPF here); both loops' knobs go back on stop.
    assert vm.CONFIG.read_text() == vm.shipped_config()
    originals = {knob: vm.knob(vm.BE, knob) for knob in ("cpu.idle", "cpu.weight", "cpu.max")}
    assert originals["cpu.idle"] == "0" and originals["cpu.max"] == vm.MAX, originals
    before = vm.measure(6, vm.LS, vm.BE)
    cursor = vm.journal_cursor()
    vm.systemctl("start", vm.UNIT)
    assert vm.wait_for(lambda: vm.knob(vm.BE, "cpu.idle") == "1", 60), vm.journal_text(cursor)
    vm.wait_ticks("be_suppress", 5)
    after = vm.measure(6, vm.LS, vm.BE)
    status = vm.koordd_status()
    summary = (f"uncontrolled LS share {share(before):.2f} (BE {before[vm.BE]:.2f} CPUs); koordd as shipped: "
               f"LS {after[vm.LS]:.2f} BE {after[vm.BE]:.2f} CPUs (LS share {share(after):.2f}), "
               f"be.slice cpu.max {vm.cpu_max()}")
    print(summary)
    assert share(before) < 0.75, f"the slices did not contest the CPU: {summary}"
    assert share(after) > 0.85 and share(after) > share(before) + 0.15, summary
    assert (status.get("sensors") or {}).get("runq_latency", {}).get("state") == "running", status.get("sensors")
    loops = status["loops"]
    assert loops["be_suppress"]["ticks"] >= 5 and not loops["be_suppress"]["failures"], loops
    for e in vm.journal(cursor, "KOORDD_LOOP=be_suppress", "KOORDD_OUTCOME=applied"):
        assert json.loads(e["KOORDD_REASON"])["rule"] == "slack", e

    vm.systemctl("stop", vm.UNIT)
    assert {knob: vm.knob(vm.BE, knob) for knob in originals} == originals
    assert vm.held() == []
