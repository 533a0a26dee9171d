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


# Lists written one entry a line, compact: at 500 pods the report's workloads are hundreds of small objects,
# and json's indenting encoder (pure Python) took 5x the time of its C one, the largest share of a quiet round.
ROW_LISTS = (("held",), ("report", "workloads"), ("report", "tenants"))
_ROW = json.JSONEncoder(separators=(",", ":")).encode      # one encoder: json.dumps builds one per call


def dumps(status: dict, history: dict | None) -> str:
    """`status` as indented JSON with `history` as its "slo_history"; each point of the history, each held
    knob and each workload and tenant of the report on a line of its own."""
    mark = f"@row-list-{uuid.uuid4().hex}@"      # a prefix nothing else in the document holds
    rows: dict[str, tuple[int, list]] = {}

    def lined(holder: dict, key: str, depth: int) -> None:
        value = holder.get(key)
        if isinstance(value, (list, tuple)) and value:
            name = f"{mark}{len(rows)}"
            rows[name] = (depth, list(value))
            holder[key] = name

    doc = {**status, "slo_history": None}
    for path in ROW_LISTS:
        holder = doc
        for part in path[:-1]:
            if not isinstance(holder.get(part), dict):
                break
            holder[part] = holder = dict(holder[part])
        else:
            lined(holder, path[-1], len(path))
    if history:
        points = dict(history.get("workloads") or {})
        doc["slo_history"] = {**history, "workloads": points}
        for path in list(points):
            lined(points, path, 3)
    text = json.dumps(doc, indent=1)
    for name, (depth, items) in rows.items():
        body = (",\n" + " " * (depth + 1)).join(_ROW(x) for x in items)
        text = text.replace(json.dumps(name), f"[\n{' ' * (depth + 1)}{body}\n{' ' * depth}]", 1)
    return text
