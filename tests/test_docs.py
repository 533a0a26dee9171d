"""Docs that cannot drift: README.md's config reference is made from the options in the code, and the
shipped config/koordd.toml lists every option with its default, each under a comment that explains it."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from koordd.core.config import DAEMON_OPTIONS, METRICS_OPTIONS, loop_options
from koordd.core.health import HEALTH_OPTIONS
from koordd.core.options import Duration, Option, parse_duration
from koordd.core.reclaimable import RECLAIMABLE_OPTIONS
from koordd.core.report import REPORT_OPTIONS
from koordd.runtime.docs import BEGIN, END, format_duration, reference_table, shipped_loops, toml_text, with_reference

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
SHIPPED = (REPO / "config" / "koordd.toml").read_text()
LOOPS = shipped_loops()
KEY = re.compile(r"^([a-z_][a-z0-9_]*)\s*=")


def test_the_shipped_loops_are_found():
    assert {"be_suppress", "cpu_burst", "memory_evict", "qos_baseline"} <= set(LOOPS)


def test_readme_reference_is_the_one_the_code_makes():
    block = README.partition(BEGIN)[2].partition(END)[0].strip()
    assert block == reference_table(LOOPS), \
        "README.md's config reference differs from the options in the code: run scripts/gen-docs"


def test_readme_describes_every_loop():
    for name, cls in LOOPS.items():
        assert f"| `{name}` |" in README, f"README.md's table of loops has no row for {name}"
        assert (cls.__doc__ or "").strip(), f"loop {name} has no docstring (its user documentation)"


def documented_keys(text: str) -> dict[str, dict[str, str]]:
    """section -> {key: the comment that documents it}, from the config file's layout: the comment block
    right above a key, or above a run of keys when the block names the later ones; `enabled` is
    documented by the comment above its section header."""
    out: dict[str, dict[str, str]] = {}
    section, block, run_block, header_block = None, [], None, ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("# "))
            run_block = None
            continue
        if stripped.startswith("["):
            section = stripped.strip("[]")
            header_block, block, run_block = " ".join(block), [], None
            out.setdefault(section, {})
            continue
        m = KEY.match(stripped)
        if m and section is not None:
            key = m.group(1)
            if block:
                run_block = " ".join(block)
                out[section][key] = run_block
            elif run_block is not None and re.search(rf"\b{key}\b", run_block):
                out[section][key] = run_block
            elif key == "enabled" and header_block:
                out[section][key] = header_block
            else:
                out[section][key] = ""
            block = []
            continue
        if not stripped:
            block, run_block = [], None
    return out


def shipped_sections() -> list[tuple[str, tuple[Option, ...]]]:
    return [("daemon", DAEMON_OPTIONS), ("metrics", METRICS_OPTIONS), ("reclaimable", RECLAIMABLE_OPTIONS),
            ("report", REPORT_OPTIONS), ("classes.health", HEALTH_OPTIONS)] + [(f"loops.{name}", loop_options(cls)) for name, cls in sorted(LOOPS.items())]


@pytest.mark.parametrize("section, options", shipped_sections(), ids=lambda x: x if isinstance(x, str) else "")
def test_shipped_config_lists_every_option_with_its_default_under_a_comment(section, options):
    parsed = tomllib.loads(SHIPPED)
    if section == "classes.health":       # the LS rule shows the targets every LS class defaults to
        [values] = [rule["health"] for rule in parsed["classes"] if rule["name"] == "LS"]
    else:
        values = parsed["loops"][section.split(".", 1)[1]] if section.startswith("loops.") else parsed[section]
    docs = documented_keys(SHIPPED)[section]
    for o in options:
        assert o.name in values, f"config/koordd.toml [{section}] does not list {o.name}"
        assert docs.get(o.name), f"config/koordd.toml [{section}] {o.name} has no comment explaining it"
        if o.name != "enabled":           # the shipped file chooses which loops run
            assert o.convert(values[o.name]) == o.default, \
                f"config/koordd.toml [{section}] {o.name} = {values[o.name]!r}, the default is {o.default!r}"
    unknown = set(values) - {o.name for o in options}
    assert not unknown, f"config/koordd.toml [{section}] has keys no option declares: {unknown}"


def test_a_changed_option_shows_as_drift():
    # The check above can fail: a doc or default changed in the code makes a different table.
    cls = LOOPS["be_suppress"]
    changed = type("Changed", (cls,), {"options": tuple(
        Option(o.name, o.type, 99.0, o.doc, o.min, o.max, o.choices) if o.name == "threshold_percent" else o
        for o in cls.options)})
    table = reference_table({**LOOPS, "be_suppress": changed})
    assert table != reference_table(LOOPS) and "| `loops.be_suppress.threshold_percent` | `99` |" in table
    assert with_reference(f"a\n{BEGIN}\nold\n{END}\nb", table) == f"a\n{BEGIN}\n{table}\n{END}\nb"


@pytest.mark.parametrize("seconds, text", [(1.0, "1s"), (0.5, "500ms"), (60.0, "1m"), (90.0, "1m30s"),
                                           (3600.0, "1h"), (0.0, "0s"), (1.5, "1s500ms")])
def test_durations_are_written_the_way_the_config_reads_them(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
    assert toml_text(Option("d", Duration, Duration(seconds), "", min=0, max=86400), Duration(seconds)) == f'"{text}"'


def test_the_shipped_slo_example_is_off_and_valid_once_uncommented():
    # The LS class's [classes.slo] is shipped commented out (no SLO: the application latency sensor is not
    # loaded); uncommented, it names every SLO option, each with a comment, and validates.
    from koordd.core.config import parse_config
    from koordd.core.slo import SLO_OPTIONS, SloTarget
    assert all(rule.get("slo") is None for rule in tomllib.loads(SHIPPED)["classes"])
    lines = SHIPPED.splitlines()
    start = lines.index("# [classes.slo]")
    block = []
    for line in lines[start:]:
        if not line.startswith("# "):
            break
        block.append(line[2:])
    example = {o.split("=")[0].strip() for o in block[1:]}
    assert example == {o.name for o in SLO_OPTIONS} and all("#" in line for line in block[1:])
    uncommented = "\n".join(lines[:start] + block + lines[start + len(block):])
    config = parse_config(uncommented, "koordd.toml", LOOPS)
    assert config.slo_of("ls.slice") == SloTarget(5000.0)
