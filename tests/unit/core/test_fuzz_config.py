"""The config loader on generated documents: the real registry's sections, keys and values mixed with
junk, wrong types, unknown names, odd unicode and huge numbers; and on arbitrary bytes. Every outcome is a
Config or a ConfigError whose every line is "<file>:<line>: <message>" — never a traceback.

Examples per property: tests/fuzzing.py (a few dozen here; scripts/fuzz runs many more)."""
from __future__ import annotations

import json
import re
import string

import pytest
from hypothesis import given, strategies as st

from koordtest.fuzzing import PROFILE, counted
from koordd.core.config import CLASS_NAMES, Config, ConfigError, DAEMON_OPTIONS, load_config, loop_options, parse_config
from koordd.core.health import HEALTH_OPTIONS
from koordd.core.options import Duration
from koordd.core.catalogue import load_registry

REGISTRY = load_registry()
PATH = "/etc/koordd/koordd.toml"
LINE = re.compile(rf"^{re.escape(PATH)}:[1-9][0-9]*: \S")

# --- values --------------------------------------------------------------------------------------------

ODD_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
HUGE_INTS = st.sampled_from((2**63 - 1, -2**63, 2**64, 10**30, -10**30, 10**400, 10**4299))
FLOAT_WORDS = ("nan", "+nan", "-nan", "inf", "-inf", "1e308", "1e999", "-0.0", "5e-324")


def toml_string(s: str) -> str:
    """A TOML basic string holding exactly `s` (JSON's escapes are TOML's, \\u for the controls)."""
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


@st.composite
def scalar(draw) -> str:
    """One value as TOML text: any type, the odd ones included."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.sampled_from(("true", "false")))
    if kind == 1:
        return str(draw(st.one_of(st.integers(-10**6, 10**6), HUGE_INTS)))
    if kind == 2:
        return draw(st.one_of(st.sampled_from(FLOAT_WORDS), st.floats(allow_nan=False, allow_infinity=False).map(
            lambda f: repr(f) if "e" in repr(f) or "." in repr(f) else repr(f) + ".0")))
    if kind == 3:
        return toml_string(draw(st.sampled_from(("500ms", "2s", "1m30s", "0s", "-1s", "1" + "0" * 400 + "h",
                                                  "nan", "µs", "5", ""))))
    if kind == 4:
        return toml_string(draw(ODD_TEXT))
    if kind == 5:
        return toml_string(draw(st.sampled_from(("LS", "BE", "LSE", "LSR", "SYSTEM", "be.slice/*", "/",
                                                  "../x", "a/[b]/*?", "eth0:10gbit", "eth0:" + "9" * 400,
                                                  "0-100%", "50%", "1Gi", "max", "koordd", "ls_slack"))))
    if kind == 6:
        return draw(st.sampled_from(("1979-05-27T07:32:00Z", "07:32:00", "1979-05-27", "0x7fffffffffffffff",
                                     "0o777", "0b1", "'literal'", '"""multi\nline"""')))
    if kind == 7:
        return "[" + ", ".join(draw(st.lists(st.deferred(lambda: scalar()), max_size=3))) + "]"
    if kind == 8:
        return "[" + ", ".join(toml_string(c) for c in draw(st.lists(st.sampled_from(
            CLASS_NAMES + ("be.slice", "kubepods.slice/*", "eth0:1gbit", "XX")), max_size=3))) + "]"
    return "{" + ", ".join(f"{draw(key())} = {draw(st.deferred(lambda: scalar()))}"
                           for _ in range(draw(st.integers(0, 2)))) + "}"


def valid_value(option) -> st.SearchStrategy[str]:
    """Values an option takes (or nearly: its bounds, its default)."""
    out = [st.just(toml_string(c)) for c in option.choices]
    if option.type is bool:
        out.append(st.sampled_from(("true", "false")))
    elif option.type in (int, float):
        lo = option.min if option.min is not None else -10**6
        hi = option.max if option.max is not None else 10**6
        out.append(st.sampled_from((lo, hi, (lo + hi) / 2)).map(
            lambda v: str(int(v)) if option.type is int else repr(float(v))))
    elif option.type is Duration:
        out.append(st.sampled_from(('"500ms"', '"2s"', '"1m"', "1", "0.05", "3600")))
    if isinstance(option.default, str):
        out.append(st.just(toml_string(option.default)))
    return st.one_of(*out) if out else scalar()


# --- names -----------------------------------------------------------------------------------------------

BARE = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=10)


@st.composite
def key(draw, names: tuple[str, ...] = ()) -> str:
    """A key: a real name or junk, bare, "quoted" (escapes too) or 'literal'."""
    name = draw(st.one_of(st.sampled_from(names), BARE, ODD_TEXT) if names else st.one_of(BARE, ODD_TEXT))
    how = draw(st.integers(0, 3))
    if how == 0 and re.fullmatch(r"[A-Za-z0-9_-]+", name):
        return name
    if how == 1 and name and "'" not in name and "\n" not in name and "\r" not in name:
        return f"'{name}'"
    if how == 2 and name:                   # every character as a \\u escape: the same key to TOML
        return '"' + "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c for c in name) + '"'
    return toml_string(name)


@st.composite
def table_body(draw, options) -> list[str]:
    names = tuple(o.name for o in options)
    lines = []
    for _ in range(draw(st.integers(0, 4))):
        opt = draw(st.sampled_from(options)) if options and draw(st.booleans()) else None
        if opt is not None:
            value = draw(st.one_of(valid_value(opt), scalar()))
            lines.append(f"{draw(key((opt.name,)))} = {value}")
        else:
            lines.append(f"{draw(key(names))} = {draw(scalar())}")
    return lines


@st.composite
def document(draw) -> str:
    """A koordd.toml: [daemon], [[classes]] with health tables, [loops.*] of real and unknown loops,
    dotted keys, junk tables, comments, blank lines, and now and then a syntax error."""
    loops = tuple(REGISTRY)
    lines: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        part = draw(st.integers(0, 6))
        if part == 0:
            lines += [f"[{draw(key(('daemon',)))}]", *draw(table_body(DAEMON_OPTIONS))]
        elif part == 1:
            lines += ["[[classes]]"]
            if draw(st.booleans()):
                lines.append(f"name = {toml_string(draw(st.sampled_from(CLASS_NAMES + ('ls', 'XX', ''))))}")
            if draw(st.booleans()):
                lines.append(f"cgroups = {draw(scalar())}" if draw(st.booleans()) else
                             'cgroups = ["kubepods.slice/*", "/be.slice/"]')
            lines += draw(table_body(()))
            if draw(st.booleans()):
                lines += ["[classes.health]", *draw(table_body(HEALTH_OPTIONS))]
        elif part == 2:
            name = draw(st.one_of(st.sampled_from(loops), BARE))
            options = loop_options(REGISTRY[name]) if name in REGISTRY else ()
            lines += [f"[loops.{draw(key((name,)))}]", *draw(table_body(options))]
        elif part == 3:       # a dotted key at the top: loops.<name>.<option> = value
            name = draw(st.sampled_from(loops))
            opt = draw(st.sampled_from(loop_options(REGISTRY[name])))
            lines.append(f"loops.{name}.{opt.name} = {draw(st.one_of(valid_value(opt), scalar()))}")
        elif part == 4:
            lines += [f"[{draw(key())}]", *draw(table_body(()))]
        elif part == 5:
            lines.append(draw(st.sampled_from(("", "# a comment", "   ", "\t# x", "[", "a =", "= 1", "[[]]",
                                               "x = [1,", "]", "a.b = 1", "a = 1 2", "'''", "\\"))))
        else:
            lines.append(f"{draw(key(('daemon', 'classes', 'loops')))} = {draw(scalar())}")
    return "\n".join(lines) + draw(st.sampled_from(("\n", "", "\r\n")))


def check(outcome) -> None:
    if isinstance(outcome, Config):
        return
    assert outcome.errors, "a ConfigError says something"
    for line in outcome.errors:
        # One line each, the file and the line it is about first.
        assert "\n" not in line and LINE.match(line), line


def load(text: str):
    try:
        return parse_config(text, PATH, REGISTRY)
    except ConfigError as e:
        return e


@PROFILE
@given(document())
@counted
def test_config_documents(text):
    check(load(text))


@PROFILE
@given(st.one_of(st.binary(max_size=400), document().map(lambda t: t.encode())).flatmap(
    lambda b: st.tuples(st.just(b), st.integers(0, len(b)), st.binary(max_size=8))))
@counted
def test_config_bytes(tmp_path_factory, spliced):
    data, at, junk = spliced
    path = tmp_path_factory.getbasetemp() / "koordd.toml"
    path.write_bytes(data[:at] + junk + data[at:])
    try:
        outcome = load_config(path, REGISTRY)
    except ConfigError as e:
        outcome = e
    if isinstance(outcome, ConfigError):
        for line in outcome.errors:
            assert line.startswith(f"{path}:") and "\n" not in line, line
            # Only a file that is not UTF-8 has no line to name: it was never read as text.
            assert re.match(rf"{re.escape(str(path))}:[1-9][0-9]*: ", line) or "not UTF-8" in line, line


# --- what the fuzzing found ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, error", [
    # tomllib raises ValueError (not TOMLDecodeError) for an integer of 4300 digits or more...
    ("[daemon]\nx = 1" + "0" * 4400 + "\n", f"{PATH}:2: "),
    # ...and RecursionError for arrays nested a thousand deep.
    ("# deep\n\na = " + "[" * 2000 + "]" * 2000 + "\n", f"{PATH}:3: "),
    ("a = [\n" + "[\n" * 2000 + "]\n" * 2000 + "]\n", f"{PATH}:"),
])
def test_a_document_tomllib_cannot_parse_is_an_error_at_its_line(text, error):
    e = load(text)
    assert isinstance(e, ConfigError) and e.errors[0].startswith(error), e


@pytest.mark.parametrize("value", ["1" + "0" * 400, "nan", "-nan", "inf"])
def test_a_number_no_option_can_take_is_an_error_at_its_line(value):
    # float(10**400) is an OverflowError; NaN passes every min and max comparison.
    e = load(f"[loops.be_suppress]\nenabled = true\nthreshold_percent = {value}\ninterval = {value}\n")
    assert isinstance(e, ConfigError) and len(e.errors) == 2, e
    check(e)


def test_an_escaped_key_is_located_at_its_line():
    # "\u0065nabled" is the key enabled to TOML: its error names its line, not the table's or none.
    e = load('[loops.be_suppress]\n\n"\\u0065nabled" = 3\n[loops."be\\u005fsuppress".x]\n')
    assert isinstance(e, ConfigError)
    assert e.errors[0].startswith(f"{PATH}:3: loops.be_suppress.enabled: "), e.errors


def test_a_key_holding_a_line_separator_of_unicode_is_located_and_so_are_the_lines_after_it():
    # str.splitlines() ends a line at \x85 and \u2028 too, TOML only at LF: the lines after drifted.
    e = load('["\x85"]\n["a\u2028b"]\n[daemon]\nlog_levl = 1\n')
    assert isinstance(e, ConfigError)
    assert [line.split(": ")[0] for line in e.errors] == [f"{PATH}:1", f"{PATH}:2", f"{PATH}:4"], e.errors


@pytest.mark.parametrize("value", ["1" + "0" * 400, '"' + "9" * 400 + 'G"', '"9000000000T"'])
def test_a_memory_size_past_any_memory_is_an_error_at_its_line(value):
    # float() of the integer overflowed; the string was inf bytes, and int(inf) in the round after.
    e = load(f"[loops.qos_baseline]\n\nls_memory_low = {value}\n")
    assert isinstance(e, ConfigError) and e.errors[0].startswith(f"{PATH}:3: loops.qos_baseline.ls_memory_low: ")
