"""<state_dir>/status.json: what `koordctl status` shows of the running daemon, rewritten after every round.

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


class StatusFile(Subscriber):
    def __init__(self, state_dir: Path, started: float, config: str, dry_run: bool, cgroups: str,
                 metrics_listen: Callable[[], str | None]):
        """`metrics_listen`: where the metrics endpoint serves now (None while it does not)."""
        self.path = Path(state_dir) / STATUS_FILE
        self.started, self.config, self.dry_run, self.cgroups = started, config, dry_run, cgroups
        self.metrics_listen = metrics_listen
        self._bpf: tuple[float, frozenset, dict] | None = None     # (taken at, objects, report)

    def published(self, result: RoundResult) -> None:
        self.write(result)

    def write(self, result: RoundResult) -> None:
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
