"""koordd: the daemon. Start-up, the main loop, reload, and a clean stop.

    koordd [--config F] [--dry-run] [--once] [--log-level L]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog, journal_sender
from koordd.act.journal import Held, JournalUnreadable, RestoreJournal, note_move, write_atomic
from koordd.act.owner import HostOwned, OwnerLock, UntrustedLock, current_holder, lock_path
from koordd.act.protect import process_cgroups
from koordd.backends.cgroup import KNOBS, kernel_lacks
from koordd.backends.registry import all_backends
from koordd.core.config import Config, ConfigError, DEFAULT_PATH, load_config
from koordd.core.feeds import REQUEST_FILE, STATUS_FILE, TOP_FILE
from koordd.core.kubelet import KubeletRule
from koordd.core.printable import PrintableFormatter
from koordd.core.reclaimable import (FIELDS as RECLAIMABLE_FIELDS, Reclaimable, ReclaimableState,
    observe as observe_reclaimable)
from koordd.core.registry import load_registry
from koordd.core.snapshot import Snapshot
from koordd.core.trust import untrusted_state_dir
from koordd.kernel.cgroupfs import CgroupFS, DEFAULT_ROOT, LayoutError, detect_layout, on_cgroupfs
from koordd.runtime import notify
from koordd.runtime.capabilities import probe_all
from koordd.runtime.configwatch import ConfigWatcher
from koordd.runtime.runner import Runner, Timing
from koordd.runtime.topfeed import TopFeed, document
from koordd.runtime.wakeup import Wakeup
from koordd.sensors.collect import Sensors
from koordd.sensors.lifecycle import SensorManager
from koordd.sensors.registry import load_sensor_registry

log = logging.getLogger("koordd")
RELOAD_DEBOUNCE = 0.5        # editors write a file in several steps: reload once they are done
RESTART_KEYS = ("cgroup_root", "state_dir", "dry_run")
# What koordd reads, appends to or replaces in its state_dir: trusted only if root's alone.
STATE_FILES = (RestoreJournal.FILE, RestoreJournal.V1_FILE, RestoreJournal.MOVED_FROM, DecisionLog.FILE, STATUS_FILE,
               TOP_FILE, REQUEST_FILE)
EX_CONFIG, EX_TEMPFAIL = 78, 75     # invalid config or untrusted files (restarting will not help); host owned


class UntrustedState(Exception):
    """The state_dir or a file in it could be changed by someone other than root."""


def setup_logging(level: str) -> None:
    root = logging.getLogger()
    root.handlers.clear()
    handler: logging.Handler
    if journal_sender() is not None:
        from systemd.journal import JournalHandler
        handler = JournalHandler(SYSLOG_IDENTIFIER="koordd")
        handler.setFormatter(PrintableFormatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    set_level(level)


def set_level(level: str) -> None:
    # Only koordd's own loggers follow log_level: libraries at debug (watchdog logs every inotify
    # event) would drown the journal, and could even feed on their own log file's events.
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("koordd").setLevel(getattr(logging, level.upper()))


class Daemon:
    def __init__(self, config: Config, registry, dry_run: bool = False):
        self.config, self.registry = config, registry
        self.dry_run = dry_run or config.daemon.dry_run
        root = Path(config.daemon.cgroup_root or DEFAULT_ROOT)
        self.layout = detect_layout(root)
        self.state_dir = Path(config.daemon.state_dir)
        # Before anything is written, the state_dir made or the journal read: one koordd per host writes.
        self.owner = self._own_host()
        try:
            self.journal = self._open_state_dir()
        except BaseException:
            self._release_host()
            raise
        self.fs = CgroupFS(self.layout, keep_open=on_cgroupfs(self.layout), max_open=_raise_open_files_limit())
        self.backends = all_backends(self.fs)
        self.actuator = Actuator(self.backends, self.journal, DecisionLog(self.state_dir, send=journal_sender()),
                                 dry_run=self.dry_run)
        self.actuator.unsupported = self.backends.probe()
        self.actuator.processes = process_cgroups()     # PID 1's and koordd's: never evicted or throttled
        self.sensors = Sensors(self.fs, config.classify, _patterns(config),
                               optional=SensorManager(load_sensor_registry()), supported=self._supported(),
                               health_of=config.health_of)
        self.runner = Runner(registry, self.actuator, sensors=self.sensors.optional.names)
        self.top = TopFeed(self.state_dir)          # what koordctl top asks for, while it asks
        self.wake = Wakeup()                # set by signal handlers: no lock (koordd/runtime/wakeup.py)
        self.stopping = False
        self.reload_at: float | None = None
        self.started = time.time()
        self.capabilities: tuple = ()
        self.reclaim = ReclaimableState()               # its windows of LS peaks
        self.reclaimable: Reclaimable | None = None
        self.rounds, self.round_time = 0, Timing()       # rounds done and their time: for the metrics
        self.exporter = None                            # koordd/runtime/metrics.py, while [metrics] enable = true
        self.metrics_server = None
        self.metrics_fields: frozenset[str] = frozenset()
        self.watcher: ConfigWatcher | None = None

    # --- the host's knobs: one owner -------------------------------------------

    def _own_host(self) -> OwnerLock | None:
        """The host lock (koordd/act/owner.py), or HostOwned naming its holder. A dry-run takes none, but
        refuses beside the holder on the holder's own state_dir: its status, decisions and top files
        would overwrite the holder's, and its recovery would take the holder's live holds for leftovers."""
        if not self.dry_run:
            return OwnerLock.take(self.config.path, self.state_dir)
        holder = current_holder()
        if holder is not None and holder.state_dir is not None and \
                os.path.realpath(holder.state_dir) == os.path.realpath(self.state_dir):
            raise HostOwned(holder, lock_path(), f"{holder.describe()} owns this host's knobs and uses state_dir "
                            f"{self.state_dir}: a dry-run there would overwrite its status and decision log; give "
                            "the dry-run a config with another daemon.state_dir")
        if holder is not None:
            log.info("%s owns this host's knobs; this dry-run writes none", holder.describe())
        return None

    def _open_state_dir(self) -> RestoreJournal:
        """The state_dir, made if missing, and its journal; UntrustedState if others could change them."""
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = untrusted_state_dir(self.state_dir, STATE_FILES)
        if why:
            raise UntrustedState(f"{why}: koordd undoes what its state_dir's journal says, so it trusts the "
                                 f"directory only if root alone can change it (chown root, chmod go-w)")
        _keep_private(self.state_dir)
        self._carry_over_previous_state_dir()
        return RestoreJournal(self.state_dir)

    def _carry_over_previous_state_dir(self) -> None:
        """The koordd that held the host before used another state_dir (the config changed it, then that
        koordd was killed before a clean stop restored its knobs): its journal's holds are carried over
        here (state.note_move), not abandoned. A state_dir others could change is not read from."""
        previous = self.owner.previous if self.owner is not None else None
        if previous is None or not previous.state_dir:
            return
        old = Path(previous.state_dir)
        if os.path.realpath(old) == os.path.realpath(self.state_dir) or not (old / RestoreJournal.FILE).exists():
            return
        why = untrusted_state_dir(old, STATE_FILES)
        if why:
            log.error("the koordd before this one (pid %s) kept its restore journal in %s, which is not trusted "
                      "(%s): its holds are not carried over", previous.pid, old, why)
            return
        log.warning("the koordd before this one (pid %s) kept its restore journal in %s: its holds are carried "
                    "over to %s", previous.pid, old, self.state_dir)
        note_move(self.state_dir, old)

    def _release_host(self) -> None:
        if self.owner is not None:
            self.owner.release()
            self.owner = None

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
        self._configure(self.config)
        # Baseline: rates need two samples.
        try:
            self.sensors.snapshot(self.runner.watched(), member_classes=self.runner.member_classes(),
                                  fields=self.runner.needs() | self._extra_fields(),
                                  member_fields=self.runner.member_needs())
        except Exception:  # noqa: BLE001 - a tree that cannot be listed now (EMFILE): the first round tries again
            log.exception("the first snapshot failed; the loops' first rounds will try again")

    def _extra_fields(self) -> frozenset[str]:
        """What is read of the class roots beyond the loops' needs: what the reclaimable figure reads,
        and while the endpoint serves, what its per-class and per-cgroup series show."""
        return RECLAIMABLE_FIELDS | (self.metrics_fields if self.exporter is not None else frozenset())

    def _configure(self, config: Config) -> None:
        """Run the loops `config` enables, and the optional sensors they need (and only those)."""
        self.actuator.kubelet = KubeletRule.of(config.daemon)     # before the loops' first writes
        self.runner.configure(config)
        self._require_sensors()

    def _require_sensors(self) -> None:
        """Run the optional sensors the enabled loops need, and those koordctl top shows while it asks."""
        users = self.runner.sensor_users()
        for sensor, viewer in self.top.sensor_users(self.sensors.optional.names).items():
            users.setdefault(sensor, []).append(viewer)
        self.sensors.optional.require(users)

    def _log_missing_knobs(self) -> None:
        """One line per knob the host lacks; of the cgroup knobs, only those the kernel lacks (those
        the layout lacks follow from the cgroup mode)."""
        unsupported = self.actuator.unsupported
        for name, why in sorted(kernel_lacks({k: why for k, why in unsupported.items() if k in KNOBS}, self.fs).items()):
            log.info("knob %s", why)
        # Other backends' knobs, one line per reason (a backend lacking its feature lacks all its knobs).
        by_reason: dict[str, list[str]] = {}
        for name, why in unsupported.items():
            if name not in KNOBS:
                by_reason.setdefault(why, []).append(name)
        for why, names in sorted(by_reason.items()):
            log.info("knob%s %s unavailable: %s", "s" if len(names) > 1 else "", ", ".join(sorted(names)), why)

    def _supported(self) -> frozenset[str]:
        return self.backends.knobs() - self.actuator.unsupported.keys()

    def _probe_knobs(self) -> None:
        """Which knobs this host has, file by file, from every backend (probed again on reload)."""
        before = self.actuator.unsupported
        self.actuator.unsupported = self.backends.probe()
        self.sensors.supported = self._supported()
        if self.actuator.unsupported != before:
            self._log_missing_knobs()

    def _recover(self) -> None:
        """Knobs left changed by a previous run that crashed: re-adopt those whose loop runs again,
        restore the rest."""
        enabled = {n for n, s in self.config.loops.items() if s.enabled}
        # Restores are writes like any other: the guard must know the classes before the first round does.
        try:
            self.actuator.protect(self.sensors.class_roots())
        except OSError as e:
            log.error("cannot list the cgroup tree to classify it (%s): what a previous run left is kept for the "
                      "first round", e)
            return
        for h in self.journal.entries():
            if self.dry_run:
                log.info("%s %s changed by a previous run (original %r, loop %s) is left as it is (dry-run)",
                         _where(h), h.knob, h.original, h.owner)
            elif h.owner in enabled:
                log.info("re-adopting %s %s (original %r) for loop %s", _where(h), h.knob, h.original, h.owner)
        # In dry-run the actuator only records what it would restore.
        self.actuator.restore_where(lambda h: h.owner in enabled,
                                    "left changed by a previous run whose loop is not enabled now")

    # --- main loop ------------------------------------------------------------

    def run(self, once: bool = False) -> int:
        if not once:
            # Before start(): a SIGTERM while it restores what a previous run left, or takes the first
            # snapshot, must stop koordd the orderly way, not kill it mid-write with the default action.
            self._install_signals()
            # First: /healthz says "starting" while the journal is recovered and the first snapshot taken.
            self._configure_metrics(self.config.metrics)
        self.start()
        if once:
            time.sleep(min([float(s.interval) for s in self.config.loops.values() if s.enabled] + [1.0]))
            self.round(list(self.runner.runs.values()))
            self._write_status()            # before the sensors stop: it says which ran and which could not
            self.sensors.close()
            self._release_host()            # what it changed stays, in the journal, for the next owner
            return 0 if all(r.failures == 0 for r in self.runner.runs.values()) else 1
        self.watcher = ConfigWatcher(str(self.config.path), lambda: self.request_reload(RELOAD_DEBOUNCE))
        if not self.watcher.start():
            self.watcher = None
        watchdog = notify.watchdog_period()
        next_ping = time.monotonic()
        ready = False
        try:
            while not self.stopping:
                now = time.monotonic()
                if self.reload_at is not None and now >= self.reload_at:
                    self.reload_at = None
                    self.reload()
                if now >= self.top.next_check:
                    self.poll_view(now)
                due, for_view = self.runner.due(now), self.top.due(now)
                if due or for_view:
                    self.round(due, for_view)
                if self.exporter is not None:
                    self.exporter.beat(time.monotonic(), self.runner.alive(time.monotonic()))
                if not ready and (due or not self.runner.runs):
                    notify.notify("READY=1", "STATUS=running")     # after the first tick
                    ready = True
                if watchdog is not None and now >= next_ping and self.runner.alive(time.monotonic()):
                    notify.notify("WATCHDOG=1")
                    next_ping = now + watchdog
                # The view's time too: a daemon with no loop due still looks for a view once a second.
                wake_at = [t for t in (self.runner.next_due(), self.reload_at, self.top.next_wake(),
                                       next_ping if watchdog else None) if t is not None]
                timeout = max(0.0, min(wake_at) - time.monotonic()) if wake_at else None
                self.wake.wait(timeout)
        finally:
            if self.watcher is not None:
                self.watcher.stop()
            self.stop()
        return 0

    def round(self, due, for_view: bool = False) -> None:
        """One snapshot for the due loops; while koordctl top asks, with what it shows too, published
        when `for_view` (the view's interval is up)."""
        loop_members = self.runner.member_classes()
        since = Timing.now()
        extra = self._extra_fields()
        try:
            # Members (pods) are listed first and read only as far as the due loops (and the view) need them now.
            snapshot = self.sensors.snapshot(self.runner.watched(),
                                             {(h.target, h.knob): h.original for h in self.journal.entries()},
                                             loop_members | self.top.member_classes(),
                                             self.runner.needs() | self.top.needs() | extra, frozenset())
            member_fields = self.runner.member_fields(due, only_members_of(snapshot, loop_members))
            snapshot = self.sensors.fill_members(snapshot, member_fields | self.top.member_needs())
        except Exception:  # noqa: BLE001 - sensors should never raise; if one does, skip this round
            log.exception("building the snapshot failed; loops skip this tick")
            self.runner.skip(due, time.monotonic())
            self.top.skip(time.monotonic())
            return
        if due:
            self.runner.tick(due, only_members_of(snapshot, loop_members))
        if self.top.settle(snapshot.time, for_view):
            self.top.publish(document(snapshot, self.top.request, self.journal.entries(), self._current_value,
                                      self.sensors.optional.status()))
        try:
            self.reclaimable = observe_reclaimable(snapshot, self.config.reclaimable, self.reclaim)
        except Exception:  # noqa: BLE001 - a figure koordd only publishes must not cost it the round
            log.exception("computing the reclaimable capacity failed")
            self.reclaimable = None
        self.round_time.last_seconds = 0.0          # a round that failed above leaves the last one's
        self.round_time.add_since(since)
        self.rounds += 1
        status = self._write_status()
        self._publish(snapshot, status)

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

    def stop(self) -> None:
        notify.notify("STOPPING=1")
        self.top.withdraw()
        with notify.StopExtender(self._restore_progress):
            self.actuator.restore_all("koordd stopping")
        self.sensors.close()
        self.backends.close()
        self.journal.close()
        self._write_status()
        self._stop_metrics()
        log.info("koordd stopped; %d knobs left held", len(self.journal.entries()))
        self._release_host()

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

    # --- metrics ----------------------------------------------------------------

    def _configure_metrics(self, settings) -> None:
        """Start, stop or move the endpoint as [metrics] says; the allow-list and the cap need no restart
        (each round publishes the settings with the state)."""
        running = self.metrics_server.listen if self.metrics_server is not None else None
        wanted = settings.listen if settings.enable else None
        if wanted == running and (wanted is None or self.exporter is not None):
            return
        self._stop_metrics()
        if wanted is None:
            return
        try:
            from koordd.runtime import metrics
        except ImportError as e:
            log.error("metrics: prometheus-client is not installed (%s); koordd runs on without its metrics "
                      "endpoint", e)
            return
        self.metrics_fields = metrics.FIELDS
        self.exporter = metrics.Exporter()
        self.metrics_server = metrics.MetricsServer.start(wanted, self.exporter)
        if self.metrics_server is None:
            self.exporter = None

    def _stop_metrics(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.stop()
            log.info("metrics: stopped serving on %s", self.metrics_server.listen)
        self.metrics_server = self.exporter = None

    def _publish(self, snapshot: Snapshot, status: dict) -> None:
        """Hand the endpoint this round's state: frozen things and copies, in one assignment."""
        held = tuple(self.journal.entries())
        latest = self.actuator.decisions.latest
        keys = {(h.kind, h.target, h.knob) for h in held}
        for key in [k for k in latest if k not in keys]:    # only the values of knobs still held
            del latest[key]
        if self.exporter is None:
            return
        from koordd.runtime.metrics import Published, RoundStats
        self.exporter.publish(Published(
            settings=self.config.metrics, started=self.started,
            info={"version": _version(), "cgroups": self.layout.describe(), "dry_run": str(self.dry_run).lower()},
            snapshot=snapshot, rounds=RoundStats(self.rounds, **asdict(self.round_time)), loops=status["loops"],
            decisions=dict(self.actuator.decisions.counts), held=held, held_values=dict(latest),
            capabilities=self.capabilities, sensors=status["sensors"], reclaimable=self.reclaimable))

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
            seen = _identity(path)
            new = load_config(path, self.registry)
            if _identity(path) != seen:
                # Half of a file being written can parse (a config without its last loops): wait
                # for the writer to finish, as after any change.
                log.info("%s changed while it was read; reading it again", path)
                self.request_reload(RELOAD_DEBOUNCE)
                notify.notify("READY=1", "STATUS=running")
                return
            if seen[1] == 0:
                # Truncated for an in-place write whose text has not come yet: an empty file would
                # stop every loop. Disable loops with enabled = false.
                raise ConfigError([f"{path}: empty (being written?)"])
        except ConfigError as e:
            log.error("reload refused, keeping the running config:\n%s", e)
            notify.notify("READY=1", "STATUS=running (reload refused, see log)")
            return
        for warning in new.warnings:
            log.warning("%s", warning)
        for key in RESTART_KEYS:
            if getattr(new.daemon, key) != getattr(self.config.daemon, key):
                log.warning("%s: daemon.%s changed; it takes effect when koordd restarts", new.path, key)
        try:
            set_level(new.daemon.log_level)
            self.config = new
            self._configure_metrics(new.metrics)
            self.sensors.set_classes(new.classify, _patterns(new), new.health_of)
            self._probe_knobs()
            self.sensors.reprobe()
            self._configure(new)
        except Exception:  # noqa: BLE001 - a bug met while applying a valid config must not stop koordd
            log.exception("reload of %s failed midway; koordd runs on with what was applied", path)
            notify.notify("READY=1", "STATUS=running (reload failed midway, see log)")
            return
        log.info("reloaded %s", new.path)
        notify.notify("READY=1", "STATUS=running")

    def _install_signals(self) -> None:
        def on_stop(signum, frame):
            self.stopping = True
            self.wake.set()
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, lambda s, f: self.request_reload())

    # --- status for koordctl ----------------------------------------------------

    def _write_status(self) -> dict:
        status = {"pid": os.getpid(), "started": self.started, "updated": time.time(),
                  "config": str(self.config.path), "dry_run": self.dry_run, "cgroups": self.layout.describe(),
                  "loops": self.runner.status(), "sensors": self.sensors.optional.status(),
                  "held": [h.__dict__ for h in self.journal.entries()],
                  "reclaimable": self.reclaimable.as_dict() if self.reclaimable is not None else None,
                  "metrics": self.metrics_server.listen if self.metrics_server is not None else None}
        try:
            write_atomic(self.state_dir / STATUS_FILE, json.dumps(status, indent=1) + "\n", durable=False)
        except OSError as e:
            log.warning("cannot write status: %s", e)
        return status


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("koordd")
    except Exception:  # noqa: BLE001 - run from a source tree without its metadata
        return "unknown"


def _identity(path: Path) -> tuple[int, int, int]:
    """What changes when a file is written or replaced: inode, size, modification time."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror or e}"]) from None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _raise_open_files_limit(reserve: int = 256) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (systemd's default soft limit is 1024) and return
    how many cgroup files may be kept open, leaving `reserve` for everything else."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ValueError, OSError):
            pass
    return max(soft - reserve, 0)


def only_members_of(snapshot: Snapshot, classes: set[str]) -> Snapshot:
    """The snapshot with only the members (pods) of `classes`: those listed for koordctl top alone must not
    change what a loop sees (Snapshot.units() acts on members wherever there are some)."""
    if all(snapshot.cgroups[root].cls in classes for root in snapshot.members):
        return snapshot
    return replace(snapshot, members={root: ms for root, ms in snapshot.members.items()
                                      if snapshot.cgroups[root].cls in classes})


def _where(h) -> str:
    return h.target or "/" if h.kind == "cgroup" else f"{h.kind} {h.target}"


def _patterns(config: Config) -> list[str]:
    return [p for rule in config.classes for p in rule.patterns]


def _keep_private(d: Path) -> None:
    """The state dir holds the names of every cgroup and process koordd acted on, and the request
    koordctl top leaves: for root (and root's group, as systemd's StateDirectoryMode=0750), nobody else."""
    mode = d.stat().st_mode
    if mode & 0o007:
        os.chmod(d, mode & 0o7770)
        log.warning("%s was open to every user (mode %04o): now %04o", d, mode & 0o7777, mode & 0o7770)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="koordd", description="Node-local QoS daemon for LS and BE workloads.")
    p.add_argument("--config", type=Path, default=DEFAULT_PATH, help=f"config file (default {DEFAULT_PATH})")
    p.add_argument("--dry-run", action="store_true", help="decide and log, write nothing")
    p.add_argument("--once", action="store_true", help="run every enabled loop one tick, then exit")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="overrides daemon.log_level")
    args = p.parse_args(argv)
    # Every file koordd makes (journal, decisions, status, the top feed) is root's alone: 0600/0700.
    os.umask(0o077)
    setup_logging(args.log_level or "info")
    registry = load_registry()
    try:
        config = load_config(args.config, registry)
    except ConfigError as e:
        log.error("refusing to start, invalid config:\n%s", e)
        return EX_CONFIG      # systemd shows it as "status=78/CONFIG"
    set_level(args.log_level or config.daemon.log_level)
    for warning in config.warnings:
        log.warning("%s", warning)
    try:
        daemon = Daemon(config, registry, dry_run=args.dry_run)
    except JournalUnreadable as e:
        # Its holds cannot be restored unread: a human must look (restarting will not fix it).
        log.error("refusing to start: the restore journal %s; koordd keeps it as it is. Run the koordd that "
                  "wrote it, or put its knobs back by hand and move the file away", e)
        return EX_CONFIG
    except HostOwned as e:
        log.error("refusing to start: %s", e)
        return EX_TEMPFAIL          # the unit's Restart= tries again: the holder may be a --once, soon done
    except (UntrustedState, UntrustedLock) as e:
        log.error("refusing to start: %s", e)
        return EX_CONFIG
    except (LayoutError, OSError) as e:
        log.error("cannot start: %s", e)
        return 1
    return daemon.run(once=args.once)


if __name__ == "__main__":
    sys.exit(main())
