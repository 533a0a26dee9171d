"""koordd's generated documentation: the configuration reference and the three man pages.

One source each. The options the code declares make the configuration reference, written as Markdown into
docs/configuration.md (between the two markers below) and as roff into the man page koordd.toml(5). The
argparse parsers of koordd and koordctl make koordd(8) and koordctl(8), through argparse-manpage (PyPI,
pinned in the test extras: its output is compared byte for byte). What no parser or option says (exit
status, signals, files, examples) is hand-written roff in man/<page>.include, in help2man's include format,
which argparse-manpage reads and `toml_manpage()` reads the same way.

`scripts/gen-docs` writes all four; tests/unit/test_docs.py fails when a committed one differs from what the code
makes now. The shipped config/koordd.toml is checked by the same test (every option there, with its default,
under a comment), so none of them can drift from the code. koordd never imports koordctl: koordctl's parser
is handed in by the caller (`pages(koordctl_parser)`).
"""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any, Mapping, NamedTuple
from unittest import mock

from koordd.core.config_check import DAEMON_OPTIONS, METRICS_OPTIONS
from koordd.core.health import HEALTH_OPTIONS
from koordd.core.options import COMMON_LOOP_OPTIONS, Duration, Option
from koordd.core.reclaimable import RECLAIMABLE_OPTIONS
from koordd.core.report import REPORT_OPTIONS, TenantMap
from koordd.core.settings import loop_options
from koordd.core.slo import PROBE_OPTIONS, PROMETHEUS_OPTIONS, SLO_OPTIONS, LabelMatchers
from koordd.core.catalogue import LOOPS, builtin
from koordd.runtime import daemon

BEGIN = "<!-- config reference: made by scripts/gen-docs from the options in the code; do not edit -->"
END = "<!-- end of config reference -->"
REFERENCE_PAGE = "docs/configuration.md"
MAN_DIR = "man"
MANUAL = "koordd manual"


def format_duration(seconds: float) -> str:
    """systemd's form, as the config takes it: 1.5 -> "1s500ms", 90 -> "1m30s", 0.0005 -> "500us", 0 -> "0s"."""
    us = round(seconds * 1_000_000)
    parts = []
    for unit, size in (("h", 3_600_000_000), ("m", 60_000_000), ("s", 1_000_000), ("ms", 1000), ("us", 1)):
        n, us = divmod(us, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


def toml_text(option: Option, value: Any) -> str:
    """`value` as it is written in the config file."""
    if isinstance(option, TenantMap):           # name -> patterns: an inline table
        return "{" + ", ".join(f'"{n}" = ' + toml_text(Option(n, tuple, (), ""), ps) for n, ps in value) + "}"
    if isinstance(option, LabelMatchers):       # label -> value: an inline table
        return "{" + ", ".join(f'{k} = "{v}"' for k, v in value) + "}"
    if option.type is Duration or isinstance(value, Duration):
        return f'"{format_duration(value)}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n") + '"'


class Entry(NamedTuple):
    """One key of the reference: its table ("daemon", "loops.be_suppress", "loops.<name>"), its name, its
    default as the file writes it, and what it means (its choices appended where the text names none)."""
    section: str
    name: str
    default: str
    doc: str

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"


SECTION_TITLES = {
    "classes.health": "below an LS, LSR or LSE [[classes]] rule",
    "classes.slo": "below an LS, LSR or LSE [[classes]] rule",
    "loops.<name>": "every loop",
}


def _entry(section: str, option: Option) -> Entry:
    doc = option.doc
    if option.choices and not any(c in doc for c in option.choices):
        doc += ": " + ", ".join(f"`{c}`" for c in option.choices)
    return Entry(section, option.name, toml_text(option, option.default), doc)


def reference_entries(loops: Mapping[str, type]) -> list[Entry]:
    """Every key: [daemon], [metrics], [reclaimable], [report], a class's [classes.health] and [classes.slo],
    the keys every loop has, then each loop's own, by name."""
    out = [_entry("daemon", o) for o in DAEMON_OPTIONS]
    out += [_entry("metrics", o) for o in METRICS_OPTIONS]
    out += [_entry("reclaimable", o) for o in RECLAIMABLE_OPTIONS]
    out += [_entry("report", o) for o in REPORT_OPTIONS]
    out += [_entry("classes.health", o) for o in HEALTH_OPTIONS]
    out += [_entry("classes.slo", o) for o in SLO_OPTIONS + PROMETHEUS_OPTIONS + PROBE_OPTIONS]
    out += [_entry("loops.<name>", o) for o in COMMON_LOOP_OPTIONS]
    common = {o.name for o in COMMON_LOOP_OPTIONS}
    for name in sorted(loops):
        out += [_entry(f"loops.{name}", o) for o in loop_options(loops[name]) if o.name not in common]
    return out


def reference_table(loops: Mapping[str, type]) -> str:
    """The reference as Markdown (docs/configuration.md): a heading per table ("### [loops.be_suppress]", which
    other pages link to as #loopsbe_suppress), then its keys with their defaults and meanings."""
    out: list[str] = []
    section = None
    for e in reference_entries(loops):
        if e.section != section:
            section = e.section
            title = f"[{section}]" + (f" ({SECTION_TITLES[section]})" if section in SECTION_TITLES else "")
            out += ["" if out else None, f"### {title}", "", "| key | default | meaning |", "|---|---|---|"]
        out.append(f"| `{e.key}` | `{e.default}` | {e.doc} |")
    return "\n".join(line for line in out if line is not None)


def with_reference(text: str, table: str) -> str:
    """`text` with what lies between the markers replaced by `table`."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"{REFERENCE_PAGE} lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def shipped_loops() -> dict[str, type]:
    """The loops koordd ships (third-party ones document themselves)."""
    return builtin(LOOPS)


# --- roff -----------------------------------------------------------------------------------------------

def roff(text: str) -> str:
    """Plain text (Markdown's `code` allowed) as roff: backslashes and hyphens escaped, `code` in bold, a line
    that would start with a control character guarded."""
    text = text.replace("\\", "\\\\").replace("-", "\\-")
    text = re.sub(r"`([^`]*)`", r"\\fB\1\\fR", text)
    text = "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in text)     # groff's form: no locale needed
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line for line in text.split("\n"))


def includes(text: str) -> list[tuple[str, str]]:
    """help2man's include format, as argparse-manpage reads it: "[SECTION]" lines, each followed by its roff;
    lines before the first are comments."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        m = re.fullmatch(r"\[([<=>]?)([^\]]+)\]", line)
        if m:
            out.append((m.group(2).upper(), ""))
        elif out:
            out[-1] = (out[-1][0], out[-1][1] + line + "\n")
    return [(name, body.strip("\n")) for name, body in out]


def toml_manpage(loops: Mapping[str, type], include: str) -> str:
    """koordd.toml(5): the prose of `include` (man/koordd.toml.5.include) with every key under OPTIONS, made
    from the same entries as docs/configuration.md's table."""
    lines = ['.TH KOORDD.TOML "5" "" "koordd" "' + MANUAL + '"', ".SH NAME",
             "koordd.toml \\- configuration file of koordd, the node QoS daemon",
             ".SH SYNOPSIS", ".B /etc/koordd/koordd.toml"]
    for name, body in includes(include):
        lines.append(f".SH {name}")
        if body:
            lines.append(body)
        if name == "OPTIONS":
            section = None
            for e in reference_entries(loops):
                if e.section != section:
                    section = e.section
                    title = f"[{section.replace('<name>', 'NAME')}]"
                    if section in SECTION_TITLES:
                        title += f" ({SECTION_TITLES[section]})"
                    lines.append(f".SS {roff(title)}")
                lines += [".TP", f"\\fB{roff(e.name)}\\fR = {roff(e.default)}", roff(e.doc)]
    return "\n".join(lines) + "\n"


def command_manpage(parser: argparse.ArgumentParser, section: int, include: Path) -> str:
    """A command's man page from its argparse parser, by argparse-manpage: NAME from the parser's description,
    every option and subcommand with its help, then `include`'s sections. The parser's epilog (which points at
    this very page) is left out; the date too, so the page changes only when its text does."""
    from argparse_manpage.manpage import Manpage      # a development tool (test extras); nodes never run this
    summary = (parser.description or "").rstrip(".")
    parser.description = None
    parser.epilog = None
    # argparse wraps usage lines at the terminal's width: a fixed one, so the page is the same from a terminal,
    # a pipe or CI.
    with mock.patch.dict(os.environ, {"COLUMNS": "80"}):
        page = Manpage(parser, _data={"manual_section": section, "project_name": "koordd", "manual_title": MANUAL,
                                      "description": summary[:1].lower() + summary[1:], "include": str(include)})
        page.date = ""
        return str(page)


def daemon_parser() -> argparse.ArgumentParser:
    """koordd's parser, as `koordd --help` uses it: koordd/runtime/daemon.py builds it inside parse_args(), so
    it is caught there when it parses (nothing else runs)."""
    if hasattr(daemon, "parser"):
        return daemon.parser()
    caught: list[argparse.ArgumentParser] = []

    class Caught(Exception):
        pass

    def catch(self, *args, **kwargs):
        caught.append(self)
        raise Caught

    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch):
        try:
            daemon.parse_args([])
        except Caught:
            pass
    return caught[0]


def pages(root: Path, koordctl_parser: argparse.ArgumentParser) -> dict[str, str]:
    """Every generated file under `root` (relative path -> its whole text)."""
    loops = shipped_loops()
    man = root / MAN_DIR
    return {
        REFERENCE_PAGE: with_reference((root / REFERENCE_PAGE).read_text(), reference_table(loops)),
        f"{MAN_DIR}/koordd.toml.5": toml_manpage(loops, (man / "koordd.toml.5.include").read_text()),
        f"{MAN_DIR}/koordd.8": command_manpage(daemon_parser(), 8, man / "koordd.8.include"),
        f"{MAN_DIR}/koordctl.8": command_manpage(koordctl_parser, 8, man / "koordctl.8.include"),
    }


def main(root: Path, koordctl_parser: argparse.ArgumentParser) -> int:
    """Write every generated file that differs (scripts/gen-docs)."""
    for path, text in pages(root, koordctl_parser).items():
        if (root / path).exists() and (root / path).read_text() == text:
            print(f"{path}: up to date")
        else:
            (root / path).write_text(text)
            print(f"{path}: written")
    return 0
