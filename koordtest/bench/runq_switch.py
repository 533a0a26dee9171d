"""What the run-queue latency BPF program costs inside the kernel: `perf bench sched pipe` (two tasks
ping-ponging over a pipe, two context switches per round trip) without and with the program loaded,
alternating, --reps times each. Needs root, perf and libbpf1.

    sudo .venv/bin/python scripts/bench-runq-switch [--loops 50000] [--reps 5] [--unwatched] [--object PATH ...]

--object compares builds of the program side by side (each in every repetition, after the run without);
--unwatched puts perf in a cgroup the program does not watch.
"""
import argparse
import os
import re
import statistics
import subprocess
from pathlib import Path

from koordd.kernel.cgroupfs import DEFAULT_ROOT, detect_layout
from koordd.sensors.contract import SensorContext
from koordd.sensors.runq import EBPF, PROGRAM, RunqLatencySensor, v2_tree
from koordtest.bench import bpf_stats


def usecs_per_op(loops: int) -> float:
    out = subprocess.run(["perf", "bench", "sched", "pipe", "-l", str(loops)], capture_output=True, text=True,
                         check=True).stdout
    return float(re.search(r"([\d.]+)\s+usecs/op", out).group(1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loops", type=int, default=50000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--object", action="append", type=Path, metavar="PATH",
                   help="a build of runq_latency.bpf.o to measure (again for more, each in every repetition, "
                        "in turn; default the shipped one)")
    p.add_argument("--unwatched", action="store_true",
                   help="perf in a cgroup the program does not watch (a sibling is watched): what the program "
                        "costs the threads of no class")
    args = p.parse_args(argv)
    objects = args.object or [PROGRAM]
    # perf runs in a cgroup of its own, which the program watches (every wait counted) or, with
    # --unwatched, does not: it watches a sibling with no task instead.
    tree, _ = v2_tree(detect_layout(DEFAULT_ROOT))
    name = f"koordd-bench-switch-{os.getpid()}"
    watched = f"{name}-watched" if args.unwatched else name
    made = [tree / n for n in dict.fromkeys((name, watched))]
    for d in made:
        d.mkdir()
    (tree / name / "cgroup.procs").write_text(str(os.getpid()))
    without, with_bpf = [], {o: [] for o in objects}
    counted, ns_a_run = {}, {o: {} for o in objects}   # object -> program -> ns a run in each repetition
    try:
        with bpf_stats.counting():
            for _ in range(args.reps):
                without.append(usecs_per_op(args.loops))
                for obj in objects:
                    sensor = RunqLatencySensor(sources=(EBPF,), program=obj)
                    sensor.start()
                    try:
                        sensor.sample(SensorContext(0.0, {watched: "LS"}))
                        with_bpf[obj].append(usecs_per_op(args.loops))
                        got = sensor.sample(SensorContext(0.0, {watched: "LS"})).get(watched)
                        counted[obj] = got.count if got else 0
                        for st in sensor.source.stats():    # loaded for this run: its counters start at 0
                            if st.run_cnt:
                                ns_a_run[obj].setdefault(st.name, []).append(st.run_time_ns / st.run_cnt)
                    finally:
                        sensor.stop()
    finally:
        (tree / "cgroup.procs").write_text(str(os.getpid()))
        for d in made:
            d.rmdir()
    a = statistics.median(without)
    print(f"perf bench sched pipe, {args.loops} round trips (two context switches each), median of {args.reps}, "
          f"perf's cgroup {'not ' if args.unwatched else ''}watched: without the program {a:.2f} us/op")
    print(f"  without: {without}")
    for obj in objects:
        b = statistics.median(with_bpf[obj])
        print(f"  {obj}: {b:.2f} us/op, +{b - a:.2f} us per round trip, +{100 * (b - a) / a:.1f}% "
              f"(waits counted in its last run: {counted[obj]})\n    {with_bpf[obj]}")
        print("    inside the kernel, ns a run (kernel.bpf_stats_enabled; the host's other tasks' runs too), median "
              "(range): " + "; ".join(f"{prog} {statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
                                      for prog, v in sorted(ns_a_run[obj].items())))
