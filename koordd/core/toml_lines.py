"""Where each key of a koordd.toml stands: tomllib keeps no positions, so the errors of the config's
check (config_check.py) find their lines here. Also the parse itself, its syntax errors and tomllib's own
limits worded with their line."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the declared minimum is 3.11; tomli is the same parser
    import tomli as tomllib


class TomlError(Exception):
    """A file tomllib refuses: one "<file>:<line>: <message>" line."""


def load(text: str, path: Path) -> dict[str, Any]:
    """The parsed document, or TomlError naming the file and the line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TomlError(syntax_error(path, text, e)) from None
    except (ValueError, RecursionError) as e:
        # tomllib's own limits, with no position: an integer of 4300 digits or more (int() refuses it),
        # arrays or inline tables nested too deep for its recursion.
        what = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
        raise TomlError(f"{path}:{first_failing_line(text, type(e))}: {what}") from None


def syntax_error(path: Path, text: str, e: Exception) -> str:
    msg = str(e)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
    if m:
        return f"{path}:{m[1]}: {msg[:m.start()]} (column {m[2]})"
    m = re.search(r"\s*\(at end of document\)$", msg)
    if m:
        return f"{path}:{max(1, len(split_lines(text)))}: {msg[:m.start()]} (at end of file)"
    return f"{path}: {msg}"


def split_lines(text: str) -> list[str]:
    """The lines as TOML counts them: ended by LF or CRLF only. str.splitlines() also ends one at \\x85,
    \\u2028, \\x1c..., which may stand in a TOML string or quoted key: every line after would be miscounted."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def first_failing_line(text: str, error: type) -> int:
    """The line where tomllib first raises `error`: the shortest run of whole lines that raises it (a
    shorter one parses, or fails as a syntax error: TOML numbers and brackets up to that line are the
    same in both)."""
    lines = [line + "\n" for line in split_lines(text)]

    def fails(n: int) -> bool:
        try:
            tomllib.loads("".join(lines[:n]))
        except error as e:
            return not isinstance(e, tomllib.TOMLDecodeError)
        except Exception:  # noqa: BLE001 - the syntax error of a cut-off document
            return False
        return False

    lo, hi = 1, max(len(lines), 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo



def line_of(lines: Mapping[tuple, int], keypath: tuple) -> int | None:
    """The key's line, else its nearest enclosing table's (keys inside inline tables are not located)."""
    for n in range(len(keypath), 0, -1):
        if keypath[:n] in lines:
            return lines[keypath[:n]]
    return None


_BARE = re.compile(r"[A-Za-z0-9_-]+")


def dotted(keypath: tuple) -> str:
    """("classes", 0, "name") -> "classes[0].name"; keys that are not bare get quoted."""
    out = ""
    for p in keypath:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + (p if _BARE.fullmatch(p) else json.dumps(p))
    return out



def locate_keys(text: str) -> dict[tuple, int]:
    """Key path -> 1-based line of its first appearance, for a file tomllib has already accepted.

    Paths look like ("loops", "be_suppress", "threshold_percent") or ("classes", 1, "name");
    a table header maps to its own line, a dotted key's prefixes to the key's line. Lines inside a
    multi-line array, inline table or multi-line string are values, never keys.
    """
    lines: dict[tuple, int] = {}
    table: tuple = ()
    arrays: dict[tuple, int] = {}  # header name path of an array of tables -> its current index
    depth, ml = 0, None  # open brackets and open multi-line string delimiter carried across lines
    for n, line in enumerate(split_lines(text), 1):
        if depth or ml:
            depth, ml = _scan_value(line, 0, depth, ml)
            continue
        s = line.lstrip()
        if s.startswith("["):
            is_array = s.startswith("[[")
            names, _ = _parse_key(s, 2 if is_array else 1)
            if not names:
                continue
            if is_array:
                arrays[names] = arrays.get(names, -1) + 1
                # A new entry starts fresh counts for arrays nested under it.
                for k in [k for k in arrays if len(k) > len(names) and k[:len(names)] == names]:
                    del arrays[k]
            table = _resolve(names, arrays)
            for i in range(1, len(table) + 1):
                lines.setdefault(table[:i], n)
            continue
        key, i = _parse_key(s, 0)
        if not key or not s.startswith("=", i):
            continue  # blank line or comment
        full = table + key
        for j in range(len(table) + 1, len(full) + 1):
            lines.setdefault(full[:j], n)
        depth, ml = _scan_value(s, i + 1, 0, None)
    return lines


def _resolve(names: tuple[str, ...], arrays: Mapping[tuple, int]) -> tuple:
    """Header names -> key path, with the current index after each array-of-tables component."""
    out: list = []
    for i, p in enumerate(names):
        out.append(p)
        if names[:i + 1] in arrays:
            out.append(arrays[names[:i + 1]])
    return tuple(out)


def _parse_key(s: str, i: int) -> tuple[tuple[str, ...], int]:
    """A dotted key (bare, "basic" or 'literal' parts) starting at s[i]; () if there is none."""
    parts: list[str] = []
    while True:
        while s.startswith((" ", "\t"), i):
            i += 1
        if s.startswith('"', i):
            j = i + 1
            while j < len(s) and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            parts.append(_unescape(s[i + 1:j]))
            i = j + 1
        elif s.startswith("'", i):
            j = s.find("'", i + 1)
            j = len(s) if j < 0 else j
            parts.append(s[i + 1:j])
            i = j + 1
        else:
            m = _BARE.match(s, i)
            if not m:
                return (), i
            parts.append(m.group())
            i = m.end()
        while s.startswith((" ", "\t"), i):
            i += 1
        if not s.startswith(".", i):
            return tuple(parts), i
        i += 1


def _unescape(inner: str) -> str:
    """A "basic" key's text as TOML reads it ("\\u0065nabled" is enabled), so that its error finds its line."""
    if "\\" not in inner:
        return inner
    try:
        return tomllib.loads(f'k = "{inner}"')["k"]
    except ValueError:
        return inner


def _scan_value(s: str, i: int, depth: int, ml: str | None) -> tuple[int, str | None]:
    """Scan value text from s[i]; returns the bracket depth and open multi-line string after the line."""
    while i < len(s):
        if ml:
            if ml == '"""' and s[i] == "\\":
                i += 2
            elif s.startswith(ml, i):
                i += 3
                for _ in range(2):  # up to two quotes may end the content right before the delimiter
                    if s.startswith(ml[0], i):
                        i += 1
                ml = None
            else:
                i += 1
            continue
        c = s[i]
        if c == "#":
            break
        if s.startswith(('"""', "'''"), i):
            ml, i = s[i:i + 3], i + 3
            continue
        if c in "\"'":
            j = i + 1
            while j < len(s) and s[j] != c:
                j += 2 if c == '"' and s[j] == "\\" else 1
            i = j + 1
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        i += 1
    return depth, ml
