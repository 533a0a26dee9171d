"""Where decision records go: one journald entry and one JSON line each (<state_dir>/decisions.jsonl,
rotated), and how `koordctl decisions` reads them back. The record itself is koordd/core/decisions.py.

journalctl -u koordd KOORDD_LOOP=be_suppress -o json   shows them with their fields.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable, Iterator

from koordd.core.decisions import APPLIED, DEFERRED, DRY_RUN, KEPT, Decision, LEFT, REFUSED, RESTORED

log = logging.getLogger("koordd.decision")


_PRIORITY = {APPLIED: 5, DRY_RUN: 6, RESTORED: 5, REFUSED: 4, LEFT: 4, DEFERRED: 5, KEPT: 6}   # notice, info, notice, warning


def _sendable(value: str) -> str | bytes:
    """A field as python-systemd can send it: it encodes str as strict UTF-8, which refuses a cgroup name
    that is not UTF-8 (surrogate escapes); journald's fields take any bytes, so that one goes as its own."""
    try:
        value.encode()
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape")


def journal_sender() -> Callable[..., None] | None:
    """systemd.journal.send when journald is there to receive, else None (records go to stderr)."""
    if not os.path.exists("/run/systemd/journal/socket"):
        return None
    try:
        from systemd import journal
    except ImportError:
        return None
    return journal.send


class DecisionLog:
    FILE = "decisions.jsonl"

    def __init__(self, state_dir: Path | str | None, max_bytes: int = 8 << 20, keep: int = 3,
                 send: Callable[..., None] | None = None):
        self.path = Path(state_dir) / self.FILE if state_dir is not None else None
        self.max_bytes, self.keep, self.send = max_bytes, keep, send
        # Records a full disk or a busy journald refused since they last took one: the write a record
        # tells of is done and journaled already, so a lost record costs one log line, not the loop.
        self.dropped = self.unsent = 0
        # Records by (loop, outcome, knob) since start, and each target's latest value koordd set or put
        # back, for the metrics endpoint (koordd/runtime/metrics.py); the daemon keeps the latter to what it holds.
        self.counts: dict[tuple[str, str, str], int] = {}
        self.latest: dict[tuple[str, str, str], str | None] = {}

    def record(self, d: Decision) -> None:
        key = (d.loop, d.outcome, d.knob)
        self.counts[key] = self.counts.get(key, 0) + 1
        if d.outcome == APPLIED:
            self.latest[(d.kind, d.target, d.knob)] = d.new
        if self.send is not None:
            try:
                self.send(d.text(), PRIORITY=str(_PRIORITY[d.outcome]), SYSLOG_IDENTIFIER="koordd",
                          **{k: _sendable(v) for k, v in d.fields().items()})
            except OSError as e:
                if not self.unsent:
                    log.error("journald refused a decision record (%s); until it takes them again they are "
                              "only in %s", e, self.path or "no file (no state_dir)")
                self.unsent += 1
            else:
                if self.unsent:
                    log.warning("journald takes decision records again; %d were not sent", self.unsent)
                    self.unsent = 0
        else:
            log.log(logging.WARNING if d.outcome == REFUSED else logging.INFO, "%s reason=%s",
                    d.text(), d.fields()["KOORDD_REASON"])
        if self.path is not None:
            self._append(json.dumps(d.record(), sort_keys=True, default=str) + "\n")

    def _append(self, line: str) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists() and self.path.stat().st_size + len(line) > self.max_bytes:
                self._rotate()
            with open(self.path, "a+b") as f:
                # A crash mid-line leaves a torn last record: start ours on a line of its own.
                if f.tell() > 0:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        line = "\n" + line
                f.write(line.encode())
        except OSError as e:
            if not self.dropped:
                log.error("%s: cannot append decisions (%s); records are dropped from the file until it can "
                          "be written%s", self.path, e, "" if self.send is None else " (journald has them)")
            self.dropped += 1
            return
        if self.dropped:
            log.warning("%s: written again; %d records were dropped while it could not be", self.path, self.dropped)
            self.dropped = 0

    def _rotate(self) -> None:
        """decisions.jsonl -> .1 -> .2 ...; the oldest beyond `keep` is dropped."""
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.FILE}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.FILE}.{i + 1}"))
        self.path.replace(self.path.with_name(f"{self.FILE}.1"))


def read_decisions(state_dir: Path | str, keep: int = 3) -> Iterator[dict]:
    """Every stored record, oldest first, across rotated files; a damaged line is skipped."""
    base = Path(state_dir) / DecisionLog.FILE
    files = [base.with_name(f"{DecisionLog.FILE}.{i}") for i in range(keep, 0, -1)] + [base]
    for path in files:
        try:
            with open(path, errors="replace") as f:    # a damaged line may not even be UTF-8
                for line in f:
                    try:
                        yield json.loads(line)
                    except ValueError:
                        continue
        except FileNotFoundError:
            continue
