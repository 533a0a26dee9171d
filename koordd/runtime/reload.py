"""Reading the config again for a reload: only a whole, valid file is taken; anything else keeps the
running config (docs/reliability.md, "config").

Reload's guarantees: a config that does not parse or validate is refused with its errors and koordd runs
on as it was; a file caught while being written (it changed while read, or is empty) is read again, or
refused; the loops no longer enabled give their knobs back (Runner.configure); daemon.cgroup_root,
state_dir and dry_run take effect at the next start, and say so.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from koordd.core.config import Config, ConfigError, load_config

log = logging.getLogger("koordd")
RELOAD_DEBOUNCE = 0.5        # editors write a file in several steps: reload once they are done
RESTART_KEYS = ("cgroup_root", "state_dir", "dry_run")


class Unsettled(Exception):
    """The file changed while it was read: read it again once the writer is done."""


def read_config(path: Path, registry) -> Config:
    """The config at `path`, whole; ConfigError (refused) or Unsettled (read again later)."""
    seen = identity(path)
    new = load_config(path, registry)
    if identity(path) != seen:
        # Half of a file being written can parse (a config without its last loops).
        raise Unsettled(path)
    if seen[1] == 0:
        # Truncated for an in-place write whose text has not come yet: an empty file would
        # stop every loop. Disable loops with enabled = false.
        raise ConfigError([f"{path}: empty (being written?)"])
    return new


def log_warnings(old: Config, new: Config) -> None:
    """The new config's warnings, and the changes that wait for a restart."""
    for warning in new.warnings:
        log.warning("%s", warning)
    for key in RESTART_KEYS:
        if getattr(new.daemon, key) != getattr(old.daemon, key):
            log.warning("%s: daemon.%s changed; it takes effect when koordd restarts", new.path, key)


def identity(path: Path) -> tuple[int, int, int]:
    """What changes when a file is written or replaced: inode, size, modification time."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror or e}"]) from None
    return st.st_ino, st.st_size, st.st_mtime_ns
