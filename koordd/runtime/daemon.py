"""koordd, the program: its command line, its log handler, and its exit status.

    koordd [--config F] [--dry-run] [--once] [--log-level L]

The daemon itself is koordd/runtime/service.py's Daemon.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from koordd.act.decision_log import journal_sender
from koordd.act.journal import JournalUnreadable
from koordd.act.owner import HostOwned, UntrustedLock
from koordd.core.config import ConfigError, DEFAULT_PATH, load_config
from koordd.core.printable import PrintableFormatter
from koordd.core.catalogue import BrokenInstall, load_registry
from koordd.kernel.cgroupfs import LayoutError
from koordd.runtime.host_claim import UntrustedState
from koordd.runtime.logs import set_level
from koordd.runtime.service import Daemon

log = logging.getLogger("koordd")
EX_CONFIG, EX_TEMPFAIL = 78, 75     # invalid config or untrusted files (restarting will not help); host owned


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="koordd", description="Node-local QoS daemon for LS and BE workloads.")
    p.add_argument("--config", type=Path, default=DEFAULT_PATH, help=f"config file (default {DEFAULT_PATH})")
    p.add_argument("--dry-run", action="store_true", help="decide and log, write nothing")
    p.add_argument("--once", action="store_true", help="run every enabled loop one tick, then exit")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="overrides daemon.log_level")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Every file koordd makes (journal, decisions, status, the top feed) is root's alone: 0600/0700.
    os.umask(0o077)
    setup_logging(args.log_level or "info")
    try:
        registry = load_registry()
    except BrokenInstall as e:
        log.error("cannot start: %s", e)
        return 1
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
