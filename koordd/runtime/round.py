"""One round: snapshot -> member fields -> decide -> act -> settle, and the figures made of it.

The snapshot reads what the loops need (the Runner says) and what the readers beside them ask for
(koordctl top's feed, the metrics endpoint, the reclaimable figure: koordd/runtime/result.py's Reader),
each asked the same way; members (pods) are listed first and read only as far as the due loops, and the
readers, need them now. The loops see only the members of their own classes.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, replace
from typing import Sequence

from koordd.act.actuator import Actuator
from koordd.act.journal import RestoreJournal
from koordd.core.reclaimable import (FIELDS as RECLAIMABLE_FIELDS, Reclaimable, ReclaimableState,
    observe as observe_reclaimable)
from koordd.core.report import FIELDS as REPORT_FIELDS, NodeReport, ReportWindow, build as build_report
from koordd.core.snapshot import Snapshot
from koordd.runtime.result import Reader, RoundResult, RoundStats
from koordd.runtime.runner import LoopRun, Runner, Timing
from koordd.sensors.collect import Sensors

log = logging.getLogger("koordd")


class ReclaimableFigure(Reader):
    """The LS classes' unused capacity (koordd/core/reclaimable.py), its windows of LS peaks kept across rounds."""

    def __init__(self, settings):
        self.settings = settings                # [reclaimable]; a reload hands the new ones
        self.state = ReclaimableState()
        self.last: Reclaimable | None = None

    def needs(self) -> frozenset[str]:
        return RECLAIMABLE_FIELDS

    def observe(self, snapshot: Snapshot) -> None:
        try:
            self.last = observe_reclaimable(snapshot, self.settings, self.state)
        except Exception:  # noqa: BLE001 - a figure koordd only publishes must not cost it the round
            log.exception("computing the reclaimable capacity failed")
            self.last = None


class ReportFigure(Reader):
    """The node report (koordd/core/report.py), its window of the workloads' response times kept across
    rounds; made after the reclaimable figure, which it includes."""

    def __init__(self, settings, node: str):
        self.settings, self.node = settings, node     # [report]; a reload hands the new ones
        self.window = ReportWindow()
        self.last: NodeReport | None = None

    def needs(self) -> frozenset[str]:
        return REPORT_FIELDS

    def observe(self, snapshot: Snapshot, reclaimable: Reclaimable | None) -> None:
        try:
            self.last = build_report(snapshot, self.settings, self.window, reclaimable, self.node)
        except Exception:  # noqa: BLE001 - a figure koordd only publishes must not cost it the round
            log.exception("computing the node report failed")
            self.last = None


class Rounds:
    """Runs rounds, and keeps their count and time (for the metrics)."""

    def __init__(self, sensors: Sensors, runner: Runner, actuator: Actuator, journal: RestoreJournal,
                 reclaimable: ReclaimableFigure, readers: Sequence[Reader], report: ReportFigure | None = None):
        """`readers`: those beside the loops, the reclaimable figure and the node report (koordctl top's feed,
        the metrics); `report`: None makes none (tests of other parts)."""
        self.sensors, self.runner, self.actuator, self.journal = sensors, runner, actuator, journal
        self.reclaimable, self.report = reclaimable, report
        self.readers = (reclaimable, *((report,) if report is not None else ()), *readers)
        self.done, self.timing = 0, Timing()

    def needs(self) -> frozenset[str]:
        """What is read of the class roots beyond the loops' needs."""
        return frozenset().union(*(r.needs() for r in self.readers))

    def baseline(self) -> None:
        """The first snapshot, at start: rates need two samples."""
        self.sensors.snapshot(self.runner.watched(), member_classes=self.runner.member_classes(),
                              fields=self.runner.needs() | self.needs(), member_fields=self.runner.member_needs(),
                              class_fields=self.runner.class_needs())

    def run(self, due: list[LoopRun], for_view: bool = False) -> RoundResult | None:
        """One snapshot for the due loops (and the readers), their decisions, writes and settling;
        None when the snapshot failed (the due loops then skip this tick)."""
        loop_members = self.runner.member_classes()
        since = Timing.now()
        try:
            snapshot = self.sensors.snapshot(
                self.runner.watched(), {(h.target, h.knob): h.original for h in self.journal.entries()},
                loop_members | frozenset().union(*(r.member_classes() for r in self.readers)),
                self.runner.needs() | self.needs(), frozenset(), self.runner.class_needs())
            member_fields = self.runner.member_fields(due, only_members_of(snapshot, loop_members))
            snapshot = self.sensors.fill_members(
                snapshot, member_fields | frozenset().union(*(r.member_needs() for r in self.readers)))
        except Exception:  # noqa: BLE001 - sensors should never raise; if one does, skip this round
            log.exception("building the snapshot failed; loops skip this tick")
            self.runner.skip(due, time.monotonic())
            return None
        if due:
            self.runner.tick(due, only_members_of(snapshot, loop_members))
        self.reclaimable.observe(snapshot)
        if self.report is not None:
            self.report.observe(snapshot, self.reclaimable.last)
        self.timing.last_seconds = 0.0          # a round that failed above leaves the last one's
        self.timing.add_since(since)
        self.done += 1
        return self.result(snapshot, for_view)

    def result(self, snapshot: Snapshot | None = None, for_view: bool = False) -> RoundResult:
        """The state now, for the subscribers: frozen things and copies."""
        held = tuple(self.journal.entries())
        latest = self.actuator.decisions.latest
        if snapshot is not None:
            keys = {(h.kind, h.target, h.knob) for h in held}
            for key in [k for k in latest if k not in keys]:    # only the values of knobs still held
                del latest[key]
        return RoundResult(snapshot, for_view, loops=self.runner.status(), sensors=self.sensors.optional.status(),
                           held=held, held_values=dict(latest), decisions=dict(self.actuator.decisions.counts),
                           reclaimable=self.reclaimable.last,
                           report=self.report.last if self.report is not None else None, rounds=RoundStats(self.done, **asdict(self.timing)))


def only_members_of(snapshot: Snapshot, classes: set[str]) -> Snapshot:
    """The snapshot with only the members (pods) of `classes`: those listed for koordctl top alone must not
    change what a loop sees (Snapshot.units() acts on members wherever there are some)."""
    if all(snapshot.cgroups[root].cls in classes for root in snapshot.members):
        return snapshot
    return replace(snapshot, members={root: ms for root, ms in snapshot.members.items()
                                      if snapshot.cgroups[root].cls in classes})
