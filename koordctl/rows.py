"""koordctl top's rows: the columns it sorts by and the selection of a class's rows. Pure, so that the command line
knows the sort keys without loading the view."""
from __future__ import annotations

from typing import Any, Callable


def highest_psi(row: dict) -> float | None:
    """The highest "some" avg10 of cpu, memory and io: what stalls this cgroup most."""
    values = [v for v in (row.get("psi") or {}).values() if v is not None]
    return max(values) if values else None


def runq_us(row: dict) -> float | None:
    """p99 wait; the mean where the sensor has no histogram (schedstat)."""
    runq = row.get("runq") or {}
    return runq.get("p99_us") if runq.get("p99_us") is not None else runq.get("mean_us")


def cpi(row: dict) -> float | None:
    return (row.get("cpi") or {}).get("cpi")


SORTS: dict[str, Callable[[dict], Any]] = {"cpu": lambda r: r.get("cpu"), "memory": lambda r: r.get("memory"),
                                           "psi": highest_psi, "runq": runq_us, "cpi": cpi, "name": None}


def select_rows(doc: dict, by: str = "cpu", cls: str | None = None) -> list[dict]:
    """The document's rows of class `cls` (all without), sorted by `by`: highest first, rows without a
    value last; by name, alphabetically. Ties go by name."""
    rows = sorted((r for r in doc.get("cgroups") or () if cls is None or r.get("class") == cls),
                  key=lambda r: r.get("path") or "")
    key = SORTS[by]
    if key is None:
        return rows
    known = [r for r in rows if key(r) is not None]
    return sorted(known, key=key, reverse=True) + [r for r in rows if key(r) is None]
