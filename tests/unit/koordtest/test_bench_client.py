"""The compiled open-loop client (koordtest/bench/client/openloop.c) and the Python that drives it: the
schedule split among engines, their records merged, and the records turned into latencies, send lags and
unanswered requests exactly as the Python loop counts them. One test builds and runs the engine where the
host has a C compiler (skipped where it has none)."""
from __future__ import annotations

import math
import os
import shutil
import socket
import threading
import time
from array import array
from pathlib import Path

import pytest

from koordtest.bench.client_build import SOURCE, build, cc_command
from koordtest.bench.openloop import (Records, connect, engine_command, merge_records, outcome_from_records,
                                      poisson_schedule, read_records, run_engines, run_open_loop, split_by_server,
                                      summary, write_schedule)

NAN = math.nan


def records(due, answered, errors=None, end=10.0, cpu=0.1, realtime=False, written=None) -> Records:
    return Records(array("d", due), array("d", answered), bytes(errors or [0] * len(due)), end, cpu, realtime,
                   array("d", written if written is not None else due))


def test_send_lag_runs_from_the_intended_time_to_when_the_client_handed_the_request_over():
    times = array("d", [0.5, 1.0, 2.0])
    rec = records(due=[100.5002, 101.003, 102.0001], answered=[100.6, 101.5, 102.2])
    out = outcome_from_records(times, start_at=100.0, record_from=0.0, rec=rec)
    assert [round(x, 6) for x in out.send_lags] == [0.0002, 0.003, 0.0001]
    # latency includes the lag: counted from the intended time, not from the actual send
    assert [round(x, 6) for x in out.latencies] == [0.1, 0.5, 0.2]
    assert summary(out, rate=1.0, seconds=3.0, client_cpu=0.0)["send_lag_p99"] == pytest.approx(0.003)


def test_a_request_the_servers_socket_could_not_take_waits_in_the_client_until_written_or_the_end():
    times = array("d", [0.5, 1.0, 2.0])
    rec = records(due=[100.5, 101.0, 102.0], answered=[100.6, 101.9, NAN], written=[100.5001, 101.4, NAN], end=104.0)
    out = outcome_from_records(times, start_at=100.0, record_from=0.0, rec=rec)
    assert [round(x, 6) for x in out.socket_waits] == [0.0001, 0.4, 2.0]     # never written: until the end
    got = summary(out, rate=1.0, seconds=3.0, client_cpu=0.0)
    assert got["socket_wait_max"] == pytest.approx(2.0) and got["socket_wait_share"] == pytest.approx(2 / 3)


def test_warm_up_is_not_counted_and_unanswered_requests_wait_until_the_engine_ends():
    times = array("d", [0.1, 1.5, 2.5])
    rec = records(due=[100.1, 101.5, 102.5], answered=[100.2, NAN, 102.6], errors=[1, 0, 1], end=105.0)
    out = outcome_from_records(times, start_at=100.0, record_from=1.0, rec=rec)
    assert list(out.unfinished) == [pytest.approx(3.5)] and list(out.unfinished_at) == [pytest.approx(0.5)]
    assert [round(x, 6) for x in out.latencies] == [0.1] and [round(x, 6) for x in out.sent_at] == [1.5]
    assert len(out.send_lags) == 2            # the warm-up's request is not counted
    assert out.errors == 1                    # only the counted error


def test_the_schedule_splits_by_server_and_merges_back_in_place():
    times, which = poisson_schedule(rate=500, seconds=1, servers=5, seed=4)
    parts = split_by_server(which, 2)
    assert [p[2] for p in parts] == [[0, 2, 4], [1, 3]]
    assert sorted(i for idx, _, _ in parts for i in idx) == list(range(len(times)))
    for idx, local, servers in parts:
        assert [servers[j] for j in local] == [which[i] for i in idx]
    # each engine answers its own requests at 1000 + the global index; merged, each lands where it belongs
    merged = merge_records(len(times), [(idx, records(due=[float(i) for i in idx], answered=[1000.0 + i for i in idx],
                                                      end=5.0 + k, cpu=0.5))
                                        for k, (idx, _, _) in enumerate(parts)])
    assert list(merged.answered) == [1000.0 + i for i in range(len(times))]
    assert merged.end == 6.0 and merged.cpu == 1.0


def test_schedule_and_record_files_round_trip(tmp_path):
    path = tmp_path / "rec.bin"
    n = 3
    due, answered, written = array("d", [1.0, 2.0, 3.0]), array("d", [1.5, NAN, 3.5]), array("d", [1.1, 2.2, 3.3])
    path.write_bytes(n.to_bytes(8, "little") + due.tobytes() + answered.tobytes() + written.tobytes()
                     + bytes([0, 0, 1]) + array("d", [9.0, 0.25]).tobytes() + b"\x01")
    rec = read_records(str(path))
    assert list(rec.due) == [1.0, 2.0, 3.0] and math.isnan(rec.answered[1]) and rec.errors == b"\x00\x00\x01"
    assert list(rec.written) == [1.1, 2.2, 3.3]
    assert (rec.end, rec.cpu, rec.realtime) == (9.0, 0.25, True)
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ValueError):
        read_records(str(path))
    write_schedule(str(tmp_path / "s.bin"), array("d", [0.5]), array("i", [7]))
    assert (tmp_path / "s.bin").read_bytes() == (1).to_bytes(8, "little") + array("d", [0.5]).tobytes() + \
        array("i", [7]).tobytes()


def test_the_build_is_static_unless_asked():
    assert "-static" in cc_command(Path("/x/openloop-c"))
    assert "-static" not in cc_command(Path("/x/openloop-c"), static=False)
    assert cc_command(Path("/x/b"))[-2:] == [str(SOURCE), "-lm"]


def _line_server(path: str, stop: threading.Event, reply: bytes) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    srv.settimeout(0.2)

    def serve_one(conn):
        conn.settimeout(0.2)
        while not stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return
            conn.sendall(reply * data.count(b"\n"))

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()
        srv.close()
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    return t


@pytest.mark.skipif(not shutil.which(os.environ.get("CC", "cc")), reason="no C compiler on this host")
@pytest.mark.parametrize("spin", [False, True])
def test_the_engine_answers_every_request_over_two_processes(tmp_path, spin):
    binary = tmp_path / "openloop-c"
    build(binary)
    stop = threading.Event()
    sockets = [str(tmp_path / f"s{i}.sock") for i in range(3)]
    for i, s in enumerate(sockets):
        _line_server(s, stop, b"-ERR\n" if i == 2 else b"+OK\n")
    try:
        times, which = poisson_schedule(rate=2000, seconds=0.3, servers=3, seed=2)
        start = time.monotonic() + 0.2
        rec = run_engines(str(binary), sockets, b"PING\n", b"\n", times, which, start, drain=2.0, connections=2,
                          processes=2, realtime=False, workdir=str(tmp_path), spin=spin)
    finally:
        stop.set()
    out = outcome_from_records(times, start, 0.0, rec)
    assert len(out.latencies) == len(times) and not out.unfinished
    assert out.errors == list(which).count(2)          # server 2 answers errors only
    assert all(lag >= 0 for lag in out.send_lags) and all(lat > 0 for lat in out.latencies)


def _stalled_server(path: str, stall: float, done: threading.Event) -> None:
    """Accepts one connection, reads nothing for `stall` seconds (the client's requests fill the socket), then
    answers each line with one."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        time.sleep(stall)
        conn.settimeout(0.2)
        while not done.is_set():
            try:
                data = conn.recv(1 << 20)
            except TimeoutError:
                continue
            if not data:
                break
            conn.sendall(b"+OK\n" * data.count(b"\n"))
        conn.close()
        srv.close()
    threading.Thread(target=serve, daemon=True).start()


@pytest.mark.parametrize("engine", ["c", "python"])
def test_requests_a_stalled_server_leaves_outside_its_socket_wait_in_the_client_and_the_summary_says_so(tmp_path,
                                                                                                    engine):
    """docs/app-latency.md: where a server falls behind by more than its socket's buffer the rest of the
    requests wait in the client, which no server-side measurement sees. Ten 256 KiB requests 10 ms apart to a
    server that reads nothing for 0.6 s: the later ones cannot go into the socket until it reads."""
    if engine == "c" and not shutil.which(os.environ.get("CC", "cc")):
        pytest.skip("no C compiler on this host")
    binary = tmp_path / "openloop-c"
    if engine == "c":
        build(binary)
    path, done = str(tmp_path / "stall.sock"), threading.Event()
    _stalled_server(path, 0.6, done)
    request = b"x" * (64 * 1024 - 1) + b"\n"
    times, which = array("d", [0.01 * i for i in range(10)]), array("i", [0] * 10)
    start = time.monotonic() + 0.2
    try:
        if engine == "c":
            rec = run_engines(str(binary), [path], request, b"\n", times, which, start, drain=3.0, connections=1,
                              processes=1, realtime=False, workdir=str(tmp_path))
            out = outcome_from_records(times, start, 0.0, rec)
        else:
            out = run_open_loop(connect([path], 1), request, times, which, start, drain=3.0)
    finally:
        done.set()
    got = summary(out, rate=100.0, seconds=0.1, client_cpu=0.0)
    assert len(out.latencies) == 10, got
    waits = list(out.socket_waits)
    assert waits[0] < 0.1 and waits[-1] > 0.3 and got["socket_wait_share"] >= 0.5, (engine, waits)   # the first fit


def test_the_engine_is_told_to_spin_only_when_asked():
    """--spin makes the compiled engine poll without sleeping (bench-qos passes it with --client-cpus)."""
    argv = engine_command("openloop-c", "s.bin", "r.bin", b"\n", ["a.sock"], 2, 1.0, 2.0, "o.bin", False)
    assert "--spin" not in argv
    assert "--spin" in engine_command("openloop-c", "s.bin", "r.bin", b"\n", ["a.sock"], 2, 1.0, 2.0, "o.bin",
                                      False, spin=True)
