"""<state_dir>/status.json: what `koordctl status` shows of the running daemon, rewritten after every round.

`slo_history` (koordctl slo's) is the node report's history of its workloads (koordd/core/report.py's
History), beside `report` rather than in it: the report is the pushed document, the history is this node's
own view. Each of its points is written on one line, so that 16 workloads of 60 points stay small.
"""
from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Callable

from koordd.act.journal import write_atomic
from koordd.core.feeds import STATUS_FILE
from koordd.kernel import libbpf
from koordd.runtime.result import RoundResult, Subscriber

log = logging.getLogger("koordd")


class StatusFile(Subscriber):
    def __init__(self, state_dir: Path, started: float, config: str, dry_run: bool, cgroups: str,
                 metrics_listen: Callable[[], str | None]):
        """`metrics_listen`: where the metrics endpoint serves now (None while it does not)."""
        self.path = Path(state_dir) / STATUS_FILE
        self.started, self.config, self.dry_run, self.cgroups = started, config, dry_run, cgroups
        self.metrics_listen = metrics_listen

    def published(self, result: RoundResult) -> None:
        self.write(result)

    def write(self, result: RoundResult) -> None:
        status = {"pid": os.getpid(), "started": self.started, "updated": time.time(), "config": self.config,
                  "dry_run": self.dry_run, "cgroups": self.cgroups, "loops": result.loops, "sensors": result.sensors,
                  "held": [h.__dict__ for h in result.held],
                  "reclaimable": result.reclaimable.as_dict() if result.reclaimable is not None else None,
                  "report": result.report.as_dict() if result.report is not None else None,
                  "metrics": self.metrics_listen(), "bpf": libbpf.report()}
        history = result.report.history if result.report is not None else None
        try:
            write_atomic(self.path, dumps(status, history) + "\n", durable=False)
        except OSError as e:
            log.warning("cannot write status: %s", e)


def dumps(status: dict, history: dict | None) -> str:
    """`status` as indented JSON with `history` as its "slo_history", each point of which on a line of its own."""
    if not history:
        return json.dumps({**status, "slo_history": None}, indent=1)
    mark = f"@slo-history-{uuid.uuid4().hex}@"      # a string nothing else in the document holds
    points = {path: mark + path for path in history.get("workloads") or {}}
    text = json.dumps({**status, "slo_history": {**history, "workloads": points}}, indent=1)
    for path, series in (history.get("workloads") or {}).items():
        rows = ",\n    ".join(json.dumps(p, separators=(",", ":")) for p in series)
        text = text.replace(json.dumps(mark + path), f"[\n    {rows}\n   ]" if rows else "[]", 1)
    return text
