"""The metrics endpoint's lifecycle as [metrics] says, and a subscriber handing it each round's result.

koordd/runtime/metrics.py needs prometheus-client, an optional dependency: it is imported only when
[metrics] enable = true, and koordd runs on without the endpoint (one error line) where it is missing.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Mapping

from koordd.runtime.result import RoundResult, Subscriber

log = logging.getLogger("koordd")


class MetricsFeed(Subscriber):
    def __init__(self, started: float, info: Mapping[str, str], capabilities: Callable[[], tuple]):
        """`info`: koordd_info's labels; `capabilities`: the host's (probed when koordd starts)."""
        self.started, self.info, self.capabilities = started, dict(info), capabilities
        self.settings = None                    # [metrics], the latest configure() was given
        self.fields: frozenset[str] = frozenset()
        self.module = None                      # koordd/runtime/metrics.py, once imported
        self.exporter = None                    # its Exporter, while it serves
        self.server = None

    @property
    def listen(self) -> str | None:
        return self.server.listen if self.server is not None else None

    def configure(self, settings) -> None:
        """Start, stop or move the endpoint as [metrics] says; the allow-list and the cap need no restart
        (each round publishes the settings with the state)."""
        self.settings = settings
        running = self.listen
        wanted = settings.listen if settings.enable else None
        if wanted == running and (wanted is None or self.exporter is not None):
            return
        self.stop()
        if wanted is None:
            return
        try:
            from koordd.runtime import metrics
        except ImportError as e:
            log.error("metrics: prometheus-client is not installed (%s); koordd runs on without its metrics "
                      "endpoint", e)
            return
        self.module, self.fields = metrics, metrics.FIELDS
        self.exporter = metrics.Exporter()
        self.server = metrics.MetricsServer.start(wanted, self.exporter)
        if self.server is None:
            self.exporter = None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            log.info("metrics: stopped serving on %s", self.server.listen)
        self.server = self.exporter = None

    def needs(self) -> frozenset[str]:
        """While the endpoint serves: what its per-class and per-cgroup series show."""
        return self.fields if self.exporter is not None else frozenset()

    def beat(self, alive: Callable[[float], bool]) -> None:
        """The main loop ticked: /healthz's heartbeat, with whether no loop is overdue."""
        if self.exporter is not None:
            self.exporter.beat(time.monotonic(), alive(time.monotonic()))

    def published(self, result: RoundResult) -> None:
        """Hand the endpoint this round's state: frozen things and copies, in one assignment."""
        if self.exporter is None:
            return
        self.exporter.publish(self.module.Published(
            settings=self.settings, started=self.started, info=self.info, snapshot=result.snapshot,
            rounds=result.rounds, loops=result.loops, decisions=result.decisions, held=result.held,
            held_values=result.held_values, capabilities=self.capabilities(), sensors=result.sensors,
            reclaimable=result.reclaimable, report=result.report))
