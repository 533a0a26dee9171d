"""Reload when the config file changes: inotify (watchdog) on the directories its path goes through.

Editors replace a file by rename, so directories are watched, not the file. The path may be a symlink
(/etc/koordd/koordd.toml -> a file elsewhere, maybe through more links): a change to any link on the
way (repointed) or to the file it leads to (edited) is a change of the config, so the directory of
each is watched, and again after every reload, where the links may lead elsewhere now.

Only writes and moves count: modified, closed after a write, created, moved, deleted. watchdog >= 2.3
also reports opens and closes without a write (IN_OPEN, IN_CLOSE_NOWRITE), and koordd's own read of the
file in a reload makes both: counting them, each reload would set off the next, forever.
"""
from __future__ import annotations

import logging
import os
from typing import Callable

from koordd.core.trust import walked_paths

log = logging.getLogger("koordd")
CHANGES = frozenset({"modified", "closed", "created", "moved", "deleted"})


def _key(path: str) -> str:
    """A name as the watch reports it: its directory resolved (watches are made on resolved directories)."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def names_of(path: str) -> frozenset[str]:
    """The names whose change changes what `path` opens: the path, every symlink on the way, the file."""
    walked = walked_paths(os.path.abspath(path))
    names = {os.path.abspath(path), os.path.realpath(path)} | {p for p in walked if os.path.islink(p)}
    return frozenset(_key(p) for p in names)


class ConfigWatcher:
    def __init__(self, path: str, on_change: Callable[[], None]):
        self.path, self.on_change = str(path), on_change
        self.names: frozenset[str] = frozenset()
        self.observer = None
        self.watches: dict[str, object] = {}        # directory -> its watchdog watch

    def start(self) -> bool:
        """False when watchdog is missing or nothing can be watched: reloads then come by SIGHUP only."""
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            log.info("watchdog not installed: config reloads on SIGHUP only")
            return False
        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if event.event_type not in CHANGES:
                    return
                names = watcher.names       # swapped whole by refresh(), in the main thread
                paths = {getattr(event, "src_path", ""), getattr(event, "dest_path", "")}
                if any(p and _key(os.fsdecode(p)) in names for p in paths):
                    watcher.on_change()

        self.observer = Observer()
        self.handler = Handler()
        self.observer.daemon = True
        self.observer.start()
        self.refresh()
        if not self.watches:
            self.stop()
            return False
        return True

    def refresh(self) -> None:
        """Watch the directories of the names the path goes through now (after a link was repointed)."""
        if self.observer is None:
            return
        self.names = names_of(self.path)
        wanted = {os.path.dirname(n) for n in self.names}
        for d in set(self.watches) - wanted:
            try:
                self.observer.unschedule(self.watches.pop(d))
            except (KeyError, OSError):
                pass
        for d in sorted(wanted - set(self.watches)):
            try:
                self.watches[d] = self.observer.schedule(self.handler, d, recursive=False)
            except OSError as e:
                log.warning("cannot watch %s (%s): changes there need a SIGHUP", d, e)

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer = None
