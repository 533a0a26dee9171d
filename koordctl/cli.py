"""koordctl: check a config, report what this host can do, and show what koordd is doing.

    koordctl validate [FILE]                    exit 0 valid, 1 invalid (one "file:line: message" per error)
    koordctl doctor [--json] [--cgroup-root DIR]
    koordctl status [--json] [--config F] [--state-dir DIR]             exit 0 running, 1 not
    koordctl decisions [--loop L] [--since T] [-n N] [--json] [--config F] [--state-dir DIR]
    koordctl slo [--json] [--ascii] [--config F] [--state-dir DIR]     exit 0 running, 1 not
    koordctl top [--interval T] [--sort KEY] [--class C] [--members] [--json] [--config F] [--state-dir DIR]
                                                exit 0, 1 when koordd is not running or does not answer
    koordctl demo [--phase T] [--period T] [--loops L,L] [--plot FILE | --no-plot]
                                                exit 0, 1 on a failure, 128+N when stopped by signal N

status, decisions and slo only read files under the daemon's state_dir (--state-dir; else that of --config; else the
running koordd's, as the host lock names it; else that of the config the last koordd's status names; else
/etc/koordd/koordd.toml's), and status the host lock's file (which koordd writes the host's knobs: koordd/act/owner.py);
they never change anything there. top writes one file there, top.request, which
asks the running koordd to publish what it samples (koordd/runtime/topfeed.py). demo runs LS and BE work and
a koordd of its own in cgroups of its own, and removes them all (koordctl/demo/); it refuses while another
koordd owns the host. Any other failure is
one line on stderr, exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Callable

from koordctl import demo
from koordctl.common import CtlError
from koordctl.rows import SORTS
from koordd.core.cgroup_text import CGROUP_MOUNT
from koordd.core.config import CLASS_NAMES, ConfigError, DEFAULT_PATH, load_config
from koordd.core.feeds import DEFAULT_INTERVAL, MAX_INTERVAL, MIN_INTERVAL
from koordd.core.options import parse_duration
from koordd.core.catalogue import load_registry


# --- subcommands --------------------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file, load_registry())
    except ConfigError as e:
        print("\n".join(e.errors))
        return 1
    for warning in config.warnings:          # valid, but likely not what was meant
        print(warning)
    print(f"{args.file}: ok")
    return 0


def duration_at_least(minimum: float):
    def parse(text: str) -> float:
        try:
            seconds = parse_duration(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if seconds < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: at least {minimum:g}s")
        return seconds
    return parse


def loop_list(text: str) -> tuple[str, ...]:
    loops = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in loops if name not in demo.LOOPS]
    if unknown or not loops:
        raise argparse.ArgumentTypeError(f"{text!r}: one or more of {', '.join(demo.LOOPS)}, comma-separated")
    return loops


def interval(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not MIN_INTERVAL <= seconds <= MAX_INTERVAL:
        raise argparse.ArgumentTypeError(f"{text!r}: from {MIN_INTERVAL * 1000:.0f}ms to {MAX_INTERVAL:.0f}s")
    return seconds


# --- command line -------------------------------------------------------------------------------

DOCS = "/usr/share/doc/koordd/docs"     # where the Debian package puts docs/ (scripts/package)


def see(man: str, page: str) -> str:
    """A subcommand's pointer to its man page and its guide (docs/<page> in the source, gzipped in the package)."""
    return f"See {man} and docs/{page} ({DOCS}/{page}.gz in the Debian package)."


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="koordctl", description="Check and inspect koordd, the node QoS daemon.",
                                epilog="The manual: koordctl(8) (man koordctl); the config file: koordd.toml(5); the "
                                       "daemon: koordd(8). Guides by task: docs/ in the source tree, "
                                       f"{DOCS}/ in the Debian package; `koordctl COMMAND --help` names each "
                                       "command's.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="machine-readable output")
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--config", type=Path, help="config file whose state_dir to read (default: the running "
                       f"koordd's, else {DEFAULT_PATH}'s)")
    state.add_argument("--state-dir", type=Path, help="read this state_dir instead of the config's")

    s = sub.add_parser("validate", help="check a config file", epilog=see("koordd.toml(5)", "configuration.md"))
    s.add_argument("file", nargs="?", type=Path, default=DEFAULT_PATH, help=f"default {DEFAULT_PATH}")
    s.set_defaults(func=cmd_validate)
    s = sub.add_parser("doctor", parents=[as_json], help="what this host's kernel and libraries support",
                       epilog=see("koordctl(8)", "troubleshooting.md"))
    s.add_argument("--cgroup-root", type=Path, default=Path(CGROUP_MOUNT), help=f"default {CGROUP_MOUNT}")
    s.set_defaults(func="koordctl.doctor:cmd_doctor")
    s = sub.add_parser("status", parents=[as_json, state], help="is koordd running; its loops and held knobs",
                       epilog=see("koordctl(8)", "decisions.md"))
    s.set_defaults(func="koordctl.status:cmd_status")
    s = sub.add_parser("decisions", parents=[as_json, state], help="the decision log (JSON lines with --json)",
                       epilog=see("koordctl(8)", "decisions.md"))
    s.add_argument("--loop", help="only this loop's decisions")
    s.add_argument("--since", metavar="T", help='a duration ago ("10m", "2h") or an ISO 8601 time')
    s.add_argument("-n", type=int, metavar="N", help="only the last N")
    s.set_defaults(func="koordctl.decisions:cmd_decisions")
    s = sub.add_parser("slo", parents=[as_json, state],
                       help="each SLO's target, its latency over the last minutes, and what be_suppress did",
                       epilog=see("koordctl(8)", "slo.md"))
    s.add_argument("--ascii", action="store_true", help="draw the chart in ASCII (the default where the "
                   "terminal's encoding is not UTF-8)")
    s.set_defaults(func="koordctl.slo:cmd_slo")
    s = sub.add_parser("top", parents=[state], help="live per-cgroup view of what koordd samples",
                       epilog=see("koordctl(8)", "decisions.md"))
    s.add_argument("--json", action="store_true", help="one sample as JSON, then exit")
    s.add_argument("--interval", type=interval, default=DEFAULT_INTERVAL, metavar="T",
                   help=f'refresh interval, "500ms" to "1m" (default {DEFAULT_INTERVAL:g}s)')
    s.add_argument("--sort", choices=list(SORTS), default="cpu",
                   help="column to sort by, highest first; name alphabetically (default cpu)")
    s.add_argument("--class", dest="cls", type=str.upper, choices=CLASS_NAMES, metavar="CLASS",
                   help=f"only this class's cgroups ({', '.join(CLASS_NAMES)})")
    s.add_argument("--members", action="store_true", help="the class roots' children (pods, jobs) too")
    s.set_defaults(func="koordctl.top:cmd_top")
    s = sub.add_parser("demo", help="see koordd work: LS and BE on the same CPUs, without and with koordd",
                       description="An LS cgroup whose CPU demand follows a sine wave and a BE cgroup that "
                                   "wants every CPU, in three phases: LS alone, no control, koordd on. A live "
                                   "view, then a summary per phase and a PNG plot. Needs root; removes "
                                   "everything it made, also on Ctrl-C.",
                       epilog=see("koordctl(8)", "demo.md"))
    s.add_argument("--phase", type=duration_at_least(1.0), default=30.0, metavar="T",
                   help="length of each of the three phases (default 30s)")
    s.add_argument("--period", type=duration_at_least(1.0), default=20.0, metavar="T",
                   help="period of LS's sine wave (default 20s)")
    s.add_argument("--loops", type=loop_list, default=demo.DEFAULT_LOOPS, metavar="L,L",
                   help="koordd's loops in phase 3: qos_baseline (BE as SCHED_IDLE), be_suppress (BE's CPU by "
                        f"LS slack) or both, as shipped (default {','.join(demo.DEFAULT_LOOPS)})")
    s.add_argument("--plot", type=Path, default=Path("koordd-demo.png"), metavar="FILE",
                   help="where the PNG goes (default koordd-demo.png)")
    s.add_argument("--no-plot", action="store_true", help="no PNG")
    s.set_defaults(func="koordctl.demo.session:cmd_demo")
    return p


def command(func) -> Callable[[argparse.Namespace], int]:
    """A subcommand's function: cmd_validate here, the others "module:function", imported when their
    command runs, so that `koordctl validate` loads neither the daemon's runtime nor the demo or the view."""
    if callable(func):
        return func
    module, _, name = func.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return command(args.func)(args)
    except CtlError as e:
        print(f"koordctl: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:     # `koordctl decisions | head`: quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
