"""What the run-queue latency BPF program costs inside the kernel: `perf bench sched pipe` (two tasks
ping-ponging over a pipe, two context switches per round trip) without and with the program loaded,
alternating, --reps times each. Needs root, perf and libbpf1.

    sudo .venv/bin/python scripts/bench-runq-switch [--loops 50000] [--reps 5]
"""
import argparse
import os
import re
import statistics
import subprocess

from koordd.kernel.cgroupfs import DEFAULT_ROOT, detect_layout
from koordd.sensors.contract import SensorContext
from koordd.sensors.runq import EBPF, RunqLatencySensor, v2_tree


def usecs_per_op(loops: int) -> float:
    out = subprocess.run(["perf", "bench", "sched", "pipe", "-l", str(loops)], capture_output=True, text=True,
                         check=True).stdout
    return float(re.search(r"([\d.]+)\s+usecs/op", out).group(1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loops", type=int, default=50000)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    # perf runs in a cgroup of its own that the program watches, so every wait it has is counted.
    tree, _ = v2_tree(detect_layout(DEFAULT_ROOT))
    name = f"koordd-bench-switch-{os.getpid()}"
    (tree / name).mkdir()
    (tree / name / "cgroup.procs").write_text(str(os.getpid()))
    without, with_bpf = [], []
    try:
        for _ in range(args.reps):
            without.append(usecs_per_op(args.loops))
            sensor = RunqLatencySensor(sources=(EBPF,))
            sensor.start()
            try:
                sensor.sample(SensorContext(0.0, {name: "LS"}))
                with_bpf.append(usecs_per_op(args.loops))
                counted = sensor.sample(SensorContext(0.0, {name: "LS"})).get(name)
            finally:
                sensor.stop()
    finally:
        (tree / "cgroup.procs").write_text(str(os.getpid()))
        (tree / name).rmdir()
    print(f"waits counted in the last run: {counted.count if counted else 0}")
    a, b = statistics.median(without), statistics.median(with_bpf)
    print(f"perf bench sched pipe, {args.loops} round trips, median of {args.reps}: "
          f"without {a:.2f} us/op, with the BPF program {b:.2f} us/op: +{b - a:.2f} us per round trip "
          f"(two context switches), +{100 * (b - a) / a:.1f}%")
    print(f"  without: {without}\n  with:    {with_bpf}")
