"""koordctl demo: LS and BE on the same CPUs, without and with koordd (session.py runs it; cgroups.py
makes and removes its cgroups; load.py is the LS worker; view.py the live view, summary and plot).

This module holds only what the command line needs, so that parsing `koordctl` loads none of the demo.
"""
from __future__ import annotations

from dataclasses import dataclass

LOOPS = ("be_suppress", "qos_baseline")
# The shipped config's loops: qos_baseline makes BE SCHED_IDLE, which gives LS its sine back and leaves
# BE all the rest; be_suppress (rule slack) takes BE's CPU away only while LS misses its targets.
DEFAULT_LOOPS = ("qos_baseline", "be_suppress")


@dataclass(frozen=True)
class Settings:
    phase: float = 30.0          # seconds per phase
    period: float = 20.0         # seconds per sine period of LS's demand
    low: float = 0.10            # LS's demand, as a fraction of each CPU (so of the node)
    high: float = 0.70
    loops: tuple[str, ...] = DEFAULT_LOOPS
