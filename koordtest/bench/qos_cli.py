"""What BE control costs LS and BE: LS latency and BE work under each setup, on this host's kernel.

    sudo .venv/bin/python scripts/bench-qos [--ls redis|memcached|probe] [--loads 20,50,70]
                                          [--antagonist cpu|membw|memory] [--setups ls-alone,be-alone,...]
                                          [--reps 3] [--seconds 10] [--out DIR]
    # the SLO proof: the SLO at 1.10x LS alone's p99, every static cap against koordd
    sudo .venv/bin/python scripts/bench-qos --oracle --loads 50 --antagonist membw --seconds 20 --reps 1
    # changing load: LS follows a sine from 20% to 70% and back, BE switches from membw to cpu half way
    sudo .venv/bin/python scripts/bench-qos --oracle --loads 70 --low-load 20 --antagonist membw --switch-to cpu \
        --seconds 120 --reps 1

LS is a server (redis-server from Debian, or a synthetic probe doing a fixed amount of work per
request), one process per CPU, driven open loop at fixed Poisson rates that make it use the given
percentages of the node's CPUs (the LS CPU per request is measured first); latency is counted from
each request's intended send time. BE is one antagonist worker per CPU (cpu, membw or memory; see
koordtest/bench/antagonist.py) counting the work it completes. Each setup runs at each load, in a
random order per repetition, every second repetition in the one before's order reversed:

    ls-alone       LS without BE (the latency baseline)
    be-alone       BE without LS (the work baseline; once per repetition)
    no-control     both, no knob changed
    be-weight-1    BE cpu.weight = 1
    be-idle        BE cpu.idle = 1
    be-idle-again  be-idle's knobs once more in each repetition (--frontier --be-idle-twice)
    be-thread-idle BE threads SCHED_IDLE, BE cpu.weight = 1 (where the kubelet owns BE's group)
    be-quota-half  BE cpu.max at half the node
    koordd         koordd with config/koordd.toml as shipped (or --koordd-config), its LS and BE classes
                   on our cgroups
    koordd-b       koordd as setup koordd, run from --koordd-b's program (another checkout's bin/koordd)
    koordd-scx     the same plus koordd's own sched_ext scheduler (docs/sched-ext.md); only on a kernel
                   with sched_ext, and not in the default list elsewhere
    be-cpu-max-N   BE cpu.max at N% of the node (N = 10, 20 ... 90): the static oracle's candidates
    be-idle-cpu-max-N  BE cpu.idle = 1 and cpu.max at N% of the node: the static counterpart of koordd's
                   own lever (BE idle, its CPUs cut); candidates too

--oracle runs ls-alone, be-alone, be-idle, every be-cpu-max-N and be-idle-cpu-max-N, and koordd, with --slo-factor 1.10 unless
given: LS alone is measured first at each load (over twice --seconds, or once under a sine), its p99 times the factor is the
SLO (or --slo-ms's p99 as given: an A/B of two checkouts, each its own invocation, then tells both one
target), declared to koordd as its LS class's [classes.slo] latency_p99, and the report judges every run
against it (p99 at or under it over the run and in 95% of its --window windows) and names the static
oracle: the static setting with the most BE work that meets the SLO. koordd is not told the antagonist.
With --low-load, LS's rate follows half a sine from that load up to the (one) --loads value and back over
the warm-up and window; with --switch-to, BE's workers switch kind half way through the window, and BE
work is each half's over BE alone's same half (be-alone switches too).

Where the kernel loads koordd's app_latency program (docs/app-latency.md), the benchmark reads it too, for
every run with LS: the server-side p99 the kernel saw next to the client's, in results.json and the report.

--koordd-settle S gives koordd's runs S seconds of load beyond --warmup before their window: a controller's
first seconds are its reaction, which a static setting has none of, and the frontier compares where each
settles (on 16 CPUs koordd floored BE 1.9 s into a 4 s window, and the windows before set its p99). The
window's arrivals are then a later stretch of the same seeded Poisson process; not with --low-load.
--settle-also be-idle settles be-idle's runs as long: a pair of one repetition then differs in koordd alone, not
in its window's arrivals nor in how long LS and BE ran before it (LS alone and BE alone, the baselines, do not
settle unless named).

--koordd-b OTHER/.venv/bin/koordd compares two programs in one invocation: setup koordd-b runs that program
with setup koordd's config and SLO, its runs interleaved with koordd's and the rest, so both sides share LS
alone's baseline, the target and the host's drift. The report adds the pairs (same repetition and load:
the same arrival times) side by side. Two invocations each measure their own LS alone, and on a noisy host
tell the two sides different targets.

--bpf-stats counts each BPF program's run time (kernel.bpf_stats_enabled on for the invocation, then put back)
and reads koordd's programs (by the ids in its status file) at each of its windows' start and end: their runs a
second, ns a run and CPU in results.json (koordd_bpf) and the report: part of what koordd present costs where it
writes nothing, since its programs run in the time of whatever task the CPU runs, LS's and BE's. koordd's own
process's CPU in each window is recorded too (koordd_cpu), with or without it.

--be-idle-twice (with --frontier) runs be-idle a second time in each repetition, as setup be-idle-again: its runs
count in the static settings' own scatter only (not as a point of the frontier, not as an oracle), so that a
proof of one repetition still measures how far one setting's runs scatter with nothing changed.
With --frontier the report also says how many repetitions its rules would need at the scatter it measured, and
judges the 95% rule paired by repetition: koordd's BE work over the oracle's in the same repetition, with a 90%
interval (koordtest/bench/power.py; docs/benchmarks.md, "How many repetitions the rules need").

--client-cpus N keeps the client off LS and BE's CPUs: its processes get the lowest N CPUs (sched_setaffinity,
not cpusets), everything else (LS servers, BE workers, koordd, bench-qos itself) the others, and loads, server
and worker counts and static caps count those others only. There the compiled engines poll without sleeping
(openloop.c --spin): an idle vCPU halts, and waking it for each send cost a SCHED_OTHER client 0.3-1.3 ms.
Where real-time policies are refused, a client sharing CPUs with BE waits for BE and counts the wait as LS latency (on 16 CPUs its send lag p99 was
0.03 ms alone and 3.8-4.8 ms beside BE in the redis case, 1.7-7.4 ms beside BE in all runs but one over the
cases: the 16-CPU proof in docs/benchmarks.md). The default, 0, shares every CPU as before.

The cgroups are koordd-qos-<pid>/{ls,be} in every hierarchy koordd uses, created and removed
by this script (also on Ctrl-C and errors), as are its processes; static knobs are written through
koordd's knob table and put back, koordd gets SIGTERM after each run and restores; before and after
every run the LS and BE knobs must read as before the benchmark. Needs root. Installs redis-server
(for --ls redis) and python3-matplotlib (for the plot) with apt when missing, unless --no-install.

Writes DIR/report.md (the command, the host, the table), DIR/qos.png, DIR/windows.png (with an SLO: each
10 s window's LS p99 of ls-alone, be-idle and koordd against the target) and DIR/results.json (every
run's record), and prints the report.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from koordtest.bench.antagonist import KINDS, UNITS
from koordtest.bench import bpf_stats, frontier
from koordtest.bench.cgroup_tree import CgroupTree
from koordtest.bench.common import command_line, cpu_model, doc_parser, git_describe, interrupted
from koordtest.bench.client_build import DEFAULT_BINARY, ensure as ensure_engine
from koordtest.bench.frontier import SWEEP_FACTORS, koordd_setup
from koordtest.koordd_proc import SHIPPED_CONFIG, koordd_command, shipped_config
from koordtest.bench.ls_servers import Memcached, Probe, Redis, find_memcached, find_redis
from koordtest.bench.packages import apt_install
from koordtest.bench.probe import bytes_for
from koordtest.bench.qos_report import ab_table, markdown, plot, slo_table, window_plot
from koordtest.bench.qos_run import (BE, CANDIDATE_SETUPS, KOORDD_A, KOORDD_B, LS, ORACLE_SETUPS, SETUP_NAMES,
                                     SETUPS, WAKE_SETUP, Bench, CpuSplit, follow_alone, on_cpus, run_one, run_order,
                                     split_cpus)
from koordtest.bench.qos_stats import BE_ALONE, LS_ALONE, baselines, median_spread, summarise
from koordd.kernel.cgroupfs import CgroupFS, detect_layout
from koordd.kernel.pm_qos import DEVICE
from koordd.backends.cgroup_knobs import KNOBS
from koordd.kernel.sched_ext import has_sched_ext, missing_reason
from koordd.sensors.node import parse_meminfo

CALIBRATION_SECONDS = 3.0
MAX_CLIENT_RATE = 8000          # requests/s beyond which this Python client would itself be the bottleneck
# requests/s one compiled engine process is given at most (--client-processes auto), and client CPU (cores):
# a margin. On the 16-CPU machine two processes sent 88k one-key gets/s alone with 23 µs of send lag p99, and
# one process reading 2000-key answers at 14k/s (0.84-0.89 cores) with 0.36-1.57 ms; with BE beside them
# every count lagged 1.7-7 ms (docs/benchmarks.md, the 16-CPU proof): more processes do not mend that.
ENGINE_RATE = 20000
ENGINE_CORES = 0.5


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    layout = host_problem()
    if isinstance(layout, str):
        print(f"bench-qos: {layout}", file=sys.stderr)
        return 2
    can_plot = ensure_matplotlib(not args.no_install)
    ls_kind = None
    if args.ls == "redis":
        ls_kind = Redis(find_redis(not args.no_install), args.redis_set_size)
    elif args.ls == "memcached":
        ls_kind = Memcached(find_memcached(not args.no_install), args.memcached_keys)
    out = Path(args.out or f"bench-qos-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, interrupted)    # koordd restores, knobs go back, processes and cgroups go
    workdir = Path(tempfile.mkdtemp(prefix="bench-qos-"))
    tree = CgroupTree(f"koordd-qos-{os.getpid()}", ("cpu", "cpuacct", "memory"))
    keep_logs = False
    try:
        # --client-cpus: bench-qos itself moves off the client's CPUs, and so does every process it starts but
        # the client (qos_run._window puts that one on its own): LS servers, BE workers and koordd inherit the
        # others. koordd too, because on a node it shares the CPUs with LS and BE (its cost lands there, as it
        # would), and on the client's CPUs its wake-ups would delay the client's, which is what the
        # reservation is for. It still counts and sizes BE against every online CPU of the node.
        with tree, on_cpus(args.cpus.rest if args.cpus else None), \
                (bpf_stats.counting() if args.bpf_stats else contextlib.nullcontext()):
            run_benchmark(args, layout, tree, ls_kind, workdir, out, can_plot)
    except KeyboardInterrupt:
        print("bench-qos: interrupted; cleaned up", file=sys.stderr)
        return 130
    except BaseException:
        keep_logs = True
        raise
    finally:
        if keep_logs:
            print(f"bench-qos: the runs' logs are kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def run_benchmark(args, layout, tree: CgroupTree, ls_kind, workdir: Path, out: Path, can_plot: bool) -> None:
    tree.create([LS, BE])
    fs = CgroupFS(layout)
    if KNOBS["memory.max"].supported(fs):     # a runaway BE hits its own limit, never the host's
        KNOBS["memory.max"].write(fs, tree.path(BE), str(args.be_memory + (512 << 20)))
    if ls_kind is None:
        ls_kind = Probe(bytes_for(args.probe_work_us), args.probe_work_us)
    bench = Bench(tree=tree, fs=fs, ncpu=ls_be_cpus(args.cpus), ls_kind=ls_kind, antagonist=args.antagonist,
                  be_memory=args.be_memory, seconds=args.seconds, warmup=args.warmup, drain=args.drain,
                  realtime_client=args.client == "realtime", engine=args.engine, client_binary=args.client_binary,
                  koordd_config=lambda state, changes, slo: shipped_config(
                      {"LS": [tree.path(LS)], "BE": [tree.path(BE)]}, state, args.koordd_config, changes,
                      slo={"LS": {"latency_p99": f"{slo * 1e6:.0f}us"}} if slo else None),
                  koordd_command=koordd_command(),
                  koordd_command_b=koordd_command(str(args.koordd_b)) if args.koordd_b else None,
                  window=args.window, app_latency=open_app_latency(args),
                  koordd_terms=args.koordd_terms, cpus=args.cpus, koordd_settle=args.koordd_settle,
                  settle_also=frozenset(args.settle_also),
                  bpf_stats=args.bpf_stats)
    bench.remember_knobs()
    calibrated = calibrate(bench, args.loads + ([args.low_load] if args.low_load else []), workdir,
                           args.client_processes)
    costs = {load: cost.ls for load, cost in calibrated.items()}
    rates = load_rates(costs, bench.ncpu)
    if bench.engine == "c":
        bench.client_processes = max(client_processes(args.client_processes, bench.ncpu, rates[load],
                                                      calibrated[load].client * rates[load], bench.client_cpus)
                                     for load in rates)
    warn_rates(rates, bench)
    if args.low_load:
        # each load's rate comes from its own calibration: on a busy host the low one can come out higher
        bench.low_rate = min(rates.pop(args.low_load), rates[args.loads[0]])
    bench.switch_to = args.switch_to
    runs = slo_baselines(bench, args, rates, workdir, out) if args.slo_factor or args.slo_ms else []
    runs += run_all(bench, args, rates, workdir, out, runs)
    write_report(args, bench, layout, costs, rates, runs, out, can_plot)
    if bench.app_latency is not None:
        bench.app_latency.close()


def ls_be_cpus(cpus: CpuSplit | None) -> int:
    """The CPUs of the node the experiment sees: loads are percentages of them, one LS server and one BE
    worker runs per CPU of them, static caps are shares of them. With --client-cpus, those left to LS and BE."""
    return len(cpus.rest) if cpus else (os.cpu_count() or 1)


def load_rates(costs: dict[int, float], ncpu: int) -> dict[int, float]:
    """LS requests/s for each load, a percentage of `ncpu` CPUs, from LS's CPU seconds per request there."""
    return {load: load / 100 * ncpu / cost for load, cost in costs.items()}


def open_app_latency(args):
    """koordd's app_latency program, loaded by the benchmark to read LS's server-side p99 in every run;
    None where this host cannot load it (said once) or --no-sensor."""
    if args.no_sensor:
        return None
    from koordd.kernel.cgroupfs import detect_layout as layout_of
    from koordd.sensors.app_latency import ResponseTimes
    from koordd.sensors.contract import SensorUnavailable
    unified = layout_of().unified
    if unified is None:
        print("bench-qos: no v2 tree: no server-side latency from the kernel", file=sys.stderr)
        return None
    source = ResponseTimes(unified)
    try:
        source.open()
    except SensorUnavailable as e:
        print(f"bench-qos: no server-side latency from the kernel: {e}", file=sys.stderr)
        return None
    return source


def slo_target_for(args, alone_p99: float) -> float:
    """The SLO's p99 target in seconds: --slo-ms as given, else --slo-factor times LS alone's p99."""
    return args.slo_ms / 1000 if args.slo_ms else args.slo_factor * alone_p99


def slo_baselines(bench: Bench, args, rates: dict[int, float], workdir: Path, out: Path) -> list[dict]:
    """LS alone at each load, first, over twice the window (under a sine, the same window: the sine spans
    it): its p99 times --slo-factor is the SLO target."""
    runs = []
    longer = dataclasses.replace(bench, seconds=bench.seconds * (1 if bench.low_rate else 2), switch_to=None)
    for load, rate in rates.items():
        record = run_one(longer, SETUPS[SETUP_NAMES.index(LS_ALONE)], rate, args.seed * 100_000 + load,
                         workdir / f"slo-baseline-{load}", load)
        record.update(rep=0, load=load, slo_baseline=True)
        runs.append(record)
        bench.alone_p99[load] = record["ls"]["p99"]
        if (record.get("sensor") or {}).get("p99"):
            bench.kernel_alone_p99[load] = record["sensor"]["p99"]
        bench.slo_target[load] = slo_target_for(args, record["ls"]["p99"])
        kernel = bench.kernel_alone_p99.get(load)
        print(f"[slo] LS alone at {load}%: p99 {record['ls']['p99'] * 1000:.2f} ms"
              + (f" (the kernel's view {kernel * 1000:.2f} ms)" if kernel else "")
              + (f"; the SLO is {bench.slo_target[load] * 1000:.2f} ms as given" if args.slo_ms else
                 f", so the SLO is {bench.slo_target[load] * 1000:.2f} ms"), file=sys.stderr, flush=True)
        (out / "results.json").write_text(json.dumps({"runs": runs, "slo_target": bench.slo_target,
                                                      "cpus": cpus_record(bench)}, indent=1))
    return runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser(__doc__)
    p.add_argument("--ls", choices=("redis", "memcached", "probe"), default="redis",
                   help="the LS server (default redis)")
    p.add_argument("--loads", default="20,50,70",
                   help="LS loads, percent of the node's CPUs (with --client-cpus: of those left to LS and BE; "
                        "default 20,50,70)")
    p.add_argument("--antagonist", choices=sorted(KINDS), default="cpu", help="the BE workers' kind (default cpu)")
    p.add_argument("--setups", default=None,
                   help="comma-separated subset (default: all this kernel can run but the oracle's candidates; "
                        "with --oracle: ls-alone, be-alone, the candidates and koordd)")
    p.add_argument("--oracle", action="store_true", help="the SLO proof (see above)")
    p.add_argument("--frontier", action="store_true",
                   help="the frontier proof (see above): --oracle's runs with koordd told each SLO of --sweep "
                        "(a factor of the median of LS alone's runs so far), LS alone and BE alone again after "
                        "every repetition, the frontier report and frontier.png")
    p.add_argument("--sweep", default=",".join(f"{f:g}" for f in SWEEP_FACTORS),
                   help="--frontier: the SLO factors koordd is told, one run each (default %(default)s)")
    p.add_argument("--candidates", default=None,
                   help="--oracle/--frontier: the static settings swept (default: be-idle and every cap)")
    p.add_argument("--engine", choices=("auto", "c", "python"), default="auto",
                   help="the load generator: the compiled engine (c; built from koordtest/bench/client when "
                        "missing), Python's own loop (python), or c where it can be had (auto, the default)")
    p.add_argument("--client-binary", type=Path, default=DEFAULT_BINARY,
                   help=f"the compiled engine (default {DEFAULT_BINARY.relative_to(DEFAULT_BINARY.parents[1])})")
    p.add_argument("--client-processes", default="auto",
                   help=f"compiled engines at once, the servers split among them (default auto: one per "
                        f"{ENGINE_RATE} requests/s and per {ENGINE_CORES:g} cores the client used reading "
                        f"answers at calibration, whichever needs more, at most a quarter of the CPUs)")
    p.add_argument("--client-cpus", type=int, default=0, metavar="N",
                   help="reserve the lowest N CPUs for the client's processes (sched_setaffinity; default 0: the "
                        "client shares every CPU): LS servers, BE workers, koordd and bench-qos itself get the "
                        "others, and loads, servers and BE workers count those")
    p.add_argument("--koordd-terms", choices=("client", "kernel"), default="client",
                   help="koordd is told the SLO's factor times LS alone's p99 as the client saw it (the default: "
                        "the figure judged), or as the kernel did (app_latency, koordd's own signal: how "
                        "docs/app-latency.md asks an operator to declare it; needs the sensor)")
    p.add_argument("--slo-factor", type=float, default=None,
                   help="the SLO: LS alone's p99 times this (default 1.10 with --oracle, else none)")
    p.add_argument("--slo-ms", type=float, default=None,
                   help="the SLO as a p99 in ms, the same whatever LS alone reads: an A/B of two checkouts, each "
                        "its own invocation, then tells both sides one target (not with --slo-factor or --frontier)")
    p.add_argument("--low-load", type=int, default=None, help="LS load follows a sine from this up to --loads")
    p.add_argument("--switch-to", choices=sorted(KINDS), default=None,
                   help="BE switches to this antagonist half way through each window")
    p.add_argument("--window", type=float, default=10.0, help="seconds of each window the SLO is judged over")
    p.add_argument("--no-sensor", action="store_true", help="do not load koordd's app_latency program")
    p.add_argument("--memcached-keys", type=int, default=2000,
                   help="memcached: keys per get; sets the work per request (default 2000)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every setup at every load (default 3)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured window of a run (default 10)")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds from starting a run's processes (and koordd) to its window (default 5)")
    p.add_argument("--koordd-settle", type=float, default=0.0,
                   help="koordd's runs: seconds of load before the window beyond --warmup, so that the window "
                        "measures koordd once it has acted, not its reaction (default 0; not with --low-rate)")
    p.add_argument("--settle-also", default="", metavar="SETUPS",
                   help="static setups whose runs settle --koordd-settle's seconds too (comma-separated): paired "
                        "with koordd's, such a run's window then starts as late, on the same arrivals (default: "
                        "none, koordd's runs alone settle)")
    p.add_argument("--drain", type=float, default=2.0, help="seconds the client waits for late answers (default 2)")
    p.add_argument("--out", help="directory for report.md, qos.png, results.json (default ./bench-qos-<time>)")
    p.add_argument("--seed", type=int, default=1, help="run order and arrival times (default 1)")
    p.add_argument("--probe-work-us", type=float, default=500.0, help="probe: work per request, µs (default 500)")
    p.add_argument("--redis-set-size", type=int, default=10000,
                   help="redis: members per set; sets the work per request (default 10000)")
    p.add_argument("--be-memory", type=int, default=None,
                   help="memory antagonist: bytes all BE workers grow to together (default: a quarter of "
                        "MemAvailable, at most 2 GiB)")
    p.add_argument("--client", choices=("realtime", "normal"), default="realtime",
                   help="the load generator's scheduling: SCHED_FIFO (default; sends and reads on time) or "
                        "normal (waits for CPU like any task); see koordtest/bench/openloop.py")
    p.add_argument("--koordd-config", type=Path, default=SHIPPED_CONFIG,
                   help="the config of setup koordd, its LS and BE classes pointed at the benchmark's cgroups "
                        "(default: config/koordd.toml as shipped)")
    p.add_argument("--koordd-b", type=Path,
                   help="an A/B of two programs in one invocation: setup koordd-b runs this koordd (another "
                        "checkout's .venv/bin/koordd) with setup koordd's config and SLO (see above)")
    p.add_argument("--be-idle-twice", action="store_true",
                   help="--frontier: be-idle runs a second time in each repetition (setup be-idle-again), counted "
                        "only in the static settings' own scatter: one repetition then measures it")
    p.add_argument("--bpf-stats", action="store_true",
                   help="what koordd's BPF programs cost in each of its windows: runs a second, ns a run, CPU "
                        "(kernel.bpf_stats_enabled on for the invocation, put back after; counting adds two clock "
                        "reads a run to every program on the host)")
    p.add_argument("--no-install", action="store_true", help="never apt-get install; say what is missing")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.loads = [int(x) for x in args.loads.split(",")]
    if any(not 0 < load < 100 for load in args.loads):
        p.error("--loads are percentages between 0 and 100")
    args.candidates = list(ORACLE_SETUPS) if args.candidates is None else [c for c in args.candidates.split(",") if c]
    if not set(args.candidates) <= set(CANDIDATE_SETUPS):
        p.error(f"--candidates must be among {', '.join(CANDIDATE_SETUPS)}")
    args.sweep = [float(f) for f in args.sweep.split(",") if f]
    if args.frontier and (unswept := [f for f in args.sweep if koordd_setup(f) not in SETUP_NAMES]):
        p.error(f"--sweep: no setup for {unswept}; known factors: {', '.join(f'{f:g}' for f in SWEEP_FACTORS)}")
    if args.frontier:
        args.oracle = True
    if args.be_idle_twice and not (args.frontier and args.setups is None and "be-idle" in args.candidates):
        p.error("--be-idle-twice: with --frontier, be-idle among the candidates and no --setups")
    if args.setups is None and args.frontier:
        args.setups = ",".join(["ls-alone", "be-alone", *args.candidates, *(["be-idle-again"] if args.be_idle_twice else
                                                                             []), *(koordd_setup(f) for f in args.sweep)])
    if args.koordd_b is not None and args.frontier:
        p.error("--koordd-b: not with --frontier (its sweep's koordd-slo-F setups run one program); "
                "give --slo-factor or --slo-ms instead")
    if args.koordd_b is not None and not (args.koordd_b.is_file() and os.access(args.koordd_b, os.X_OK)):
        p.error(f"--koordd-b {args.koordd_b}: not an executable file (another checkout's .venv/bin/koordd)")
    if args.setups is None:
        default = ["ls-alone", "be-alone", *args.candidates, KOORDD_A] if args.oracle else \
            [s.name for s in SETUPS if (not s.needs_sched_ext or has_sched_ext()) and s.name not in ORACLE_SETUPS[1:]
             and not s.program_b and s.name not in ("be-idle-again", WAKE_SETUP)]
        if args.koordd_b is not None:
            default.insert(default.index(KOORDD_A) + 1, KOORDD_B)
        args.setups = ",".join(default)
    if args.slo_ms is not None and (args.slo_ms <= 0 or args.slo_factor is not None or args.frontier):
        p.error("--slo-ms: a positive p99 in ms, and not with --slo-factor or --frontier (whose sweep is factors)")
    if args.oracle and args.slo_factor is None and args.slo_ms is None:
        args.slo_factor = 1.10
    if args.slo_factor is not None and args.slo_factor <= 0:
        p.error("--slo-factor must be positive")
    args.setups = [s for s in args.setups.split(",") if s]
    unknown = set(args.setups) - set(SETUP_NAMES)
    if unknown:
        p.error(f"unknown setups {sorted(unknown)}; known: {', '.join(SETUP_NAMES)}")
    if WAKE_SETUP in args.setups and not DEVICE.exists():
        p.error(f"setup {WAKE_SETUP}: this host has no {DEVICE} (a kernel without CPU idle PM QoS)")
    if (KOORDD_B in args.setups) != (args.koordd_b is not None):
        p.error("setup koordd-b and --koordd-b go together: the program to run, and the setup that runs it")
    if not has_sched_ext() and (needing := [s.name for s in SETUPS if s.needs_sched_ext and s.name in args.setups]):
        p.error(f"setups {', '.join(needing)}: {missing_reason()}")
    if args.reps < 1 or args.seconds <= 0:
        p.error("--reps and --seconds must be positive")
    if args.low_load is not None and (len(args.loads) != 1 or not 0 < args.low_load < args.loads[0]):
        p.error("--low-load needs one --loads value above it")
    if args.koordd_settle < 0 or (args.koordd_settle and args.low_load is not None):
        p.error("--koordd-settle: seconds, 0 or more, and not with --low-load (the sine spans warm-up and "
                "window: a longer warm-up would stretch koordd's)")
    args.settle_also = [s for s in args.settle_also.split(",") if s]
    if args.settle_also and not args.koordd_settle:
        p.error("--settle-also: with --koordd-settle, the seconds they settle")
    static = [s.name for s in SETUPS if s.name in args.setups and not s.koordd]
    if unrun := [s for s in args.settle_also if s not in static]:
        p.error(f"--settle-also: {', '.join(unrun)} not among this invocation's static setups ({', '.join(static)})")
    if args.client_processes != "auto" and not (args.client_processes.isdigit() and int(args.client_processes) > 0):
        p.error("--client-processes: a positive number or auto")
    try:
        args.cpus = split_cpus(args.client_cpus, host_cpus())
    except ValueError as e:
        p.error(str(e))
    if args.cpus and args.client_processes != "auto" and int(args.client_processes) > args.client_cpus:
        print(f"bench-qos: warning: {args.client_processes} client processes share --client-cpus "
              f"{args.client_cpus}'s CPUs", file=sys.stderr)
    if args.koordd_terms == "kernel" and args.no_sensor:
        p.error("--koordd-terms kernel reads LS alone's p99 from the kernel: not with --no-sensor")
    args.engine = pick_engine(args.engine, args.client_binary)
    if args.be_memory is None:
        available = parse_meminfo(Path("/proc/meminfo").read_text()).get("MemAvailable", 0)
        args.be_memory = min(available // 4, 2 << 30)
    return args


def host_cpus() -> list[int]:
    """The CPUs bench-qos may use (all online ones on a host that does not confine it): --client-cpus takes the
    lowest of these."""
    return sorted(os.sched_getaffinity(0))


def host_problem():
    """The layout to use, or why this host cannot run the benchmark."""
    if os.geteuid() != 0:
        return "needs root: it creates cgroups and writes their knobs"
    layout = detect_layout()
    if layout.mode == "v2":
        enabled = (layout.root / "cgroup.subtree_control").read_text().split()
        if "cpu" not in enabled:
            return "the cpu controller is not enabled in /sys/fs/cgroup/cgroup.subtree_control (this script " \
                   "does not change the host's root cgroup)"
    elif not {"cpu", "cpuacct"} <= set(layout.v1):
        return f"needs the v1 cpu and cpuacct hierarchies or cgroup v2 ({layout.describe()})"
    return layout


def ensure_matplotlib(install: bool) -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        pass
    try:
        apt_install("python3-matplotlib", install)
        importlib.invalidate_caches()
        import matplotlib  # noqa: F401,F811
        return True
    except (RuntimeError, ImportError, subprocess.CalledProcessError) as e:
        print(f"bench-qos: no plot: {e}", file=sys.stderr)
        return False


@dataclasses.dataclass(frozen=True)
class Cost:
    """CPU seconds per request answered, LS alone: the servers' and the client's."""
    ls: float
    client: float


def calibrate(bench: Bench, loads: list[int], workdir: Path, processes: str = "auto") -> dict[int, Cost]:
    """What a request costs alone, per load. The cost per request falls as the rate rises (a busier
    server reads several requests per wake-up), so it is measured at a modest rate first, then again at
    the rate that cost implies for each load, and that second measurement sets the load's rate (and the
    client's CPU there, how many client processes the load needs)."""
    guess = 0.25 * bench.ncpu / (bench.ls_kind.work_us * 1e-6) if isinstance(bench.ls_kind, Probe) else 300.0
    first = _cost(bench, guess, workdir / "calibration", processes)
    return {load: _cost(bench, load / 100 * bench.ncpu / first.ls, workdir / f"calibration-{load}", processes)
            for load in loads}


def _cost(bench: Bench, rate: float, workdir: Path, processes: str = "auto") -> Cost:
    """LS alone at `rate` for a short while: its cgroup's CPU, and the client's, over the requests answered."""
    short = dataclasses.replace(bench, seconds=CALIBRATION_SECONDS, warmup=1.0, low_rate=None, switch_to=None,
                                app_latency=None,
                                client_processes=client_processes(processes, bench.ncpu, rate, 0.0, bench.client_cpus))
    record = run_one(short, SETUPS[SETUP_NAMES.index(LS_ALONE)], rate, 0, workdir)
    answered = record["ls"]["answered"]
    if not answered:
        raise RuntimeError(f"calibration: no request answered ({record['ls']})")
    per_request = CALIBRATION_SECONDS / answered
    return Cost(record["cpu"][LS] * per_request, (record["ls"].get("client_cpu") or 0.0) * per_request)


def pick_engine(asked: str, binary: Path) -> str:
    """"c" with the engine built (when stale and a compiler is there), "python" where asked or, for
    "auto", where the engine cannot be had (said once)."""
    if asked == "python":
        return "python"
    try:
        ensure_engine(binary)
        return "c"
    except RuntimeError as e:
        if asked == "c":
            raise SystemExit(f"bench-qos: --engine c: {e}")
        print(f"bench-qos: the Python client sends, not the compiled one: {e}", file=sys.stderr)
        return "python"


def client_processes(asked: str, ncpu: int, rate: float, client_cores: float = 0.0, client_cpus: int = 0) -> int:
    """Compiled engines for `rate` requests/s whose answers take `client_cores` of the client's CPU to read:
    as asked, or one per ENGINE_RATE and per ENGINE_CORES, whichever needs more, at most ncpu / 4 (and 1); with
    `client_cpus` reserved for the client (--client-cpus), at most one per reserved CPU instead."""
    if asked != "auto":
        return int(asked)
    most = client_cpus if client_cpus else ncpu // 4
    return max(1, min(max(math.ceil(rate / ENGINE_RATE), math.ceil(client_cores / ENGINE_CORES)), most))


def cpus_record(bench: Bench) -> dict:
    """Where the benchmark's processes ran, for results.json: how many CPUs the node has and LS and BE had, and
    with --client-cpus which were the client's and which LS and BE's (else None: all shared all)."""
    return {"node_cpus": bench.host_ncpu, "ls_be_cpus": bench.ncpu,
            **(bench.cpus.record() if bench.cpus else {"client": None, "ls_be": None})}


def title_cpus(bench: Bench) -> str:
    """The CPUs in a plot's title: "16 CPUs", or "14 CPUs (+2 the client's)" with --client-cpus."""
    return f"{bench.ncpu} CPUs" + (f" (+{bench.client_cpus} the client's)" if bench.client_cpus else "")


def cpus_line(cpus: CpuSplit | None, host_ncpu: int) -> str:
    """The report's line on where the client ran against LS and BE."""
    if cpus is None:
        return f"CPUs: the client, LS, BE and koordd share all {host_ncpu} (no --client-cpus)"
    return (f"CPUs: {cpus.describe()} (--client-cpus {len(cpus.client)}, sched_setaffinity; koordd and bench-qos "
            f"with LS and BE; loads, servers and BE workers count LS and BE's {len(cpus.rest)} only)")


def warn_rates(rates: dict[int, float], bench: Bench) -> None:
    for load, rate in rates.items():
        if bench.engine == "c" and rate > ENGINE_RATE * bench.client_processes:
            print(f"bench-qos: warning: {rate:.0f} requests/s for {load}% over {bench.client_processes} compiled "
                  f"client processes may be more than they send on time (send lag in the report)", file=sys.stderr)
        if bench.engine == "python" and rate > MAX_CLIENT_RATE:
            print(f"bench-qos: warning: {rate:.0f} requests/s for {load}% may be more than the Python load "
                  f"generator can send on time (send lag in the report); make requests costlier "
                  f"(--probe-work-us, --redis-set-size)", file=sys.stderr)


def run_all(bench: Bench, args, rates: dict[int, float], workdir: Path, out: Path, before: list[dict]) -> list[dict]:
    setups = {s.name: s for s in SETUPS}
    # With an SLO, LS alone was measured first (slo_baselines): that is its one run per load
    order = run_order([s for s in args.setups if not ((args.slo_factor or args.slo_ms) and s == LS_ALONE)],
                      args.loads, args.reps,
                      args.seed, alone_between=args.frontier)
    runs = []
    for i, (rep, name, load) in enumerate(order):
        # The same arrival times for every setup at one load and repetition: differences are the setup's.
        seed = args.seed * 100_000 + rep * 1000 + (load or 0)
        record = run_one(bench, setups[name], rates.get(load), seed, workdir / f"run{i}", load)
        record.update(rep=rep, load=load)
        runs.append(record)
        if args.frontier and name == LS_ALONE:
            follow_alone(bench, before + runs, load)
        (out / "results.json").write_text(json.dumps({"runs": before + runs, "slo_target": bench.slo_target,
                                                      "cpus": cpus_record(bench)}, indent=1))
        ls, sensor = record["ls"], record.get("sensor")
        print(f"[{i + 1}/{len(order)}] rep {rep + 1} {name:13} load {load or '-':>3}%"
              + (f"  p99 {ls['p99'] * 1000:7.2f} ms" if ls else " " * 18)
              + (f" (kernel {sensor['p99'] * 1000:.2f})" if sensor else "")
              + (f"  BE {record['be_work']:.3g}/s" if record["be_work"] is not None else "")
              + f"  cpu ls {record['cpu'][LS]:.2f} be {record['cpu'][BE]:.2f} other {record['cpu']['other']:.2f}",
              file=sys.stderr, flush=True)
    return runs


def write_report(args, bench: Bench, layout, costs: dict[int, float], rates: dict[int, float], runs: list[dict],
                 out: Path, can_plot: bool) -> None:
    rows = summarise(runs, bench.ncpu, SETUP_NAMES)
    ls_base, be_base = baselines(runs)
    command = command_line("scripts/bench-qos", args.argv)
    about = [
        f"host: {bench.host_ncpu} CPUs ({cpu_model()}), Linux {platform.release()}, cgroups {layout.describe()}; "
        f"koordd {git_describe()}; Python {platform.python_version()}",
        f"LS: {bench.ls_kind.describe()}; {bench.ncpu} servers (one per CPU of LS and BE), each on its own UNIX "
        f"socket, open-loop Poisson arrivals over 2 connections per server; LS CPU per request alone, measured near "
        f"each load's rate: " + ", ".join(f"{load}%: {costs[load] * 1e6:.0f} µs, so {rate:.0f} req/s"
                                          for load, rate in rates.items()),
        f"BE: {bench.ncpu} `{bench.antagonist}` workers, work counted in {UNITS[bench.antagonist]}"
        + (f" (growing to {bench.be_memory >> 20} MiB together)" if bench.antagonist == "memory" else ""),
        f"runs: {bench.seconds:g} s measured after {bench.warmup:g} s of warm-up"
        + (f" ({bench.warmup + bench.koordd_settle:g} s for koordd's runs"
           + "".join(f", {s}'s" for s in sorted(bench.settle_also))
           + f": they settle {bench.koordd_settle:g} s first)" if bench.koordd_settle else "")
        + f", {args.reps} repetitions, "
        f"setups and loads in a random order per repetition, every second one reversed (seed {args.seed}); "
        f"every setup at the same "
        f"load and repetition gets the same arrival times"
        + ("; LS alone and BE alone again after every repetition" if args.frontier else ""),
        "client: " + (f"the compiled engine ({bench.client_processes} process(es), koordtest/bench/client/openloop.c)"
                      if bench.engine == "c" else "Python (koordtest/bench/openloop.py)"),
        cpus_line(bench.cpus, bench.host_ncpu),
    ]
    if ls_base:
        used = {load: median_spread(r["cpu"][LS] for r in runs if r["setup"] == LS_ALONE and r["load"] == load)
                for load in ls_base}
        about.append(f"{LS_ALONE}: " + "; ".join(
            f"{load}%: {used[load].median:.2f} CPUs used, p50 / p99 / p99.9 "
            + " / ".join(f"{v * 1000:.2f}" for v in base.values()) + " ms" for load, base in ls_base.items()))
    if be_base is not None:
        about.append(f"{BE_ALONE}: {be_base:.4g} {UNITS[bench.antagonist]} per second")
    if told := sorted({(r["load"], r["slo_terms"]) for r in runs if r.get("slo_terms")}):
        alone = {"kernel": bench.kernel_alone_p99, "client": bench.alone_p99}
        about.append((f"the SLO given: {args.slo_ms:g} ms (--slo-ms), whatever LS alone read; " if args.slo_ms else "")
                     + "koordd told its SLO as a factor of LS alone's p99 ("
                     + ("the median of its runs so far at that load: the first baseline, then with each repetition's; "
                        "at the end " if args.frontier else "the first baseline) ") + "; ".join(
            f"at {load}%: as the {terms} saw it, {alone[terms][load] * 1000:.2f} ms" for load, terms in told)
            + (")" if args.frontier else "") + " (the SLO is judged on the client's figure)")
    if bench.low_rate is not None:
        about.append(f"LS load: half a sine from {args.low_load}% ({bench.low_rate:.0f} req/s) up to {args.loads[0]}% "
                     f"and back over the warm-up and window")
    if bench.switch_to:
        about.append(f"BE: `{bench.antagonist}` for the window's first half, `{bench.switch_to}` for its second")
    report = markdown(rows, command, about, trust_notes(runs))
    if bench.slo_target:
        report += "\n## Against the SLO and the static oracle\n\n" + slo_table(runs, bench.slo_target, args.candidates) \
            + "\n"
        if can_plot:
            window_plot(runs, bench.slo_target, out / "windows.png",
                        f"{bench.ls_kind.name} vs {bench.antagonist}"
                        + (f" then {bench.switch_to}" if bench.switch_to else "") + ": each window's LS p99")
    if any(r["setup"] == KOORDD_B for r in runs):
        report += (f"\n## A/B: {KOORDD_A} ({git_describe()}) against {KOORDD_B} ({args.koordd_b}), pair by pair\n\n"
                   + ab_table(runs, bench.slo_target, KOORDD_A, KOORDD_B) + "\n")
    if any(r.get("sensor") for r in runs):
        report += "\n## The kernel's view: LS p99 from koordd's app_latency program against the client's\n\n" \
            + sensor_table(runs) + "\n"
    if args.frontier:
        report += "\n## The static frontier, koordd's points on it, and the SLO sweep\n\n" + "\n".join(
            frontier.report(runs, load, args.candidates, args.sweep) for load in args.loads)
        if can_plot:
            frontier.plot(runs, args.loads, args.candidates, out / "frontier.png",
                          f"{bench.ls_kind.name} vs {bench.antagonist}, {title_cpus(bench)}: the static frontier")
    (out / "report.md").write_text(report)
    if can_plot:
        plot(runs, SETUP_NAMES, out / "qos.png",
             f"{bench.ls_kind.name} vs {bench.antagonist} antagonist, {title_cpus(bench)}")
    print((out / "report.md").read_text())
    print(f"written: {out / 'report.md'}, {out / 'results.json'}" + (f", {out / 'qos.png'}" if can_plot else ""))


def trust_notes(runs: list[dict]) -> list[str]:
    """What could make this run's numbers less trustworthy, measured rather than assumed."""
    notes = []
    with_ls = [r["ls"] for r in runs if r["ls"]]
    if with_ls:
        lag = median_spread(ls["send_lag_p99"] for ls in with_ls)
        notes.append(f"client send lag p99 (intended to actual send): median {lag.median * 1e6:.0f} µs, "
                     f"at most {lag.high * 1e6:.0f} µs; it is part of every latency above")
        waits = median_spread(ls.get("socket_wait_p99") for ls in with_ls)
        if waits is not None:
            longest = max(ls.get("socket_wait_max") or 0.0 for ls in with_ls)
            notes.append(f"requests that waited in the client for the server's socket to take them (due to in the "
                         f"socket) p99: median {waits.median * 1e3:.2f} ms, at most {waits.high * 1e3:.2f} ms, the "
                         f"longest {longest * 1e3:.0f} ms; part of the latencies above, unseen by any server-side "
                         f"measurement (koordd's app_latency too)")
        scheduling = sorted({ls["scheduling"] for ls in with_ls})
        notes.append("the client ran " + " / ".join(scheduling) + ", outside the LS and BE cgroups")
        unfinished = sum(ls["unfinished"] for ls in with_ls)
        errors = sum(ls["errors"] for ls in with_ls)
        if unfinished or errors:
            notes.append(f"{unfinished} requests unanswered by the end of the drain (counted with their wait so "
                         f"far) and {errors} error replies over all runs")
        small = min(ls["count"] for ls in with_ls)
        if small < 1000:
            notes.append(f"a run has only {small} latency samples: its p99.9 is close to its maximum")
    seen = {(who, cpus) for r in runs for who, cpus in (r.get("affinity") or {}).items() if cpus}
    if seen:
        notes.append("the CPUs each kind of process was allowed, as the kernel had them (sched_getaffinity): "
                     + "; ".join(f"{who} {', '.join(sorted(c for w, c in seen if w == who))}"
                                 for who in sorted({w for w, _ in seen})))
    other = median_spread(r["cpu"]["other"] for r in runs)
    notes.append(f"other CPU (not LS, BE or client): median {other.median:.2f}, at most {other.high:.2f} cores")
    own = median_spread(r["koordd_cpu"] for r in runs if r.get("koordd_cpu") is not None)
    if own is not None:
        notes.append(f"of it koordd's own process (all its threads) in its windows: median {1000 * own.median:.1f} "
                     f"ms/s, {1000 * own.low:.1f}-{1000 * own.high:.1f} over {own.n} runs; its BPF programs run in "
                     "other tasks' time")
    stolen = median_spread(r["steal"]["ms"] for r in runs if r.get("steal"))
    if stolen is not None:
        notes.append(f"hypervisor steal (all vCPUs) during a window: median {stolen.median:.0f} ms, at most "
                     f"{stolen.high:.0f} ms: time a vCPU with work was not running at all")
    notes += bpf_notes(runs)
    koordd_caps = [r["be_cpu_max"] for r in runs if r["setup"] == "koordd"]
    if koordd_caps:
        notes.append("BE cpu.max that koordd held at the end of its windows: " + ", ".join(sorted(set(koordd_caps))))
    scanned = median_spread(r["reclaim_scanned"] for r in runs)
    notes.append(f"pages scanned by the node's reclaim during a window: median {scanned.median:.0f}, "
                 f"at most {scanned.high:.0f}")
    return notes


def bpf_notes(runs: list[dict]) -> list[str]:
    """Per koordd setup (--bpf-stats): its BPF programs' cost in each of its windows, in run order."""
    setups = sorted({r["setup"] for r in runs if r.get("koordd_bpf")})
    return [f"{setup}'s BPF programs in its windows (kernel.bpf_stats_enabled, which adds two clock reads a run): "
            + "; ".join(f"{r['load']}% rep {r.get('rep', 0) + 1}: {bpf_stats.words(r['koordd_bpf'])}"
                        for r in runs if r["setup"] == setup and r.get("koordd_bpf"))
            for setup in setups]


def sensor_table(runs: list[dict]) -> str:
    """Per run with LS: the client's p99 and the server-side p99 koordd's program measured over the same
    window, and their ratio."""
    lines = ["| load | setup | client p99 (ms) | kernel p99 (ms) | kernel / client | waited in the client p99 (ms) "
             "| sent on a full socket | responses seen |", "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for r in runs:
        ls, seen = r.get("ls"), r.get("sensor")
        if not ls or not seen or not ls.get("p99"):
            continue
        ratios.append(seen["p99"] / ls["p99"])
        wait, crowded = ls.get("socket_wait_p99"), seen.get("crowded")
        full = "-" if crowded is None else f"{crowded / seen['count']:.1%}"    # a reading has a response at least
        lines.append(f"| {r['load']}% | {r['setup']} | {ls['p99'] * 1000:.2f} | {seen['p99'] * 1000:.2f} | "
                     f"{ratios[-1]:.2f} | {'-' if wait is None else f'{wait * 1000:.2f}'} | {full} | "
                     f"{seen['count']} of {ls['answered']} answered |")
    spread = median_spread(ratios)
    lines += ["", f"kernel / client p99 over {spread.n} runs: median {spread.median:.2f}, from {spread.low:.2f} "
              f"to {spread.high:.2f}. The kernel counts from a request's bytes arriving at the server's socket "
              "to the server's answer (log2 buckets, interpolated); the client from the request's intended "
              "send time to reading the answer. Waited in the client: from when a request was due to when its "
              "last byte went into the server's socket, where the server had fallen behind by more than that "
              "socket's buffer; the kernel cannot see that wait (docs/app-latency.md), but counts the responses "
              "sent while the socket was full (koordd's app_socket_full)."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
