"""koordctl: check a config, report what this host can do, and show what koordd is doing.

    koordctl validate [FILE]                    exit 0 valid, 1 invalid (one "file:line: message" per error)
    koordctl doctor [--json] [--cgroup-root DIR]
    koordctl status [--json] [--config F] [--state-dir DIR]             exit 0 running, 1 not
    koordctl decisions [--loop L] [--since T] [-n N] [--json] [--config F] [--state-dir DIR]
    koordctl top [--interval T] [--sort KEY] [--class C] [--members] [--json] [--config F] [--state-dir DIR]
                                                exit 0, 1 when koordd is not running or does not answer
    koordctl demo [--phase T] [--period T] [--loops L,L] [--plot FILE | --no-plot]
                                                exit 0, 1 on a failure, 128+N when stopped by signal N

status and decisions only read files under the daemon's state_dir (taken from the config unless
--state-dir is given), and status the host lock's file (which koordd writes the host's knobs: koordd/act/owner.py);
they never change anything there. top writes one file there, top.request, which
asks the running koordd to publish what it samples (koordd/runtime/topfeed.py). demo runs LS and BE work and
a koordd of its own in cgroups of its own, and removes them all (koordctl/demo.py); it refuses while another
koordd owns the host. Any other failure is
one line on stderr, exit 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Sequence

from koordctl import demo, top
from koordctl.demo_cgroups import DemoError, hierarchy_roots
from koordctl.top import NoAnswer, SORTS, Terminal, render, select_rows, wait_for_document, watch, write_request
from koordd.act.decision_log import read_decisions
from koordd.act.journal import RestoreJournal, read_held
from koordd.act.owner import current_holder
from koordd.core.config import CLASS_NAMES, ConfigError, DAEMON_OPTIONS, DEFAULT_PATH, load_config
from koordd.core.feeds import DEFAULT_INTERVAL, MAX_INTERVAL, MIN_INTERVAL, REQUEST_FILE, STATUS_FILE, TopRequest
from koordd.core.options import parse_duration
from koordd.core.printable import printable
from koordd.core.registry import load_registry
from koordd.kernel.cgroupfs import DEFAULT_ROOT, LayoutError, detect_layout
from koordd.runtime.capabilities import format_report, probe_all, report_json

DEFAULT_STATE_DIR = next(o.default for o in DAEMON_OPTIONS if o.name == "state_dir")


class CtlError(Exception):
    """Reported as one line on stderr, exit 2."""


# --- shared helpers -----------------------------------------------------------------------------

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


def read_json(path: Path) -> Any:
    """The parsed file, or None when it does not exist."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise CtlError(f"{path}: unreadable: {getattr(e, 'strerror', None) or e}") from None


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str] | None = None) -> str:
    """Left-aligned columns as wide as their widest cell; None shows as "-". Every cell goes through
    printable(): a cgroup's name (the workload's choice) cannot add a line or reach the terminal."""
    cells = [[str(h) for h in headers]] if headers else []
    cells += [["-" if c is None else printable(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))] if cells else []
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def local_time(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def ago(t: float | None, now: float) -> str | None:
    """How long ago `t` was: 0.4s ago, 3m05s ago, 2h10m ago, 3d4h ago."""
    if t is None:
        return None
    d = max(0.0, now - t)
    if d < 60:
        span = f"{d:.1f}s"
    elif d < 3600:
        span = f"{d // 60:.0f}m{d % 60:02.0f}s"
    elif d < 86400:
        span = f"{d // 3600:.0f}h{d % 3600 // 60:02.0f}m"
    else:
        span = f"{d // 86400:.0f}d{d % 86400 // 3600:.0f}h"
    return f"{span} ago"


def knob_value(v: str | None) -> str:
    """None (no value: the knob was absent or not read) as "-", an empty value as "" so it shows."""
    return "-" if v is None else v or '""'


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


def cmd_doctor(args: argparse.Namespace) -> int:
    caps = probe_all(args.cgroup_root)
    print(report_json(caps) if args.json else format_report(caps))
    return 0


def pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # it exists, under another user
        return True
    return True


def host_owner() -> tuple[Any, str]:
    """The koordd holding the host lock (None when none does), and it in words."""
    try:
        holder = current_holder()
    except OSError as e:
        return None, f"unknown ({e.filename}: {e.strerror})"
    return holder, holder.describe() if holder is not None else "none (no koordd writes this host's knobs)"


def cmd_status(args: argparse.Namespace) -> int:
    sd = state_dir(args)
    status = read_json(sd / STATUS_FILE)
    if not isinstance(status, dict):
        print(f"koordd has not run with state_dir {sd}")
        return 1
    # The restore journal is written before every knob and survives a crash; status.json may be stale.
    # Read with read_held rather than by RestoreJournal: a reader takes no part in the journal.
    try:
        journal = read_held(sd)
    except (OSError, ValueError) as e:
        bad = sd / RestoreJournal.FILE if (sd / RestoreJournal.FILE).exists() else sd / RestoreJournal.V1_FILE
        raise CtlError(f"{bad}: unreadable: {getattr(e, 'strerror', None) or e}") from None
    held, source = (journal[0], journal[1].name) if journal is not None else (status.get("held") or [], STATUS_FILE)
    running = pid_alive(status.get("pid"))
    holder, owner_text = host_owner()
    if args.json:
        print(json.dumps({**status, "state_dir": str(sd), "running": running, "held": held,
                          "held_source": source, "owner": None if holder is None else holder.__dict__},
                         indent=1, sort_keys=True))
        return 0 if running else 1
    now = time.time()
    state = "running" if running else "not running"
    print(table([
        ("koordd", f"{state} (pid {status.get('pid')}, status updated {ago(status.get('updated'), now)})"),
        ("started", f"{local_time(status.get('started'))} ({ago(status.get('started'), now)})"),
        ("config", status.get("config")),
        ("dry-run", "yes" if status.get("dry_run") else "no"),
        ("cgroups", status.get("cgroups")),
        ("state_dir", sd),
        # The koordd that writes this host's knobs, whatever its state_dir (koordd/act/owner.py).
        ("owner", owner_text),
        *((("metrics", f"http://{status['metrics']}/metrics"),) if status.get("metrics") else ()),
        *((("reclaimable", reclaimable_text(status["reclaimable"])),) if status.get("reclaimable") else ()),
    ]))
    loops = status.get("loops") or {}
    print()
    print(table([(name, f"{r.get('interval', 0):g}s", r.get("ticks"), ago(r.get("last_tick"), now),
                  r.get("failures"), r.get("last_error")) for name, r in loops.items()],
                ("LOOP", "INTERVAL", "TICKS", "LAST TICK", "FAILURES", "LAST ERROR"))
          if loops else "no loops enabled")
    sensors = {name: s for name, s in (status.get("sensors") or {}).items() if s.get("loops")}
    if sensors:                  # only those an enabled loop needs: the others are stopped by design
        print()
        print(table([(name, s.get("state"), ", ".join(s.get("loops") or ()), s.get("reason") or "")
                     for name, s in sorted(sensors.items())], ("SENSOR", "STATE", "FOR LOOPS", "REASON")))
    print()
    print(f"held knobs (from {source}):" if held else f"held knobs (from {source}): none")
    if held:
        print(table([(target_text(h), h.get("knob"), h.get("original"), h.get("owner"),
                      f"{local_time(h.get('since'))} ({ago(h.get('since'), now)})") for h in held],
                    ("TARGET", "KNOB", "ORIGINAL", "OWNER", "SINCE")))
    return 0 if running else 1


def reclaimable_text(r: dict) -> str:
    """What LS was given but left unused (koordd/core/reclaimable.py): "1.25 CPUs, 3.0 GiB"; "?" for a resource
    unknown in the last round."""
    cpu, memory = r.get("cpu_cores"), r.get("memory_bytes")
    cpus = f"{cpu['reclaimable']:.2f} CPUs" if cpu else "? CPUs"
    mem = f"{memory['reclaimable'] / 2**30:.1f} GiB" if memory else "? GiB"
    return f"{cpus}, {mem} (of {r.get('ls_cgroups', 0)} LS cgroups' limits, unused over the window)"


def target_text(record: dict) -> str:
    """A cgroup as its path ("/" for the root); another kind of target as kind:name. Records written
    before targets had kinds name a cgroup under "cgroup"."""
    kind = record.get("kind") or "cgroup"
    name = record.get("target", record.get("cgroup")) or ""
    return (name or "/") if kind == "cgroup" else f"{kind}:{name}"


def parse_since(text: str, now: float) -> float:
    """A duration meaning "ago" ("10m", "2h") or an ISO 8601 time (local unless it has an offset)."""
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise CtlError(f"--since {text!r}: neither a duration (\"10m\", \"2h\") nor an ISO 8601 time"
                       " (\"2024-05-01T13:00\")") from None


def cmd_decisions(args: argparse.Namespace) -> int:
    sd = state_dir(args)
    since = None if args.since is None else parse_since(args.since, time.time())
    try:
        records = [r for r in read_decisions(sd) if isinstance(r, dict)
                   and (args.loop is None or r.get("loop") == args.loop)
                   and (since is None or (r.get("time") or 0) >= since)]
    except OSError as e:
        raise CtlError(f"{e.filename}: unreadable: {e.strerror or e}") from None
    if args.n is not None:
        records = records[-args.n:] if args.n > 0 else []
    if args.json:
        for r in records:
            print(json.dumps(r, sort_keys=True))
    elif not records:
        print(f"no decisions recorded in {sd}" + (" matching the filters" if args.loop or since else ""))
    else:
        print(table(((local_time(r.get("time")), r.get("loop"), r.get("outcome"), target_text(r),
                      r.get("knob"), f"{knob_value(r.get('old'))} -> {knob_value(r.get('new'))}",
                      " ".join(filter(None, (r.get("message"), r.get("error") and f"({r['error']})"))))
                     for r in records),
                    ("TIME", "LOOP", "OUTCOME", "TARGET", "KNOB", "CHANGE", "MESSAGE")))
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    sd = state_dir(args)
    status = read_json(sd / STATUS_FILE)
    pid = status.get("pid") if isinstance(status, dict) else None
    if not pid_alive(pid):
        print(f"koordctl top: koordd is not running (state_dir {sd})", file=sys.stderr)
        return 1
    request = TopRequest(args.interval, args.members)
    try:
        asked = write_request(sd, request)
    except OSError as e:
        raise CtlError(f"cannot ask koordd for samples: {sd / REQUEST_FILE}: {e.strerror or e}"
                       " (run koordctl top as koordd's user)") from None
    no_answer = (f"koordctl top: koordd (pid {pid}) published no sample within {top.ANSWER_TIMEOUT:g}s"
                 " (a koordd older than koordctl top does not answer: restart it)")
    if args.json or not sys.stdout.isatty():
        doc = wait_for_document(sd, asked, top.ANSWER_TIMEOUT)
        if doc is None:
            print(no_answer, file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps({**doc, "cgroups": select_rows(doc, args.sort, args.cls)}, indent=1, sort_keys=True))
        else:
            print("\n".join(render(doc, args.sort, args.cls, time.time())))
        return 0
    try:
        with Terminal() as screen:
            watch(screen, sd, request, asked, args.sort, args.cls, alive=lambda: pid_alive(pid),
                  answer_timeout=top.ANSWER_TIMEOUT)
    except NoAnswer:
        print(no_answer, file=sys.stderr)
        return 1
    except KeyboardInterrupt:       # Ctrl-C quits like q; the terminal is back already
        pass
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise CtlError("demo: needs root (it creates cgroups under /sys/fs/cgroup and starts koordd)")
    try:
        layout = detect_layout(DEFAULT_ROOT)
        hierarchy_roots(layout)          # a host without the hierarchies the demo needs says so now
    except (LayoutError, DemoError) as e:
        raise CtlError(f"demo: {e}") from None
    holder, _ = host_owner()
    if holder is not None:          # its koordd would refuse (one koordd per host owns the knobs)
        raise CtlError(f"demo: {holder.describe()} owns this host's knobs: stop it first (systemctl stop koordd)")
    settings = demo.Settings(phase=args.phase, period=args.period, loops=args.loops)
    return demo.run(settings, None if args.no_plot else args.plot, layout)


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

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="koordctl", description="Check and inspect koordd, the node QoS daemon.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="machine-readable output")
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--config", type=Path, default=DEFAULT_PATH, help=f"config file (default {DEFAULT_PATH})")
    state.add_argument("--state-dir", type=Path, help="read this state_dir instead of the config's")

    s = sub.add_parser("validate", help="check a config file")
    s.add_argument("file", nargs="?", type=Path, default=DEFAULT_PATH, help=f"default {DEFAULT_PATH}")
    s.set_defaults(func=cmd_validate)
    s = sub.add_parser("doctor", parents=[as_json], help="what this host's kernel and libraries support")
    s.add_argument("--cgroup-root", type=Path, default=DEFAULT_ROOT, help=f"default {DEFAULT_ROOT}")
    s.set_defaults(func=cmd_doctor)
    s = sub.add_parser("status", parents=[as_json, state], help="is koordd running; its loops and held knobs")
    s.set_defaults(func=cmd_status)
    s = sub.add_parser("decisions", parents=[as_json, state], help="the decision log (JSON lines with --json)")
    s.add_argument("--loop", help="only this loop's decisions")
    s.add_argument("--since", metavar="T", help='a duration ago ("10m", "2h") or an ISO 8601 time')
    s.add_argument("-n", type=int, metavar="N", help="only the last N")
    s.set_defaults(func=cmd_decisions)
    s = sub.add_parser("top", parents=[state], help="live per-cgroup view of what koordd samples")
    s.add_argument("--json", action="store_true", help="one sample as JSON, then exit")
    s.add_argument("--interval", type=interval, default=DEFAULT_INTERVAL, metavar="T",
                   help=f'refresh interval, "500ms" to "1m" (default {DEFAULT_INTERVAL:g}s)')
    s.add_argument("--sort", choices=list(SORTS), default="cpu",
                   help="column to sort by, highest first; name alphabetically (default cpu)")
    s.add_argument("--class", dest="cls", type=str.upper, choices=CLASS_NAMES, metavar="CLASS",
                   help=f"only this class's cgroups ({', '.join(CLASS_NAMES)})")
    s.add_argument("--members", action="store_true", help="the class roots' children (pods, jobs) too")
    s.set_defaults(func=cmd_top)
    s = sub.add_parser("demo", help="see koordd work: LS and BE on the same CPUs, without and with koordd",
                       description="An LS cgroup whose CPU demand follows a sine wave and a BE cgroup that "
                                   "wants every CPU, in three phases: LS alone, no control, koordd on. A live "
                                   "view, then a summary per phase and a PNG plot. Needs root; removes "
                                   "everything it made, also on Ctrl-C.")
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
    s.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except CtlError as e:
        print(f"koordctl: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:     # `koordctl decisions | head`: quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
