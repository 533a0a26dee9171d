"""Wake-up latency with and without 0 µs CPU latency held on /dev/cpu_dma_latency (be_suppress's wake lever).

    sudo .venv/bin/python scripts/bench-wakeup [--runs 8] [--samples 2000] [--gap-us 2000] [--out FILE]

Each run measures both modes, "released" (no request of ours) and "held" (0 µs requested through koordd's
own LatencyRequest, koordd/kernel/pm_qos.py, as the wake lever holds it), in an ABBA order (the mode that
goes first alternates), with two probes each:

- pingpong: a child pinned to the last CPU blocks reading a pipe; the parent, pinned to CPU 0, sleeps
  --gap-us (long enough for both CPUs to go idle), then writes a byte, and the child writes one back. The
  round trip is two wake-ups of an idle CPU (the child's, then the parent's) plus two pipe transfers.
- timer: the parent sleeps 1 ms with a timer slack of 1 ns (prctl) and takes the overshoot: one timer
  wake-up of an idle CPU.

Reported per mode and probe: the median over runs of each run's p50 and p99, with the range (min-max) over
runs. The host is shared: the report gives the load average at its start and end and, per run, the node's
busy CPUs that were not the benchmark's (from /proc/stat), so a noisy run can be told from an effect.
Needs root (the device is root's). The request is dropped at the end of each "held" run and when the
benchmark is interrupted (closing the fd; the kernel would drop it at exit anyway).
"""
from __future__ import annotations

import ctypes
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from koordd.kernel.pm_qos import DEVICE, LatencyRequest, read_target
from koordtest.bench.common import cell, command_line, cpu_model, doc_parser, interrupted, page
from koordtest.bench.procstat import node_cpu_ticks
from koordtest.bench.qos_stats import median_spread, percentile

MODES = ("released", "held")
PROBES = ("pingpong", "timer")
PR_SET_TIMERSLACK = 29


def _us(ns: int) -> float:
    return ns / 1000.0


def pingpong(samples: int, gap_us: float) -> list[float]:
    """Round trips (µs) of one byte to a child on another CPU and back, each after `gap_us` of sleep."""
    cpus = sorted(os.sched_getaffinity(0))
    here, there = cpus[0], cpus[-1]
    from_parent, to_child = os.pipe()             # (read end, write end)
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: answer every byte until the pipe closes
        try:
            os.close(to_child)
            os.close(from_child)
            os.sched_setaffinity(0, {there})
            while os.read(from_parent, 1):
                os.write(to_parent, b"y")
        finally:
            os._exit(0)
    os.close(from_parent)
    os.close(to_parent)
    out = []
    try:
        os.sched_setaffinity(0, {here})
        os.write(to_child, b"x")                   # the child is up and pinned once it answers the first
        os.read(from_child, 1)
        for _ in range(samples):
            time.sleep(gap_us / 1e6)
            t = time.perf_counter_ns()
            os.write(to_child, b"x")
            os.read(from_child, 1)
            out.append(_us(time.perf_counter_ns() - t))
    finally:
        os.sched_setaffinity(0, set(cpus))
        os.close(to_child)
        os.waitpid(pid, 0)
        os.close(from_child)
    return out


def timer(samples: int, sleep_us: float = 1000.0) -> list[float]:
    """Overshoots (µs) of `sleep_us` sleeps with a timer slack of 1 ns."""
    libc = ctypes.CDLL(None, use_errno=True)
    old = libc.prctl(30, 0, 0, 0, 0)               # PR_GET_TIMERSLACK
    libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    out = []
    try:
        for _ in range(samples):
            t = time.perf_counter_ns()
            time.sleep(sleep_us / 1e6)
            out.append(_us(time.perf_counter_ns() - t) - sleep_us)
    finally:
        if old > 0:
            libc.prctl(PR_SET_TIMERSLACK, old, 0, 0, 0)
    return out


@dataclass(frozen=True)
class Measure:
    run: int
    mode: str
    probe: str
    p50: float
    p99: float
    other_cpus: float                              # the node's busy CPUs not ours during the probe


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def measured(run: int, mode: str, probe: str, fn: Callable[[], list[float]]) -> Measure:
    ticks = os.sysconf("SC_CLK_TCK")
    busy0, total0 = node_cpu_ticks()
    own0 = own_cpu()
    values = sorted(fn())
    busy1, total1 = node_cpu_ticks()
    own = own_cpu() - own0
    ncpu = os.cpu_count() or 1
    wall = (total1 - total0) / ticks / ncpu
    other = max((busy1 - busy0) / ticks - own, 0.0) / wall if wall > 0 else 0.0
    return Measure(run, mode, probe, percentile(values, 50), percentile(values, 99), other)


def order(run: int) -> tuple[str, str]:
    """ABBA: run 0 released first, run 1 held first, ..."""
    return MODES if run % 2 == 0 else MODES[::-1]


def bench(runs: int, samples: int, gap_us: float, device: Path = DEVICE,
          log: Callable[[str], None] = print) -> list[Measure]:
    out = []
    for run in range(runs):
        for mode in order(run):
            request = LatencyRequest(0, device) if mode == "held" else None
            try:
                for probe, fn in (("pingpong", lambda: pingpong(samples, gap_us)), ("timer", lambda: timer(samples))):
                    m = measured(run, mode, probe, fn)
                    out.append(m)
                    log(f"run {run} {mode:8} {probe:8} p50 {m.p50:7.1f} µs  p99 {m.p99:7.1f} µs  "
                        f"(other work {m.other_cpus:.2f} CPUs)")
            finally:
                if request is not None:
                    request.close()
    return out


def table(measures: Sequence[Measure]) -> list[str]:
    """Per probe and mode: p50 and p99 (median, min-max over runs), and the other work's CPUs."""
    def spread(values: list[float]) -> str:
        return cell(median_spread(values), 1)
    rows = ["| probe | mode | runs | p50 µs | p99 µs | other work, CPUs |", "|---|---|---|---|---|---|"]
    for probe in PROBES:
        for mode in MODES:
            ms = [m for m in measures if m.probe == probe and m.mode == mode]
            rows.append(f"| {probe} | {mode} | {len(ms)} | {spread([m.p50 for m in ms])} | {spread([m.p99 for m in ms])} "
                        f"| {spread([m.other_cpus for m in ms])} |")
    return rows


def paired(measures: Sequence[Measure]) -> list[str]:
    """Per probe: the median over runs of held minus released, in the same run (the pairing takes the
    host's drift out), and in how many runs held was lower."""
    out = []
    for probe in PROBES:
        for q in ("p50", "p99"):
            diffs = []
            for run in sorted({m.run for m in measures}):
                by = {m.mode: getattr(m, q) for m in measures if m.run == run and m.probe == probe}
                if len(by) == 2:
                    diffs.append(by["held"] - by["released"])
            if diffs:
                lower = sum(d < 0 for d in diffs)
                out.append(f"{probe} {q}: held - released, same run: median {statistics.median(diffs):+.1f} µs "
                           f"(range {min(diffs):+.1f} to {max(diffs):+.1f}); held lower in {lower} of {len(diffs)} runs")
    return out


def cpuidle() -> str:
    base = Path("/sys/devices/system/cpu/cpuidle")
    def read(name: str) -> str:
        try:
            return (base / name).read_text().strip()
        except OSError:
            return "?"
    return f"cpuidle driver {read('current_driver')}, governor {read('current_governor_ro')}"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: Sequence[str] | None = None) -> int:
    p = doc_parser(__doc__)
    p.add_argument("--runs", type=int, default=8, help="runs, each with both modes (default 8)")
    p.add_argument("--samples", type=int, default=2000, help="samples per probe and mode in a run (default 2000)")
    p.add_argument("--gap-us", type=float, default=2000.0, help="pingpong: sleep before each round trip (µs)")
    p.add_argument("--out", type=Path, help="write the report (Markdown) here too")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)
    if not os.access(DEVICE, os.W_OK):
        print(f"needs {DEVICE}, writable (root)", file=sys.stderr)
        return 2
    before, load0 = read_target(), loadavg()
    start = time.monotonic()
    measures = bench(args.runs, args.samples, args.gap_us)
    took = time.monotonic() - start
    about = [f"host: {os.cpu_count()} CPUs, {cpu_model()}, kernel {os.uname().release}; {cpuidle()}",
             f"CPU latency target before: {before} µs (the aggregate of every request; 2000000000: none)",
             f"load average (1, 5, 15 min): {load0} at the start, {loadavg()} at the end; {took:.0f} s",
             f"{args.runs} runs x {args.samples} samples per probe and mode, ABBA order; pingpong gap "
             f"{args.gap_us:g} µs"]
    report = page("Wake-up latency: cpu_dma_latency held at 0 vs released", command_line(), about,
                  table(measures) + [""] + [f"- {line}" for line in paired(measures)])
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0
