"""The configuration reference, made from the options the code declares.

README.md's table of keys is `reference_table()` between the two markers below: tests/test_docs.py
fails when they differ, and `scripts/gen-docs` writes the table in again. The shipped
config/koordd.toml is checked by the same test (every option there, with its default, under a
comment), so neither can drift from the code.
"""
from __future__ import annotations

from typing import Any, Mapping

from koordd.core.config import DAEMON_OPTIONS, METRICS_OPTIONS, loop_options
from koordd.core.health import HEALTH_OPTIONS
from koordd.core.options import COMMON_LOOP_OPTIONS, Duration, Option
from koordd.core.reclaimable import RECLAIMABLE_OPTIONS
from koordd.core.report import REPORT_OPTIONS, TenantMap
from koordd.core.slo import PROBE_OPTIONS, PROMETHEUS_OPTIONS, SLO_OPTIONS, LabelMatchers
from koordd.core.registry import load_registry

BEGIN = "<!-- config reference: made by scripts/gen-docs from the options in the code; do not edit -->"
END = "<!-- end of config reference -->"


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


def _row(key: str, option: Option) -> str:
    doc = option.doc
    if option.choices and not any(c in doc for c in option.choices):
        doc += ": " + ", ".join(f"`{c}`" for c in option.choices)
    return f"| `{key}` | `{toml_text(option, option.default)}` | {doc} |"


def reference_table(loops: Mapping[str, type]) -> str:
    """The table of every key: [daemon], [metrics], [reclaimable], [report], a class's [classes.health] and
    [classes.slo], the keys every loop has, then each loop's own, by name."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    rows += [_row(f"daemon.{o.name}", o) for o in DAEMON_OPTIONS]
    rows += [_row(f"metrics.{o.name}", o) for o in METRICS_OPTIONS]
    rows += [_row(f"reclaimable.{o.name}", o) for o in RECLAIMABLE_OPTIONS]
    rows += [_row(f"report.{o.name}", o) for o in REPORT_OPTIONS]
    rows += [_row(f"classes.health.{o.name}", o) for o in HEALTH_OPTIONS]
    rows += [_row(f"classes.slo.{o.name}", o) for o in SLO_OPTIONS + PROMETHEUS_OPTIONS + PROBE_OPTIONS]
    rows += [_row(f"loops.<name>.{o.name}", o) for o in COMMON_LOOP_OPTIONS]
    common = {o.name for o in COMMON_LOOP_OPTIONS}
    for name in sorted(loops):
        rows += [_row(f"loops.{name}.{o.name}", o) for o in loop_options(loops[name]) if o.name not in common]
    return "\n".join(rows)


def with_reference(readme: str, table: str) -> str:
    """`readme` with the text between the markers replaced by `table`."""
    head, sep, rest = readme.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"README.md lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def shipped_loops() -> dict[str, type]:
    """The loops koordd ships (third-party ones document themselves)."""
    return {name: cls for name, cls in load_registry().items() if cls.__module__.startswith("koordd.loops.")}


def main(argv: list[str] | None = None) -> int:
    import sys
    from pathlib import Path
    path = Path((argv if argv is not None else sys.argv[1:] or ["README.md"])[0])
    text = path.read_text()
    new = with_reference(text, reference_table(shipped_loops()))
    if new != text:
        path.write_text(new)
        print(f"{path}: config reference rewritten")
    else:
        print(f"{path}: config reference already up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
