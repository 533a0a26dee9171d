"""koordctl decisions: the decision log, filtered."""
from __future__ import annotations

import argparse
import json
import time
from datetime import datetime

from koordctl.common import CtlError, knob_value, local_time, table, target_text
from koordctl.running import trusted_state_dir
from koordctl.statefiles import escaped, read_records
from koordd.core.options import parse_duration


def parse_since(text: str, now: float) -> float:
    """A duration meaning "ago" ("10m", "2h") or an ISO 8601 time (local unless it has an offset)."""
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise CtlError(f"--since {text!r}: neither a duration (\"10m\", \"2h\") nor an ISO 8601 time"
                       " (\"2024-05-01T13:00\")") from None


def cmd_decisions(args: argparse.Namespace) -> int:
    sd = trusted_state_dir(args)
    since = None if args.since is None else parse_since(args.since, time.time())
    records = [r for r in read_records(sd) if (args.loop is None or r.get("loop") == args.loop)
               and (since is None or (r.get("time") or 0) >= since)]
    if args.n is not None:
        records = records[-args.n:] if args.n > 0 else []
    if args.json:
        for r in records:
            print(json.dumps(r, sort_keys=True))
    elif not records:
        print(f"no decisions recorded in {sd}" + (" matching the filters" if args.loop or since else ""))
    else:
        records = escaped(records)      # a workload's names cannot reach the terminal
        print(table(((local_time(r.get("time")), r.get("loop"), r.get("outcome"), target_text(r),
                      r.get("knob"), f"{knob_value(r.get('old'))} -> {knob_value(r.get('new'))}",
                      " ".join(filter(None, (r.get("message"), r.get("error") and f"({r['error']})"))))
                     for r in records),
                    ("TIME", "LOOP", "OUTCOME", "TARGET", "KNOB", "CHANGE", "MESSAGE")))
    return 0
