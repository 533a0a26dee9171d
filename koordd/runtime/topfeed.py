"""What koordd publishes for `koordctl top`, and only while a view asks for it.

The view asks by keeping <state_dir>/top.request fresh: it writes the file once
(TopRequest as JSON: its refresh interval, whether it shows members) and touches
it at every refresh. The daemon stats it once a second (REQUEST_POLL). While it
is younger than 3 intervals (at least 5 s), every round also reads what the
view shows (VIEW_FIELDS of the class roots; of their members too when asked),
the run-queue latency and CPI sensors run for the view as they would for a
loop, and every `interval` the round's numbers are written to
<state_dir>/top.json (document()). The first round after a view comes is not
published: rates need two samples, and a sensor started for the view has seen
nothing yet. When the request goes stale, what was started for the view stops
and top.json is removed: with no view, nothing is read or written for one.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Mapping

from koordd.act.journal import Held, write_atomic
from koordd.core.classes import CLASS_NAMES
from koordd.core.feeds import REQUEST_FILE, TOP_FILE, TopRequest, parse_request
from koordd.core.snapshot import CPI, CgroupSample, CpiSample, PressureStat, RUNQ_LATENCY, RunqLatency, Snapshot
from koordd.runtime.result import RoundResult, Subscriber
from koordd.runtime.runner import COALESCE, class_of
from koordd.sensors.lifecycle import VIEW_USER

log = logging.getLogger("koordd.topfeed")     # its name before the move: log lines unchanged
VERSION = 1
VIEW_FIELDS = frozenset(("cpu_usage", "memory_current", "cpu_pressure", "memory_pressure", "io_pressure"))
VIEW_SENSORS = (RUNQ_LATENCY, CPI)     # started for the view where registered
REQUEST_POLL = 1.0        # how often a daemon that no view watches looks for one: one stat
FIRST_AFTER = 1.0         # the first published round comes at most this long after the unpublished one


class TopFeed(Subscriber):
    """The daemon's side: whether a view asks, what it needs sampled, and when a round is published."""

    def __init__(self, state_dir: Path, current: Callable[[Held], str | None] = lambda held: None):
        """`current`: a held knob's value now (read through its backend), None where it cannot be read."""
        self.current = current
        self.request_path, self.path = Path(state_dir) / REQUEST_FILE, Path(state_dir) / TOP_FILE
        self.request: TopRequest | None = None      # while a view asks
        self.next_check = 0.0                       # time.monotonic() of the next look at the request
        self.next_publish = 0.0
        self.sampled = False                        # a round has read the view's needs since it came
        self._seen: tuple[int, int] | None = None   # (inode, mtime) of the request last read, and what it said
        self._parsed = TopRequest()
        self._write_error: str | None = None

    @property
    def active(self) -> bool:
        return self.request is not None

    def check(self, now: float) -> bool:
        """Look at the request: one stat, and a read of the tiny file only when a view wrote or touched it.
        True when a view came or went (the daemon then starts or stops the view's sensors)."""
        self.next_check = now + REQUEST_POLL
        before, self.request = self.request, self._fresh_request()
        if self.request is None:
            if before is not None:
                self.withdraw()
            return before is not None
        if before is None or before.members != self.request.members:
            # Rates need a round before the first published one: of the members too when they come.
            self.sampled, self.next_publish = False, now
            return before is None
        # A second view asking for a faster rhythm gets it from now on, not after the old interval.
        self.next_publish = min(self.next_publish, now + self.request.interval)
        return False

    def _fresh_request(self) -> TopRequest | None:
        try:
            st = os.stat(self.request_path)
            if st.st_uid not in (0, os.geteuid()):
                return None             # only root's koordctl may make koordd sample more
            if (st.st_ino, st.st_mtime_ns) != self._seen:
                self._parsed = parse_request(self.request_path.read_text())
                self._seen = (st.st_ino, st.st_mtime_ns)
        except OSError:
            return None
        return self._parsed if time.time() - st.st_mtime < self._parsed.fresh_for else None

    def withdraw(self) -> None:
        """No view any more (or koordd starts or stops): forget the request and remove what was published."""
        self.request, self.sampled = None, False
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove %s: %s", self.path, e)

    # --- what a round reads for the view ---------------------------------------------------------

    def needs(self) -> frozenset[str]:
        """The class roots' fields the view shows, while it asks."""
        return VIEW_FIELDS if self.active else frozenset()

    def member_classes(self) -> frozenset[str]:
        """Classes whose members (pods) the view lists: all of them when it asked for members."""
        return frozenset(CLASS_NAMES) if self.active and self.request.members else frozenset()

    def member_needs(self) -> frozenset[str]:
        return VIEW_FIELDS if self.member_classes() else frozenset()

    def sensor_users(self, registered: Collection[str]) -> dict[str, str]:
        """Optional sensor -> VIEW_USER, for those of VIEW_SENSORS registered, while a view asks."""
        return {name: VIEW_USER for name in VIEW_SENSORS if name in registered} if self.active else {}

    # --- when a round is published ------------------------------------------------------------------

    def due(self, now: float) -> bool:
        return self.active and self.next_publish <= now + COALESCE

    def next_wake(self) -> float:
        return min(self.next_check, self.next_publish) if self.active else self.next_check

    def settle(self, now: float, for_view: bool) -> bool:
        """After a round at `now` (its snapshot's time) that read the view's needs: True when this
        round is to be published. `for_view`: the round is one the view was due for."""
        if not self.active:
            return False
        if not self.sampled:
            self.sampled = True
            self.next_publish = now + min(self.request.interval, FIRST_AFTER)
            return False
        if not for_view:
            return False
        self.next_publish = now + self.request.interval
        return True

    def skip(self, now: float) -> None:
        """A round that failed: try again one interval later, not at once."""
        if self.active:
            self.next_publish = now + self.request.interval

    skipped = skip

    def published(self, result: RoundResult) -> None:
        """A round that read the view's needs: top.json when it is the one to publish."""
        if self.settle(result.snapshot.time, result.for_view):
            self.publish(document(result.snapshot, self.request, result.held, self.current, result.sensors))

    def publish(self, doc: dict) -> None:
        try:
            write_atomic(self.path, json.dumps(doc) + "\n", durable=False)
        except OSError as e:
            if str(e) != self._write_error:     # once per cause, not once a second
                log.warning("cannot write %s for koordctl top: %s", self.path, e)
            self._write_error = str(e)
        else:
            self._write_error = None


# --- the document ---------------------------------------------------------------------------------

def document(snapshot: Snapshot, request: TopRequest, held: Iterable[Held], current: Callable[[Held], str | None],
             sensors: Mapping[str, dict]) -> dict[str, Any]:
    """top.json: the node, one row per sampled cgroup (members only when the view asked for them),
    and the knobs koordd holds, each on its target's row. `current` reads a held knob's value now;
    `sensors` is the optional sensors' status (SensorManager.status())."""
    knobs: dict[tuple[str, str], dict[str, dict]] = {}
    for h in held:
        knobs.setdefault((h.kind, h.target), {})[h.knob] = {"current": current(h), "original": h.original,
                                                           "owner": h.owner, "since": h.since}
    sections = {name: snapshot.section(name) for name in VIEW_SENSORS}
    sections = {name: s if isinstance(s, Mapping) else {} for name, s in sections.items()}

    def row(path: str, cls: str | None, sample: CgroupSample | None, member_of: str | None = None,
            kind: str = "cgroup") -> dict[str, Any]:
        sample = sample or CgroupSample(path, cls or "")         # a row without numbers: all None
        return {"path": path, "kind": kind, "class": cls, "member_of": member_of,
                "cpu": sample.cpu_usage, "memory": sample.memory_current,
                "psi": {res: _some_avg10(getattr(sample, f"{res}_pressure")) for res in ("cpu", "memory", "io")},
                "runq": _runq(sections[RUNQ_LATENCY].get(path)) if kind == "cgroup" else None,
                "cpi": _cpi(sections[CPI].get(path)) if kind == "cgroup" else None,
                "knobs": knobs.pop((kind, path), {})}

    rows = [row(s.path, s.cls, s) for s in snapshot.cgroups.values()]
    if request.members:
        rows += [row(m.path, m.cls, m, root) for root, ms in snapshot.members.items() for m in ms]
    # Knobs held on a target that is no row (a pod while members are not shown, a target of another
    # kind) still show, on a row of their own.
    rows += [row(target, class_of(target, snapshot) if kind == "cgroup" else None, None, kind=kind)
             for kind, target in list(knobs)]
    node = snapshot.node
    return {"version": VERSION, "time": snapshot.wall, "pid": os.getpid(), "interval": request.interval,
            "members": request.members,
            "sensors": {name: sensors[name] for name in VIEW_SENSORS if name in sensors},
            "node": {"cpus": node.cpu_count, "cpu_used": node.cpu_used, "memory_total": node.memory_total,
                     "memory_available": node.memory_available,
                     "psi": {res: _some_avg10(getattr(node, f"{res}_pressure")) for res in ("cpu", "memory", "io")}},
            "cgroups": rows}


def _some_avg10(stat: PressureStat | None) -> float | None:
    return stat.some.avg10 if stat is not None and stat.some is not None else None


def _runq(value: Any) -> dict | None:
    """The summary koordctl top shows; the histogram stays with the loops."""
    if not isinstance(value, RunqLatency):
        return None
    return {k: v for k, v in asdict(value).items() if k != "slots"}


def _cpi(value: Any) -> dict | None:
    return {**asdict(value), "cpi": value.cpi} if isinstance(value, CpiSample) else None
