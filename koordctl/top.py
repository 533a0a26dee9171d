"""koordctl top: the terminal view of what koordd publishes for it (<state_dir>/top.json, see topfeed.py).

One row per cgroup koordd samples (the class roots; their members with --members) with its class, CPU,
memory, PSI, run-queue p99 and CPI where those sensors run, and the knobs koordd holds on it; sorted by
a column, highest first. On a terminal it refreshes in place with plain ANSI sequences (an alternate
screen, restored on exit); anywhere else it prints one sample.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import sys
import termios
import time
import tty
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, TextIO

from koordctl.common import CtlError, pid_alive
from koordctl.rows import cpi, select_rows
from koordctl.running import trusted_state_dir
from koordctl.shapes import STATUS, TOP
from koordctl.statefiles import escaped, read_document as read_state_document
from koordd.act.journal import write_atomic
from koordd.core.feeds import REQUEST_FILE, STATUS_FILE, TOP_FILE, TopRequest
from koordd.core.printable import printable
from koordd.core.snapshot import CPI, RUNQ_LATENCY

ANSWER_TIMEOUT = 5.0    # koordd looks for a request once a second and publishes its second round after that
POLL = 0.1              # how often a waiting koordctl reads top.json again
SORT_KEYS = {"c": "cpu", "m": "memory", "p": "psi", "r": "runq", "i": "cpi", "n": "name"}
QUIT_KEYS = "qQ"


class NoAnswer(Exception):
    """koordd runs but published nothing for the request in time."""


# --- rows -----------------------------------------------------------------------------------------


# --- text -----------------------------------------------------------------------------------------

def human_bytes(n: float | None) -> str | None:
    if n is None:
        return None
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" or abs(n) >= 10 else f"{n:.1f}{unit}"
        n /= 1024
    return None


def human_us(us: float | None) -> str | None:
    if us is None:
        return None
    return f"{us:.0f}us" if us < 1000 else f"{us / 1000:.1f}ms" if us < 1e6 else f"{us / 1e6:.2f}s"


def _fixed(value: float | None, digits: int = 2) -> str | None:
    return None if value is None else f"{value:.{digits}f}"


def target_name(row: dict) -> str:
    kind = row.get("kind") or "cgroup"
    path = row.get("path") or ""
    return (path or "/") if kind == "cgroup" else f"{kind}:{path}"


def knobs_text(row: dict) -> str | None:
    """Each knob koordd holds here: its value now and, in parentheses, the original koordd restores."""
    knobs = row.get("knobs") or {}
    return "; ".join(f"{name} {_value(k.get('current'))} (was {_value(k.get('original'))})"
                     for name, k in sorted(knobs.items())) or None


def _value(v: str | None) -> str:
    return "?" if v is None else v or '""'


def runq_text(row: dict) -> str | None:
    runq = row.get("runq") or {}
    if runq.get("p99_us") is None and runq.get("mean_us") is not None:
        return f"avg {human_us(runq['mean_us'])}"          # schedstat: a mean, no quantiles
    return human_us(runq.get("p99_us"))


@dataclass(frozen=True)
class Column:
    title: str
    cell: Callable[[dict], str | None]
    left: bool = False              # text; numbers are right-aligned
    sensor: str | None = None       # shown only where this optional sensor is registered


COLUMNS = (
    Column("CGROUP", target_name, left=True),
    Column("CLASS", lambda r: r.get("class") or None, left=True),
    Column("CPU", lambda r: _fixed(r.get("cpu"))),
    Column("MEMORY", lambda r: human_bytes(r.get("memory"))),
    Column("PSI CPU", lambda r: _fixed((r.get("psi") or {}).get("cpu"))),
    Column("PSI MEM", lambda r: _fixed((r.get("psi") or {}).get("memory"))),
    Column("PSI IO", lambda r: _fixed((r.get("psi") or {}).get("io"))),
    Column("RUNQ P99", runq_text, sensor=RUNQ_LATENCY),
    Column("CPI", lambda r: _fixed(cpi(r)), sensor=CPI),
    Column("KNOBS HELD", knobs_text, left=True),
)


def columns_for(doc: dict) -> list[Column]:
    """The columns worth showing: a sensor's only where koordd has that sensor (running or not: a
    column of "-" says it has no values, and the header says why)."""
    sensors = doc.get("sensors") or {}
    return [c for c in COLUMNS if c.sensor is None or c.sensor in sensors
            or any(c.cell(r) is not None for r in doc.get("cgroups") or ())]


def table_lines(rows: Iterable[dict], columns: list[Column]) -> list[str]:
    # printable(): a cgroup's name, the workload's choice, cannot add a line or reach the terminal.
    cells = [[c.title for c in columns]] + [["-" if (v := c.cell(r)) is None else printable(v) for c in columns]
                                            for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return ["  ".join(v.ljust(w) if c.left else v.rjust(w) for v, w, c in zip(row, widths, columns)).rstrip()
            for row in cells]


def age_text(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.1f}s" if seconds < 60 else f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"


def header_lines(doc: dict, now: float) -> list[str]:
    """The node in one line (the sample's age first: a narrow terminal cuts the end), then why a sensor's
    column has no values."""
    node = doc.get("node") or {}
    total, available = node.get("memory_total"), node.get("memory_available")
    used = human_bytes(total - available) if total is not None and available is not None else None
    psi = node.get("psi") or {}
    lines = [f"koordd {doc.get('pid')} | sample {age_text(now - (doc.get('time') or 0))} old"
             f" | CPU {_fixed(node.get('cpu_used')) or '-'} of {node.get('cpus', '-')} busy"
             f" | memory {used or '-'} of {human_bytes(total) or '-'} used"
             f" | PSI some avg10 cpu {_percent(psi.get('cpu'))} mem {_percent(psi.get('memory'))}"
             f" io {_percent(psi.get('io'))}"]
    for name, s in sorted((doc.get("sensors") or {}).items()):
        if s.get("state") != "running":
            lines.append(f"{name}: {s.get('state')}" + (f" ({s['reason']})" if s.get("reason") else ""))
    return [printable(line) for line in lines]


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}%"


def render(doc: dict, by: str, cls: str | None, now: float, keys: bool = False, notice: str | None = None,
           width: int | None = None, height: int | None = None) -> list[str]:
    """The screen: header, a line on what is shown, and the table; cut to `width` x `height` when given."""
    rows = select_rows(doc, by, cls)
    shown = f"{len(rows)} cgroups" + (f" of class {cls}" if cls else "") + f", by {by}"
    if keys:
        shown += " | sort: c cpu, m memory, p psi, r runq, i cpi, n name | q quit"
    lines = header_lines(doc, now) + ([notice] if notice else []) + [shown, ""]
    table = table_lines(rows, columns_for(doc))
    if height is not None and len(lines) + len(table) > height:
        room = max(height - len(lines) - 1, 1)              # the header of the table and its first rows
        table = table[:room] + [f"... and {len(table) - room} more"]
    lines += table
    return [line[:width] for line in lines] if width is not None else lines


# --- koordd's answer --------------------------------------------------------------------------------

def read_document(state_dir: Path) -> dict | None:
    """top.json, or None while there is none (koordd writes it whole, by rename: never half of one);
    CtlError naming it where it is not what koordd writes (koordctl/statefiles.py)."""
    return read_state_document(Path(state_dir) / TOP_FILE, TOP)


def wait_for_document(state_dir: Path, newer_than: float, timeout: float) -> dict | None:
    """The first top.json sampled after `newer_than` (a wall time: the request's), or None after `timeout`."""
    end = time.monotonic() + timeout
    while True:
        doc = read_document(state_dir)
        if doc is not None and (doc.get("time") or 0) > newer_than:
            return doc
        if time.monotonic() >= end:
            return None
        time.sleep(POLL)


# --- the terminal -----------------------------------------------------------------------------------

class Terminal:
    """The tty while the view runs: keys read one by one without echo, an alternate screen without a
    cursor; all put back on exit, whatever the exit (q, Ctrl-C, an error)."""
    ENTER, LEAVE = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"

    def __init__(self, inp: TextIO = sys.stdin, out: TextIO = sys.stdout):
        self.inp, self.out = inp, out
        self.fd = inp.fileno() if inp.isatty() else None     # no keys from a pipe: Ctrl-C still quits
        self.saved: list | None = None

    def __enter__(self) -> "Terminal":
        if self.fd is not None:
            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)          # signals stay on: Ctrl-C is a KeyboardInterrupt
        self.out.write(self.ENTER)
        self.out.flush()
        return self

    def __exit__(self, *exc) -> None:
        self.out.write(self.LEAVE)
        self.out.flush()
        if self.saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def size(self) -> tuple[int, int]:
        """(columns, lines), asked at every frame: the window may have been resized."""
        return tuple(shutil.get_terminal_size())

    def show(self, lines: list[str]) -> None:
        """Draw over the last frame: home, each line then clear to its end, clear below (no flicker)."""
        self.out.write("\x1b[H" + "".join(f"{line}\x1b[K\n" for line in lines[:-1])
                       + (lines[-1] if lines else "") + "\x1b[K\x1b[J")
        self.out.flush()

    def key(self, timeout: float) -> str:
        """The keys pressed within `timeout` seconds ("" if none); "q" when the terminal went away."""
        if self.fd is None:
            time.sleep(timeout)
            return ""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return ""
        try:
            return os.read(self.fd, 64).decode(errors="ignore") or "q"      # b"": end of input, a hang-up
        except OSError:
            return "q"


def watch(screen, state_dir: Path, request: TopRequest, asked: float, by: str, cls: str | None,
          alive: Callable[[], bool], answer_timeout: float = ANSWER_TIMEOUT) -> None:
    """Refresh until q: at every interval, keep the request fresh and show the newest top.json.
    `asked`: the request's mtime (what koordd samples after it answers). NoAnswer when nothing comes."""
    started = next_frame = time.monotonic()
    doc = None
    while True:
        if time.monotonic() >= next_frame:
            touch_request(state_dir, request)
            latest = read_document(state_dir)
            if latest is not None and (doc is not None or (latest.get("time") or 0) > asked):
                doc = latest
            elif doc is None and time.monotonic() - started >= answer_timeout:
                raise NoAnswer(f"koordd published no sample within {answer_timeout:g}s")
            # Until the first answer, look often: it comes about 2 s after the request, whatever the interval.
            next_frame = time.monotonic() + (request.interval if doc is not None else POLL)
        width, height = screen.size()
        if doc is None:
            screen.show([f"koordctl top: waiting for koordd to publish a sample in {Path(state_dir) / TOP_FILE} ..."])
        else:
            now = time.time()
            notice = None
            if not alive():
                notice = "koordd is not running: this is its last sample"
            elif now - (doc.get("time") or 0) > 3 * request.interval + ANSWER_TIMEOUT:
                notice = "koordd has published nothing new for a while"
            screen.show(render(escaped(doc), by, cls, now, keys=True, notice=notice, width=width, height=height))
        for key in screen.key(max(0.0, next_frame - time.monotonic())):
            if key in QUIT_KEYS:
                return
            by = SORT_KEYS.get(key, by)


def write_request(state_dir: Path, request: TopRequest) -> float:
    """Ask koordd for samples (koordctl's side); returns the request's mtime: what koordd
    publishes later than that answers it. OSError (PermissionError unless root) as raised."""
    path = Path(state_dir) / REQUEST_FILE
    write_atomic(path, json.dumps(asdict(request)) + "\n", durable=False)
    return path.stat().st_mtime


def touch_request(state_dir: Path, request: TopRequest) -> None:
    """Keep asking (at every refresh); the request is written again if it went away."""
    try:
        os.utime(Path(state_dir) / REQUEST_FILE)
    except FileNotFoundError:
        write_request(state_dir, request)


def cmd_top(args: argparse.Namespace) -> int:
    sd = trusted_state_dir(args)
    status = read_state_document(sd / STATUS_FILE, STATUS)
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
    no_answer = (f"koordctl top: koordd (pid {pid}) published no sample within {ANSWER_TIMEOUT:g}s"
                 " (a koordd older than koordctl top does not answer: restart it)")
    if args.json or not sys.stdout.isatty():
        doc = wait_for_document(sd, asked, ANSWER_TIMEOUT)
        if doc is None:
            print(no_answer, file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps({**doc, "cgroups": select_rows(doc, args.sort, args.cls)}, indent=1, sort_keys=True))
        else:
            print("\n".join(render(escaped(doc), args.sort, args.cls, time.time())))
        return 0
    try:
        with Terminal() as screen:
            watch(screen, sd, request, asked, args.sort, args.cls, alive=lambda: pid_alive(pid),
                  answer_timeout=ANSWER_TIMEOUT)
    except NoAnswer:
        print(no_answer, file=sys.stderr)
        return 1
    except KeyboardInterrupt:       # Ctrl-C quits like q; the terminal is back already
        pass
    return 0
