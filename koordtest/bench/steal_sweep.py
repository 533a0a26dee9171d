"""Hypervisor stalls against how busy best-effort work keeps the vCPUs (scripts/bench-steal).

    .venv/bin/python scripts/bench-steal [--shares 100,90,75,50,0] [--seconds 60] [--rounds 2]
                                         [--spinner cpu|memory] [--out FILE]

For each share (the shares interleaved, --rounds times): one SCHED_IDLE spinner per CPU in a scratch cgroup
whose CPU quota is that share of the node (100: no quota; 0: no spinner), and beside them one SCHED_OTHER
sleeper pinned to each CPU that sleeps 1 ms at a time and notes every oversleep over --stall-ms (20). A
SCHED_OTHER thread preempts a SCHED_IDLE one at once in the guest, so an oversleep that long is the host
not running the vCPU. A `cpu` spinner only spins; a `memory` one writes a byte in every page of its own
256 MiB, over and over (a TLB and cache miss a write), to tell how busy from how much memory traffic.
Reported per share: the stalls (per minute, and the longest) and the steal the vCPUs
lost (/proc/stat, all of them), median and range over rounds. Needs root (the cgroup).

On the 2-CPU development VM a vCPU that never halted was taken for about 100 ms at a time a few times a
minute, and none was with the spinners capped at 90% of the node or less (docs/be-control.md, "When the
hypervisor takes a vCPU").
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from koordd.backends.cgroup_knobs import KNOBS
from koordd.kernel.cgroupfs import CgroupFS, detect_layout
from koordd.sensors.node import CLOCK_TICKS
from koordtest.bench.cgroup_tree import CgroupTree
from koordtest.bench.common import cell, command_line, doc_parser, interrupted, page
from koordtest.bench.ls_servers import python_module
from koordtest.bench.qos_stats import median_spread
from koordtest.bench.steal import read_steal

PERIOD_US = 100_000
SPIN = "spin"
SPINNERS = {
    "cpu": "while True: pass",
    "memory": "b = bytearray(256 << 20)\nwhile True:\n    for i in range(0, len(b), 4096):\n        b[i] = (b[i] + 1) & 255",
}


@dataclass(frozen=True)
class Trial:
    share: int                 # percent of the node the spinners may use
    seconds: float
    stalls: tuple[float, ...]  # oversleeps over the threshold, ms, all sleepers
    steal_s: float             # steal over all vCPUs, seconds


def sleeper(cpu: int, seconds: float, stall_ms: float) -> list[float]:
    """On `cpu`: sleep 1 ms at a time for `seconds`; the oversleeps over `stall_ms`, in ms."""
    os.sched_setaffinity(0, {cpu})
    out, end = [], time.monotonic() + seconds
    last = time.monotonic()
    while last < end:
        time.sleep(0.001)
        now = time.monotonic()
        if (now - last) * 1000 - 1 > stall_ms:
            out.append(round((now - last) * 1000 - 1, 1))
        last = now
    return out


def quota(share: int, ncpu: int) -> str:
    """cpu.max for `share` percent of `ncpu` CPUs ("max" at 100)."""
    return "max 100000" if share >= 100 else f"{max(ncpu * PERIOD_US * share // 100, 1000)} {PERIOD_US}"


def steal_seconds() -> float:
    return sum(read_steal()) / CLOCK_TICKS


def trial(tree: CgroupTree, fs: CgroupFS, share: int, seconds: float, stall_ms: float, spinner: str = "cpu") -> Trial:
    cpus = sorted(os.sched_getaffinity(0))
    KNOBS["cpu.max"].write(fs, tree.path(SPIN), quota(share, len(cpus)))
    spinners = [tree.spawn(SPIN, [sys.executable, "-c", SPINNERS[spinner]], idle_policy=True)
                for _ in (cpus if share > 0 else ())]
    try:
        time.sleep(1.0)                                   # the spinners running before the count starts
        steal0 = steal_seconds()
        sleepers = [subprocess.Popen(python_module("koordtest.bench.steal_sweep", "--sleeper", str(c), str(seconds),
                                                   str(stall_ms)), stdout=subprocess.PIPE, text=True) for c in cpus]
        stalls = [v for s in sleepers for v in json.loads(s.communicate()[0])]
        return Trial(share, seconds, tuple(stalls), steal_seconds() - steal0)
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def table(trials: Sequence[Trial], stall_ms: float) -> list[str]:
    """Per share, highest first: stalls per minute and the longest, steal per minute; median (range) over rounds."""
    out = [f"| spinners' quota | rounds | stalls over {stall_ms:g} ms a minute | longest (ms) | steal (s a minute, "
           "all vCPUs) |", "|---|---|---|---|---|"]
    for share in sorted({t.share for t in trials}, reverse=True):
        mine = [t for t in trials if t.share == share]
        per_min = median_spread(60 * len(t.stalls) / t.seconds for t in mine)
        longest = max((v for t in mine for v in t.stalls), default=None)
        steal = median_spread(60 * t.steal_s / t.seconds for t in mine)
        label = "none (no quota)" if share >= 100 else ("no spinner" if share == 0 else f"{share}% of the node")
        out.append(f"| {label} | {len(mine)} | {cell(per_min, 1)} | {'-' if longest is None else f'{longest:.0f}'} | "
                   f"{cell(steal, 2)} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--sleeper"]:
        print(json.dumps(sleeper(int(argv[1]), float(argv[2]), float(argv[3]))))
        return 0
    p = doc_parser(__doc__)
    p.add_argument("--shares", default="100,90,75,50,0", help="percent of the node the spinners may use, each")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds per trial")
    p.add_argument("--rounds", type=int, default=2, help="how many times every share is tried, interleaved")
    p.add_argument("--stall-ms", type=float, default=20.0, help="an oversleep longer than this is a stall")
    p.add_argument("--spinner", choices=sorted(SPINNERS), default="cpu",
                   help="what each spinner does: spin (cpu) or write to its own memory (memory)")
    p.add_argument("--out", type=Path, help="write the report here too")
    args = p.parse_args(argv)
    shares = [int(s) for s in args.shares.split(",")]
    if any(not 0 <= s <= 100 for s in shares):
        p.error("--shares: percents from 0 to 100")
    signal.signal(signal.SIGTERM, interrupted)
    layout = detect_layout(Path("/sys/fs/cgroup"))
    trials = []
    with CgroupTree(f"koordd-steal-{os.getpid()}", ("cpu",)) as tree:
        tree.create([SPIN])
        fs = CgroupFS(layout)
        for r in range(args.rounds):
            for share in shares:
                trials.append(trial(tree, fs, share, args.seconds, args.stall_ms, args.spinner))
                print(f"round {r + 1} share {share}%: {len(trials[-1].stalls)} stalls, steal "
                      f"{trials[-1].steal_s:.2f} s", file=sys.stderr, flush=True)
    text = page("Hypervisor stalls against how busy BE keeps the vCPUs", command_line(),
                [f"{len(os.sched_getaffinity(0))} CPUs; one SCHED_IDLE {args.spinner} spinner per CPU under the quota, one "
                 f"SCHED_OTHER 1 ms sleeper pinned to each CPU; {args.seconds:g} s a trial"],
                table(trials, args.stall_ms))
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
