"""Runs the optional sensors the enabled loops need, and only those.

The daemon tells the manager, whenever the loops change (start, reload), which
loops need which sensor: it starts the newly needed, stops those no longer
needed, and at every round samples the running ones into the snapshot's
sections. A sensor that cannot start is said once, with the loops that go
without it; it is tried again every RETRY_AFTER (a driver loaded after koordd
started) and after a reload, and said again only when its reason or the users
going without it change, or after that reload (not each time `koordctl top`
comes back for it).

Besides loops, `koordctl top` may need a sensor while it shows its section: the
daemon then names VIEW_USER among the sensor's users, and stops the sensor
again when the view goes away (unless a loop still needs it).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable
from koordd.sensors.optional_sensors import SensorFactory

log = logging.getLogger(__name__)
RUNNING, UNAVAILABLE, STOPPED = "running", "unavailable", "stopped"
RETRY_AFTER = 60.0
VIEW_USER = "koordctl top"      # a sensor's user that is not a loop: the view showing its section


def start_sensor(factory: SensorFactory) -> tuple[OptionalSensor | None, str | None]:
    """(a started sensor, None), or (None, why it cannot start)."""
    sensor = None
    try:
        sensor = factory()
        sensor.start()
        return sensor, None
    except SensorUnavailable as e:
        why = str(e) or "unavailable"
    except Exception as e:  # noqa: BLE001 - a third-party sensor's bug must not stop koordd
        why = f"start failed: {type(e).__name__}: {e}"
    if sensor is not None:
        stop_sensor(sensor)     # a partial start may hold something (an fd, an NVML reference)
    return None, why


def stop_sensor(sensor: OptionalSensor) -> None:
    try:
        sensor.stop()
    except Exception as e:  # noqa: BLE001 - what it failed to release is its own; the others still stop
        log.error("sensor %s failed to stop: %s: %s", sensor.name, type(e).__name__, e)


def users_text(users: tuple[str, ...]) -> str:
    """Who goes without a sensor, for its log line: "loop a runs", "loops a, b run", "koordctl top runs",
    "loop a and koordctl top run", "the SLO of class LS runs" (a user other than a loop, named as it is)."""
    loops = [u for u in users if " " not in u]     # a loop's name is one word; VIEW_USER and an SLO's are not
    parts = [f"loop {loops[0]}" if len(loops) == 1 else f"loops {', '.join(loops)}"] if loops else []
    parts += [u for u in users if " " in u]
    return f"{' and '.join(parts)} {'runs' if len(users) == 1 else 'run'}"


@dataclass
class SensorSlot:
    """What the manager knows of one registered sensor."""
    name: str
    factory: SensorFactory
    state: str = STOPPED
    sensor: OptionalSensor | None = None    # while running
    reason: str | None = None               # while unavailable: why
    loops: tuple[str, ...] = ()             # the enabled loops (and VIEW_USER) that need it
    tried: float = 0.0                      # time.monotonic() of the last start
    sample_error: str | None = None         # the last sample() failure, logged once
    said: tuple[str, tuple[str, ...]] | None = None   # the last "unavailable" logged: (reason, users)


class SensorManager:
    def __init__(self, registry: Mapping[str, SensorFactory]):
        self.slots = {name: SensorSlot(name, factory) for name, factory in sorted(registry.items())}

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.slots)

    def require(self, users: Mapping[str, Iterable[str]], now: float | None = None) -> None:
        """`users`: sensor name -> the enabled loops (and VIEW_USER) that need it. Start those newly
        needed, stop the others."""
        now = time.monotonic() if now is None else now
        for slot in self.slots.values():
            slot.loops = tuple(sorted(users.get(slot.name, ())))
            if not slot.loops:
                self._stop(slot, "no enabled loop (nor koordctl top) needs it")
            elif slot.state == STOPPED:
                self._start(slot, now)

    def reprobe(self) -> None:
        """After a reload the host may have changed: unavailable sensors try again at the next require()
        and, still unavailable, say so again."""
        for slot in self.slots.values():
            if slot.state == UNAVAILABLE:
                slot.state, slot.reason, slot.said = STOPPED, None, None

    def sample(self, context: SensorContext) -> dict[str, Any]:
        """name -> section, of every running sensor."""
        sections = {}
        for slot in self.slots.values():
            if slot.state == UNAVAILABLE and slot.loops and context.now - slot.tried >= RETRY_AFTER:
                self._start(slot, context.now)
            if slot.state != RUNNING:
                continue
            try:
                sections[slot.name] = slot.sensor.sample(context)
            except Exception as e:  # noqa: BLE001 - one sensor's failure must not cost the round
                why = f"{type(e).__name__}: {e}"
                if why != slot.sample_error:
                    log.error("sensor %s failed to sample, its section is absent this round: %s", slot.name, why,
                              exc_info=True)
                slot.sample_error = why
            else:
                slot.sample_error = None
        return sections

    def stop_all(self, why: str) -> None:
        for slot in self.slots.values():
            self._stop(slot, why)

    def status(self) -> dict[str, dict]:
        return {s.name: {"state": s.state, "reason": s.reason, "loops": list(s.loops)} for s in self.slots.values()}

    def _start(self, slot: SensorSlot, now: float) -> None:
        slot.tried = now
        sensor, why = start_sensor(slot.factory)
        if sensor is not None:
            slot.state, slot.sensor, slot.reason, slot.sample_error, slot.said = RUNNING, sensor, None, None, None
            log.info("sensor %s started for %s", slot.name, ", ".join(slot.loops))
            return
        if (why, slot.loops) != slot.said:      # one line per reason and users, not one per try
            slot.said = (why, slot.loops)
            log.warning("sensor %s unavailable (%s): %s without it", slot.name, why, users_text(slot.loops))
        slot.state, slot.reason = UNAVAILABLE, why

    def _stop(self, slot: SensorSlot, why: str) -> None:
        if slot.sensor is not None:
            stop_sensor(slot.sensor)
            log.info("sensor %s stopped: %s", slot.name, why)
        slot.state, slot.sensor, slot.reason = STOPPED, None, None
