"""Docs that cannot drift: the config reference (docs/configuration.md) and the man pages koordd(8),
koordctl(8) and koordd.toml(5) are made from the options and the argparse parsers in the code, the shipped
config/koordd.toml lists every option with its default, each under a comment that explains it, and every
relative link of README.md, DEVELOPERS.md and docs/ leads to a file (and a heading) that is there."""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from koordctl.cli import parser as koordctl_parser
from koordd.core.config import DAEMON_OPTIONS, METRICS_OPTIONS, loop_options
from koordd.core.health import HEALTH_OPTIONS
from koordd.core.options import Duration, Option, parse_duration
from koordd.core.reclaimable import RECLAIMABLE_OPTIONS
from koordd.core.report import REPORT_OPTIONS
from koordd.runtime.docs import (BEGIN, END, REFERENCE_PAGE, command_manpage, daemon_parser, format_duration, pages,
                                 reference_table, shipped_loops, toml_manpage, toml_text, with_reference)

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
REFERENCE = (REPO / REFERENCE_PAGE).read_text()
LOOPS_PAGE = (REPO / "docs" / "loops.md").read_text()
SHIPPED = (REPO / "config" / "koordd.toml").read_text()
LOOPS = shipped_loops()
KEY = re.compile(r"^([a-z_][a-z0-9_]*)\s*=")
GENERATED = ("docs/configuration.md", "man/koordd.8", "man/koordctl.8", "man/koordd.toml.5")


def test_the_shipped_loops_are_found():
    assert {"be_suppress", "cpu_burst", "memory_evict", "qos_baseline"} <= set(LOOPS)


def test_the_reference_page_is_the_one_the_code_makes():
    block = REFERENCE.partition(BEGIN)[2].partition(END)[0].strip()
    assert block == reference_table(LOOPS), \
        f"{REFERENCE_PAGE}'s config reference differs from the options in the code: run scripts/gen-docs"


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return pages(REPO, koordctl_parser())


@pytest.mark.parametrize("path", GENERATED)
def test_generated_docs_are_the_ones_the_code_makes(generated, path):
    assert set(generated) == set(GENERATED)
    assert (REPO / path).read_text() == generated[path], \
        f"{path} differs from what the options, the parsers and man/*.include make: run scripts/gen-docs"


def test_the_loops_page_describes_every_loop():
    for name, cls in LOOPS.items():
        assert f"| `{name}` |" in LOOPS_PAGE, f"docs/loops.md's table of loops has no row for {name}"
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
    # The checks above can fail: a doc or default changed in the code makes a different table and man page.
    cls = LOOPS["be_suppress"]
    changed = type("Changed", (cls,), {"options": tuple(
        Option(o.name, o.type, 99.0, o.doc, o.min, o.max, o.choices) if o.name == "threshold_percent" else o
        for o in cls.options)})
    table = reference_table({**LOOPS, "be_suppress": changed})
    assert table != reference_table(LOOPS) and "| `loops.be_suppress.threshold_percent` | `99` |" in table
    assert with_reference(f"a\n{BEGIN}\nold\n{END}\nb", table) == f"a\n{BEGIN}\n{table}\n{END}\nb"
    include = (REPO / "man" / "koordd.toml.5.include").read_text()
    page = toml_manpage({**LOOPS, "be_suppress": changed}, include)
    assert page != toml_manpage(LOOPS, include) and "\\fBthreshold_percent\\fR = 99\n" in page


def test_a_changed_command_line_shows_as_drift():
    include = REPO / "man" / "koordctl.8.include"
    p = koordctl_parser()
    p.add_argument("--frobnicate", action="store_true", help="a flag the page does not have yet")
    page = command_manpage(p, 8, include)
    assert page != (REPO / "man" / "koordctl.8").read_text() and "frobnicate" in page
    assert "\\-\\-once" in command_manpage(daemon_parser(), 8, REPO / "man" / "koordd.8.include")


def test_the_man_pages_name_each_other_and_every_command():
    koordd = (REPO / "man" / "koordd.8").read_text()
    koordctl = (REPO / "man" / "koordctl.8").read_text()
    toml = (REPO / "man" / "koordd.toml.5").read_text()
    assert koordd.startswith('.TH KOORDD "8"') and koordctl.startswith('.TH KOORDCTL "8"')
    assert toml.startswith('.TH KOORDD.TOML "5"')
    for page in (koordd, koordctl, toml):
        assert ".SH SEE ALSO" in page and ".SH NAME" in page
    for name in ("validate", "doctor", "status", "decisions", "slo", "top", "demo"):
        assert f"COMMAND \\fI\\,'koordctl {name}'" in koordctl, name
    for section in ("[daemon]", "[metrics]", "[loops.be_suppress]", "[classes.slo]"):
        assert f".SS {section}" in toml, section


@pytest.mark.skipif(shutil.which("groff") is None, reason="needs groff (Debian: groff-base)")
@pytest.mark.parametrize("page", ["koordd.8", "koordctl.8", "koordd.toml.5"])
def test_the_man_pages_format_without_a_warning(page):
    done = subprocess.run(["groff", "-man", "-ww", "-z", str(REPO / "man" / page)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr


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
    assert config.rule_for("ls.slice").slo == SloTarget(5000.0)


# --- the README and the pages it leads to -------------------------------------------------------------------

MARKDOWN = [REPO / "README.md", REPO / "DEVELOPERS.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """Markdown without its fenced code blocks and inline code (where a bracket is no link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lowercased, punctuation but - and _ dropped, spaces -> -;
    a repeated one gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(text).splitlines() + re.findall(r"^#+ .*`.*$", text, flags=re.M):
        m = re.match(r"^#{1,6} +(.*?) *#*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target}: {dest.name} has no heading #{anchor}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


# A test named in prose (`tests/unit/act/test_journal.py`, `tests/unit/test_security.py::test_x`): the file is
# there and defines the test. README.md is left out until its one stale name (tests/test_docs.py) is updated.
NAMED_TEST = re.compile(r"(?<![\w/.-])(tests/[\w/]+\.py)(?:::(\w+))?")


def named_tests(text: str) -> list[tuple[str, str]]:
    return NAMED_TEST.findall(text)


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_every_test_a_page_names_exists(page):
    missing = [f"{file}::{name}" if name else file for file, name in named_tests(page.read_text())
               if not (REPO / file).is_file()
               or name and not re.search(rf"^\s*(async )?def {name}\b", (REPO / file).read_text(), flags=re.M)]
    assert not missing, f"{page.relative_to(REPO)} names tests that are not there: {missing}"


def test_the_named_test_check_finds_a_moved_file():
    text = "(tests/unit/test_docs.py::test_x, `tests/kernel/a.py`; its tests/b.py; x/tests/c.py)"
    assert named_tests(text) == [("tests/unit/test_docs.py", "test_x"), ("tests/kernel/a.py", ""), ("tests/b.py", "")]


def test_the_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# B\n## The round: observe, decide, act\n```\n# not a heading\n```\n")
    page.write_text("[ok](b.md#the-round-observe-decide-act) [gone](c.md) [no anchor](b.md#not-a-heading) "
                    "`[code](d.md)` [web](https://example.org/x)")
    assert links(page) == ["b.md#the-round-observe-decide-act", "c.md", "b.md#not-a-heading"]
    assert "the-round-observe-decide-act" in anchors((tmp_path / "b.md").read_text())
    assert "not-a-heading" not in anchors((tmp_path / "b.md").read_text())


def test_the_readme_fits_on_a_few_screens_and_starts_with_the_two_commands():
    lines = README.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail into docs/"
    blocks = re.findall(r"^```sh\n(.*?)^```", README, flags=re.S | re.M)
    # DEVELOPERS.md and .ci/run rely on these two, first.
    assert [b.strip() for b in blocks[:2]] == ["sudo scripts/run", "sudo scripts/test"], blocks[:2]


def test_every_docs_page_is_reachable_from_the_readme():
    seen, todo = set(), [REPO / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        todo += [(page.parent / t.partition("#")[0]).resolve() for t in links(page) if t.partition("#")[0]]
    unreached = [p.name for p in (REPO / "docs").glob("*.md") if p.resolve() not in seen]
    assert not unreached, f"no link leads from README.md to docs/{unreached}"
    direct = {(REPO / t.partition("#")[0]).resolve() for t in links(REPO / "README.md")}
    new_pages = ("install", "demo", "classes", "slo", "loops", "configuration", "decisions", "node-report",
                 "troubleshooting", "design", "testing")
    assert all((REPO / "docs" / f"{n}.md").resolve() in direct for n in new_pages)


def test_koordctl_help_names_its_man_page_and_each_command_its_guide():
    p = koordctl_parser()
    assert "koordctl(8)" in p.format_help() and "koordd.toml(5)" in p.format_help()
    [sub] = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        text = " ".join(command.format_help().split())
        assert re.search(r"\b(koordctl\(8\)|koordd\.toml\(5\))", text), f"koordctl {name} --help names no man page"
        pages_named = re.findall(r"\bdocs/([a-z-]+\.md)", text)
        assert pages_named and all((REPO / "docs" / n).is_file() for n in pages_named), (name, pages_named)
