"""proactive_reclaim under systemd on pure cgroup v2 (memory.reclaim, Linux 5.19+): a BE service with a
large, mostly cold page cache and anon footprint gives memory back while its memory PSI stays under the
target; its throughput stays where it was; stopping koordd puts memory.swap.max back.

reclaimbe.slice holds reclaimbe.service: python that writes a 256 MiB file (its page cache, charged to
the service), allocates 96 MiB of anon memory, then loops over 16 MiB of the file and 8 MiB of the anon
memory (the hot part) and counts its passes per second into a file. The rest (240 MiB of cache, 88 MiB of
anon) is never touched again: what senpai takes back. Without swap the anon part stays; the cache goes.

In scripts/vmtest's VM (TCG), two runs: 362 -> 117 and 362 -> 150 MiB (243 and 204 MiB reclaimed in 25 and
18 steps); passes/s 124-128 without koordd and 106-119 with it in the first, 113-128 and 114-126 in the
second.

Throughput is judged by the median second of 15 before koordd starts against the median second of 15
while it reclaims, with 25% of room: scripts/bench-reclaim (issue 29, 27 runs in this VM)
found single seconds of the same workload anywhere from 61 to 117 passes/s without koordd, but the
medians of runs within ±5% of each other, and koordd's at off's. A median that falls by a quarter is
reclaim hurting the workload; one slow second is TCG.

Each second is taken relative to a reference in the same VM (reclaimref.service: a CPU loop counting its
own passes, in a slice koordd leaves alone): the emulator's speed is not the service's. CI runs two VMs
side by side on two cores; in one run the service did 36-49 passes/s before koordd started (a third of
the figures above) and 20-42 while it reclaimed, with 7 MiB refaulted and no memory pressure, while the
other VM was filling its memory to the OOM killer: the host had slowed, not the service. koordd's own CPU
(its startup, under TCG) slows both alike; its cost is scripts/bench-overhead's to measure.
"""
from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import pytest

from . import vm

pytestmark = vm.only_in_vm

MiB = 1 << 20
# No dash: systemd would put "reclaim-be.slice" inside reclaim.slice
BE_SLICE = "reclaimbe.slice"
BE_UNIT = "reclaimbe.service"
CG = f"{BE_SLICE}/{BE_UNIT}"
RATE = Path("/run/reclaim-be.rate")
REF_UNIT = "reclaimref.service"
REF_RATE = Path("/run/reclaim-ref.rate")
PSI_TARGET = 0.5
SECONDS = 15            # per-second rates measured before and during: their medians are compared
KEPT = 0.75             # the share of the median before that the median during must keep

def counting(rate: Path, one_pass: str, setup: str = "") -> str:
    """Python that runs `one_pass` (lines at the loop's depth) forever after `setup`, writing its passes per
    second to `rate` each second."""
    return f"""import os, time
{setup}passes, t0 = 0, time.monotonic()
while True:
{one_pass}    passes += 1
    now = time.monotonic()
    if now - t0 >= 1:
        with open("{rate}.tmp", "w") as out:
            out.write(str(passes / (now - t0)))
        os.replace("{rate}.tmp", "{rate}")
        passes, t0 = 0, now
"""


BE_CODE = counting(RATE, setup="""\
path = "/var/tmp/reclaim-be.data"
with open(path, "wb") as f:
    for _ in range(256):
        f.write(os.urandom(1 << 20))
anon = bytearray(96 << 20)
for i in range(0, len(anon), 4096):
    anon[i] = 1
f = open(path, "rb")
""", one_pass="""\
    f.seek(0)
    for _ in range(16):
        f.read(1 << 20)
    for i in range(0, 8 << 20, 4096):
        anon[i] = (anon[i] + 1) & 255
""")
REF_CODE = counting(REF_RATE, one_pass="    sum(range(2000))\n")


def read(cgroup: str, name: str) -> str | None:
    try:
        return (vm.CGROUP / cgroup / name).read_text().strip()
    except OSError:
        return None


def current() -> int:
    return int(read(CG, "memory.current") or 0)


def refaults() -> int:
    """The service's workingset_refault_file + _anon, in pages."""
    stat = dict(line.split(" ", 1) for line in (read(CG, "memory.stat") or "").splitlines() if " " in line)
    return sum(int(stat.get(k, 0)) for k in ("workingset_refault_file", "workingset_refault_anon"))


def rate(path: Path = RATE) -> float:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return 0.0


def rates(seconds: float) -> tuple[list[float], list[float]]:
    """Each second: the service's passes/s, and the same over the reference's (the VM's speed that second)."""
    raw, relative = [], []
    for _ in range(int(seconds)):
        time.sleep(1)
        raw.append(rate())
        relative.append(rate() / max(rate(REF_RATE), 1e-9))
    return raw, relative


def start_reference() -> None:
    """The reference loop, running once it has written its first rate."""
    REF_RATE.unlink(missing_ok=True)
    vm.sh("systemd-run", f"--unit={REF_UNIT}", "/usr/bin/python3", "-c", REF_CODE)
    assert vm.wait_for(lambda: rate(REF_RATE) > 0, 60), "the reference loop wrote no rate"


@pytest.fixture
def be_service(koordd_stopped):
    vm.stop_units(BE_UNIT, REF_UNIT)
    RATE.unlink(missing_ok=True)
    REF_RATE.unlink(missing_ok=True)
    vm.sh("systemd-run", f"--unit={BE_UNIT}", f"--slice={BE_SLICE}", "-p", "MemoryAccounting=yes",
          "/usr/bin/python3", "-c", BE_CODE)
    start_reference()
    assert vm.wait_for(lambda: rate() > 0 and current() >= 300 * MiB, 120), \
        f"the BE service did not settle: memory.current {current() // MiB} MiB, rate {rate()}"
    yield
    vm.systemctl("stop", vm.UNIT, check=False)
    vm.stop_units(BE_UNIT, REF_UNIT)
    Path("/var/tmp/reclaim-be.data").unlink(missing_ok=True)
    RATE.unlink(missing_ok=True)
    REF_RATE.unlink(missing_ok=True)


def config() -> str:
    text = vm.without_qos_baseline(vm.shipped_config())
    text = re.sub(r"(?ms)^\[loops\.proactive_reclaim\]\n.*?(?=^\[|\Z)", "", text)
    text = text.replace("[loops.be_suppress]\nenabled = true", "[loops.be_suppress]\nenabled = false")
    return text + f"""
[[classes]]
name = "BE"
cgroups = ["{BE_SLICE}"]

[loops.proactive_reclaim]
enabled = true
interval = "1s"
psi_target = {PSI_TARGET}
min_step = "4M"
max_step_percent = 5.0
grow_percent = 100
be_swap_max = "0"
"""


def records(since: float, knob: str) -> list[dict]:
    try:
        lines = (vm.STATE_DIR / "decisions.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [d for d in (json.loads(line) for line in lines if line.strip())
            if d["loop"] == "proactive_reclaim" and d["time"] >= since and d["knob"] == knob]


def test_cold_memory_is_reclaimed_under_the_psi_target_throughput_kept_and_swap_restored(be_service):
    assert (vm.CGROUP / BE_SLICE / "memory.reclaim").exists(), "this kernel has no memory.reclaim"
    swap_before = read(BE_SLICE, "memory.swap.max")
    before_mib = current() // MiB
    refaults_before = refaults()
    base, base_rel = rates(SECONDS)                       # koordd off: the workload's own median
    since = time.time()
    vm.write_config(config())
    # No busy reference while koordd starts: under TCG, beside the other VM, its start then outlasted the
    # unit's start timeout in one run. It runs again for the seconds measured with koordd.
    vm.stop_units(REF_UNIT)
    vm.systemctl("start", vm.UNIT)
    assert vm.is_active() == "active"
    vm.wait_ticks("proactive_reclaim", 20)
    start_reference()
    during, during_rel = rates(SECONDS)
    # The cold part goes: at least 100 MiB of the 240 MiB of cold cache. Waited for, not sampled at a fixed
    # time: how many steps fit in the time above depends on the emulator's speed and on the refault back-off
    # (one CI run read 98 MiB there); a loop that stopped reclaiming still fails here, after 120 s.
    vm.wait_for(lambda: before_mib - current() // MiB >= 100, 120)
    after_mib = current() // MiB
    refaulted_mib = (refaults() - refaults_before) * 4096 / MiB
    applied = [d for d in records(since, "memory.reclaim") if d["outcome"] == "applied"]
    saved = max((d["reason"]["saved_total_bytes"] + d["reason"]["reclaim_bytes"] for d in applied), default=0)
    print(f"memory.current {before_mib} -> {after_mib} MiB; reclaimed {saved // MiB} MiB in {len(applied)} steps; "
          f"passes/s without {min(base):.1f}..{max(base):.1f} (median {statistics.median(base):.1f}), "
          f"with {min(during):.1f}..{max(during):.1f} (median {statistics.median(during):.1f}); relative to the "
          f"reference {statistics.median(base_rel):.3g} -> {statistics.median(during_rel):.3g}; "
          f"refaulted {refaulted_mib:.1f} MiB; memory.pressure {read(CG, 'memory.pressure')}")
    assert applied, records(since, "memory.reclaim")
    # The service, one by one under its slice; anything else reclaimed is BE too (the shipped be.slice)
    reclaimed = {d["cgroup"] for d in applied}
    assert CG in reclaimed and all(c == CG or c.split("/")[0] == vm.BE for c in reclaimed), reclaimed
    # Never on a cgroup above the target: every reclaim was asked under it.
    assert all(d["reason"]["psi_some_percent"] < PSI_TARGET for d in applied), applied
    assert before_mib - after_mib >= 100, (before_mib, after_mib)
    # The refault signal saw the kernel's memory.stat: each step after the first carries its figures.
    assert any(d["reason"].get("refault_bytes") is not None for d in applied), applied
    # Throughput kept: the median second while reclaiming against the median second before, each relative to
    # the reference's that second (see the docstring).
    assert statistics.median(during_rel) >= KEPT * statistics.median(base_rel), (base, during, base_rel, during_rel)
    assert read(BE_SLICE, "memory.swap.max") == "0"

    vm.systemctl("stop", vm.UNIT)
    assert read(BE_SLICE, "memory.swap.max") == swap_before
