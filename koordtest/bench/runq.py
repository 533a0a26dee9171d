"""What one round of the run-queue latency sensor costs koordd, per source, with pyperf: a cgroup of
its own in the v2 tree (the unified tree on hybrid hosts) holding one process with --threads sleeping
threads, and --cgroups empty sibling cgroups that are sampled too. Needs root; removes what it made.

    .venv/bin/pip install pyperf
    sudo .venv/bin/python scripts/bench-runq --threads 100 --cgroups 100 [--source ebpf|schedstat] [pyperf options]

schedstat reads one /proc/<tid>/schedstat per thread per round, so its cost grows with the threads;
the eBPF source reads one map entry per sampled cgroup, whatever the threads (its cost in the kernel,
a few map operations per context switch, is not in this figure).
"""
import os
import subprocess
import sys
import time

import pyperf

from koordd.kernel.cgroupfs import DEFAULT_ROOT, detect_layout
from koordd.sensors.contract import SensorContext
from koordd.sensors.runq import EBPF, SCHEDSTAT, RunqLatencySensor, v2_tree

SLEEPERS = "import threading, time\nfor _ in range({n}):\n    threading.Thread(target=lambda: [time.sleep(0.01) " \
           "for _ in iter(int, 1)], daemon=True).start()\ntime.sleep(3600)"


def main():
    def forward(cmd, args):      # pyperf's workers get this script's own options too
        cmd += ["--threads", str(args.threads), "--cgroups", str(args.cgroups), "--source", args.source]

    runner = pyperf.Runner(add_cmdline_args=forward)
    runner.argparser.add_argument("--threads", type=int, default=100)
    runner.argparser.add_argument("--cgroups", type=int, default=100, help="empty sibling cgroups, sampled too")
    runner.argparser.add_argument("--source", choices=(EBPF, SCHEDSTAT), default=SCHEDSTAT)
    args = runner.parse_args()
    tree, _ = v2_tree(detect_layout(DEFAULT_ROOT))
    base = tree / f"koordd-bench-runq-{os.getpid()}"
    dirs = [base / "busy"] + [base / f"empty{i}" for i in range(args.cgroups)]
    base.mkdir()
    for d in dirs:
        d.mkdir()
    proc = None
    sensor = RunqLatencySensor(sources=(args.source,))
    try:
        proc = subprocess.Popen([sys.executable, "-c", SLEEPERS.format(n=args.threads)],
                                preexec_fn=lambda: (dirs[0] / "cgroup.procs").write_text(str(os.getpid())))
        while len((dirs[0] / "cgroup.threads").read_text().split()) < args.threads + 1:
            time.sleep(0.05)
        sensor.start()
        # LS: on schedstat the sensor reads only the latency-sensitive classes' cgroups.
        paths = {str(d.relative_to(tree)): "LS" for d in dirs}
        context = SensorContext(0.0, paths)
        sensor.sample(context)
        runner.bench_func(f"runq {args.source}: {args.threads} threads, {len(dirs)} cgroups",
                          lambda: sensor.sample(context))
    finally:
        sensor.stop()
        if proc is not None:
            proc.kill()
            proc.wait()
        time.sleep(0.2)
        for d in dirs[::-1] + [base]:
            d.rmdir()
