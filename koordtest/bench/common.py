"""What several benchmarks share: a parser that shows the module's docstring, SIGTERM handled as Ctrl-C,
a KEY=VALUE option's value read as TOML, waiting for a condition, the command line and the host as a
report gives them, a median (range) cell and the report's page."""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from koordtest.bench.qos_stats import Spread

REPO = Path(__file__).resolve().parents[2]


def doc_parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser whose --help is `doc`: its first line, then (verbatim) all after the second."""
    lines = doc.splitlines()
    return argparse.ArgumentParser(description=lines[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="\n".join(lines[2:]))


def interrupted(signum, frame):
    """SIGTERM cleans up as Ctrl-C does (signal.signal(signal.SIGTERM, interrupted))."""
    raise KeyboardInterrupt


def toml_value(text: str) -> Any:
    """An option's VALUE as TOML reads it (10, 2.5, true, "1s"); what TOML does not read is a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def wait_for(predicate, timeout: float, step: float = 0.1):
    """predicate()'s first truthy value within `timeout` seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(step)


def command_line(script: str | None = None, args: Sequence[str] | None = None) -> str:
    """How this run was started, for a report: the Python (relative where it lies below the current
    directory), the script as it was named (or `script`) and its arguments (or `args`)."""
    python = os.path.relpath(sys.executable)
    if python.startswith(".."):
        python = sys.executable
    return shlex.join([python, script or os.path.relpath(sys.argv[0])] + list(sys.argv[1:] if args is None else args))


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.machine()


def git_describe() -> str:
    """The checkout's `git describe --always --dirty`, or says it is none."""
    try:
        return subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "(not a git checkout)"


def cell(s: Spread | None, digits: int = 2, unit: str = "", scale: float = 1) -> str:
    """"1.23 (1.10-1.40)": median (min-max), each times `scale`; one value, or all alike: just it; no
    value: "-"."""
    if s is None:
        return "-"
    f = f"{{:.{digits}f}}"
    if s.n == 1 or s.low == s.high:
        return f.format(scale * s.median) + unit
    return f"{f.format(scale * s.median)}{unit} ({f.format(scale * s.low)}-{f.format(scale * s.high)})"


def page(title: str, command: str, about: Sequence[str], body: Sequence[str], notes: Sequence[str] = (),
         fence: str = "console") -> str:
    """A report in Markdown: the title, the command that made it, what was measured (a bullet each), the
    body's lines, then the notes (a bullet each)."""
    out = [f"# {title}", "", f"```{fence}", command, "```", ""] + [f"- {line}" for line in about] + [""]
    out += body
    if notes:
        out += [""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"
