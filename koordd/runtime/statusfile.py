"""<state_dir>/status.json: what `koordctl status` shows of the running daemon.

It is rewritten after a round that changed what an operator acts on (a knob taken, written or given back,
a loop's changes or failures, a sensor starting or stopping), else every STATUS_EVERY seconds, and at stop
and after `--once`. Rewriting it every round was a fifth of a quiet round's CPU at 503 cgroups: the
atomic replace of a file on ext4 alone is about 0.2 ms, and most rounds change only counters and figures.

`slo_history` (koordctl slo's) is the node report's history of its workloads (koordd/core/report.py's
History), beside `report` rather than in it: the report is the pushed document, the history is this node's
own view. Each of its points is written on one line, so that 16 workloads of 60 points stay small, and so
is each held knob and each of the report's workloads and tenants (ROW_LISTS).
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

from koordd.act.journal import write_atomic
from koordd.core.feeds import STATUS_FILE
from koordd.kernel import libbpf
from koordd.runtime.result import RoundResult, Subscriber

log = logging.getLogger("koordd")


# The BPF report (each program's run time and count, for koordctl doctor) is taken again at most this often,
# or when an object is loaded or closed: describing the programs was 0.4 ms of a 7 ms round at 503 cgroups.
BPF_REPORT_EVERY = 10.0
# A round that changed nothing an operator acts on leaves the file alone for up to this long: its counters,
# figures and the node report show at most this old (koordctl status says how old: "status updated 3s ago").
STATUS_EVERY = 5.0


class StatusFile(Subscriber):
    def __init__(self, state_dir: Path, started: float, config: str, dry_run: bool, cgroups: str,
                 metrics_listen: Callable[[], str | None]):
        """`metrics_listen`: where the metrics endpoint serves now (None while it does not)."""
        self.path = Path(state_dir) / STATUS_FILE
        self.started, self.config, self.dry_run, self.cgroups = started, config, dry_run, cgroups
        self.metrics_listen = metrics_listen
        self._bpf: tuple[float, frozenset, dict] | None = None     # (taken at, objects, report)
        self._written: tuple[float, tuple] | None = None           # (when, what_acts_on) of the last write

    def published(self, result: RoundResult) -> None:
        """After a round: rewritten if what an operator acts on changed, or STATUS_EVERY has passed."""
        acts = what_acts_on(result)
        if self._written is None or time.monotonic() - self._written[0] >= STATUS_EVERY or \
                any(r.get("last_changes") for r in result.loops.values()) or acts != self._written[1]:
            self.write(result, acts)

    def write(self, result: RoundResult, acts: tuple | None = None) -> None:
        """Now, whatever changed (at stop, after --once, and from published, which has `acts` at hand)."""
        self._written = (time.monotonic(), what_acts_on(result) if acts is None else acts)
        status = {"pid": os.getpid(), "started": self.started, "updated": time.time(), "config": self.config,
                  "dry_run": self.dry_run, "cgroups": self.cgroups, "loops": result.loops, "sensors": result.sensors,
                  "held": [h.__dict__ for h in result.held],
                  "reclaimable": result.reclaimable.as_dict() if result.reclaimable is not None else None,
                  "report": result.report.as_dict() if result.report is not None else None,
                  "metrics": self.metrics_listen(), "bpf": self._bpf_report(time.monotonic())}
        history = result.report.history if result.report is not None else None
        try:
            write_atomic(self.path, dumps(status, history) + "\n", durable=False)
        except OSError as e:
            log.warning("cannot write status: %s", e)

    def _bpf_report(self, now: float) -> dict:
        objects = libbpf.loaded()
        if self._bpf is None or self._bpf[1] != objects or now - self._bpf[0] >= BPF_REPORT_EVERY:
            self._bpf = (now, objects, libbpf.report())
        return self._bpf[2]


def what_acts_on(result: RoundResult) -> tuple:
    """What in a round's status an operator acts on, to compare with the last written: the knobs held (with
    the values written), each loop's failures, each sensor's state. Not the counters, timings, figures and
    reports, which change every round and are refreshed every STATUS_EVERY. (A round in which a loop changed
    a knob is written whatever this says.)"""
    loops = tuple((name, r.get("failures"), r.get("errors"), r.get("last_error"))
                  for name, r in result.loops.items())
    sensors = tuple((name, s.get("state"), s.get("reason"), tuple(s.get("loops") or ()))
                    for name, s in result.sensors.items())
    return result.held, loops, sensors


# Lists written one entry a line, compact: at 500 pods the report's workloads are hundreds of small objects.
# "*" stands for any key. The rest is indented down to INDENT_DEPTH (the top level's keys and theirs) and
# compact below: json's indenting encoder is pure Python, and indenting the whole document was the largest
# share of a quiet round (a third of the round at 503 cgroups under cProfile); its C encoder writes the rest.
ROW_LISTS = (("held",), ("report", "workloads"), ("report", "tenants"), ("slo_history", "workloads", "*"))
INDENT_DEPTH = 2
_ROW = json.JSONEncoder(separators=(",", ":")).encode      # one encoder: json.dumps builds one per call


def dumps(status: dict, history: dict | None) -> str:
    """`status` as JSON with `history` as its "slo_history": indented down to INDENT_DEPTH, compact below;
    each point of the history, each held knob and each workload and tenant of the report on a line of its own."""
    return _format({**status, "slo_history": history or None}, (), 0)


def _format(value, path: tuple, depth: int) -> str:
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value) and (
            depth < INDENT_DEPTH or any(_leads(path, row) for row in ROW_LISTS)):
        items = (f"{inner}{_ROW(k)}: {_format(v, path + (k,), depth + 1)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, (list, tuple)) and value and any(_matches(path, row) for row in ROW_LISTS):
        return f"[\n{inner}" + f",\n{inner}".join(_ROW(x) for x in value) + f"\n{pad}]"
    return _ROW(value)


def _matches(path: tuple, row: tuple) -> bool:
    return len(path) == len(row) and all(r in ("*", p) for p, r in zip(path, row))


def _leads(path: tuple, row: tuple) -> bool:
    """`path` is on the way to row list `row` (its holders are indented, so the rows get their lines)."""
    return len(path) < len(row) and _matches(path, row[:len(path)])
