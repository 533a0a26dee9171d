"""An SLO's latency from a synthetic probe (`[classes.slo] source = "probe"`), as a blackbox prober does.

A worker thread opens a fresh connection to the declared address ("tcp://host:port" or "unix:/path"; no
other) every `probe_interval`, sends `probe_send` and times from the connect to the answer's first byte;
where `probe_expect` is set, the answer must start with it. An answer later than the timeout (probe_timeout,
else latency_p99 x 10, at most 5 s), or none by then, counts as a response at the timeout: a late answer
is a violation, not unknown. A refused connection, a closed one without an answer or a wrong answer leaves
the round without an entry (unknown), with one log line per kind of failure.

The exchange is koordd/kernel/netpeer.py's: one deadline (the timeout) from the name lookup to the answer,
ended at once by a stop. A UNIX socket is connected only where no other user could have replaced it or
a directory on its path (netpeer.open_unix_path): koordd runs as root, and a service must not make it
connect, with root's credentials, to a socket the service itself could not open.
"""
from __future__ import annotations

import time

from koordd.core.slo import SOURCES, SloTarget, parse_probe
from koordd.core.snapshot import AppLatency
from koordd.kernel.netpeer import Cancel, Deadline, PeerError, Resolver, connect_tcp, connect_unix
from koordd.sensors.declared import SLOTS, DeclaredSourceSensor, Worker, slot_of_us, summarize


class Unknown(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def probe_once(address: str, send: bytes, expect: bytes, timeout: float, cancel: Cancel | None = None,
               resolver: Resolver | None = None) -> float:
    """Seconds from the connect to the answer's first byte, or `timeout` where none came by then;
    Unknown (kind, message) where the target refused, closed without answering, or answered otherwise,
    where its name did not resolve, where its UNIX socket's path is one another user could replace
    (netpeer.open_unix_path), or where `cancel` was set ("cancelled"). One deadline, `timeout` from the
    start, bounds it all: the name lookup, the connect, the request and the answer."""
    kind, where = parse_probe(address)
    deadline = Deadline(timeout, cancel)
    try:
        if kind == "unix":
            began = time.monotonic()
            conn = connect_unix(where, deadline)
        else:
            resolver = resolver or Resolver(0)
            resolver.resolve(*where, deadline)          # the lookup is no part of the service's latency
            began = time.monotonic()
            conn = connect_tcp(*where, deadline, resolver)
    except PeerError as e:
        if e.kind == "timeout":
            return timeout
        if e.kind == "refused":
            raise Unknown("refused", f"{address} refused the connection") from None
        raise Unknown(e.kind, f"{address}: {e}") from None
    answer, first = b"", None
    with conn:
        try:
            conn.send_all(send)
            while True:
                chunk = conn.recv(max(len(expect) - len(answer), 1))
                if not chunk:
                    break
                first = first if first is not None else time.monotonic()
                answer += chunk
                if len(answer) >= len(expect):
                    break
        except PeerError as e:
            if e.kind == "timeout":
                if first is None:
                    return timeout
                raise Unknown("wrong answer", f"{address} answered {answer[:40]!r}, not {expect[:40]!r}, "
                                              f"within {timeout:g}s") from None
            raise Unknown(e.kind, f"{address}: {e}") from None
    if first is None:
        raise Unknown("no answer", f"{address} closed the connection without answering")
    if not answer.startswith(expect):
        raise Unknown("wrong answer", f"{address} answered {answer[:40]!r}, not {expect[:40]!r}")
    return min(first - began, timeout)


class Prober(Worker):
    def __init__(self, target: SloTarget):
        super().__init__(target, f"probe {target.probe}")
        self.send = target.probe_send.encode()
        self.expect = target.probe_expect.encode()
        self.slots = [0] * SLOTS            # since the last round: bounded whatever the interval
        self.count, self.total_us = 0, 0.0
        self.unknown = True                 # the latest probe failed (or none completed)

    def measure(self) -> None:
        while not self.halt.is_set():
            began = time.monotonic()
            try:
                seconds = probe_once(self.target.probe, self.send, self.expect, self.target.timeout, self.halt,
                                     self.resolver)
            except Unknown as e:
                if e.kind == "cancelled":
                    break
                with self.lock:
                    self.unknown = True
                self.failed(e.kind, str(e))
            except Exception as e:  # noqa: BLE001 - nothing a target answers may end the worker
                with self.lock:
                    self.unknown = True
                self.failed("error", f"probe failed: {e!r}")
            else:
                us = seconds * 1e6
                with self.lock:
                    self.slots[slot_of_us(us)] += 1
                    self.count += 1
                    self.total_us += us
                    self.unknown = False
                self.recovered()
            self.halt.wait(max(self.target.probe_interval - (time.monotonic() - began), 0.001))

    def take(self) -> AppLatency | None:
        with self.lock:
            slots, count, total, unknown = self.slots, self.count, self.total_us, self.unknown
            self.slots, self.count, self.total_us = [0] * SLOTS, 0, 0.0
        if unknown:
            return None
        top = max((i for i, n in enumerate(slots) if n), default=-1)
        return summarize(tuple(slots[:top + 1]), total, count)


class SloProbeSensor(DeclaredSourceSensor):
    """Section SOURCES["probe"]: class root -> AppLatency of the round, from the probe its SLO declares."""
    name = SOURCES["probe"]
    source = "probe"
    features = {}

    def worker(self, target: SloTarget) -> Worker:
        return Prober(target)
