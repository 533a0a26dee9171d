"""Which koordd this is about: its state_dir (the running one's, a config's, or the default) and who holds the host."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from koordd.act.owner import current_holder
from koordd.core.config import ConfigError, DAEMON_OPTIONS, load_config
from koordd.core.registry import load_registry


DEFAULT_STATE_DIR = next(o.default for o in DAEMON_OPTIONS if o.name == "state_dir")


def state_dir(args: argparse.Namespace) -> Path:
    """--state-dir, else the config's state_dir, else (invalid config) the default, saying so on stderr."""
    if args.state_dir is not None:
        return args.state_dir
    try:
        return Path(load_config(args.config, load_registry()).daemon.state_dir)
    except ConfigError as e:
        more = f" (and {len(e.errors) - 1} more)" if len(e.errors) > 1 else ""
        print(f"koordctl: invalid config: {e.errors[0]}{more}; using the default state_dir {DEFAULT_STATE_DIR}",
              file=sys.stderr)
        return Path(DEFAULT_STATE_DIR)


def host_owner() -> tuple[Any, str]:
    """The koordd holding the host lock (None when none does), and it in words."""
    try:
        holder = current_holder()
    except OSError as e:
        return None, f"unknown ({e.filename}: {e.strerror})"
    return holder, holder.describe() if holder is not None else "none (no koordd writes this host's knobs)"
