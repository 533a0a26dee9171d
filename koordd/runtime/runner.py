"""Runs the enabled loops, each on its own interval, each failing alone.

One thread: when loops are due, the sensors build one snapshot, each due loop
decides, the actuator applies. A command that runs long (a prekill hook) is only
begun in a round; finish() applies what waited for it, between rounds. An exception in a loop is logged with its
traceback and the loop backs off (doubling, up to MAX_BACKOFF) while the
others keep their rhythm.
"""
from __future__ import annotations

import logging
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Collection, Mapping

from koordd.act.actuator import Actuator
from koordd.act.journal import Held
from koordd.act.protect import standing_harm
from koordd.core.config import Config
from koordd.core.loop import Action, Loop
from koordd.core.protected import Protected
from koordd.core.settings import Settings
from koordd.core.snapshot import CGROUP_FIELDS, Snapshot

log = logging.getLogger("koordd.runner")     # its name before the move: log lines unchanged
MAX_BACKOFF = 60.0
COALESCE = 0.05
FIRST_ROUND_AFTER = 0.5    # seconds from a loop's start (the baseline snapshot) to its first round, at most


@dataclass
class Timing:
    """Wall and thread-CPU seconds of a piece of work: its last run (one or more blocks) and in total.
    Thread CPU time: the main thread's alone, not the metrics server's."""
    last_seconds: float = 0.0
    seconds_total: float = 0.0
    cpu_seconds_total: float = 0.0

    @staticmethod
    def now() -> tuple[float, float]:
        return time.perf_counter(), time.thread_time()

    def add_since(self, since: tuple[float, float]) -> None:
        wall, cpu = (b - a for a, b in zip(since, self.now()))
        self.last_seconds += wall
        self.seconds_total += wall
        self.cpu_seconds_total += cpu

    @contextmanager
    def measure(self):
        """Adds the time of the block, also when it raises."""
        since = self.now()
        try:
            yield
        finally:
            self.add_since(since)


@dataclass
class LoopRun:
    name: str
    impl: type[Loop]
    settings: Settings
    state: Any
    next_due: float
    ticks: int = 0
    failures: int = 0
    last_tick: float | None = None       # wall time of the last attempt
    last_ok: float | None = None
    last_error: str | None = None
    last_changes: int = 0
    errors: int = 0                      # failures since start (failures counts those in a row)
    # This loop's own share of its rounds (decide and settle: the snapshot and the writes are the
    # round's), for the metrics endpoint.
    timing: Timing = field(default_factory=Timing)


def class_of(cgroup: str, snapshot: Snapshot) -> str | None:
    """Class of a cgroup: that of the class root it is, or lies below (the nearest: the deepest match).
    A cgroup sampled without a class (a scope a loop watches) gives none: the search goes on above it."""
    path = cgroup
    while True:
        sample = snapshot.cgroups.get(path)
        if sample is not None and sample.cls:
            return sample.cls
        if "/" not in path:
            return None
        path = path.rpartition("/")[0]


def classes_of(snapshot: Snapshot) -> dict[str, str]:
    """cgroup -> class of every cgroup the snapshot holds, members included."""
    out = {path: c.cls for path, c in snapshot.cgroups.items()}
    for members in snapshot.members.values():
        out.update((m.path, m.cls) for m in members)
    return out


class Runner:
    def __init__(self, registry: Mapping[str, type[Loop]], actuator: Actuator, sensors: Collection[str] = ()):
        """`sensors`: the names of the registered optional sensors, which needs() may name."""
        self.registry, self.actuator = registry, actuator
        self.sensors = frozenset(sensors)
        self.runs: dict[str, LoopRun] = {}

    def configure(self, config: Config, now: float | None = None) -> None:
        """Start newly enabled loops, stop disabled ones (restoring their knobs), refresh changed settings."""
        now = time.monotonic() if now is None else now
        for name, settings in config.loops.items():
            run = self.runs.get(name)
            if not settings.enabled:
                if run is not None:
                    self.stop(name, "loop disabled")
                continue
            impl = self.registry[name]
            if run is None:
                # A rate needs two samples, not a whole interval between them: the first round comes
                # FIRST_ROUND_AFTER the start's baseline snapshot (or one interval, if shorter), so koordd
                # acts, and says READY, within a second of its start whatever the loops' intervals.
                self.runs[name] = LoopRun(name, impl, settings, impl.initial_state(settings),
                                          now + min(float(settings.interval), FIRST_ROUND_AFTER))
                log.info("loop %s started: %s", name, settings)
                self._check_needs(self.runs[name])
            elif run.settings != settings:
                run.settings, run.state, run.next_due = settings, impl.initial_state(settings), now
                log.info("loop %s reconfigured: %s", name, settings)
                self._check_needs(run)
        for name in set(self.runs) - {n for n, s in config.loops.items() if s.enabled}:
            self.stop(name, "loop removed from config")

    def _check_needs(self, run: LoopRun) -> None:
        """A needs() word that is neither a cgroup field nor a registered sensor (a typo, a sensor whose
        package is not installed) is one error line; the loop runs, and finds no such section."""
        unknown = self._words(run) - CGROUP_FIELDS - self.sensors
        if unknown:
            log.error("loop %s: needs() names %s, neither a cgroup field nor a registered sensor (sensors: %s); "
                      "the loop runs without %s", run.name, ", ".join(sorted(unknown)),
                      ", ".join(sorted(self.sensors)) or "none", "it" if len(unknown) == 1 else "them")

    def stop(self, name: str, why: str) -> None:
        self.runs.pop(name, None)
        self.actuator.cancel(f"loop {name} stopped ({why})", loop=name)    # its pending evictions are not made
        self.actuator.restore_owner(name, why)
        log.info("loop %s stopped: %s", name, why)

    def watched(self) -> set[str]:
        return {cg for r in self.runs.values() for cg in r.impl.watches(r.settings)}

    def needs(self) -> frozenset[str]:
        """What the enabled loops read from a snapshot: the sensors read only that."""
        return frozenset().union(*(r.impl.needs(r.settings) for r in self.runs.values()))

    def sensor_users(self) -> dict[str, list[str]]:
        """Optional sensor -> the enabled loops that need it: the sensors to run."""
        users: dict[str, list[str]] = {}
        for name, r in sorted(self.runs.items()):
            for sensor in sorted(self._words(r) & self.sensors):
                users.setdefault(sensor, []).append(name)
        return users

    def class_needs(self) -> dict[str, frozenset[str]]:
        """Class -> what is read of its class roots alone (Loop.class_needs), beyond needs()."""
        out: dict[str, frozenset[str]] = {}
        for r in self.runs.values():
            extra = r.impl.class_needs(r.settings)
            for cls in r.impl.members_of(r.settings) if extra else ():
                out[cls] = out.get(cls, frozenset()) | extra
        return out

    def member_needs(self) -> frozenset[str]:
        """What is read of class members (pods): only the loops that asked for members need them."""
        return frozenset().union(*(r.impl.member_needs(r.settings) for r in self.runs.values()
                                   if r.impl.members_of(r.settings)))

    def member_fields(self, runs: list[LoopRun], snapshot: Snapshot) -> frozenset[str]:
        """What the due loops read of members this tick (Loop.member_fields); a loop that fails to say
        gets all it may need, and its decide() is where a bug shows."""
        out: frozenset[str] = frozenset()
        for run in runs:
            if not run.impl.members_of(run.settings):
                continue
            try:
                wanted = run.impl.member_fields(snapshot, run.settings, run.state)
            except Exception:  # noqa: BLE001
                log.exception("loop %s: member_fields failed; reading all it needs", run.name)
                wanted = run.impl.member_needs(run.settings)
            out |= frozenset(wanted) & run.impl.member_needs(run.settings)
        return out

    @staticmethod
    def _words(run: LoopRun) -> frozenset[str]:
        return run.impl.needs(run.settings) | run.impl.member_needs(run.settings) | run.impl.class_needs(run.settings)

    def member_classes(self) -> set[str]:
        return {cls for r in self.runs.values() for cls in r.impl.members_of(r.settings)}

    def due(self, now: float) -> list[LoopRun]:
        # Loops due within COALESCE share this snapshot: a second one a few ms later would measure
        # usage rates over a few ms, which is noise.
        return [r for r in self.runs.values() if r.next_due <= now + COALESCE]

    def next_due(self) -> float | None:
        return min((r.next_due for r in self.runs.values()), default=None)

    def skip(self, runs: list[LoopRun], now: float) -> None:
        for run in runs:
            run.next_due = now + float(run.settings.interval)

    def tick(self, runs: list[LoopRun], snapshot: Snapshot) -> None:
        """Every due loop decides; then all their actions are written as one batch (one write order
        across loops: a parent's limit and a child's never cross); then each loop settles."""
        decided: list[tuple[LoopRun, list]] = []
        for run in runs:
            run.last_tick = time.time()
            run.ticks += 1
            run.timing.last_seconds = 0.0
            try:
                with run.timing.measure():
                    actions = list(run.impl.decide(snapshot, run.settings, run.state))
                bad = [a for a in actions if not isinstance(a, Action)]
                if bad:
                    raise TypeError(f"decide returned {bad[0]!r}, not an Action")
            except Exception as e:  # noqa: BLE001 - one loop's bug must not stop the others
                self._failed(run, e, snapshot)
                continue
            decided.append((run, actions))
        self.actuator.protect(classes_of(snapshot))
        try:
            applied = self.actuator.apply_round([(run.name, actions) for run, actions in decided])
        except Exception:  # noqa: BLE001 - one loop's odd action must not cost the others their round
            applied = {}
            for run, actions in list(decided):
                try:
                    applied[run.name] = self.actuator.apply(run.name, actions)
                except Exception as e:  # noqa: BLE001
                    self._failed(run, e, snapshot)
                    decided.remove((run, actions))
        for run, actions in decided:
            try:
                changes = applied[run.name]
                # What runs beside the round (a prekill hook, the kill behind it) settles when it is done.
                waiting = {id(a) for a in self.actuator.waiting(run.name)}
                with run.timing.measure():
                    run.impl.settle([a for a in actions if id(a) not in waiting], changes, run.settings, run.state)
                changes += self._release_strays(run, snapshot)
            except Exception as e:  # noqa: BLE001
                self._failed(run, e, snapshot)
                continue
            run.failures, run.last_error, run.last_ok = 0, None, run.last_tick
            run.last_changes = len(changes)
            interval = float(run.settings.interval)
            # Keep the rhythm; after a stall, skip the missed ticks rather than run them back to back.
            run.next_due = run.next_due + interval if run.next_due + interval > snapshot.time \
                else snapshot.time + interval

    def finish(self, now: float | None = None) -> None:
        """Apply what waited beside the round for a command now done or out of time (the actuator's
        finish(), on this thread), and let each loop settle it. Called by the main loop between rounds."""
        for loop, actions, decisions in self.actuator.finish(now):
            run = self.runs.get(loop)
            if run is None:
                continue
            try:
                with run.timing.measure():
                    run.impl.settle(actions, decisions, run.settings, run.state)
            except Exception as e:  # noqa: BLE001
                run.failures += 1
                run.errors += 1
                run.last_error = f"{type(e).__name__}: {e}"
                log.error("loop %s failed to settle what ran beside its round:\n%s", run.name,
                          "".join(traceback.format_exception(e)).rstrip())

    def _failed(self, run: LoopRun, e: Exception, snapshot: Snapshot) -> None:
        run.failures += 1
        run.errors += 1
        backoff = min(float(run.settings.interval) * 2 ** run.failures, MAX_BACKOFF)
        run.last_error = f"{type(e).__name__}: {e}"
        run.next_due = snapshot.time + backoff
        log.error("loop %s failed (%d in a row), retrying in %.1fs:\n%s", run.name, run.failures, backoff,
                  "".join(traceback.format_exception(e)).rstrip())

    def _release_strays(self, run: LoopRun, snapshot: Snapshot) -> list:
        """Knobs this loop holds on cgroups that left its classes (config edit, relabel) go back.
        Other kinds of target have no class to leave: the loop that holds them lets them go."""
        allowed = run.impl.writes(run.settings)
        backends = self.actuator.backends

        def on_cgroup(h: Held) -> bool:
            backend = backends.of_kind(h.kind)
            return backend is not None and backend.cgroup_targets

        def still_ours(h: Held) -> bool:
            return h.owner != run.name or not on_cgroup(h) or (class_of(h.target, snapshot), h.knob) in allowed

        changes = self.actuator.restore_where(still_ours, f"cgroup is no longer managed by {run.name}")
        # A throttle or freeze this loop holds on a cgroup that is, holds or lies inside non-BE work now
        # (an LS job started in be.slice): the guard refuses new ones only, so the standing ones go back.
        guard: list[Protected] = []         # built once, and only when this loop holds a cgroup knob

        def harmless(h: Held) -> bool:
            if h.owner != run.name or not on_cgroup(h):
                return True
            guard[:] = guard or [Protected.of_snapshot(snapshot)]
            backend = backends.of_kind(h.kind)
            return standing_harm(guard[0], h.target, backend.knobs.get(h.knob), h.original,
                                 lambda: backend.scope(h.knob, backend.read(h.target, h.knob), h.original)) is None
        return changes + self.actuator.restore_where(
            harmless, f"{run.name}'s throttle lifted: the cgroup is, holds or lies inside LS, LSR, LSE or SYSTEM work")

    def alive(self, now: float) -> bool:
        """True while no loop is overdue by much: the scheduler itself is not stuck."""
        return all(now - r.next_due < max(3 * float(r.settings.interval), 5.0) for r in self.runs.values())

    def status(self) -> dict:
        return {name: {"interval": float(r.settings.interval), "ticks": r.ticks, "failures": r.failures,
                       "last_tick": r.last_tick, "last_ok": r.last_ok, "last_error": r.last_error,
                       "last_changes": r.last_changes, "errors": r.errors, **asdict(r.timing),
                       **({"report": report} if (report := _report(r)) else {})}
                for name, r in sorted(self.runs.items())}


def _report(run: LoopRun) -> Mapping[str, Any]:
    """The loop's own report (Loop.report); a loop whose report fails costs the status nothing but it."""
    try:
        return run.impl.report(run.settings, run.state)
    except Exception:  # noqa: BLE001 - a summary koordd only publishes must not cost it the round
        log.exception("loop %s: its report failed", run.name)
        return {}

