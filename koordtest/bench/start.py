"""koordd's start on the shipped default config (be_suppress rule "slack": the run-queue sensor and its
BPF program): seconds from exec to the first complete tick (every loop ticked once, every sensor a loop
needs running or known unavailable; a loop's first tick comes half a second after the start's baseline
snapshot, or one interval if shorter: a rate needs two samples), koordd's CPU time until then, and RSS (VmRSS after --settle seconds, VmHWM the peak), --runs
times. With --koordd OTHER (another checkout's .venv/bin/koordd) both run, pair by pair, alternating
which goes first. Needs root (the BPF program); each koordd has a state directory and owner lock of its own.

    sudo .venv/bin/python scripts/bench-start [--runs 7] [--settle 5] [--koordd OTHER/.venv/bin/koordd]
"""
import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from koordtest.bench.procstat import cpu_seconds, status
from koordtest.koordd_proc import KoorddProcess, koordd_command, shipped_config

from koordd.act.owner import TEST_ENV


def one_run(command: list[str], workdir: Path, settle: float) -> dict:
    os.environ[TEST_ENV] = str(workdir / "owner.lock")
    config = shipped_config({}, workdir / "state")
    with KoorddProcess(config, workdir, command) as k:
        first_tick = k.wait_ready(timeout=120, ticks=1)
        start_cpu = cpu_seconds(k.proc.pid)
        runq = (k.status().get("sensors") or {}).get("runq_latency", {})
        time.sleep(settle)
        k.check_running()
        memory = status(k.proc.pid)
        rss, peak = memory["VmRSS"], memory["VmHWM"]
    return {"first_tick_s": first_tick, "start_cpu_s": start_cpu, "rss_mib": rss / 1024, "peak_mib": peak / 1024,
            "runq": runq.get("detail") or runq.get("state") or "?"}


def summary(name: str, runs: list[dict]) -> str:
    def stat(key: str) -> str:
        values = sorted(r[key] for r in runs)
        return f"{statistics.median(values):.2f} ({values[0]:.2f}-{values[-1]:.2f})"
    sources = sorted({r["runq"] for r in runs})
    return f"| {name} | {stat('first_tick_s')} | {stat('start_cpu_s')} | {stat('rss_mib')} | {stat('peak_mib')} | {', '.join(sources)} |"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--koordd", help="another koordd to compare with (its checkout's .venv/bin/koordd)")
    args = p.parse_args(argv)
    commands = {"this": koordd_command()}
    if args.koordd:
        commands["other"] = koordd_command(args.koordd)
    results: dict[str, list[dict]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory(prefix="koordd-bench-start-") as tmp:
        for i in range(args.runs):
            order = list(commands) if i % 2 == 0 else list(reversed(commands))
            for name in order:
                r = one_run(commands[name], Path(tmp) / f"{name}-{i}", args.settle)
                results[name].append(r)
                print(f"run {i} {name}: first tick {r['first_tick_s']:.2f} s ({r['start_cpu_s']:.2f} s CPU), RSS {r['rss_mib']:.1f} MiB "
                      f"(peak {r['peak_mib']:.1f}), run-queue sensor: {r['runq']}", flush=True)
    print("\n| koordd | start to first tick, s: median (range) | its CPU time, s | RSS MiB | peak RSS MiB | run-queue sensor |")
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        print(summary(f"{name} ({' '.join(commands[name])})", runs))
