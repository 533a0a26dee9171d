"""Which of koordd's log lines are kept: daemon.log_level, set at start and again on reload."""
from __future__ import annotations

import logging


def set_level(level: str) -> None:
    # Only koordd's own loggers follow log_level: libraries at debug (watchdog logs every inotify
    # event) would drown the journal, and could even feed on their own log file's events.
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("koordd").setLevel(getattr(logging, level.upper()))
