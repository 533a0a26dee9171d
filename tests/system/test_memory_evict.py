"""memory_evict under systemd on pure cgroup v2: BE services in a memory-limited slice are reclaimed,
then killed (or frozen) before the kernel's OOM killer takes the LS service; stopping koordd thaws.

The slice evict.slice (a runtime unit with MemoryMax=512M, MemorySwapMax=0) holds:
- evict-ls.service in evict-ls.slice: python holding 200 MiB (class LS);
- evict-be1..3.service in evict-be.slice: python growing by 10 MiB every 0.5 s up to 140 MiB each
  (class BE, one victim per service).
Together they want about 650 MiB. Uncontrolled, the kernel's OOM killer kills the largest process:
the LS one. koordd's memory_evict (scope evict.slice, threshold 60% = 307 MiB) acts first. Here
`memory.reclaim` exists, so each victim is first asked to reclaim; with no swap that cannot free
anon memory, and the next round (a cool-down later) kills it.

Only cgroup files and decisions.jsonl are read while the workload runs: journalctl is expensive
under TCG.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from . import vm

pytestmark = vm.only_in_vm

MiB = 1 << 20
SCOPE = "evict.slice"
LS_SLICE, BE_SLICE = f"{SCOPE}/evict-ls.slice", f"{SCOPE}/evict-be.slice"
LS_UNIT = "evict-ls.service"
BE_UNITS = tuple(f"evict-be{i}.service" for i in (1, 2, 3))
LIMIT = 512 * MiB
THRESHOLD = 60
SLICE_UNIT = Path("/run/systemd/system") / SCOPE
LS_MIB, BE_MAX_MIB, BE_STEP_MIB, BE_STEP_S = 200, 140, 10, 0.5

LS_CODE = f"""
import time
blob = b"\\x01" * ({LS_MIB} << 20)
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


@pytest.fixture
def evict_slice(koordd_stopped):
    """evict.slice with its memory limit (before anything runs in it); units and slice removed after."""
    vm.stop_units(LS_UNIT, *BE_UNITS)
    SLICE_UNIT.parent.mkdir(parents=True, exist_ok=True)
    SLICE_UNIT.write_text(f"[Slice]\nMemoryAccounting=yes\nMemoryMax={LIMIT}\nMemorySwapMax=0\n")
    vm.systemctl("daemon-reload")
    vm.systemctl("start", SCOPE)
    assert read(SCOPE, "memory.max") == str(LIMIT), read(SCOPE, "memory.max")
    yield
    vm.systemctl("stop", vm.UNIT, check=False)       # koordd thaws what it froze
    for unit in BE_UNITS:                            # and should it not have: a frozen task cannot stop
        try:
            (vm.CGROUP / BE_SLICE / unit / "cgroup.freeze").write_text("0")
        except OSError:
            pass
    vm.stop_units(LS_UNIT, *BE_UNITS)
    vm.systemctl("stop", SCOPE, check=False)
    SLICE_UNIT.unlink(missing_ok=True)
    vm.systemctl("daemon-reload")


def read(cgroup: str, name: str) -> str | None:
    try:
        return (vm.CGROUP / cgroup / name).read_text().strip()
    except OSError:
        return None


def oom_kills(cgroup: str) -> int:
    """Kernel OOM kills in the subtree (v2 memory.events is hierarchical)."""
    text = read(cgroup, "memory.events") or ""
    return int(dict(line.split() for line in text.splitlines()).get("oom_kill", 0))


def run_unit(unit: str, slice_: str, code: str) -> None:
    vm.sh("systemd-run", f"--unit={unit}", f"--slice={slice_.rpartition('/')[2]}", "/usr/bin/python3", "-c", code)


def start_ls() -> None:
    run_unit(LS_UNIT, LS_SLICE, LS_CODE)
    ls = f"{LS_SLICE}/{LS_UNIT}"
    assert vm.wait_for(lambda: int(read(ls, "memory.current") or 0) >= LS_MIB * MiB, 60), \
        f"LS did not reach {LS_MIB} MiB: {read(ls, 'memory.current')}"


def start_be() -> None:
    for unit in BE_UNITS:
        run_unit(unit, BE_SLICE, BE_CODE)


def be_running() -> list[str]:
    return [u for u in BE_UNITS if vm.is_active(u) == "active"]


def config(action: str, reclaim: bool) -> str:
    """The shipped config with be_suppress off (it would cap the BE services' CPU), qos_baseline off
    (BE's CPU knobs are not under test) and memory_evict on."""
    text = vm.without_qos_baseline(vm.shipped_config())
    text = re.sub(r"(?ms)^\[loops\.memory_evict\]\n.*?(?=^\[|\Z)", "", text)     # ours replaces the shipped one
    assert "[loops.be_suppress]\nenabled = true" in text
    text = text.replace("[loops.be_suppress]\nenabled = true", "[loops.be_suppress]\nenabled = false")
    return text + f"""
[[classes]]
name = "LS"
cgroups = ["{LS_SLICE}"]

[[classes]]
name = "BE"
cgroups = ["{BE_SLICE}/*"]

[loops.memory_evict]
enabled = true
interval = "250ms"
scope = "{SCOPE}"
threshold_percent = {THRESHOLD}
action = "{action}"
cooldown = "1s"
max_kills_per_minute = 20
pressure_full_percent = 0
reclaim = {"true" if reclaim else "false"}
thaw_delay = "10m"
"""


def records(since: float, knob: str | None = None, outcome: str | None = None) -> list[dict]:
    """memory_evict's decisions since `since` (decisions.jsonl keeps those of earlier tests too)."""
    try:
        lines = (vm.STATE_DIR / "decisions.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    out = [json.loads(line) for line in lines if line.strip()]
    return [d for d in out if d["loop"] == "memory_evict" and d["time"] >= since
            and (knob is None or d["knob"] == knob)
            and (outcome is None or d["outcome"] == outcome)]


def test_without_koordd_the_oom_killer_takes_the_ls_service(evict_slice):
    start_ls()
    start_be()
    assert vm.wait_for(lambda: oom_kills(SCOPE) > 0, 120), \
        f"no OOM kill in {SCOPE}: {read(SCOPE, 'memory.events')}, peak {read(SCOPE, 'memory.peak')}"
    # The largest process in the slice is the LS one: that is whom the OOM killer picks.
    assert vm.wait_for(lambda: vm.is_active(LS_UNIT) != "active", 30), vm.is_active(LS_UNIT)
    print(f"koordd off: OOM kills in {SCOPE} {oom_kills(SCOPE)}, of them in LS {oom_kills(LS_SLICE)}; "
          f"{LS_UNIT} Result={vm.show('Result', LS_UNIT)}")
    assert oom_kills(LS_SLICE) >= 1


def test_be_is_reclaimed_then_killed_before_the_oom_killer_takes_ls(evict_slice):
    assert (vm.CGROUP / SCOPE / "memory.reclaim").exists(), "this kernel has no memory.reclaim"
    since, cursor = time.time(), vm.journal_cursor()
    vm.write_config(config("kill", reclaim=True))
    vm.systemctl("start", vm.UNIT)          # Type=notify: returns after koordd's first tick
    assert vm.is_active() == "active"
    start_ls()
    start_be()
    ended = vm.wait_for(lambda: not be_running(), 180)
    summary = (f"BE running {be_running()}, LS {vm.is_active(LS_UNIT)}, OOM kills {oom_kills(SCOPE)}, "
               f"peak {int(read(SCOPE, 'memory.peak') or 0) // MiB} MiB of {LIMIT // MiB}")
    steps = [(d["knob"], d["cgroup"].rpartition("/")[2], d["outcome"], d["reason"].get("effective_usage", 0) // MiB)
             for d in records(since)]
    print(summary, steps)
    assert ended, summary
    assert vm.is_active(LS_UNIT) == "active", summary
    assert oom_kills(SCOPE) == 0, summary

    kills = records(since, "cgroup.kill", "applied")
    assert kills, steps
    be = {f"{BE_SLICE}/{u}" for u in BE_UNITS}
    for d in records(since):
        assert d["cgroup"] in be, d                                   # nothing but the BE services
        assert d["reason"]["scope"] == SCOPE and d["reason"]["capacity"] == LIMIT, d
    # Escalation: a victim's first step is memory.reclaim (EAGAIN "refused" when nothing could be
    # reclaimed), and a later round kills it.
    reclaimed = {d["cgroup"]: d["time"] for d in reversed(records(since, "memory.reclaim"))}
    assert any(d["cgroup"] in reclaimed and reclaimed[d["cgroup"]] < d["time"] for d in kills), steps
    for d in records(since, "memory.reclaim"):
        assert d["reason"]["step"] == "reclaim" and int(d["new"]) == d["reason"]["reclaim_bytes"] > 0, d

    # The journal has them too, with the loop's fields.
    entries = vm.wait_journal(lambda: vm.journal(cursor, "KOORDD_LOOP=memory_evict", "KOORDD_KNOB=cgroup.kill"))
    assert entries and all(e["KOORDD_CGROUP"] in be for e in entries), entries

    vm.systemctl("stop", vm.UNIT)
    assert vm.held() == []


def test_be_is_frozen_and_stopping_koordd_thaws_it(evict_slice):
    since = time.time()
    vm.write_config(config("freeze", reclaim=False))
    vm.systemctl("start", vm.UNIT)
    start_ls()
    start_be()

    def settled():
        """No BE service can grow any more (each frozen, or at its full size), and no new freeze in the
        next 4 rounds of memory_evict. Under a slow emulator the services grow slowly: a pause in the
        freezes alone does not mean the last one came."""
        if not all(read(f"{BE_SLICE}/{u}", "cgroup.freeze") == "1"
                   or int(read(f"{BE_SLICE}/{u}", "memory.current") or 0) >= BE_MAX_MIB * MiB for u in BE_UNITS):
            return False
        n = len(records(since, "cgroup.freeze", "applied"))
        vm.wait_ticks("memory_evict", 4)
        return n and n == len(records(since, "cgroup.freeze", "applied"))

    assert vm.wait_for(settled, 180), f"not settled in 180s: {records(since)}"
    frozen = [u for u in BE_UNITS if read(f"{BE_SLICE}/{u}", "cgroup.freeze") == "1"]
    summary = (f"frozen {frozen}, LS {vm.is_active(LS_UNIT)}, OOM kills {oom_kills(SCOPE)}, "
               f"peak {int(read(SCOPE, 'memory.peak') or 0) // MiB} MiB of {LIMIT // MiB}")
    print(summary)
    assert frozen, summary
    assert vm.is_active(LS_UNIT) == "active" and oom_kills(SCOPE) == 0, summary
    assert sorted(be_running()) == sorted(BE_UNITS), summary       # frozen, not dead
    held = sorted((h["target"], h["knob"], h["original"]) for h in vm.held())
    assert held == sorted((f"{BE_SLICE}/{u}", "cgroup.freeze", "0") for u in frozen), held

    # Room for the thawed services first (they grow again), then stop koordd: everything thaws.
    vm.systemctl("stop", LS_UNIT)
    vm.systemctl("stop", vm.UNIT)
    assert [u for u in BE_UNITS if read(f"{BE_SLICE}/{u}", "cgroup.freeze") != "0"] == []
    assert vm.held() == []
    restored = records(since, "cgroup.freeze", "restored")
    assert sorted(d["cgroup"] for d in restored) == sorted(f"{BE_SLICE}/{u}" for u in frozen), restored
    grown = vm.wait_for(lambda: all(int(read(f"{BE_SLICE}/{u}", "memory.current") or 0) >= BE_MAX_MIB * MiB
                                    for u in BE_UNITS), 60)
    assert grown, "the thawed services did not resume"
