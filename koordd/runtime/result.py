"""What a round hands its subscribers (the status file, the metrics endpoint, koordctl top's feed, the report's pusher), and
what they give it: each reader says what it wants read of the class roots and their members.

A subscriber gets one RoundResult after every round that sampled the node, and `skipped()` after one
that could not. Nothing in a RoundResult changes after it is made: the metrics endpoint's thread reads
it while the next round runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from koordd.act.journal import Held
from koordd.core.reclaimable import Reclaimable
from koordd.core.report import NodeReport
from koordd.core.snapshot import Snapshot


@dataclass(frozen=True)
class RoundStats:
    rounds: int = 0
    last_seconds: float = 0.0
    seconds_total: float = 0.0
    cpu_seconds_total: float = 0.0


@dataclass(frozen=True)
class RoundResult:
    snapshot: Snapshot | None                       # None: no round yet (a stop, --once's last status)
    for_view: bool = False                          # the round koordctl top's interval was due for
    loops: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)        # Runner.status()
    sensors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)      # SensorManager.status()
    held: tuple[Held, ...] = ()
    held_values: Mapping[tuple[str, str, str], str | None] = field(default_factory=dict)  # (kind, target, knob)
    decisions: Mapping[tuple[str, str, str], int] = field(default_factory=dict)  # (loop, outcome, knob) -> n
    reclaimable: Reclaimable | None = None
    report: NodeReport | None = None                # the node report (koordd/core/report.py)
    rounds: RoundStats = RoundStats()


class Reader:
    """What a round reads for one reader beyond the loops' needs (the loops' own come from the Runner)."""

    def needs(self) -> frozenset[str]:
        """Fields of the class roots."""
        return frozenset()

    def member_classes(self) -> frozenset[str]:
        """Classes whose members (pods) are listed."""
        return frozenset()

    def member_needs(self) -> frozenset[str]:
        """Fields of those members."""
        return frozenset()


class Subscriber(Reader):
    def published(self, result: RoundResult) -> None:
        """After a round that sampled the node."""

    def skipped(self, now: float) -> None:
        """After a round whose snapshot failed (`now`: time.monotonic())."""
