"""Hypervisor steal during a run's window: how long the host ran something else while a vCPU had work.

A guest cannot see those stalls any other way: its run-queue latency and its own clocks go on, and a
request in flight simply takes longer. On the 2-CPU development guest two SCHED_IDLE spinners kept both
vCPUs busy and the host took one for 100 ms at a time, a few times a minute (a SCHED_OTHER thread that
sleeps 1 ms overslept by 100 ms, and steal grew by 10 ticks); with the spinners capped at 90% of the node
or less, or with no spinner, it did not (scripts/bench-steal; docs/benchmarks.md). So a client's
window whose p99 jumps while the kernel's server-side p99 does not may be the host's, not BE's in the
guest; the report says which windows lost a vCPU for how long.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from koordd.sensors.node import CLOCK_TICKS, parse_proc_stat_steal

PERIOD = 0.1         # seconds between samples: a window's boundaries are placed to this


def read_steal() -> list[int]:
    return list(parse_proc_stat_steal(Path("/proc/stat").read_text()))


class StealSampler:
    """Per-CPU steal ticks every PERIOD seconds from start() to stop(), in a thread of its own."""

    def __init__(self, read: Callable[[], list[int]] = read_steal, clock: Callable[[], float] = time.monotonic,
                 period: float = PERIOD):
        self.read, self.clock, self.period = read, clock, period
        self.samples: list[tuple[float, list[int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steal-sampler", daemon=True)

    def start(self) -> "StealSampler":
        self.samples.append((self.clock(), self.read()))
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.samples.append((self.clock(), self.read()))

    def stop(self) -> list[tuple[float, list[int]]]:
        self._stop.set()
        self._thread.join()
        self.samples.append((self.clock(), self.read()))
        return self.samples


def window_steal(samples: Sequence[tuple[float, Sequence[int]]], start: float, seconds: float,
                 windows: int) -> dict:
    """Steal over [start, start + seconds] cut into `windows` equal windows: the whole window's steal in ms
    (all CPUs) and, per window, the ms of the CPU that lost the most in it. Each sample's growth since the
    one before goes to the window its time falls in."""
    width = seconds / max(windows, 1)
    per_window = [[0] * len(samples[0][1]) if samples else [] for _ in range(max(windows, 1))]
    total = 0
    for (_, before), (t, after) in zip(samples, samples[1:]):
        if not start < t <= start + seconds + PERIOD:
            continue
        w = min(max(int((t - start) / width), 0), len(per_window) - 1)
        for cpu, (a, b) in enumerate(zip(before, after)):
            grown = max(b - a, 0)
            per_window[w][cpu] += grown
            total += grown
    ms = 1000 / CLOCK_TICKS
    return {"ms": round(total * ms), "windows_ms": [round(max(w, default=0) * ms) for w in per_window]}


STOLEN_MS = 50       # a window in which one vCPU lost this long to the host is "stolen"
SLOW = 3.0           # a window whose p99 is over this x LS alone's median p99 is "slow"


def steal_line(runs: Sequence[dict], load, alone_p99: float) -> str | None:
    """One report line: of the LS windows at `load`, how many lost a vCPU to the host for STOLEN_MS or more
    (with BE and without), and how many of the slow ones did. None where no run recorded steal."""
    pairs = []                          # (run has BE, window slow, window stolen)
    for r in runs:
        steal, ls = r.get("steal"), r.get("ls")
        if r.get("load") != load or not ls or not steal or len(steal["windows_ms"]) != len(ls.get("windows", [])):
            continue
        with_be = r.get("be_work") is not None or bool(r.get("be_work_halves"))
        for w, ms in zip(ls["windows"], steal["windows_ms"]):
            pairs.append((with_be, w["p99"] is not None and w["p99"] > SLOW * alone_p99, ms >= STOLEN_MS))
    if not pairs:
        return None
    count = lambda f: sum(1 for p in pairs if f(*p))            # noqa: E731
    slow = count(lambda be, s, st: s)
    return (f"- windows that lost a vCPU to the hypervisor for {STOLEN_MS} ms or more (steal): "
            f"{count(lambda be, s, st: st and be)} of {count(lambda be, s, st: be)} with BE, "
            f"{count(lambda be, s, st: st and not be)} of {count(lambda be, s, st: not be)} with LS alone; "
            f"of the {slow} windows whose p99 was over {SLOW:g}x LS alone's, "
            f"{count(lambda be, s, st: s and st)} had lost one")
