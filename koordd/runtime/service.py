"""The daemon: start (recover what a previous run left), the main loop, reload, and a clean stop.

Its parts are built by koordd/runtime/wiring.py and handed to each other through their constructors; a
round is koordd/runtime/round.py's, and its result goes to the subscribers (koordctl top's feed, the
status file, the metrics endpoint) through one interface (koordd/runtime/result.py).

Nothing in a round waits on a prekill hook: the actuator begins it, a thread watches it (and wakes the
main loop when it is done), and the main loop applies the kill that waited for it between rounds
(Runner.finish()), within one budget per eviction; a stop cancels whatever still waits, first.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import time
from pathlib import Path

from koordd.act.decision_log import DecisionLog
from koordd.act.journal import Held
from koordd.core.config import Config, ConfigError
from koordd.core.installed import version
from koordd.core import slo
from koordd.core.kubelet import KubeletRule
from koordd.kernel.cgroupfs import DEFAULT_ROOT, detect_layout
from koordd.runtime import notify, reload as rereading, wiring
from koordd.runtime.capabilities import probe_all
from koordd.runtime.configwatch import ConfigWatcher
from koordd.runtime.host_claim import HostClaim
from koordd.runtime.logs import set_level
from koordd.runtime.metricsfeed import MetricsFeed
from koordd.runtime.reportpush import ReportPusher
from koordd.runtime.round import ReclaimableFigure, ReportFigure, Rounds
from koordd.runtime.statusfile import StatusFile
from koordd.runtime.topfeed import TopFeed
from koordd.runtime.wakeup import Wakeup

log = logging.getLogger("koordd")


class Daemon:
    def __init__(self, config: Config, registry, dry_run: bool = False):
        """`registry`: the loops (name -> Loop class) the config was validated against."""
        self.config, self.registry = config, registry
        self.dry_run = dry_run or config.daemon.dry_run
        self.layout = detect_layout(Path(config.daemon.cgroup_root or DEFAULT_ROOT))
        # Before anything is written, the state_dir made or the journal read: one koordd per host writes.
        self.claim = HostClaim.take(config, self.dry_run)
        self.state_dir, self.journal = self.claim.state_dir, self.claim.journal
        parts = wiring.build(config, registry, self.layout, self.claim, self.dry_run)
        self.fs, self.backends, self.actuator = parts.fs, parts.backends, parts.actuator
        self.sensors, self.runner = parts.sensors, parts.runner
        self.started = time.time()
        self.capabilities: tuple = ()
        self.top = TopFeed(self.state_dir, current=self._current_value)    # what koordctl top asks for, while it asks
        self.metrics = MetricsFeed(self.started, {"version": _version(), "cgroups": self.layout.describe(),
                                                  "dry_run": str(self.dry_run).lower()}, lambda: self.capabilities)
        self.status = StatusFile(self.state_dir, self.started, str(config.path), self.dry_run, self.layout.describe(),
                                 lambda: self.metrics.listen)
        self.reclaimable = ReclaimableFigure(config.reclaimable)
        self.report = ReportFigure(config.report, socket.gethostname())
        self.pusher = ReportPusher()        # [report] url: a thread of its own POSTs the latest report
        self.rounds = Rounds(self.sensors, self.runner, self.actuator, self.journal, self.reclaimable,
                             readers=(self.top, self.metrics), report=self.report)
        self.subscribers = (self.top, self.status, self.metrics, self.pusher)    # in this order after every round
        self.wake = Wakeup()                # set by signal handlers: no lock (koordd/runtime/wakeup.py)
        self.actuator.woken = self.wake.set     # a command beside the round (a prekill hook) is done
        self.stopping = False
        self.reload_at: float | None = None
        self.watcher: ConfigWatcher | None = None
        # The start could not classify the tree (EMFILE, ENOMEM): what a previous run left waits for a
        # round that can, and is recovered then.
        self.recovery_pending = False

    # --- start ----------------------------------------------------------------

    def start(self) -> None:
        log.info("koordd starting: config %s, cgroups %s%s", self.config.path, self.layout.describe(),
                 ", dry-run: nothing will be written" if self.dry_run else "")
        # Not the optional sensors: they start when a loop needs them, and say so if they cannot.
        self.capabilities = tuple(probe_all(self.layout.root, skip=("sensors",)))
        for cap in self.capabilities:
            if not cap.available:
                log.info("capability %s unavailable: %s", cap.name, cap.detail)
        self._log_missing_knobs()
        self._recover()
        self.top.withdraw()                 # a top.json a previous run left: nobody asked this run
        self.runner.configure(self.config)
        self._require_sensors()
        try:
            self.rounds.baseline()
        except Exception:  # noqa: BLE001 - a tree that cannot be listed now (EMFILE): the first round tries again
            log.exception("the first snapshot failed; the loops' first rounds will try again")

    def _log_missing_knobs(self) -> None:
        wiring.log_missing_knobs(self.actuator.unsupported, self.fs)

    def _recover(self) -> None:
        """Knobs left changed by a previous run that crashed: re-adopt those whose loop runs again,
        restore the rest."""
        enabled = {n for n, s in self.config.loops.items() if s.enabled}
        # Restores are writes like any other: the guard must know the classes before the first round does.
        try:
            self.actuator.protect(self.sensors.class_roots())
        except OSError as e:
            if not self.recovery_pending:
                log.error("cannot list the cgroup tree to classify it (%s): what a previous run left is kept "
                          "until a round can, and recovered then", e)
            self.recovery_pending = True
            return
        if self.recovery_pending:
            log.info("the cgroup tree can be listed again: recovering what a previous run left")
        self.recovery_pending = False
        for h in self.journal.entries():
            if self.dry_run:
                log.info("%s %s changed by a previous run (original %r, loop %s) is left as it is (dry-run)",
                         _where(h), h.knob, h.original, h.owner)
            elif h.owner in enabled:
                log.info("re-adopting %s %s (original %r) for loop %s", _where(h), h.knob, h.original, h.owner)
        # In dry-run the actuator only records what it would restore.
        self.actuator.restore_where(lambda h: h.owner in enabled,
                                    "left changed by a previous run whose loop is not enabled now")

    def _require_sensors(self) -> None:
        """Run the optional sensors the enabled loops need, those the classes' SLOs are measured by (the
        application latency sensor while a class declares an SLO), and those koordctl top shows while it asks."""
        users = self.runner.sensor_users()
        slos = ((rule.name, rule.slo) for rule in self.config.classes if rule.slo is not None)
        for sensor, who in slo.sensor_users(slos).items():
            users.setdefault(sensor, []).extend(who)
        for sensor, viewer in self.top.sensor_users(self.sensors.optional.names).items():
            users.setdefault(sensor, []).append(viewer)
        self.sensors.optional.require(users)

    # --- the main loop ------------------------------------------------------------

    def run(self, once: bool = False) -> int:
        if not once:
            # Before start(): a SIGTERM while it restores what a previous run left, or takes the first
            # snapshot, must stop koordd the orderly way, not kill it mid-write with the default action.
            self._install_signals()
            # First: /healthz says "starting" while the journal is recovered and the first snapshot taken.
            self.metrics.configure(self.config.metrics)
            self.pusher.configure(self.config.report)
        self.start()
        if once:
            time.sleep(min([float(s.interval) for s in self.config.loops.values() if s.enabled] + [1.0]))
            self.round(list(self.runner.runs.values()))
            while self.actuator.beside:     # a prekill hook and the kill behind it: within their budget
                self.wake.wait(max(0.0, self.actuator.next_deadline() - time.monotonic()))
                self.runner.finish()
            self._write_status()            # before the sensors stop: it says which ran and which could not
            self.sensors.close()
            self.claim.release()            # what it changed stays, in the journal, for the next owner
            return 0 if all(r.failures == 0 for r in self.runner.runs.values()) else 1
        self.watcher = ConfigWatcher(str(self.config.path), lambda: self.request_reload(rereading.RELOAD_DEBOUNCE))
        if not self.watcher.start():
            self.watcher = None
        try:
            self._serve()
        finally:
            if self.watcher is not None:
                self.watcher.stop()
            self.stop()
        return 0

    def _serve(self) -> None:
        watchdog = notify.watchdog_period()
        next_ping = time.monotonic()
        ready = False
        while not self.stopping:
            now = time.monotonic()
            if self.reload_at is not None and now >= self.reload_at:
                self.reload_at = None
                self.reload()
            if now >= self.top.next_check:
                self.poll_view(now)
            if self.actuator.beside and not self.stopping:
                self.runner.finish()        # kills whose prekill hooks are done or out of time
            due, for_view = self.runner.due(now), self.top.due(now)
            if due or for_view:
                self.round(due, for_view)
            self.metrics.beat(self.runner.alive)
            if not ready and (due or not self.runner.runs):
                notify.notify("READY=1", "STATUS=running")     # after the first tick
                ready = True
            if watchdog is not None and now >= next_ping and self.runner.alive(time.monotonic()):
                notify.notify("WATCHDOG=1")
                next_ping = now + watchdog
            # The view's time too: a daemon with no loop due still looks for a view once a second.
            wake_at = [t for t in (self.runner.next_due(), self.reload_at, self.top.next_wake(),
                                   next_ping if watchdog else None, self.actuator.next_deadline()) if t is not None]
            timeout = max(0.0, min(wake_at) - time.monotonic()) if wake_at else None
            self.wake.wait(timeout)

    def round(self, due, for_view: bool = False) -> None:
        """One round for the due loops; while koordctl top asks, with what it shows too, published
        when `for_view` (the view's interval is up). Its result goes to every subscriber."""
        if self.recovery_pending and not self.stopping:
            self._recover()
        result = self.rounds.run(due, for_view)
        for subscriber in self.subscribers:
            if result is None:
                subscriber.skipped(time.monotonic())
            else:
                subscriber.published(result)

    def poll_view(self, now: float | None = None) -> None:
        """Look for koordctl top's request; start or stop the sensors it shows when a view came or went."""
        if self.top.check(time.monotonic() if now is None else now):
            log.debug("koordctl top %s", "is watching" if self.top.active else "went away")
            self._require_sensors()

    def _current_value(self, held: Held) -> str | None:
        """A held knob's value now, for the view: read through its backend; None if it cannot be read."""
        backend = self.backends.of_kind(held.kind)
        try:
            return backend.read(held.target, held.knob) if backend is not None else None
        except Exception:  # noqa: BLE001 - a gone target or a third-party backend's bug costs the view one value
            return None

    def _write_status(self) -> None:
        self.status.write(self.rounds.result())

    # --- stop -----------------------------------------------------------------------

    def stop(self) -> None:
        notify.notify("STOPPING=1")
        # First: no eviction that waited for a prekill hook is made once a stop was asked; the hooks end.
        self.actuator.cancel("koordd stopping")
        self.top.withdraw()
        with notify.StopExtender(self._restore_progress):
            self.actuator.restore_all("koordd stopping")
        self.sensors.close()
        self.backends.close()
        self.journal.close()
        self._write_status()
        self.metrics.stop()
        self.pusher.stop()
        log.info("koordd stopped; %d knobs left held", len(self.journal.entries()))
        self.claim.release()

    def _restore_progress(self) -> tuple:
        """What changes with every restore (a release in the journal, a decision record), read from the
        files alone: the stop extender asks from its own thread."""
        out = []
        for path in (self.journal.path, self.state_dir / DecisionLog.FILE):
            try:
                st = os.stat(path)
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    # --- reload ---------------------------------------------------------------

    def request_reload(self, delay: float = 0.0) -> None:
        self.reload_at = time.monotonic() + delay
        self.wake.set()

    def reload(self) -> None:
        notify.reloading()
        path = Path(self.config.path)
        if self.watcher is not None:
            self.watcher.refresh()          # a repointed symlink: watch where it leads now
        try:
            new = rereading.read_config(path, self.registry)
        except rereading.Unsettled:
            log.info("%s changed while it was read; reading it again", path)
            self.request_reload(rereading.RELOAD_DEBOUNCE)
            notify.notify("READY=1", "STATUS=running")
            return
        except ConfigError as e:
            log.error("reload refused, keeping the running config:\n%s", e)
            notify.notify("READY=1", "STATUS=running (reload refused, see log)")
            return
        rereading.log_warnings(self.config, new)
        try:
            self._swap(new)
        except Exception:  # noqa: BLE001 - a bug met while applying a valid config must not stop koordd
            log.exception("reload of %s failed midway; koordd runs on with what was applied", path)
            notify.notify("READY=1", "STATUS=running (reload failed midway, see log)")
            return
        log.info("reloaded %s", new.path)
        notify.notify("READY=1", "STATUS=running")

    def _swap(self, new: Config) -> None:
        """The one place a reload hands the new config, and what is built from it, to the running parts."""
        set_level(new.daemon.log_level)
        self.config = new
        self.metrics.configure(new.metrics)
        self.sensors.set_classes(new.classes)
        # Which knobs this host has, file by file, from every backend: probed again.
        unsupported, before = self.backends.probe(), self.actuator.unsupported
        self.sensors.set_supported(wiring.supported(self.backends, unsupported))
        if unsupported != before:
            wiring.log_missing_knobs(unsupported, self.fs)
        self.sensors.reprobe()
        self.reclaimable.settings = new.reclaimable
        self.report.settings = new.report
        self.pusher.configure(new.report)
        self.actuator.reconfigure(KubeletRule.of(new.daemon), unsupported)     # before the loops' first writes
        self.runner.configure(new)          # the loops no longer enabled give their knobs back
        self._require_sensors()

    def _install_signals(self) -> None:
        def on_stop(signum, frame):
            self.stopping = True
            self.wake.set()
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, lambda s, f: self.request_reload())


def _version() -> str:
    return version("koordd") or "unknown"      # unknown: run from a source tree without its metadata


def _where(h) -> str:
    return h.target or "/" if h.kind == "cgroup" else f"{h.kind} {h.target}"
