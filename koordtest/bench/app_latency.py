"""What the app_latency sensor (docs/app-latency.md) costs: in the kernel per request, and per round in
koordd, on this host. Needs root; removes what it made and puts kernel.bpf_stats_enabled back.

    sudo .venv/bin/python scripts/bench-app-latency [--requests 2000000] [--clients 50] [--servers 2]
                                                   [--cgroups 500] [--rounds 200] [--repeat 3]
                                                   [--baseline OLD.bpf.o]
    sudo .venv/bin/python scripts/bench-app-latency --steering [--repeat 5] [--baseline OLD.bpf.o]

Per request: redis-server (Debian's, one per --servers, each on its own UNIX socket, in a cgroup of
its own) answers PING to redis-benchmark (redis-tools: C, one request per round trip, no pipelining)
from --clients connections, as fast as this host goes (about 100k requests/s on 2 CPUs). The program is
loaded by koordd's loader; with kernel.bpf_stats_enabled=1 the kernel adds up each of its programs' run
time; that sum over the requests answered is the cost per request (each request fires the tracepoints
twice: its arrival at the server and the answer's at the client, the client's send and the server's, the
server's read and the client's).
Three cases, each --repeat times, in turn: the servers' cgroup watched (koordd samples it), not watched
(a host's other traffic), and the program not loaded (the rate's own baseline).

Per round: --cgroups watched sibling cgroups (empty but the servers') read as koordd reads them each
round (ResponseTimes.read: one batched read of the histograms, a sum per watched subtree), --rounds
times after a first read; the median and spread of a round.

--steering (instead of the above; no redis needed): can clients steer the measured p99 (issue 35)? A
small Python server (koordtest/apps.py's STEERED_SERVER, on TCP, in a cgroup of its own) answers "ping"
at once and "wait 24" after 24 ms. Three cases, each --repeat times (the programs in turn): 300 pings
alone on one connection; the same while 30 clients send half a request, wait 150 ms and send the rest
(twice each); 60,000 pings on one connection while another sends 40 "wait 24". Each gives the sensor's p99 over the case, next to
what the clients saw: the slowest answer after a request's last bytes, or the slow client's fastest
answer.

--baseline OLD.bpf.o: the per-request cases (or the steering ones) with an older program too (e.g. `git
show f7a7a0a~1:koordd/bpf/app_latency.bpf.o`, before issue 35), read as the sensor then read it: its
`responses` map, one response one vote.
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from koordtest.apps import STEERED_SERVER, flood, half_sent, pings
from koordtest.bench.bpf_stats import counting
from koordtest.bench.cgroup_tree import CgroupTree
from koordtest.bench.common import doc_parser
from koordtest.bench.ls_servers import find_redis, wait_accepting
from koordd.core.histogram import slot_upper_us
from koordd.kernel.cgroupfs import detect_layout
from koordd.sensors.app_latency import PROGRAM, SLOTS, ResponseTimes, summarize
from koordd.sensors.cgroup_hist import CgroupHistograms


def main(argv: list[str] | None = None) -> int:
    p = doc_parser(__doc__)
    p.add_argument("--requests", type=int, default=2_000_000, help="requests per measurement")
    p.add_argument("--clients", type=int, default=50, help="redis-benchmark connections")
    p.add_argument("--servers", type=int, default=2, help="redis servers (one per CPU on this host)")
    p.add_argument("--cgroups", type=int, default=500, help="watched cgroups for the round's cost")
    p.add_argument("--rounds", type=int, default=200, help="rounds timed")
    p.add_argument("--repeat", type=int, default=3, help="measurements per case")
    p.add_argument("--no-install", action="store_true", help="never apt-get install redis-server")
    p.add_argument("--no-requests", action="store_true", help="skip the per-request cases (no redis needed)")
    p.add_argument("--steering", action="store_true", help="only the clients-steer-the-p99 cases (issue 35)")
    p.add_argument("--baseline", type=Path, help="also with this older app_latency.bpf.o (read per response)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("bench-app-latency: needs root (cgroups, BPF)", file=sys.stderr)
        return 2
    unified = detect_layout().unified
    if unified is None:
        print("bench-app-latency: no v2 tree: the program names cgroups there", file=sys.stderr)
        return 2
    if args.steering:
        with CgroupTree(f"koordd-applat-steer-{os.getpid()}", ("cpu",)) as tree:
            tree.create(["server"])
            steering(args, tree, unified)
        return 0
    redis = find_redis(not args.no_install) if not args.no_requests else None
    benchmark = shutil.which("redis-benchmark")
    if benchmark is None and not args.no_requests:
        print("bench-app-latency: no redis-benchmark (apt-get install redis-tools)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-app-latency-"))
    tree = CgroupTree(f"koordd-applat-{os.getpid()}", ("cpu",))
    try:
        with counting(), tree:
            tree.create(["servers"] + [f"empty{i}" for i in range(args.cgroups - 1)])
            if not args.no_requests:
                sockets = start_servers(tree, redis, args.servers, workdir)
                per_request(args, tree, unified, benchmark, sockets)
            per_round(args, tree, unified)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def start_servers(tree: CgroupTree, redis: str, n: int, workdir: Path) -> list[Path]:
    sockets = []
    for i in range(n):
        sock = workdir / f"redis{i}.sock"
        proc = tree.spawn("servers", [redis, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                                      "--save", "", "--appendonly", "no", "--dir", str(workdir),
                                      "--logfile", ""], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_accepting(sock, proc)
        sockets.append(sock)
    return sockets


def drive(benchmark: str, sockets: list[Path], requests: int, clients: int) -> tuple[int, float]:
    """redis-benchmark on every server at once: (requests answered, seconds)."""
    each = requests // len(sockets)
    start = time.monotonic()
    procs = [subprocess.Popen([benchmark, "-s", str(s), "-t", "ping_mbulk", "-n", str(each), "-c",
                               str(max(clients // len(sockets), 1)), "-P", "1", "-q"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for s in sockets]
    outs = [pr.communicate()[0] for pr in procs]
    seconds = time.monotonic() - start
    for pr, out in zip(procs, outs):
        if pr.returncode != 0 or not re.search(r"requests per second", out):
            raise RuntimeError(f"redis-benchmark failed: {out[-500:]}")
    return each * len(sockets), seconds


def per_request(args, tree: CgroupTree, unified: Path, benchmark: str, sockets: list[Path]) -> None:
    path = tree.path("servers")
    programs = {"": lambda: ResponseTimes(unified)}
    if args.baseline is not None:
        programs[f", {args.baseline.name}"] = lambda: PerResponse(unified, args.baseline)
    cases = [(f"{case}{label}", make, case) for label, make in programs.items()
             for case in ("watched", "not watched")] + [("not loaded", None, "not loaded")]
    rows = {name: [] for name, _, _ in cases}
    for _ in range(args.repeat):
        for name, make, case in cases:
            source = None
            if make is not None:
                source = make()
                source.open()
                source.read([path] if case == "watched" else [tree.path("empty0")])
            try:
                before = _run_time(source)
                answered, seconds = drive(benchmark, sockets, args.requests, args.clients)
                spent = _run_time(source) - before
                seen = source.read([path]).get(path) if case == "watched" else None
            finally:
                if source is not None:
                    source.close()
            rows[name].append((answered / seconds, spent / answered if source else None,
                               seen.count if seen else None, answered))
    print(f"## Per request ({args.servers} redis servers, redis-benchmark PING from {args.clients} connections, "
          f"{args.requests} requests a measurement, {args.repeat} measurements a case)\n")
    print("| case | requests/s | ns per request in the kernel | CPU at that rate | responses the sensor counted |")
    print("|---|---|---|---|---|")
    for case, got in rows.items():
        rate = statistics.median(r for r, _, _, _ in got)
        cost = [c for _, c, _, _ in got if c is not None]
        ns = f"{statistics.median(cost):.0f} ({min(cost):.0f}-{max(cost):.0f})" if cost else "-"
        cpu = f"{statistics.median(cost) * rate / 1e9:.3f}" if cost else "-"
        counted = [f"{n}/{a}" for _, _, n, a in got if n is not None]
        print(f"| {case} | {rate:.0f} ({min(r for r, _, _, _ in got):.0f}-{max(r for r, _, _, _ in got):.0f}) | "
              f"{ns} | {cpu} | {', '.join(counted) or '-'} |")
    print()


def _run_time(source: ResponseTimes | None) -> int:
    return sum(s.run_time_ns for s in source.stats()) if source is not None else 0


def per_round(args, tree: CgroupTree, unified: Path) -> None:
    paths = [tree.path("servers")] + [tree.path(f"empty{i}") for i in range(args.cgroups - 1)]
    programs = {"this program": lambda: ResponseTimes(unified)}
    if args.baseline is not None:
        programs[f"{args.baseline.name} (one map, per response)"] = lambda: PerResponse(unified, args.baseline)
    sources = {name: make() for name, make in programs.items()}
    times: dict[str, list[float]] = {name: [] for name in sources}
    try:
        for source in sources.values():
            source.open()
            source.read(paths)      # the first read resolves every path's cgroup id
        for _ in range(args.rounds):            # the programs in turn, a round each
            for name, source in sources.items():
                t = time.perf_counter()
                source.read(paths)
                times[name].append(time.perf_counter() - t)
    finally:
        for source in sources.values():
            source.close()
    print(f"## Per round: {args.cgroups} watched cgroups, {args.rounds} rounds\n")
    for name, got in times.items():
        got.sort()
        q1, q3 = got[len(got) // 4], got[3 * len(got) // 4]
        print(f"{name}: median {statistics.median(got) * 1e3:.2f} ms, quartiles {q1 * 1e3:.2f}-{q3 * 1e3:.2f} ms, "
              f"min {got[0] * 1e3:.2f} ms, max {got[-1] * 1e3:.2f} ms")


class PerResponse(CgroupHistograms):
    """An older program's `responses`, read as the sensor read them before issue 35: one response, one
    vote in the quantiles."""

    def __init__(self, tree: Path, program: Path):
        super().__init__(tree, program, "responses", SLOTS)

    def read(self, paths):
        return {path: summarize(slots, total_ns) for path, (slots, total_ns) in self.deltas(paths).items()}


CASES = {"300 pings alone": (partial(pings, "tcp"), "slowest answer after a last byte", max),
         "+ 30 clients sending half a request, 150 ms pause": (partial(half_sent, "tcp"),
                                                               "slowest answer after a last byte", max),
         "60,000 pings on one connection + 40 of 24 ms on another": (partial(flood, "tcp"),
                                                                    "slow client's fastest answer", min)}


def steering(args, tree: CgroupTree, unified: Path) -> None:
    proc = tree.spawn("server", [sys.executable, "-c", STEERED_SERVER, "tcp", "-"], stdout=subprocess.PIPE,
                      stderr=subprocess.DEVNULL)
    address = proc.stdout.readline().decode().strip()
    path = tree.path("server")
    programs = [("this program", lambda: ResponseTimes(unified, PROGRAM))]
    if args.baseline is not None:
        programs.insert(0, (f"{args.baseline.name} (per response)", lambda: PerResponse(unified, args.baseline)))
    results = {(case, name): ([], []) for name, _ in programs for case in CASES}
    for _ in range(args.repeat):            # the programs in turn, so that both see the host's moods alike
        for name, make in programs:
            source = make()
            source.open()
            try:
                source.read([path])
                for case, (run, _, pick) in CASES.items():
                    source.read([path])
                    client = run(address)
                    got = source.read([path]).get(path)
                    results[case, name][0].append(got.p99_us if got else float("nan"))
                    results[case, name][1].append(pick(client))
            finally:
                source.close()
    rows = [(case, name, results[case, name][0], CASES[case][1], results[case, name][1])
            for case in CASES for name, _ in programs]
    print(f"## Clients steering the p99 (TCP, a Python server; {args.repeat} runs a case)\n")
    print("| case | program | sensor's p99, µs: median (range) | what the clients saw, µs: median (range) |")
    print("|---|---|---|---|")
    for case, name, p99s, what, seen in rows:
        print(f"| {case} | {name} | {fmt(p99s)} | {what}: {fmt(seen)} |")
    print()


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"

