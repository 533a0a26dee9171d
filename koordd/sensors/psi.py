"""Pressure stall information: /proc/pressure/* and per-cgroup *.pressure files."""
from __future__ import annotations

import math

from koordd.core.snapshot import Pressure, PressureStat


def parse_psi(text: str) -> PressureStat:
    """Parse the kernel's text; ValueError when a line is malformed.

    some avg10=1.13 avg60=1.12 avg300=0.32 total=1327965
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0
    """
    lines: dict[str, Pressure] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        kind, *fields = line.split()
        if kind not in ("some", "full"):
            raise ValueError(f"unexpected PSI line {line!r}")
        kv = dict(f.split("=", 1) for f in fields)
        try:
            avgs = [float(kv[k]) for k in ("avg10", "avg60", "avg300")]
            lines[kind] = Pressure(*avgs, int(kv["total"]))
        except KeyError as e:
            raise ValueError(f"PSI line lacks {e.args[0]}: {line!r}") from None
        # float() takes "nan" and "inf", which the kernel never writes and no threshold compares with.
        if not all(math.isfinite(a) for a in avgs):
            raise ValueError(f"PSI averages not finite: {line!r}")
    if not lines:
        raise ValueError("empty PSI file")
    return PressureStat(lines.get("some"), lines.get("full"))


def with_growth(new: PressureStat, old: PressureStat | None, seconds: float) -> PressureStat:
    """Attach the growth of total (µs of stall per second) since `old`."""
    if old is None or seconds <= 0:
        return new

    def grow(n: Pressure | None, o: Pressure | None) -> Pressure | None:
        if n is None or o is None or n.total_us < o.total_us:
            return n
        return Pressure(n.avg10, n.avg60, n.avg300, n.total_us, (n.total_us - o.total_us) / seconds)

    return PressureStat(grow(new.some, old.some), grow(new.full, old.full))
