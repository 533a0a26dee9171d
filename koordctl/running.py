"""Which koordd this is about: its state_dir (the running one's, a config's, or the default) and who holds the host."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from koordctl.common import CtlError, pid_alive
from koordctl.shapes import STATUS
from koordctl.statefiles import read_document, refuse_untrusted
from koordd.act.owner import Holder, current_holder
from koordd.core.config import ConfigError, DAEMON_OPTIONS, DEFAULT_PATH, load_config
from koordd.core.feeds import STATUS_FILE
from koordd.core.catalogue import load_registry


DEFAULT_STATE_DIR = next(o.default for o in DAEMON_OPTIONS if o.name == "state_dir")


def state_dir(args: argparse.Namespace) -> Path:
    """--state-dir; else the state_dir of --config; else the running koordd's (the host lock names it);
    else that of the config the last koordd with the default state_dir ran (its status.json names it);
    else /etc/koordd's config's. An invalid config: the default, saying so on stderr."""
    if args.state_dir is not None:
        return args.state_dir
    config = args.config
    if config is None:
        running = running_koordd()
        if running is not None and running.state_dir:
            return Path(running.state_dir)
        last = last_config()
        if last is not None:
            try:
                return Path(load_config(last, load_registry()).daemon.state_dir)
            except ConfigError:
                return Path(DEFAULT_STATE_DIR)      # its status is there, whatever its config says now
        config = DEFAULT_PATH
    try:
        return Path(load_config(config, load_registry()).daemon.state_dir)
    except ConfigError as e:
        more = f" (and {len(e.errors) - 1} more)" if len(e.errors) > 1 else ""
        print(f"koordctl: invalid config: {e.errors[0]}{more}; using the default state_dir {DEFAULT_STATE_DIR}",
              file=sys.stderr)
        return Path(DEFAULT_STATE_DIR)


def running_koordd() -> Holder | None:
    """The koordd that holds this host's lock and still runs; None when none does or the lock is unreadable."""
    try:
        holder = current_holder()
    except OSError:
        return None
    return holder if holder is not None and pid_alive(holder.pid) else None


def last_config() -> Path | None:
    """The config of the last koordd that ran with the default state_dir, as its status.json names it; None
    where that state_dir is not one koordd would trust (it says so on stderr) or names none."""
    try:
        refuse_untrusted(Path(DEFAULT_STATE_DIR))
        status = read_document(Path(DEFAULT_STATE_DIR) / STATUS_FILE, STATUS)
    except CtlError as e:
        print(f"koordctl: not following the config the last status names: {e}", file=sys.stderr)
        return None
    config = status.get("config") if isinstance(status, dict) else None
    return Path(config) if isinstance(config, str) and config and "\0" not in config else None


def trusted_state_dir(args: argparse.Namespace) -> Path:
    """state_dir(args), once koordctl.statefiles.refuse_untrusted has found it one koordd would trust."""
    sd = state_dir(args)
    refuse_untrusted(sd)
    return sd


def host_owner() -> tuple[Any, str]:
    """The koordd holding the host lock (None when none does), and it in words."""
    try:
        holder = current_holder()
    except OSError as e:
        return None, f"unknown ({e.filename}: {e.strerror})"
    return holder, holder.describe() if holder is not None else "none (no koordd writes this host's knobs)"
