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
    latencies, lags, unfinished, sent_at = array("d"), array("d"), array("d"), array("d")
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
            _flush(c)
            in_flight += 1
            i += 1
        if (i >= n and in_flight == 0) or now >= deadline:
            break
        wait = (start_at + times[i] if i < n else deadline) - now
        writers = [c.sock for c in by_fd.values() if c.unsent]
        # select() sleeps on a high-resolution timer (epoll rounds timeouts up to whole ms)
        readable, writable, _ = select.select(list(by_fd), writers, [], max(wait, 0.0))
        for s in writable:
            _flush(by_fd[s.fileno()])
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
    return Outcome(latencies, lags, errors, array("d", (end - t for t in late)), sent_at,
                   array("d", (t - counted_from for t in late)))


def _flush(c: _Connection) -> None:
    """Send what the socket buffer takes now, in order."""
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


def window_p99s(outcome: Outcome, seconds: float, window: float) -> list[dict]:
    """count and p99 (seconds; None without requests) of each `window` seconds of the counted time, each
    request (unfinished ones with their wait so far) in the window of its intended send time; a last
    window shorter than half a window joins the one before it."""
    n = max(1, round(seconds / window)) if window > 0 else 1
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
            "client_cpu": client_cpu}


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


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
    p.add_argument("--out", required=True, help="JSON summary")
    args = p.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
