"""<state_dir>/status.json: what `koordctl status` shows of the running daemon, rewritten after every round."""
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
        try:
            write_atomic(self.path, json.dumps(status, indent=1) + "\n", durable=False)
        except OSError as e:
            log.warning("cannot write status: %s", e)
