"""What the koordctl commands share: their one error and printing tables and times (reading the state_dir:
koordctl/statefiles.py)."""
from __future__ import annotations

import os
import time
from typing import Any, Iterable, Sequence

from koordd.core.printable import printable


class CtlError(Exception):
    """Reported as one line on stderr, exit 2."""


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str] | None = None) -> str:
    """Left-aligned columns as wide as their widest cell; None shows as "-". Every cell goes through
    printable(): a cgroup's name (the workload's choice) cannot add a line or reach the terminal."""
    cells = [[str(h) for h in headers]] if headers else []
    cells += [["-" if c is None else printable(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))] if cells else []
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def local_time(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def ago(t: float | None, now: float) -> str | None:
    """How long ago `t` was: 0.4s ago, 3m05s ago, 2h10m ago, 3d4h ago."""
    if t is None:
        return None
    d = max(0.0, now - t)
    if d < 60:
        span = f"{d:.1f}s"
    elif d < 3600:
        span = f"{d // 60:.0f}m{d % 60:02.0f}s"
    elif d < 86400:
        span = f"{d // 3600:.0f}h{d % 3600 // 60:02.0f}m"
    else:
        span = f"{d // 86400:.0f}d{d % 86400 // 3600:.0f}h"
    return f"{span} ago"


def knob_value(v: str | None) -> str:
    """None (no value: the knob was absent or not read) as "-", an empty value as "" so it shows."""
    return "-" if v is None else v or '""'


def pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # it exists, under another user
        return True
    return True


def target_text(record: dict) -> str:
    """A cgroup as its path ("/" for the root); another kind of target as kind:name. Records written
    before targets had kinds name a cgroup under "cgroup"."""
    kind = record.get("kind") or "cgroup"
    name = record.get("target", record.get("cgroup")) or ""
    return (name or "/") if kind == "cgroup" else f"{kind}:{name}"
