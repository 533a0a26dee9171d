"""Issue 25, defect 10: the metrics endpoint cannot be exhausted. Hundreds of clients trickling their
requests and a few sending huge headers cost no thread each and no unbounded memory, a request has one
deadline from accept (not a timeout per read), and /healthz (the liveness probe) answers all the while.
"""
from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from koordd.runtime.endpoint import DEADLINE, MAX_HEAD
from koordd.runtime.metrics import Exporter, MetricsServer
from koordtest.metricsnode import free_port

PROBE_TIMEOUT = 5.0        # deploy/kubernetes/daemonset.yaml: the liveness probe's timeoutSeconds


@pytest.fixture
def endpoint():
    exporter = Exporter()
    exporter.beat(time.monotonic() + 3600, True)      # healthy for the whole test
    started = []

    def start(**limits):
        srv = MetricsServer.start(f"127.0.0.1:{free_port()}", exporter, **limits)
        assert srv is not None
        started.append(srv)
        return srv
    yield start
    for srv in started:
        srv.stop()


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT)
    return s


def healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=PROBE_TIMEOUT) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def answer_or_close(s: socket.socket, wait: float) -> bytes | None:
    """What the server sent before closing the connection (b"" or a reset: closed without a word);
    None when it neither answered nor closed within `wait` seconds."""
    s.settimeout(wait)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except socket.timeout:
        return None
    except ConnectionResetError:
        pass
    return got


def test_a_flood_of_slow_and_huge_requests_takes_no_thread_each_and_healthz_answers(endpoint):
    srv = endpoint()                # the limits koordd runs with
    threads_before = threading.active_count()
    slow, huge = [], []
    try:
        for _ in range(400):        # each starts a request and trickles the rest of it
            s = connect(srv.port)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        line = b"X-Padding: " + b"a" * 1000 + b"\r\n"
        for _ in range(10):         # each sends 64 KiB of headers and never ends them
            s = connect(srv.port)
            try:
                s.sendall(b"GET /metrics HTTP/1.1\r\n" + line * 64)
            except OSError:
                pass                # refused and closed mid-send: what the bound is for
            huge.append(s)
        for s in slow[-50:]:        # the newest still trickle
            try:
                s.sendall(b"X-More: 1\r\n")
            except OSError:
                pass
        assert healthz(srv.port) == (200, "ok\n")
        # No thread per connection: the endpoint's own thread serves them all.
        assert threading.active_count() <= threads_before + 2, threading.active_count() - threads_before
        for s in huge:              # headers past the bound: 431 (or closed), not read on and on
            got = answer_or_close(s, PROBE_TIMEOUT * 2)
            assert got is not None, "a request with 64 KiB of headers is still being read"
            assert got == b"" or got.startswith(b"HTTP/1.1 431 "), got[:80]
    finally:
        for s in slow + huge:
            s.close()
    assert healthz(srv.port) == (200, "ok\n")


def test_a_request_trickled_a_byte_at_a_time_ends_at_one_deadline_from_accept(endpoint):
    srv = endpoint()
    s = connect(srv.port)
    s.sendall(b"GET /healthz HTTP/1.1\r\n")
    started = time.monotonic()
    closed = False
    try:
        # Each byte comes well within any timeout per read; only a deadline for the whole request ends it.
        while not closed and time.monotonic() - started < DEADLINE * 4:
            try:
                s.sendall(b"x")
                s.settimeout(0.2)
                s.recv(4096)            # an answer (408) or b"": the server ended the request
                closed = True
            except socket.timeout:
                pass
            except OSError:
                closed = True
    finally:
        s.close()
    assert closed, f"a request trickled for {DEADLINE * 4:g}s is still open"
    assert healthz(srv.port) == (200, "ok\n")


def test_past_the_connection_cap_the_oldest_unfinished_request_makes_room(endpoint):
    srv = endpoint(max_connections=4)
    pending = [connect(srv.port) for _ in range(4)]
    for s in pending:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
    assert healthz(srv.port) == (200, "ok\n")           # the fifth: the first pending one gave way
    assert answer_or_close(pending[0], PROBE_TIMEOUT) == b""
    for s in pending:
        s.close()


def test_headers_one_byte_past_the_bound_are_431_and_bad_requests_are_refused(endpoint):
    srv = endpoint()
    s = connect(srv.port)
    head = b"GET /healthz HTTP/1.1\r\nX: "
    s.sendall(head + b"a" * (MAX_HEAD + 1 - len(head)))
    assert (answer_or_close(s, PROBE_TIMEOUT) or b"").startswith(b"HTTP/1.1 431 ")
    s.close()
    for request, status in ((b"POST /metrics HTTP/1.1\r\n\r\n", b"405"), (b"hello\r\n\r\n", b"400"),
                            (b"GET /healthz HTTP/1.0\n\n", b"200"), (b"GET /nope HTTP/1.1\r\n\r\n", b"404")):
        s = connect(srv.port)
        s.sendall(request)
        assert (answer_or_close(s, PROBE_TIMEOUT) or b"").startswith(b"HTTP/1.1 " + status + b" "), request
        s.close()
    s = connect(srv.port)
    s.sendall(b"HEAD /healthz HTTP/1.1\r\n\r\n")
    got = answer_or_close(s, PROBE_TIMEOUT) or b""
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"\r\n\r\n") and b"Content-Length: 3" in got
    s.close()
