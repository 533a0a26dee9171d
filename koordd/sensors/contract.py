"""The contract between the core and an optional sensor.

An optional sensor reads something not every host has or every loop wants (NVML
for GPUs; later BPF programs, perf counters, netlink) and fills one section of
the snapshot, named after it. It runs only while an enabled loop names it in
needs(), or while `koordctl top` shows its section (the run-queue latency and
CPI sections: koordd/runtime/topfeed.py). koordd's own are built in (sensors/optional_sensors.py); a third-party package
registers its class under the entry-point group `koordd.sensors`, with the
entry point's name equal to the class's `name`. The core calls:

- the class, with no arguments: it must be cheap and acquire nothing, so that a
  sensor no loop needs costs nothing.
- `start()` when a loop first needs it: acquire what it reads through (NVML
  init, BPF programs, perf fds, netlink sockets). It raises
  `SensorUnavailable(reason)` when the host lacks that: the loops needing it run
  without its section, and koordd says why in one log line.
- `sample(context)` every round while needed: the section's value, built from
  the kernel without raising for a vanished process or cgroup (an exception
  loses the section for that round and is logged).
- `stop()` when nothing needs it any more, when koordd stops, and after
  a failed start (to release what a partial start took). Idempotent.

An instance is started at most once: when it is needed again later, or retried
after it was unavailable, the core makes a fresh one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from koordd.core.probe import Probe
from koordd.core.slo import SloTarget


class SensorUnavailable(Exception):
    """Raised by start(): the host lacks what the sensor reads through. The message says what, for the log."""


@dataclass(frozen=True)
class SensorContext:
    """What the core knows of this round when it asks a sensor for its section."""
    now: float                      # time.monotonic() of this round's snapshot
    # Every cgroup sampled this round -> its class ("" for one a loop watches without a class). Class members
    # (pods) are there too, with their root's class, so a per-cgroup sensor can key its values by path.
    cgroups: Mapping[str, str]
    # Each class root whose rule declares an SLO -> that SLO: a sensor measuring a declared source
    # (core/slo.py's SOURCES) learns from it which roots to measure, and where from.
    slos: Mapping[str, SloTarget] = field(default_factory=dict)


class OptionalSensor:
    name: ClassVar[str] = ""        # the snapshot section it fills, and the word a loop puts in needs()
    # The host features it reads through, each with its probe (koordd/core/probe.py): koordctl doctor's rows.
    features: ClassVar[Mapping[str, Probe]] = {}

    def start(self) -> None:
        """Acquire what sample() reads through; raise SensorUnavailable(reason) when the host lacks it."""

    def sample(self, context: SensorContext) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        """Release what start() acquired. Called once more is harmless."""
