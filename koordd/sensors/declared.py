"""What the sensors of declared SLO sources share (core/slo.py's SOURCES "prometheus" and "probe").

Such a sensor measures a service from outside koordd's rounds: one worker thread per distinct declared
source (a rule's SLO, whichever class roots it matches), which the round never waits for. Each round
the sensor takes what each worker measured since the round before, as an AppLatency (log2-µs slots like
the app_latency sensor's, so core/health.py reads them unchanged), for every class root that declares
that source; a source whose latest attempt failed has no entry: unknown, never healthy. A worker logs
one line per kind of failure until it measures again. Memory is bounded: fixed histograms, one worker
per declared source.

Isolation: each source is measured by its own worker and taken on its own: whatever one source answers
(a garbled or absurd histogram, a take() that fails) costs that source's entry, logged once, never
another's. A worker's network exchanges go through koordd/kernel/netpeer.py, bounded by one deadline each
and cancelled by stop(): a stopped worker's thread ends within STOP_WAIT seconds, whatever its peer does.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import ClassVar, Mapping

from koordd.core.histogram import quantile_us, slot_lower_us, slot_upper_us
from koordd.core.slo import SloTarget
from koordd.core.snapshot import AppLatency
from koordd.kernel.netpeer import Cancel, Resolver
from koordd.sensors.contract import OptionalSensor, SensorContext

SLOTS = 32          # as the app_latency program's (koordd_shared.h's APP_SLOTS): up to 2^31 µs
STOP_WAIT = 1.0     # seconds stop() waits, all workers together, for their threads to end

log = logging.getLogger("koordd.slo")


def slot_of_us(us: float) -> int:
    """The log2 slot of a latency in µs: slot k holds [2^(k-1), 2^k) µs, slot 0 those under 1 µs."""
    if not us >= 1:                 # NaN too
        return 0
    if us >= 2 ** (SLOTS - 1):      # inf too: int(inf) would raise
        return SLOTS - 1
    return min(int(us).bit_length(), SLOTS - 1)


def spread(slots: list[float], lower_us: float, upper_us: float, n: float) -> None:
    """Add `n` events spread evenly over [lower_us, upper_us] (all at lower_us where the two are one)."""
    if not n > 0 or not math.isfinite(n):
        return
    top = slot_upper_us(SLOTS - 1)
    lower_us, upper_us = min(lower_us, top), min(upper_us, top)     # a bound of 1e303 s: the last slot
    if upper_us <= lower_us:
        slots[slot_of_us(lower_us)] += n
        return
    first, last = slot_of_us(lower_us), slot_of_us(upper_us)
    for k in range(first, last + 1):
        lo, hi = max(lower_us, slot_lower_us(k)), min(upper_us, slot_upper_us(k))
        if k == SLOTS - 1:
            hi = upper_us
        if hi > lo:
            slots[k] += n * (hi - lo) / (upper_us - lower_us)


def whole(slots: list[float]) -> tuple[int, ...]:
    """Fractional slot counts as whole ones with the same running total (rounded cumulatively)."""
    out, acc, given = [], 0.0, 0
    for x in slots:
        acc += x
        n = int(round(acc)) - given
        out.append(n)
        given += n
    while out and out[-1] == 0:
        out.pop()
    return tuple(out)


def summarize(slots: tuple[int, ...], total_us: float, count: int, p50: float | None = None,
              p99: float | None = None, p999: float | None = None, max_us: float | None = None
              ) -> AppLatency | None:
    """An AppLatency of `count` events; the quantiles from the slots unless given (a finer source's)."""
    if count <= 0 or not any(slots):
        return None
    top = max(i for i, n in enumerate(slots) if n)
    q = lambda given, level: given if given is not None else quantile_us(slots, level)  # noqa: E731
    return AppLatency(count, total_us / count, q(p50, 0.5), q(p99, 0.99), q(p999, 0.999),
                      max_us if max_us is not None else slot_upper_us(top), slots)


class Worker(threading.Thread):
    """Measures one declared source in its own thread; take() hands the round what it measured since."""

    def __init__(self, target: SloTarget, name: str):
        super().__init__(name=name, daemon=True)
        self.target = target
        self.halt = Cancel()            # stop(): ends the wait between attempts and the exchange in flight
        self.resolver = Resolver()
        self.lock = threading.Lock()
        self.failing: set[str] = set()

    def failed(self, kind: str, message: str) -> None:
        """One log line per kind of failure, until the source measures again."""
        if kind not in self.failing:
            self.failing.add(kind)
            log.warning("SLO source %s: %s; its latency is unknown until it answers", self.name, message)

    def recovered(self) -> None:
        if self.failing:
            log.info("SLO source %s measures again", self.name)
            self.failing.clear()

    def run(self) -> None:
        try:
            self.measure()
        finally:
            self.halt.close()

    def measure(self) -> None:
        """The worker's loop, until self.halt is set."""
        raise NotImplementedError

    def take(self) -> AppLatency | None:
        raise NotImplementedError

    def stop(self) -> None:
        self.halt.set()


def stop_all(workers) -> None:
    """Stop the workers and wait, STOP_WAIT seconds at most in all, for their threads to end."""
    workers = list(workers)
    for w in workers:
        w.stop()
    end = time.monotonic() + STOP_WAIT
    for w in workers:
        if w.is_alive():
            w.join(max(end - time.monotonic(), 0))
        if w.is_alive():
            log.warning("SLO source %s: its thread did not end within %gs of the stop", w.name, STOP_WAIT)


class DeclaredSourceSensor(OptionalSensor):
    """Section SOURCES[source]: class root -> AppLatency of the round, for each root whose SLO declares
    this source and whose source measured since the last round."""
    source: ClassVar[str] = ""

    def __init__(self):
        self.workers: dict[SloTarget, Worker] = {}

    def worker(self, target: SloTarget) -> Worker:
        raise NotImplementedError

    def sample(self, context: SensorContext) -> Mapping[str, AppLatency]:
        wanted = {t for t in context.slos.values() if t.source == self.source}
        gone = [self.workers.pop(t) for t in list(self.workers) if t not in wanted]
        for w in gone:
            w.stop()            # its thread ends on its own; the round does not wait for it
        for new in wanted - set(self.workers):
            self.workers[new] = w = self.worker(new)
            w.start()
        got = {}
        for t, w in self.workers.items():
            try:
                got[t] = w.take()
            except Exception as e:  # noqa: BLE001 - one source's data must not cost the others theirs
                w.failed("error", f"its latency cannot be computed: {e!r}")
        return {root: app for root, t in context.slos.items() if (app := got.get(t)) is not None}

    def stop(self) -> None:
        stop_all(self.workers.values())
        self.workers.clear()
