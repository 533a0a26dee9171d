"""scripts/bench-qos's open-loop client: the schedule is fixed in advance, requests go out on it whatever
the server does, and latency counts from the intended send time."""
from __future__ import annotations

import math
import socket
import threading
import time

import pytest

from koordtest.bench.openloop import poisson_schedule, run_open_loop, sine_rate, summary


def test_schedule_is_poisson_at_the_rate():
    times, which = poisson_schedule(rate=2000, seconds=10, servers=3, seed=7)
    assert abs(len(times) - 20000) < 4 * 20000 ** 0.5             # Poisson count: within 4 sigma
    assert all(0 < a < b < 10 for a, b in zip(times, times[1:]))
    gaps = [b - a for a, b in zip(times, times[1:])]
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(1 / 2000, rel=0.05)
    # exponential gaps: the standard deviation equals the mean
    assert (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 == pytest.approx(mean, rel=0.05)
    assert {w for w in which} == {0, 1, 2} and abs(which.tolist().count(0) - len(which) / 3) < 0.05 * len(which)


def test_schedule_depends_on_its_arguments_only():
    assert poisson_schedule(500, 2, 2, seed=1) == poisson_schedule(500, 2, 2, seed=1)
    assert poisson_schedule(500, 2, 2, seed=1) != poisson_schedule(500, 2, 2, seed=2)


def stalling_server(sock: socket.socket, until: float, reply: bytes = b"\n", answer: bool = True,
                    seen: list | None = None):
    """Reads nothing until `until` (time.monotonic()), then answers every request at once (and appends
    how many each read held to `seen`)."""
    def serve():
        time.sleep(max(until - time.monotonic(), 0))
        sock.settimeout(0.5)
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                if seen is not None:
                    seen.append(data.count(b"\n"))
                if answer:
                    sock.sendall(reply * data.count(b"\n"))
        except (TimeoutError, OSError):
            return
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_requests_go_out_on_schedule_while_the_server_stalls():
    client, server = socket.socketpair()
    times, which = poisson_schedule(rate=400, seconds=0.1, servers=1, seed=3)
    start = time.monotonic() + 0.05
    stall_end = start + 0.3
    stalling_server(server, stall_end)
    out = run_open_loop([[client]], b"\n", times, which, start, drain=1.0)
    assert len(out.latencies) == len(times) and not out.unfinished and out.errors == 0
    # Open loop: every request left on time although none was answered (a closed loop would have waited).
    assert max(out.send_lags) < 0.05
    # Each latency is the stall's end minus its own intended send time: the queue the stall built.
    for intended, latency in zip(times, out.latencies):
        assert latency == pytest.approx(stall_end - (start + intended), abs=0.05)
    assert out.latencies[0] > out.latencies[-1]


def test_unanswered_requests_count_with_their_wait_until_the_drain_ends():
    client, server = socket.socketpair()
    times, which = poisson_schedule(rate=200, seconds=0.05, servers=1, seed=4)
    start = time.monotonic() + 0.02
    stalling_server(server, start, answer=False)
    out = run_open_loop([[client]], b"\n", times, which, start, drain=0.1)
    assert len(out.unfinished) == len(times) and not out.latencies
    assert min(out.unfinished) >= 0.1 - 0.01                   # the last request waited the whole drain
    s = summary(out, rate=200, seconds=0.05, client_cpu=0.01)
    assert (s["answered"], s["unfinished"], s["count"], s["sent"]) == (0, len(times), len(times), len(times))
    assert s["p50"] >= 0.09


def test_error_replies_are_counted_and_requests_spread_over_connections():
    pairs = [socket.socketpair() for _ in range(2)]
    times, which = poisson_schedule(rate=500, seconds=0.04, servers=1, seed=5)
    start = time.monotonic() + 0.02
    seen = [[], []]
    for (_, server), got in zip(pairs, seen):
        stalling_server(server, start, reply=b"-ERR nope\r\n", seen=got)
    out = run_open_loop([[c for c, _ in pairs]], b"\n", times, which, start, drain=0.5)
    assert out.errors == len(times) == len(out.latencies)
    assert [sum(got) for got in seen] == [(len(times) + 1) // 2, len(times) // 2]     # in turn


def test_warm_up_requests_are_sent_but_not_counted():
    client, server = socket.socketpair()
    times, which = poisson_schedule(rate=1000, seconds=0.1, servers=1, seed=6)
    start = time.monotonic() + 0.02
    stalling_server(server, start)
    out = run_open_loop([[client]], b"\n", times, which, start, drain=0.5, record_from=0.05)
    counted = [t for t in times if t >= 0.05]
    assert len(out.latencies) == len(out.send_lags) == len(counted) < len(times)


def test_a_sine_schedule_is_low_at_the_ends_and_high_half_way():
    times, _ = poisson_schedule(rate=3000, seconds=30, servers=1, seed=8, low_rate=600)
    third = [sum(1 for t in times if lo <= t < lo + 2) / 2 for lo in (0, 14, 28)]
    # sine_rate over [0,2), [14,16), [28,30): about 830, 3000, 830 per second (Poisson: within 5 sigma)
    assert third[0] == pytest.approx(830, abs=5 * (830 / 2) ** 0.5 * 2)
    assert third[1] == pytest.approx(2990, abs=5 * (3000 / 2) ** 0.5)
    assert third[2] == pytest.approx(830, abs=5 * (830 / 2) ** 0.5 * 2)
    assert len(times) == pytest.approx(600 * 30 + 2400 * 30 * 2 / math.pi, rel=0.03)


def test_a_sine_needs_a_low_rate_under_the_rate():
    with pytest.raises(ValueError):
        poisson_schedule(rate=100, seconds=1, servers=1, seed=1, low_rate=200)
    assert sine_rate(0, 10, 1, 5) == 1 and sine_rate(5, 10, 1, 5) == 5 and sine_rate(10, 10, 1, 5) == pytest.approx(1)


def test_responses_end_at_the_terminator_not_at_a_newline():
    """memcached's multi-key get: lines inside a response, one terminator at its end."""
    client, server = socket.socketpair()
    times, which = poisson_schedule(rate=500, seconds=0.04, servers=1, seed=9)
    start = time.monotonic() + 0.02
    stalling_server(server, start, reply=b"VALUE k0 0 1\r\nv\r\nVALUE k1 0 1\r\nv\r\nEND\r\n")
    out = run_open_loop([[client]], b"\n", times, which, start, drain=0.5, terminator=b"END\r\n")
    assert len(out.latencies) == len(times) and out.errors == 0 and not out.unfinished


def test_windows_hold_each_request_by_its_intended_send_time():
    from array import array
    from koordtest.bench.openloop import Outcome, window_p99s
    # 10 s counted: a slow first window, a fast second one, one request never answered in the second
    out = Outcome(latencies=array("d", [0.5] * 100 + [0.001] * 100), send_lags=array("d"), errors=0,
                  unfinished=array("d", [2.0]), sent_at=array("d", [i * 0.05 for i in range(100)]
                                                             + [5 + i * 0.05 for i in range(100)]),
                  unfinished_at=array("d", [9.9]))
    windows = window_p99s(out, seconds=10, window=5)
    assert [w["count"] for w in windows] == [100, 101]
    assert windows[0]["p99"] == 0.5 and windows[1]["p99"] == 0.001     # 1 of 101 over: the p99 holds
    # a last window shorter than half a window joins the one before: 12 s in 10 s windows is one
    assert len(window_p99s(out, seconds=12, window=10)) == 1
    assert summary(out, rate=20, seconds=10, client_cpu=0.0, window=5)["windows"] == windows


def test_requests_behind_a_stalled_server_wait_whole_and_in_order():
    """Large requests (memcached's multi-key get) behind a server that reads nothing for a while: the socket
    buffer fills, the rest waits in the client, and every request still arrives whole and in order."""
    client, server = socket.socketpair()
    request = b"get " + b"x" * 8000 + b"\n"
    times, which = poisson_schedule(rate=2000, seconds=0.2, servers=1, seed=10)
    start = time.monotonic() + 0.02
    stalling_server(server, start + 0.3)
    out = run_open_loop([[client]], request, times, which, start, drain=2.0)
    assert len(out.latencies) == len(times) and not out.unfinished
