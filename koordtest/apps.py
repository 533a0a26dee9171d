"""Small servers, their clients and host checks for the tests and benchmarks of the application latency
sensor and the SLOs (tests/kernel/test_app_latency_kernel.py, tests/kernel/test_slo_kernel.py,
scripts/bench-app-latency --steering)."""
from __future__ import annotations

import socket
import threading
import time

from koordd.kernel.libbpf import BpfError, libbpf
from koordd.sensors.cgroup_hist import KERNEL_BTF

TRACEPOINTS = (b"btf_trace_sk_data_ready", b"btf_trace_sock_recv_length", b"btf_trace_sock_send_length")

def server_source(arguments: str, backlog: int, serve: str) -> str:
    """The source of a small server (`python -c` it): `arguments` reads sys.argv into at least `kind` ("tcp":
    on a free port of 127.0.0.1, or "unix") and `where` (a UNIX socket's path); it listens with `backlog`,
    prints its address (the port, or the path) once listening, and gives each connection `c` a thread that
    runs `serve` (statements indented for a function's body)."""
    return r"""
import socket, sys, threading, time
""" + arguments + r"""
if kind == "tcp":
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    where = str(s.getsockname()[1])
else:
    s = socket.socket(socket.AF_UNIX)
    s.bind(where)
s.listen(""" + str(backlog) + r""")
print(where, flush=True)

def serve(c):
""" + serve + r"""

while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
"""


def each_line(answer: str) -> str:
    """A connection's body that runs `answer` (statements indented for the loop's body) for each `line`."""
    return r"""
    with c, c.makefile("rb") as requests:
        for line in requests:
""".lstrip("\n") + answer


# One request per line, each answered after `delay` seconds.
SERVER = server_source("kind, delay, where = sys.argv[1], float(sys.argv[2]), sys.argv[3]", 16, each_line(r"""
            time.sleep(delay)
            c.sendall(b"ok\n")""".lstrip("\n")))

# Clients steering the measurement (issue 35, item 9): a server that answers "ping" at once and "wait <ms>"
# after that many milliseconds, one thread per connection.
STEERED_SERVER = server_source("kind, where = sys.argv[1], sys.argv[2]", 64, each_line(r"""
            if line.startswith(b"wait "):
                time.sleep(int(line[5:]) / 1000)
            c.sendall(b"ok\n")""".lstrip("\n")))

# As an event loop serves (redis, memcached): each read takes whatever requests have come, `delay` seconds
# of work each, and one send answers them all. Requests that come while it works wait on the socket.
BATCH_SERVER = server_source("kind, delay, where = sys.argv[1], float(sys.argv[2]), sys.argv[3]", 16, r"""
    with c:
        while data := c.recv(65536):
            n = data.count(b"\n")
            time.sleep(delay * n)
            c.sendall(b"ok\n" * n)""".lstrip("\n"))


# A server that falls behind: requests of a fixed `size` in bytes, each read whole and answered after `delay`
# seconds, one at a time. Clients that send faster fill its socket, and the rest of their requests wait in them.
BEHIND_SERVER = server_source("kind, size, delay, where = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), "
                              "sys.argv[4]", 16, r"""
    with c:
        while True:
            request = b""
            while len(request) < size:
                if not (chunk := c.recv(size - len(request))):
                    return
                request += chunk
            time.sleep(delay)
            c.sendall(b"ok\n")""".lstrip("\n"))


def connect(kind: str, address: str) -> socket.socket:
    if kind == "tcp":
        return socket.create_connection(("127.0.0.1", int(address)))
    c = socket.socket(socket.AF_UNIX)
    c.connect(address)
    return c


def ask(c: socket.socket, *parts: bytes, pause: float = 0.0) -> float:
    """Send a request in `parts`, `pause` s apart; the µs from its last part's send to the whole answer."""
    for i, part in enumerate(parts):
        if i:
            time.sleep(pause)
        t0 = time.perf_counter()
        c.sendall(part)
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = c.recv(64)
        if not chunk:
            raise ConnectionError("the server hung up")
        answer += chunk
    return (time.perf_counter() - t0) * 1e6


# The steering cases' clients (issue 35), against STEERED_SERVER at `address` (`kind`: "tcp" or "unix"): each
# gives the µs the clients waited, from a request's last bytes to its whole answer.
def pings(kind: str, address: str, n: int = 300) -> list[float]:
    """`n` pings, one after another on one connection."""
    with connect(kind, address) as c:
        return [ask(c, b"ping\n") for _ in range(n)]


def half_sent(kind: str, address: str) -> list[float]:
    """30 clients send half a request, wait 150 ms and send the rest, twice each, while another sends 300
    pings: all 360 waits."""
    waited: list[float] = []

    def slow_client():
        with connect(kind, address) as c:
            for _ in range(2):
                waited.append(ask(c, b"pi", b"ng\n", pause=0.15))

    threads = [threading.Thread(target=slow_client) for _ in range(30)]
    for t in threads:
        t.start()
    waited += pings(kind, address)
    for t in threads:
        t.join()
    return waited


def flood(kind: str, address: str) -> list[float]:
    """60,000 pings on one connection while another sends 40 "wait 24": the 40 slow waits."""
    started = threading.Event()

    def flooder():
        with connect(kind, address) as c:
            started.set()
            for _ in range(60_000):
                ask(c, b"ping\n")

    thread = threading.Thread(target=flooder)
    thread.start()
    started.wait()
    with connect(kind, address) as c:
        slow = [ask(c, b"wait 24\n") for _ in range(40)]
    thread.join()
    return slow


def queued(kind: str, address: str, delay: float, bursts: int = 10, size: int = 4) -> list[float]:
    """Against BATCH_SERVER answering after `delay`: `bursts` times, `size` requests on one connection,
    `delay / size` apart, so that all but the first come while the server works on the first (a queue on
    the connection); each request's µs from its send to its answer."""
    took: list[float] = []
    with connect(kind, address) as c:
        for _ in range(bursts):
            sent = []
            for i in range(size):
                if i:
                    time.sleep(delay / size)
                sent.append(time.perf_counter())
                c.sendall(b"get\n")
            answered = 0
            while answered < size:
                chunk = c.recv(64)
                if not chunk:
                    raise ConnectionError("the server hung up")
                now = time.perf_counter()
                for _ in range(chunk.count(b"\n")):
                    took.append((now - sent[answered]) * 1e6)
                    answered += 1
            time.sleep(delay)
    return took


def crowd(kind: str, address: str, size: int, seconds: float) -> int:
    """Against BEHIND_SERVER: requests of `size` bytes sent on one connection as fast as its socket takes them
    for `seconds` (a writer that blocks once the socket is full), then every answer read: their number."""
    with connect(kind, address) as c:
        sent = [0]

        def writer():
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                c.sendall(b"x" * size)
                sent[0] += 1

        thread = threading.Thread(target=writer)
        thread.start()
        answers = 0
        while True:
            chunk = c.recv(4096)
            if not chunk:
                raise ConnectionError("the server hung up")
            answers += chunk.count(b"\n")
            if not thread.is_alive() and answers >= sent[0]:
                return answers


def one_by_one(kind: str, address: str, size: int, n: int) -> int:
    """Against BEHIND_SERVER: `n` requests of `size` bytes, each sent once the answer before came: its number."""
    with connect(kind, address) as c:
        for _ in range(n):
            c.sendall(b"x" * size)
            if not c.recv(64).endswith(b"\n"):
                raise ConnectionError("the server hung up")
    return n


def lacks_ebpf() -> str | None:
    """What this host lacks for any of koordd's BPF programs, if anything: libbpf or the kernel's BTF."""
    try:
        libbpf()
    except BpfError as e:
        return str(e)
    return None if KERNEL_BTF.exists() else f"no {KERNEL_BTF}"


def lacks_tracepoints() -> str | None:
    """The program's tracepoints the kernel lacks (before Linux 6.6), if any."""
    btf = KERNEL_BTF.read_bytes()
    missing = [t.decode() for t in TRACEPOINTS if t not in btf]
    return f"the kernel has no {', '.join(missing)} (Linux 6.6+)" if missing else None
