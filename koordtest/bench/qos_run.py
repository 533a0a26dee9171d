"""One run of scripts/bench-qos: a setup at one LS rate, from starting its processes to a record of what
LS saw, what BE got done and where the CPU went.

A run: LS servers start in the LS cgroup and BE workers in the BE cgroup (as the setup says); static
knobs are written (or koordd starts); the client (outside the LS and BE cgroups, SCHED_FIFO unless
asked otherwise, so it is not the one waiting; see koordtest.bench.openloop) sends through `warmup` seconds
and the window, and counts the window's requests only; CPU use, BE work and reclaim counters are read
at the window's start and end; then the client drains, koordd gets SIGTERM (restoring), static knobs
are put back, every process in the tree is killed, and the BE and LS knobs must read as they did
before the run.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import time
from contextlib import closing, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from koordtest.bench import bpf_stats
from koordtest.bench.antagonist import make_counters, read_counters
from koordtest.bench.cgroup_tree import CgroupTree, die_with_parent
from koordtest.bench.frontier import SWEEP_FACTORS, koordd_setup
from koordtest.koordd_proc import KoorddProcess
from koordtest.bench.ls_servers import python_module, wait_accepting, worker_env
from koordtest.bench.openloop import window_count
from koordtest.bench.procstat import cpu_seconds
from koordtest.bench.qos_stats import LS_ALONE, median_spread
from koordtest.bench.static_knobs import StaticKnobs, read_knobs
from koordtest.bench.steal import StealSampler, window_steal
from koordd.core.cgroup_text import format_cpulist
from koordd.kernel.cgroupfs import CgroupFS
from koordd.kernel.pm_qos import DEVICE, LatencyRequest, read_target
from koordd.sensors.cgroup_stats import CgroupSensor
from koordd.sensors.node import parse_proc_stat_cpu

PERIOD_US = 100_000
CLIENT_STARTUP = 1.0     # seconds for the client's Python to start and connect before it sends
WATCHED_KNOBS = ["cpu.max", "cpu.weight", "cpu.idle"]
RECLAIM_COUNTERS = ("pgscan_kswapd", "pgscan_direct")
LS, BE = "ls", "be"
KOORDD_A, KOORDD_B = "koordd", "koordd-b"


@dataclass(frozen=True)
class Setup:
    name: str
    doc: str
    ls: bool = True
    be: bool = True
    knobs: Callable[[int], dict[str, str]] | None = None     # static BE knobs, from the node's CPU count
    koordd: bool = False
    idle_threads: bool = False                                # BE workers run with the SCHED_IDLE policy
    config_changes: tuple[tuple[str, object], ...] = ()      # koordd: ("loops.x.option", value) over the config
    needs_sched_ext: bool = False                             # runs only on a kernel with sched_ext
    slo_factor: float | None = None   # koordd: its SLO is this x LS alone's p99 (else the benchmark's target)
    program_b: bool = False           # koordd: run --koordd-b's program (another checkout's), not this one's
    wake: bool = False                # the benchmark holds a 0 µs request on /dev/cpu_dma_latency for the run


WAKE_SETUP = "be-idle-wake"


def _idle(ncpu: int) -> dict[str, str]:
    """BE's group SCHED_IDLE: be-idle's knobs, and those of the settings that repeat or extend it."""
    return {"cpu.idle": "1"}

SETUPS = (
    Setup("ls-alone", "LS without BE: the latency baseline", be=False),
    Setup("be-alone", "BE without LS: the BE work baseline", ls=False),
    Setup("no-control", "LS and BE, no knob changed"),
    Setup("be-weight-1", "BE cpu.weight = 1 (v1: cpu.shares 10)", knobs=lambda ncpu: {"cpu.weight": "1"}),
    Setup("be-idle", "BE cpu.idle = 1 (SCHED_IDLE as a group)", knobs=_idle),
    Setup("be-idle-again", "be-idle's knobs once more in the same repetition (--frontier --be-idle-twice): a static "
          "setting's own scatter, measured where one repetition is all there is time for", knobs=_idle),
    # be_suppress's wake lever held for good, as tuned's latency-performance profile holds it: the static setting
    # to judge koordd's wake lever against, where its windows had CPUs held out of deep idle and be-idle's had not
    Setup(WAKE_SETUP, "be-idle's knobs with CPUs kept out of deep idle for the run: the benchmark holds a 0 µs "
          "request on /dev/cpu_dma_latency (a vCPU that polls is not halted, so a wake-up is no slow re-entry)",
          knobs=_idle, wake=True),
    Setup("be-thread-idle", "BE threads SCHED_IDLE and BE cpu.weight = 1 (the placement koordd uses where the "
          "kubelet owns the group: the kubelet gives BestEffort the lowest weight)",
          knobs=lambda ncpu: {"cpu.weight": "1"}, idle_threads=True),
    Setup("be-quota-half", "BE cpu.max at half the node's CPUs",
          knobs=lambda ncpu: {"cpu.max": f"{ncpu * PERIOD_US // 2} {PERIOD_US}"}),
    Setup(KOORDD_A, "koordd with config/koordd.toml as shipped, its LS and BE classes on the benchmark's cgroups "
          "(with --slo-factor: LS declares its SLO, [classes.slo] latency_p99 = the benchmark's target)",
          koordd=True),
    Setup("koordd-scx", "the same, plus koordd's own sched_ext scheduler (loop sched_ext: LS and BE on SCHED_EXT, "
          "scheduler = koordd; qos_baseline's be_cpu_idle off, as a thread has one policy)", koordd=True,
          config_changes=(("loops.sched_ext.enabled", True), ("loops.sched_ext.ext_classes", ["LS", "BE"]),
                          ("loops.sched_ext.scheduler", "koordd"), ("loops.qos_baseline.be_cpu_idle", False)),
          needs_sched_ext=True),
    # An A/B of two programs in one invocation: one LS-alone baseline and target for both, their runs interleaved
    # with the rest. Two invocations measured LS alone at 15.86 and 4.00 ms on the 2-CPU host and told the two
    # sides targets of 23.8 and 6.0 ms (docs/benchmarks.md): no pair compared.
    Setup(KOORDD_B, "koordd as setup koordd (the same config and SLO), run from --koordd-b's program: another "
          "checkout's bin/koordd", koordd=True, program_b=True),
)
ORACLE_PERCENTS = tuple(range(10, 100, 10))


def _quota_of_node(percent: int) -> Callable[[int], dict[str, str]]:
    return lambda ncpu: {"cpu.max": f"{max(ncpu * PERIOD_US * percent // 100, 1000)} {PERIOD_US}"}


def _idle_and_quota_of_node(percent: int) -> Callable[[int], dict[str, str]]:
    return lambda ncpu: {"cpu.idle": "1", **_quota_of_node(percent)(ncpu)}


# The static oracle's candidates (--oracle): BE capped at a share of the node, at its normal weight and
# at cpu.idle. The second kind is the static counterpart of what koordd does (BE idle, its CPUs cut):
# a cap alone leaves BE competing with LS at equal weight within its quota. With be-idle they are the
# static settings the oracle picks from: the one with the most BE work that meets the SLO.
SETUPS += tuple(Setup(f"be-cpu-max-{pct}", f"BE cpu.max at {pct}% of the node's CPUs", knobs=_quota_of_node(pct))
                for pct in ORACLE_PERCENTS)
SETUPS += tuple(Setup(f"be-idle-cpu-max-{pct}", f"BE cpu.idle = 1 and cpu.max at {pct}% of the node's CPUs",
                      knobs=_idle_and_quota_of_node(pct)) for pct in ORACLE_PERCENTS)
# The frontier's SLO sweep (--frontier): koordd told each SLO of the sweep in a run of its own.
SETUPS += tuple(Setup(koordd_setup(f), f"koordd as setup koordd, its LS class's SLO at {f:g}x LS alone's p99",
                      koordd=True, slo_factor=f) for f in SWEEP_FACTORS)
SETUP_NAMES = tuple(s.name for s in SETUPS)
ORACLE_SETUPS = ("be-idle",) + tuple(f"be-{kind}cpu-max-{pct}" for kind in ("", "idle-") for pct in ORACLE_PERCENTS)
CANDIDATE_SETUPS = ORACLE_SETUPS + (WAKE_SETUP,)      # --candidates may name it; not swept unless named


def run_order(setups: list[str], loads: list[int], reps: int, seed: int,
              alone_between: bool = False) -> list[tuple[int, str, int | None]]:
    """(rep, setup, load) in the order to run: every repetition runs each setup at each load (a setup
    without LS once, load None), so drift on the host spreads over the setups: the first repetition of
    each pair in a random order, the second in that order reversed, so that over a pair every run sits
    as far from the start on average (A B, then B A). A shuffle alone can put one setup first every time:
    issue 36's A/B of two programs ran koordd before be-idle in all 10 of its pairs. `alone_between`: LS
    alone is not shuffled in but runs after each repetition's batch, at each load (with the baseline run
    before the first, it brackets every repetition: its spread over the session is the instrument's own),
    and BE alone, shuffled in as before, runs once more after it: BE work scatters too (one BE-alone run per
    repetition gave a spread of 0 where the 16-CPU proof's koordd, writing nothing, did 74-92% of it)."""
    has_ls = {s.name: s.ls for s in SETUPS}
    rng = random.Random(seed)
    order, previous = [], []
    for rep in range(reps):
        batch = [(s, load) for s in setups for load in (loads if has_ls[s] else [None])
                 if not (alone_between and s == "ls-alone")]
        if rep % 2 == 0:
            rng.shuffle(batch)
        else:
            batch = previous[::-1]
        previous = batch
        order += [(rep, s, load) for s, load in batch]
        if alone_between:
            order += [(rep, "ls-alone", load) for load in loads]
            if "be-alone" in setups:
                order.append((rep, "be-alone", None))
    return order


@dataclass(frozen=True)
class CpuSplit:
    """--client-cpus: the CPUs the client's processes have to themselves (the lowest: koordd's cpuset lever
    gives BE the highest first) and those left to everything else, set with sched_setaffinity only (the
    benchmark's cgroups, their knobs and koordd's cpuset lever are left as they are; from Linux 6.2 a task keeps
    its own affinity, intersected, when its cpuset changes, where older kernels reset it to the cpuset's)."""
    client: tuple[int, ...]
    rest: tuple[int, ...]

    def describe(self) -> str:
        return f"client on {cpu_words(self.client)}, LS and BE on {format_cpulist(self.rest)}"

    def record(self) -> dict[str, str]:
        return {"client": format_cpulist(self.client), "ls_be": format_cpulist(self.rest)}


def cpu_words(cpus: Iterable[int]) -> str:
    """"CPU 0", "CPUs 0-1"."""
    cpus = sorted(cpus)
    return f"CPU{'s' if len(cpus) != 1 else ''} {format_cpulist(cpus)}"


def split_cpus(client_cpus: int, cpus: Iterable[int]) -> CpuSplit | None:
    """The lowest `client_cpus` of `cpus` (the CPUs this process may use) for the client, the others for LS
    and BE; None for 0 (no reservation: everything shares every CPU). ValueError naming --client-cpus
    where it leaves LS and BE no CPU."""
    cpus = sorted(cpus)
    if client_cpus == 0:
        return None
    if not 0 < client_cpus < len(cpus):
        raise ValueError(f"--client-cpus {client_cpus}: must be 0 (none reserved) up to {len(cpus) - 1}, leaving "
                         f"at least one of this host's {len(cpus)} CPUs to LS and BE")
    return CpuSplit(tuple(cpus[:client_cpus]), tuple(cpus[client_cpus:]))


@contextmanager
def on_cpus(cpus: Iterable[int] | None) -> Iterator[None]:
    """This thread, and every process it starts meanwhile (affinity is inherited from the first
    instruction), on `cpus`; the affinity it had before afterwards. None or empty: nothing changes."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def client_preexec(cpus: Iterable[int] | None) -> Callable[[], None]:
    """What the client's process runs before exec: die with its parent and, with `cpus`, move onto them
    (its engine processes inherit them)."""
    cpus = set(cpus or ())

    def preexec() -> None:
        die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)
    return preexec


def affinity(pid: int) -> str | None:
    """The CPUs `pid` may run on, in the kernel's list form; None once it is gone."""
    try:
        return format_cpulist(os.sched_getaffinity(pid))
    except (ProcessLookupError, PermissionError):
        return None


@dataclass
class Bench:
    """What stays the same for every run of one benchmark."""
    tree: CgroupTree
    fs: CgroupFS
    ncpu: int                        # the CPUs of LS and BE (the node's, less any --client-cpus)
    ls_kind: object                  # koordtest.bench.ls_servers.Probe or Redis
    antagonist: str
    be_memory: int                   # memory antagonist: bytes all workers grow to together
    seconds: float
    warmup: float
    drain: float
    realtime_client: bool
    koordd_config: Callable[[Path, tuple, float | None], str]   # (state dir, a setup's config_changes, the LS
    koordd_command: list[str]                                    # SLO's p99 target in seconds or None) -> config
    koordd_command_b: list[str] | None = None    # --koordd-b: the other program of an A/B (setup koordd-b)
    switch_to: str | None = None     # the antagonist kind BE switches to half way through the window
    low_rate: float | None = None    # LS rate follows half a sine from this up to the run's rate and back
    window: float = 10.0             # seconds per window of the client's window p99s
    app_latency: object = None       # koordd.sensors.app_latency.ResponseTimes, opened: the kernel's view of LS
    slo_target: dict = field(default_factory=dict)     # load -> the LS p99 target (seconds) given to koordd
    alone_p99: dict = field(default_factory=dict)      # load -> LS alone's p99 (seconds) of the SLO baseline
    kernel_alone_p99: dict = field(default_factory=dict)   # load -> the same run's p99 in the kernel's view
    koordd_terms: str = "client"     # koordd is told factor x LS alone's p99 as the client saw it, or the kernel
    engine: str = "python"           # the client: "python" (openloop.py's own loop) or "c" (the compiled engine)
    client_binary: str | None = None  # the compiled engine
    client_processes: int = 1        # compiled engines at once
    cpus: CpuSplit | None = None     # --client-cpus: the client's CPUs and LS and BE's (None: all share all)
    koordd_settle: float = 0.0       # koordd's runs: seconds of load before the window, beyond the warm-up
    settle_also: frozenset = frozenset()   # static setups whose runs settle as koordd's do (--settle-also)
    bpf_stats: bool = False          # --bpf-stats: koordd's BPF programs' cost over each window (kernel counters on)
    originals: dict[str, dict[str, str]] = field(default_factory=dict)   # cgroup -> knob -> value

    @property
    def host_ncpu(self) -> int:
        """The node's CPUs: LS and BE's and the client's own."""
        return self.ncpu + (len(self.cpus.client) if self.cpus else 0)

    @property
    def client_cpus(self) -> int:
        return len(self.cpus.client) if self.cpus else 0

    def settle_for(self, setup: Setup) -> float:
        """Seconds of load a run of `setup` gets before its window beyond the warm-up: koordd's runs settle, and a
        static setting named by --settle-also settles as long, so that a pair differs in koordd alone, not in
        how long LS and BE ran before the window nor in the window's arrivals."""
        return self.koordd_settle if setup.koordd or setup.name in self.settle_also else 0.0

    def remember_knobs(self) -> None:
        self.originals = {cg: read_knobs(self.fs, cg, WATCHED_KNOBS) for cg in (self.tree.path(LS), self.tree.path(BE))}

    def check_knobs(self, when: str) -> None:
        for cg, values in self.originals.items():
            now = read_knobs(self.fs, cg, WATCHED_KNOBS)
            if now != values:
                raise RuntimeError(f"{when}: knobs of {cg} are {now}, not {values} as before the benchmark")


def koordd_command_for(bench: Bench, setup: Setup) -> list[str]:
    """The koordd a setup runs: --koordd-b's program for koordd-b (the other side of an A/B), this checkout's
    for every other."""
    if not setup.program_b:
        return bench.koordd_command
    if bench.koordd_command_b is None:
        raise RuntimeError(f"setup {setup.name} needs --koordd-b (the other program of an A/B)")
    return bench.koordd_command_b


def run_one(bench: Bench, setup: Setup, rate: float | None, seed: int, workdir: Path, load: int | None = None) -> dict:
    """One run; `rate` is the LS request rate (None for a setup without LS), `load` its name (the SLO's key)."""
    workdir.mkdir(parents=True)
    bench.check_knobs(f"before {setup.name}")
    env = worker_env()
    servers, workers = [], []
    record: dict = {"setup": setup.name, "cpus": bench.cpus.record() if bench.cpus else None}
    try:
        sockets = []
        if setup.ls:
            for i in range(bench.ncpu):
                sock = workdir / f"ls{i}.sock"
                with open(workdir / f"ls{i}.log", "w") as log:
                    p = bench.tree.spawn(LS, bench.ls_kind.command(sock, workdir), env=env, stdout=log,
                                         stderr=log)
                servers.append(p)
                wait_accepting(sock, p)
                bench.ls_kind.prepare(sock)
                sockets.append(sock)
        static = StaticKnobs(bench.fs, bench.tree.path(BE), setup.knobs(bench.ncpu) if setup.knobs else {})
        with static, held_cpu_latency(setup.wake):
            counters = workdir / "be.counters"
            if setup.be:
                workers += start_antagonist(bench, setup, bench.antagonist, counters, workdir, env)
                record["be_policy"] = sorted({_policy_name(w.pid) for w in workers})
            slo = told_target(bench, setup, load)
            if slo is not None:
                record["slo_target"], record["slo_terms"] = slo, told_terms(bench, load)
            koordd = KoorddProcess(bench.koordd_config(workdir / "koordd" / "state", setup.config_changes, slo),
                                   workdir / "koordd", koordd_command_for(bench, setup)) if setup.koordd else None
            if koordd:
                # Before any request: the window measures koordd running, not its start (see wait_ready).
                record["koordd_ready_s"] = round(koordd.start().wait_ready(), 2)
            # The CPUs each kind of process may run on, as the kernel has them (the client's: _window)
            record["affinity"] = {name: affinity(procs[0].pid) for name, procs in
                                  ((LS, servers), (BE, workers), ("koordd", [koordd.proc] if koordd else []))
                                  if procs}
            try:
                record.update(_window(bench, setup, rate, seed, sockets, counters, workdir, koordd, workers, env))
                if "client_affinity" in record:
                    record["affinity"]["client"] = record.pop("client_affinity")
                retired = record.pop("retired", [])      # the first antagonist's workers, killed half way
                dead = [p.args[0] for p in servers + workers if p.poll() is not None and p not in retired]
                if dead:
                    raise RuntimeError(f"{setup.name}: {len(dead)} LS/BE processes died during the run "
                                       f"(logs in {workdir})")
            finally:
                if koordd:
                    rc = koordd.stop()
                    if rc != 0:
                        raise RuntimeError(f"koordd exited {rc} on SIGTERM:\n{koordd.log_tail()}")
    finally:
        problems = bench.tree.kill_processes()
        if problems:
            raise RuntimeError("; ".join(problems))
    bench.check_knobs(f"after {setup.name}")
    return record


def told_target(bench: Bench, setup: Setup, load: int | None) -> float | None:
    """The `latency_p99` koordd is told (seconds): the SLO's factor (the setup's, or --slo-factor's) times LS
    alone's p99 in `bench.koordd_terms`. "client": the figure the SLO is judged on. "kernel": the same
    baseline run as koordd's own signal (app_latency) saw it, which reads lower than the client by the
    client's send lag, the way back and any queue on a connection; docs/app-latency.md asks an operator to
    declare the target so. The SLO itself is judged on the client's figure either way."""
    if not setup.koordd or load not in bench.alone_p99:
        return None
    if setup.slo_factor is not None:
        factor = setup.slo_factor
    elif load in bench.slo_target:
        factor = bench.slo_target[load] / bench.alone_p99[load]
    else:
        return None
    alone = bench.kernel_alone_p99 if told_terms(bench, load) == "kernel" else bench.alone_p99
    return factor * alone[load]


def follow_alone(bench: Bench, runs: list[dict], load: int | None) -> None:
    """The LS-alone p99 koordd's targets are factors of, at `load`: the median of LS alone's runs so far there
    (the SLO baseline, then one after each repetition: --frontier), in both terms. The frontier's sweep judges
    each SLO against the median of all of them; told the first baseline alone, koordd was judged against a
    target of its own twice as tight where that one run read 33.45 ms and the median 17.37 (redis against the
    memory antagonist, 2 CPUs)."""
    alone = [r for r in runs if r["setup"] == LS_ALONE and r["load"] == load and r.get("ls")]
    if not alone:
        return
    bench.alone_p99[load] = median_spread(r["ls"]["p99"] for r in alone).median
    kernel = median_spread((r.get("sensor") or {}).get("p99") or None for r in alone)
    if kernel is not None:
        bench.kernel_alone_p99[load] = kernel.median


def told_terms(bench: Bench, load: int | None) -> str:
    """The terms koordd's target at `load` is told in: "kernel" where asked and the baseline's kernel p99 is
    there (a baseline the sensor saw nothing of falls back to the client's figure), else "client"."""
    return "kernel" if bench.koordd_terms == "kernel" and bench.kernel_alone_p99.get(load) else "client"


def start_antagonist(bench: Bench, setup: Setup, kind: str, counters: Path, workdir: Path,
                     env: dict) -> list[subprocess.Popen]:
    """One `kind` worker per CPU in the BE cgroup, counting into the fresh counter file `counters`."""
    make_counters(str(counters), bench.ncpu)
    workers = []
    for i in range(bench.ncpu):
        argv = python_module("koordtest.bench.antagonist", "--kind", kind, "--counters", str(counters),
                             "--slot", str(i), "--memory", str(bench.be_memory // bench.ncpu))
        with open(workdir / f"be-{kind}{i}.log", "w") as log:
            workers.append(bench.tree.spawn(BE, argv, env=env, stdout=log, stderr=log,
                                            idle_policy=setup.idle_threads))
    return workers


def _policy_name(pid: int) -> str:
    try:
        policy = os.sched_getscheduler(pid)
    except ProcessLookupError:
        return "exited"
    return {os.SCHED_OTHER: "normal", os.SCHED_IDLE: "idle", os.SCHED_BATCH: "batch"}.get(policy, str(policy))


def _window(bench: Bench, setup: Setup, rate: float | None, seed: int, sockets: list[Path], counters: Path,
            workdir: Path, koordd: KoorddProcess | None, workers: list, env: dict) -> dict:
    # The client sends from `sending` on, through the warm-up (so that koordd and the caches see LS at
    # its load before the window), and counts the requests of the window only.
    sending = time.monotonic() + CLIENT_STARTUP
    # koordd's runs settle first: the frontier compares steady states, and a controller's first seconds are
    # its reaction, which a static setting has none of (the changing-load case is where reaction counts).
    warmup = bench.warmup + bench.settle_for(setup)
    start_at = sending + warmup
    client = None
    if setup.ls:
        args = ["--request-hex", bench.ls_kind.request.hex(), "--rate", f"{rate:.3f}", "--start-at", f"{sending:.6f}",
                "--warmup", str(warmup), "--seconds", str(bench.seconds), "--seed", str(seed),
                "--drain", str(bench.drain), "--out", str(workdir / "client.json"), "--window", str(bench.window),
                "--response-end-hex", bench.ls_kind.response_end.hex()]
        if bench.low_rate is not None:
            args += ["--low-rate", f"{bench.low_rate:.3f}"]
        if bench.realtime_client:
            args.append("--realtime")
        if bench.engine == "c":
            args += ["--engine", "c", "--binary", str(bench.client_binary), "--processes",
                     str(bench.client_processes), "--workdir", str(workdir)]
            if bench.cpus:
                # On CPUs of its own the engine polls: sleeping until a send is due lets the vCPU halt, and
                # waking it cost a SCHED_OTHER client 286-1,321 µs of send lag on the 2-CPU host
                args.append("--spin")
        for s in sockets:
            args += ["--socket", str(s)]
        with open(workdir / "client.log", "w") as log:
            # --client-cpus: on the reserved CPUs, and its engines with it (everything else the benchmark
            # starts inherits the other CPUs from bench-qos itself: qos_cli.main)
            client = subprocess.Popen(python_module("koordtest.bench.openloop", *args), env=worker_env(), stdout=log,
                                      stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                                      preexec_fn=client_preexec(bench.cpus.client if bench.cpus else None))
        seen_client = affinity(client.pid)
    try:
        out = _measure(bench, setup, start_at, counters, workdir, koordd, client, workers, env)
        if client is not None:
            out["client_affinity"] = seen_client
        return out
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()


def _measure(bench: Bench, setup: Setup, start_at: float, counters: Path, workdir: Path,
             koordd: KoorddProcess | None, client: subprocess.Popen | None, workers: list, env: dict) -> dict:
    time.sleep(max(start_at - time.monotonic(), 0))
    meter = CpuMeter(bench.fs, [bench.tree.path(c) for c in (LS, BE)], bench.host_ncpu)   # /proc/stat: all
    koordd_cpu0 = (cpu_seconds(koordd.proc.pid), time.monotonic()) if koordd else None
    steal = StealSampler().start()
    wall0 = time.time()
    if bench.app_latency is not None and setup.ls:
        bench.app_latency.read([bench.tree.path(LS)])         # what came before the window is dropped
    scanned0 = reclaim_scans()
    programs = bpf_stats.koordd_programs(koordd.status()) if koordd and bench.bpf_stats else {}
    counters0, counted0 = bpf_stats.read_counters(programs), time.monotonic()
    out: dict = {"settled": bench.settle_for(setup), "cpu_latency_us": [cpu_latency_target()]}
    if setup.be and bench.switch_to:
        # The first antagonist for the first half, then the other: each half's work over its own counters
        out["be_work_halves"] = [_work_over(counters, bench.seconds / 2) / (bench.seconds / 2)]
        for w in workers:
            w.kill()
            w.wait()
        out["retired"] = list(workers)
        second = counters.with_name("be-second.counters")
        workers += start_antagonist(bench, setup, bench.switch_to, second, workdir, env)
        out["be_work_halves"].append(_work_over(second, start_at + bench.seconds - time.monotonic())
                                     / (bench.seconds / 2))
        work = None
    else:
        work0 = read_counters(str(counters)) if setup.be else 0
        time.sleep(max(start_at + bench.seconds - time.monotonic(), 0))
        work = (read_counters(str(counters)) - work0) / bench.seconds if setup.be else None
    cpu = meter.stop()
    if koordd_cpu0 is not None:
        spent, since = koordd_cpu0
        out["koordd_cpu"] = (cpu_seconds(koordd.proc.pid) - spent) / (time.monotonic() - since)
    if programs:
        out["koordd_bpf"] = bpf_stats.cost(programs, counters0, bpf_stats.read_counters(programs),
                                           time.monotonic() - counted0)
    out["cpu_latency_us"].append(cpu_latency_target())
    out["steal"] = window_steal(steal.stop(), start_at, bench.seconds, window_count(bench.seconds, bench.window))
    scanned1 = reclaim_scans()
    if bench.app_latency is not None and setup.ls:
        seen = bench.app_latency.read([bench.tree.path(LS)]).get(bench.tree.path(LS))
        out["sensor"] = None if seen is None else {"count": seen.count, "p50": seen.p50_us / 1e6,
                                                   "p99": seen.p99_us / 1e6, "p999": seen.p999_us / 1e6,
                                                   "crowded": seen.crowded}
    out["be_cpu_max"] = read_knobs(bench.fs, bench.tree.path(BE), ["cpu.max"]).get("cpu.max")
    if koordd:
        koordd.check_running()
        loops = koordd.status()["loops"]
        failures = {n: r["failures"] for n, r in loops.items() if r["failures"]}
        if failures:
            raise RuntimeError(f"koordd loops failed during the run: {failures}\n{koordd.log_tail()}")
        decisions = koordd.decisions()
        out["koordd_writes"] = sum(1 for d in decisions if d.get("outcome") == "applied")
        out["koordd_window"] = window_decisions(decisions, wall0, wall0 + bench.seconds)
        out["koordd_before"] = decisions_before(decisions, wall0)
        # rounds that held BE where no cut could show write nothing: only be_suppress's report counts them
        report = (loops.get("be_suppress") or {}).get("report") or {}
        out["koordd_unshowable"] = report.get("unshowable_rounds")
        # a control trial LS recovered from (BE left alone) writes nothing: only the levers' report counts it
        out["koordd_levers"] = report.get("levers")
        if setup.needs_sched_ext:
            out["sched_ext_ops"] = _sched_ext_ops()
            if out["sched_ext_ops"] != "koordd":     # a comparison without the scheduler would say nothing
                refused = [d.get("error") for d in decisions if d.get("knob") == "scheduler"]
                raise RuntimeError(f"{setup.name}: koordd's scheduler was not running at the window's end "
                                   f"(root/ops {out['sched_ext_ops']!r}; {refused or 'no scheduler decision'})")
    ls = None
    if client:
        rc = client.wait(timeout=bench.drain + 30)
        if rc != 0:
            raise RuntimeError(f"the load generator exited {rc}:\n{(workdir / 'client.log').read_text()[-2000:]}")
        ls = json.loads((workdir / "client.json").read_text())
    cores = {LS: cpu[bench.tree.path(LS)], BE: cpu[bench.tree.path(BE)], "node": cpu["node"]}
    cores["other"] = max(cores["node"] - cores[LS] - cores[BE] - (ls["client_cpu"] if ls else 0.0), 0.0)
    return {**out, "ls": ls, "cpu": cores, "be_work": work, "reclaim_scanned": scanned1 - scanned0,
            "be_throttled": meter.throttled.get(bench.tree.path(BE))}


def _work_over(counters: Path, seconds: float) -> int:
    """Work the counters gain over the next `seconds`."""
    start = read_counters(str(counters))
    time.sleep(max(seconds, 0))
    return read_counters(str(counters)) - start


def window_decisions(decisions: list[dict], start: float, end: float) -> list[dict]:
    """What koordd decided within the window, compactly: when (seconds into it), which knob and value,
    and for be_suppress's rule the step it took, the LS signal behind it, the standing headroom's phase
    (with the sentence where it changed: core/headroom.py), and the experiment's lever and verdict where the
    decision carries one (a kept "helped" is on record only so)."""
    out = []
    for d in decisions:
        if not start <= d.get("time", 0) <= end:
            continue
        reason, worst = d.get("reason") or {}, (d.get("reason") or {}).get("worst") or {}
        row = {"t": round(d["time"] - start, 2), "loop": d.get("loop"), "knob": d.get("knob"), "new": d.get("new"),
               "outcome": d.get("outcome")}
        headroom = reason.get("headroom") if isinstance(reason.get("headroom"), dict) else {}
        experiment = reason.get("experiment") if isinstance(reason.get("experiment"), dict) else {}
        row.update({k: v for k, v in (("step", reason.get("step")), ("slack", reason.get("slack")),
                                      ("signal", worst.get("signal")), ("measured", worst.get("value")),
                                      ("headroom", headroom.get("phase")), ("lever", experiment.get("lever")),
                                      ("verdict", experiment.get("verdict")))
                    if v is not None})
        if "headroom" in (d.get("message") or ""):     # the standing headroom holds, starts, is judged or ends
            row["said"] = d["message"]
        out.append(row)
    return out


def decisions_before(decisions: list[dict], start: float) -> list[dict]:
    """What koordd decided before the window that starts at `start` (its settling time, --koordd-settle), as
    window_decisions has them but t in seconds before the window (negative): the window sees its knobs as
    these left them. The baseline's writes (qos_baseline: cpu.idle) are left out: be-idle has them too."""
    return [dict(d, t=round(d["t"] - start, 2)) for d in window_decisions(decisions, 0.0, start)
            if d["loop"] != "qos_baseline"]


class CpuMeter:
    """CPU use in cores from now until stop(): of each cgroup (koordd's own cgroup sensor, so v1 and v2
    are read as koordd reads them) and of the whole node (/proc/stat, busy = not idle, iowait or steal).
    After stop(), `throttled`: each cgroup's cpu.stat periods and throttled periods over the same time (None
    where the kernel has no such counters), whether a cap held the cgroup back at all."""

    FIELDS = frozenset({"cpu_usage", "throttling"})

    def __init__(self, fs: CgroupFS, cgroups: list[str], ncpu: int):
        self.sensor, self.cgroups, self.ncpu = CgroupSensor(fs), cgroups, ncpu
        self.throttled: dict[str, dict | None] = {}
        t = time.monotonic()
        for cg in cgroups:
            self.sensor.sample(cg, "", t, self.FIELDS)
        self.node = _proc_stat()

    def stop(self) -> dict[str, float]:
        t = time.monotonic()
        samples = {cg: self.sensor.sample(cg, "", t, self.FIELDS) for cg in self.cgroups}
        out = {cg: s.cpu_usage or 0.0 for cg, s in samples.items()}
        self.throttled = {cg: None if s.throttling is None or s.throttling.periods_delta is None else
                          {"periods": s.throttling.periods_delta, "throttled": s.throttling.throttled_delta}
                          for cg, s in samples.items()}
        busy0, total0 = self.node
        busy1, total1 = _proc_stat()
        out["node"] = self.ncpu * (busy1 - busy0) / max(total1 - total0, 1)
        return out


def _proc_stat() -> tuple[int, int]:
    return parse_proc_stat_cpu(Path("/proc/stat").read_text())


def held_cpu_latency(wake: bool):
    """A 0 µs CPU latency request held for the block where `wake` (the wake setup's run), none otherwise."""
    return closing(LatencyRequest(0, DEVICE)) if wake else nullcontext()


def cpu_latency_target() -> int | None:
    """The CPU latency target in force (µs; NO_CONSTRAINT where no request is held), None where the host has no
    /dev/cpu_dma_latency: whether a window ran with CPUs held out of deep idle, by koordd's wake lever or else."""
    try:
        return read_target(DEVICE)
    except (OSError, ValueError):
        return None


def reclaim_scans() -> int:
    """Pages the node's reclaim has scanned so far (kswapd and direct reclaim): whether a window
    saw reclaim at all."""
    total = 0
    for line in Path("/proc/vmstat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key in RECLAIM_COUNTERS:
            total += int(value)
    return total


def _sched_ext_ops() -> str:
    try:
        return Path("/sys/kernel/sched_ext/root/ops").read_text().strip()
    except OSError:
        return ""
