"""The load of `koordctl demo`: what the LS worker wants, and the worker itself.

LS wants a fraction of each CPU that follows a raised cosine over time: `low` at the start, `high`
half a period later, `low` again after a whole one. Each LS worker is one process, one per CPU,
which in every slot (100 ms) burns that fraction of the slot in CPU time and sleeps for the rest. A
slot's work not done by the slot's end is dropped, as a request past its deadline would be: what LS
gets is then at most what it asked for, and the gap is what contention cost it.

    python -m koordctl.demo.load --start T --period P --low L --high H [--slot S]

T is the demo's start on CLOCK_MONOTONIC (time.monotonic() of the parent: the same clock in every
process), so every worker and the parent agree on what is wanted when. BE needs no code of its own:
a shell busy loop per CPU.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

SLOT = 0.1                      # seconds: LS's unit of work, and its deadline
BE_LOOP = ["/bin/sh", "-c", "while :; do :; done"]


def demand(elapsed: float, period: float, low: float, high: float) -> float:
    """The fraction of a CPU LS wants `elapsed` seconds into the demo."""
    return low + (high - low) * (1 - math.cos(2 * math.pi * elapsed / period)) / 2


def mean_demand(t0: float, t1: float, period: float, low: float, high: float) -> float:
    """The mean of demand() over [t0, t1] (seconds into the demo), exactly: what a slot or a sample
    window asks for, whatever its length against the period."""
    if t1 <= t0:
        return demand(t0, period, low, high)
    w = 2 * math.pi / period
    mean_cos = (math.sin(w * t1) - math.sin(w * t0)) / (w * (t1 - t0))
    return low + (high - low) * (1 - mean_cos) / 2


def burn_until(cpu_seconds: float, deadline: float) -> None:
    """Spin until this thread has used `cpu_seconds` more CPU time, or until `deadline` (monotonic)."""
    end_cpu = time.thread_time() + cpu_seconds
    while time.thread_time() < end_cpu and time.monotonic() < deadline:
        for _ in range(500):            # some tens of µs of work between two reads of the clocks
            pass


def run_ls(start: float, period: float, low: float, high: float, slot: float = SLOT) -> None:
    """Forever from `start` on: each slot, the slot's mean demand × slot of CPU time, then sleep to the next."""
    n = max(0, math.floor((time.monotonic() - start) / slot))
    while True:
        t0 = n * slot
        time.sleep(max(0.0, start + t0 - time.monotonic()))          # before the start, wait for it
        burn_until(mean_demand(t0, t0 + slot, period, low, high) * slot, start + t0 + slot)
        time.sleep(max(0.0, start + t0 + slot - time.monotonic()))
        # A slot that ran late is not made up for: the next one starts on time, as the next request would.
        n = max(n + 1, math.floor((time.monotonic() - start) / slot))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m koordctl.demo.load", description="One LS worker of koordctl demo.")
    p.add_argument("--start", type=float, required=True, help="the demo's start, time.monotonic()")
    p.add_argument("--period", type=float, required=True, help="seconds per sine period")
    p.add_argument("--low", type=float, required=True, help="lowest fraction of a CPU wanted")
    p.add_argument("--high", type=float, required=True, help="highest fraction of a CPU wanted")
    p.add_argument("--slot", type=float, default=SLOT, help="seconds per unit of work")
    args = p.parse_args(argv)
    try:
        run_ls(args.start, args.period, args.low, args.high, args.slot)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
