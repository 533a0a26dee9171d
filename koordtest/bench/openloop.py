"""An open-loop load generator: requests go out at times drawn in advance (Poisson arrivals at a fixed
rate), whatever the server answers, and each latency is counted from the request's *intended* send
time. A server that stalls therefore shows the whole queue it built up (no coordinated omission), and a
client that sends late shows its lag in the latencies instead of hiding it.

The rate is fixed, or (--low-rate) follows half a sine over the whole sending time, from the low rate up
to --rate half way and back down: arrivals are drawn at --rate and kept with probability rate(t)/--rate
(thinning), which gives Poisson arrivals at rate(t). The summary has the p99 of each --window seconds of
the counted time as well as of all of it, each request in the window of its intended send time.

Servers are UNIX sockets answering each request in order with a response that ends in a fixed terminator:
one line for the probe and redis (a command whose reply is one line; a reply starting with "-" is an error),
"END\r\n" for a memcached multi-key get (--response-end-hex). Each
request goes to one server chosen at random (so each server still sees Poisson arrivals), over one of
`connections` connections to it in turn; a connection answers in order.

Run as a process of its own (python -m koordtest.bench.openloop ...), it writes one JSON summary: latency
percentiles, counts, how late it sent (send lag) and its own CPU time. With --realtime it runs as
SCHED_FIFO: on a host it shares with the servers, a normal task waits for a busy server's time slice to
end before it may send or read (about a millisecond), and that wait would be counted as latency; a
real-time client is woken at once. It uses a few percent of a CPU, and the kernel's RT throttling
bounds it even if it did not. Its wake-ups interrupt a busy server the way a network card's
interrupts would; measured on a 2-CPU host, LS alone at half the node had a p99 of 5-7 ms with it and
3.6-4.2 ms with a normal client, whose own send lag p99 was 0.6-0.7 ms (0.1-0.2 ms real-time).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import random
import resource
import select
import socket
import subprocess
import sys
import time
from array import array
from collections import deque
from dataclasses import dataclass, field

from koordtest.bench.qos_stats import latency_summary, percentile

PR_SET_TIMERSLACK = 29
RT_PRIORITY = 1          # the lowest real-time priority: above every normal task, below the kernel's own


def poisson_schedule(rate: float, seconds: float, servers: int, seed: int,
                     low_rate: float | None = None) -> tuple[array, array]:
    """(intended send times in seconds from the start, server index of each request): Poisson
    arrivals at `rate` per second over `seconds`, each to a server drawn uniformly; with `low_rate`, at
    sine_rate(t) instead (thinning). A pure function of its arguments: nothing the servers do can move a
    request."""
    if rate <= 0 or seconds <= 0 or servers < 1:
        raise ValueError("rate and seconds must be positive and there must be a server")
    if low_rate is not None and not 0 < low_rate <= rate:
        raise ValueError("low_rate must be positive and at most rate")
    rng = random.Random(seed)
    times, which = array("d"), array("i")
    t = rng.expovariate(rate)
    while t < seconds:
        if low_rate is None or rng.random() * rate < sine_rate(t, seconds, low_rate, rate):
            times.append(t)
            which.append(rng.randrange(servers))
        t += rng.expovariate(rate)
    return times, which


def sine_rate(t: float, seconds: float, low: float, high: float) -> float:
    """low at 0 and at `seconds`, high half way, along half a sine."""
    return low + (high - low) * math.sin(math.pi * min(max(t / seconds, 0.0), 1.0))


@dataclass
class _Connection:
    sock: socket.socket
    pending: deque = field(default_factory=deque)    # intended send times (absolute) of requests in flight
    # What the socket buffer did not take yet: requests whole, the first one from `sent_of_first` on. Kept
    # apart, not joined: behind a stalled server megabytes wait here, and re-slicing one buffer after
    # every partial send would copy them all each time.
    unsent: deque = field(default_factory=deque)
    unsent_due: deque = field(default_factory=deque)  # per unsent request: when it was due, None: not counted
    sent_of_first: int = 0
    partial: bytes = b""                             # start of a response not complete yet


@dataclass
class Outcome:
    latencies: array          # seconds from intended send to response, answered requests, in arrival order
    send_lags: array          # seconds from intended to actual send, every request counted
    errors: int               # responses that were errors
    unfinished: array         # seconds from intended send to the drain deadline, of requests never answered
    sent_at: array = field(default_factory=lambda: array("d"))       # intended send time of each latency,
    unfinished_at: array = field(default_factory=lambda: array("d"))  # and of each unfinished one, seconds
                                                                      # from the start of the counted time
    # Seconds each counted request waited in the client, from when it was due to when its last byte went
    # into the socket (never: until the end): where the server falls behind by more than the socket's buffer
    # the rest wait here, part of the latency above, where no server-side measurement sees them.
    socket_waits: array = field(default_factory=lambda: array("d"))


def run_open_loop(conns: list[list[socket.socket]], request: bytes, times: array, which: array,
                  start_at: float, drain: float, record_from: float = 0.0, terminator: bytes = b"\n") -> Outcome:
    """Send `request` to server which[i] at start_at + times[i] (time.monotonic() clock), read every
    response (ending in `terminator`) as it comes, and stop when all are answered or `drain` seconds after
    the last send time. Requests intended before start_at + record_from (the warm-up) are sent and read,
    not counted."""
    servers = [[_Connection(s) for s in group] for group in conns]
    by_fd = {c.sock.fileno(): c for group in servers for c in group}
    turn = [0] * len(servers)
    for c in by_fd.values():
        c.sock.setblocking(False)
    latencies, lags, unfinished, sent_at, waits = array("d"), array("d"), array("d"), array("d"), array("d")
    errors = 0
    deadline = start_at + (times[-1] if times else 0.0) + drain
    counted_from = start_at + record_from
    n, i = len(times), 0
    in_flight = 0
    while True:
        now = time.monotonic()
        while i < n and start_at + times[i] <= now:
            group = servers[which[i]]
            c = group[turn[which[i]] % len(group)]
            turn[which[i]] += 1
            intended = start_at + times[i]
            c.pending.append(intended)
            if intended >= counted_from:
                lags.append(now - intended)
            c.unsent.append(request)
            c.unsent_due.append(now if intended >= counted_from else None)
            _flush(c, waits)
            in_flight += 1
            i += 1
        if (i >= n and in_flight == 0) or now >= deadline:
            break
        wait = (start_at + times[i] if i < n else deadline) - now
        writers = [c.sock for c in by_fd.values() if c.unsent]
        # select() sleeps on a high-resolution timer (epoll rounds timeouts up to whole ms)
        readable, writable, _ = select.select(list(by_fd), writers, [], max(wait, 0.0))
        for s in writable:
            _flush(by_fd[s.fileno()], waits)
        for fd in readable:
            c = by_fd[fd]
            data = c.sock.recv(65536)
            got = time.monotonic()
            if not data:
                raise ConnectionError("server closed the connection")
            responses = (c.partial + data).split(terminator)
            c.partial = responses.pop()
            for response in responses:
                intended = c.pending.popleft()
                in_flight -= 1
                if intended >= counted_from:
                    latencies.append(got - intended)
                    sent_at.append(intended - counted_from)
                    errors += response.startswith(b"-") or response.startswith(b"ERROR") \
                        or b"_ERROR" in response[:16]
    end = time.monotonic()
    late = [t for c in by_fd.values() for t in c.pending if t >= counted_from]
    waits.extend(end - t for c in by_fd.values() for t in c.unsent_due if t is not None)
    return Outcome(latencies, lags, errors, array("d", (end - t for t in late)), sent_at,
                   array("d", (t - counted_from for t in late)), waits)


def _flush(c: _Connection, waits: array) -> None:
    """Send what the socket buffer takes now, in order; each counted request sent whole adds its wait to
    `waits`."""
    while c.unsent:
        first = c.unsent[0]
        try:
            sent = c.sock.send(memoryview(first)[c.sent_of_first:])
        except BlockingIOError:
            return
        c.sent_of_first += sent
        if c.sent_of_first < len(first):
            return                      # the buffer is full
        c.unsent.popleft()
        due = c.unsent_due.popleft()
        if due is not None:
            waits.append(time.monotonic() - due)
        c.sent_of_first = 0


def connect(paths: list[str], per_server: int) -> list[list[socket.socket]]:
    conns = []
    for path in paths:
        group = []
        for _ in range(per_server):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            group.append(s)
        conns.append(group)
    return conns


def window_count(seconds: float, window: float) -> int:
    """How many windows `seconds` of counted time are cut into: of `window` seconds each, as near as whole
    windows allow (a last window shorter than half a window joins the one before it)."""
    return max(1, round(seconds / window)) if window > 0 else 1


def window_p99s(outcome: Outcome, seconds: float, window: float) -> list[dict]:
    """count and p99 (seconds; None without requests) of each `window` seconds of the counted time, each
    request (unfinished ones with their wait so far) in the window of its intended send time; a last
    window shorter than half a window joins the one before it."""
    n = window_count(seconds, window)
    width = seconds / n
    buckets: list[list[float]] = [[] for _ in range(n)]
    pairs = list(zip(outcome.sent_at, outcome.latencies)) + list(zip(outcome.unfinished_at, outcome.unfinished))
    for at, latency in pairs:
        buckets[min(max(int(at / width), 0), n - 1)].append(latency)
    out = []
    for b in buckets:
        b.sort()
        out.append({"count": len(b), "p99": percentile(b, 99) if b else None})
    return out


def summary(outcome: Outcome, rate: float, seconds: float, client_cpu: float, window: float = 10.0) -> dict:
    """The JSON the orchestrator reads: unfinished requests count with their (lower-bound) latency."""
    lat = latency_summary(list(outcome.latencies) + list(outcome.unfinished))
    lags = sorted(outcome.send_lags)
    return {**lat, "windows": window_p99s(outcome, seconds, window), "answered": len(outcome.latencies),
            "errors": outcome.errors,
            "unfinished": len(outcome.unfinished), "sent": len(lags), "target_rate": rate,
            "achieved_rate": len(outcome.latencies) / seconds,
            "send_lag_p50": percentile(lags, 50) if lags else None,
            "send_lag_p99": percentile(lags, 99) if lags else None,
            **socket_wait_summary(outcome.socket_waits), "client_cpu": client_cpu}


def socket_wait_summary(waits) -> dict:
    """How long requests waited in the client for the server's socket to take them (Outcome.socket_waits):
    the p99, the longest and the share that waited at all (over a millisecond); None where not measured."""
    w = sorted(waits)
    return {"socket_wait_p99": percentile(w, 99) if w else None, "socket_wait_max": w[-1] if w else None,
            "socket_wait_share": sum(x > 1e-3 for x in w) / len(w) if w else None}


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# --- the compiled engine (--engine c: koordtest/bench/client/openloop.c) -------------------------------
# Python draws the schedule and turns the engine's records into the same Outcome as its own loop does;
# the engine only sends on time and notes when each request was due and answered.

def write_schedule(path: str, times: array, which: array) -> None:
    """The engine's schedule file: int64 n, n doubles (send times), n int32 (server indexes)."""
    with open(path, "wb") as f:
        f.write(len(times).to_bytes(8, "little", signed=True))
        f.write(array("d", times).tobytes())
        f.write(array("i", which).tobytes())


@dataclass
class Records:
    """What the engine wrote: per request when it was due (handed to its socket), answered and in the
    socket whole, all time.monotonic() seconds (NaN: never), whether its answer was an error; the engine's
    end, CPU and whether it ran SCHED_FIFO."""
    due: array
    answered: array
    errors: bytes
    end: float
    cpu: float
    realtime: bool
    written: array


def read_records(path: str) -> Records:
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little", signed=True)
    due, answered, written = array("d"), array("d"), array("d")
    due.frombytes(data[8:8 + 8 * n])
    answered.frombytes(data[8 + 8 * n:8 + 16 * n])
    written.frombytes(data[8 + 16 * n:8 + 24 * n])
    errors = data[8 + 24 * n:8 + 25 * n]
    tail = array("d")
    tail.frombytes(data[8 + 25 * n:8 + 25 * n + 16])
    if len(errors) != n or len(tail) != 2 or len(data) != 8 + 25 * n + 17:
        raise ValueError(f"{path}: not an engine record of {n} requests (one built before "
                         f"openloop.c noted when each request went into its socket? scripts/build-client)")
    return Records(due, answered, errors, tail[0], tail[1], data[-1] == 1, written)


def outcome_from_records(times: array, start_at: float, record_from: float, rec: Records) -> Outcome:
    """The Outcome run_open_loop would give for the same requests: requests intended before
    start_at + record_from are not counted; a latency runs from the intended send time to the answer,
    a send lag from the intended time to when the client handed the request over, and a request never
    answered counts with its wait until the engine's end."""
    latencies, lags, unfinished, sent_at, unfinished_at, waits = (array("d") for _ in range(6))
    errors = 0
    counted_from = start_at + record_from
    for i, t in enumerate(times):
        intended = start_at + t
        if intended < counted_from:
            continue
        if not math.isnan(rec.due[i]):
            lags.append(rec.due[i] - intended)
            waits.append((rec.end if math.isnan(rec.written[i]) else rec.written[i]) - rec.due[i])
        if math.isnan(rec.answered[i]):
            unfinished.append(rec.end - intended)
            unfinished_at.append(intended - counted_from)
        else:
            latencies.append(rec.answered[i] - intended)
            sent_at.append(intended - counted_from)
            errors += rec.errors[i]
    return Outcome(latencies, lags, errors, unfinished, sent_at, unfinished_at, waits)


def split_by_server(which: array, processes: int) -> list[tuple[array, array, list[int]]]:
    """The schedule cut for `processes` engines, server s going to engine s % processes: per engine, the
    global indexes of its requests, their server index within the engine's own list, and its servers."""
    servers = max(which, default=-1) + 1
    parts = []
    for k in range(processes):
        mine = list(range(k, servers, processes))
        local = {s: j for j, s in enumerate(mine)}
        idx = array("q", (i for i, s in enumerate(which) if s % processes == k))
        parts.append((idx, array("i", (local[which[i]] for i in idx)), mine))
    return parts


def merge_records(n: int, parts: list[tuple[array, Records]]) -> Records:
    """One Records over all `n` requests from each engine's (its global indexes, its records)."""
    due, answered, written = (array("d", [math.nan]) * n for _ in range(3))
    errors = bytearray(n)
    for idx, rec in parts:
        for j, i in enumerate(idx):
            due[i], answered[i], written[i], errors[i] = rec.due[j], rec.answered[j], rec.written[j], rec.errors[j]
    return Records(due, answered, bytes(errors), max(r.end for _, r in parts), sum(r.cpu for _, r in parts),
                   all(r.realtime for _, r in parts), written)


def engine_command(binary: str, schedule: str, request: str, terminator: bytes, sockets: list[str],
                   connections: int, start_at: float, drain: float, out: str, realtime: bool,
                   spin: bool = False) -> list[str]:
    argv = [binary, "--schedule", schedule, "--request", request, "--terminator", terminator.hex(),
            "--connections", str(connections), "--start-at", repr(start_at), "--drain", str(drain),
            "--out", out]
    if realtime:
        argv.append("--realtime")
    if spin:
        argv.append("--spin")
    for s in sockets:
        argv += ["--socket", s]
    return argv


def run_engines(binary: str, sockets: list[str], request: bytes, terminator: bytes, times: array, which: array,
                start_at: float, drain: float, connections: int, processes: int, realtime: bool,
                workdir: str, spin: bool = False) -> Records:
    """The schedule sent by `processes` compiled engines at once, each to its share of the servers; `spin`:
    each polls without sleeping (for CPUs of their own)."""
    req = os.path.join(workdir, "request.bin")
    with open(req, "wb") as f:
        f.write(request)
    parts = [p for p in split_by_server(which, min(processes, len(sockets))) if p[2]]
    running = []
    for k, (idx, local, servers) in enumerate(parts):
        schedule, out = os.path.join(workdir, f"schedule{k}.bin"), os.path.join(workdir, f"records{k}.bin")
        write_schedule(schedule, array("d", (times[i] for i in idx)), local)
        argv = engine_command(binary, schedule, req, terminator, [sockets[s] for s in servers], connections,
                              start_at, drain, out, realtime, spin)
        running.append((idx, out, subprocess.Popen(argv, stdin=subprocess.DEVNULL)))
    for _, _, p in running:
        if p.wait() != 0:
            raise RuntimeError(f"the compiled client exited {p.returncode}")
    return merge_records(len(times), [(idx, read_records(out)) for idx, out, _ in running])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="open-loop client (see the module docstring)")
    p.add_argument("--socket", action="append", required=True, help="a server's UNIX socket (repeat)")
    p.add_argument("--request-hex", required=True, help="one request, hex-encoded")
    p.add_argument("--rate", type=float, required=True, help="requests per second, all servers together")
    p.add_argument("--low-rate", type=float, help="follow half a sine from this rate up to --rate and back")
    p.add_argument("--window", type=float, default=10.0, help="seconds per window of the windows' p99s")
    p.add_argument("--response-end-hex", default="0a", help="what ends a response, hex-encoded (default: newline)")
    p.add_argument("--warmup", type=float, default=0.0, help="seconds sent first and not counted")
    p.add_argument("--seconds", type=float, required=True, help="seconds counted, after the warm-up")
    p.add_argument("--start-at", type=float, required=True, help="time.monotonic() when sending starts")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--connections", type=int, default=2, help="connections per server")
    p.add_argument("--drain", type=float, default=2.0, help="seconds to wait for answers after the last send")
    p.add_argument("--realtime", action="store_true", help="run as SCHED_FIFO (see the module docstring)")
    p.add_argument("--spin", action="store_true",
                   help="the compiled engines poll without sleeping (for CPUs of their own: bench-qos --client-cpus)")
    p.add_argument("--engine", choices=("python", "c"), default="python",
                   help="who sends: this process (python) or the compiled engine (c, --binary)")
    p.add_argument("--binary", help="the compiled engine (scripts/build-client)")
    p.add_argument("--processes", type=int, default=1, help="engines at once, the servers split among them")
    p.add_argument("--workdir", default=None, help="the engine's schedule and record files (default: by --out)")
    p.add_argument("--out", required=True, help="JSON summary")
    args = p.parse_args(argv)
    if args.engine == "c":
        return _main_compiled(args)
    try:        # timer slack 1 ns: wake for the next send on time, not up to 50 µs late
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    scheduling = "normal"
    if args.realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
            scheduling = "SCHED_FIFO"
        except OSError as e:       # e.g. a v1 cpu cgroup without RT runtime: say so in the summary
            scheduling = f"normal (SCHED_FIFO refused: {e.strerror})"
    times, which = poisson_schedule(args.rate, args.warmup + args.seconds, len(args.socket), args.seed, args.low_rate)
    conns = connect(args.socket, args.connections)
    time.sleep(max(args.start_at - time.monotonic(), 0.0))
    cpu0 = _cpu_seconds()
    outcome = run_open_loop(conns, bytes.fromhex(args.request_hex), times, which, args.start_at, args.drain,
                            record_from=args.warmup, terminator=bytes.fromhex(args.response_end_hex))
    cpu = _cpu_seconds() - cpu0
    elapsed = max(time.monotonic() - args.start_at, args.warmup + args.seconds)
    with open(args.out, "w") as f:
        json.dump({**summary(outcome, args.rate, args.seconds, cpu / elapsed, args.window),
                   "scheduling": scheduling}, f)
    return 0


def _main_compiled(args: argparse.Namespace) -> int:
    if not args.binary:
        raise SystemExit("--engine c needs --binary")
    times, which = poisson_schedule(args.rate, args.warmup + args.seconds, len(args.socket), args.seed, args.low_rate)
    workdir = args.workdir or os.path.dirname(os.path.abspath(args.out))
    rec = run_engines(args.binary, args.socket, bytes.fromhex(args.request_hex), bytes.fromhex(args.response_end_hex),
                      times, which, args.start_at, args.drain, args.connections, args.processes, args.realtime,
                      workdir, args.spin)
    outcome = outcome_from_records(times, args.start_at, args.warmup, rec)
    elapsed = max(rec.end - args.start_at, args.warmup + args.seconds)
    scheduling = "SCHED_FIFO" if rec.realtime else ("normal (SCHED_FIFO refused)" if args.realtime else "normal")
    with open(args.out, "w") as f:
        json.dump({**summary(outcome, args.rate, args.seconds, rec.cpu / elapsed, args.window),
                   "scheduling": f"{scheduling}, compiled ({min(args.processes, len(args.socket))} processes)"}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
