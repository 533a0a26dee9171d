"""Typed option declarations shared by the config loader and the loops.

A loop declares its options as a tuple of `Option`; the config loader checks
every value against them when the file is loaded, so a loop never sees a
wrong type or an out-of-range number. Every number option (int, float,
Duration) declares a finite min and max, and non-finite values (nan, inf) are
refused whatever the range: a value a loop multiplies, rounds or divides by
must be one it can compute with (inf once stopped every be_suppress tick with
an OverflowError).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from koordd.core.cgroup_text import normalize_pattern

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"us": 1e-6, "µs": 1e-6, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from a systemd-style duration: "500us", "500ms", "2s", "1m30s", "1.5h", "5" (seconds)."""
    s = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        return float(s)
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(s):
        if s[pos:m.start()].strip():
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if pos == 0 or s[pos:].strip():
        raise ValueError(f"not a duration: {text!r} (use e.g. \"500ms\", \"2s\", \"1m\")")
    return total


class Duration(float):
    """Seconds, written in the config as "500ms", "2s", "1m"."""


NUMBER_TYPES = (int, float, Duration)


@dataclass(frozen=True)
class Option:
    """One option of a loop (or of [daemon]): type, default, range and the doc line the shipped config shows."""
    name: str
    type: type           # bool, int, float, str, Duration
    default: Any
    doc: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = field(default=())

    def __post_init__(self):
        # A number without both bounds would let inf or 1e308 (or 10**30) through to a loop's arithmetic:
        # refused where it is declared, so a loop (koordd's or a third party's) cannot forget one.
        if self.type in NUMBER_TYPES and type(self).convert is Option.convert:
            for bound in ("min", "max"):
                v = getattr(self, bound)
                if v is None or isinstance(v, bool) or not math.isfinite(v):
                    raise TypeError(f"option {self.name!r}: a number option declares a finite {bound} "
                                    f"(got {v!r})")

    def convert(self, value: Any) -> Any:
        """The checked value, or ValueError saying what is wrong with it."""
        t = self.type
        if t is Duration:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"expected a duration such as \"2s\", got {_tname(value)}")
            out: Any = Duration(parse_duration(value) if isinstance(value, str) else _float(value))
        elif t is bool:
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, got {_tname(value)}")
            out = value
        elif t is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"expected an integer, got {_tname(value)}")
            out = value
        elif t is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"expected a number, got {_tname(value)}")
            out = _float(value)
        elif t is str:
            if not isinstance(value, str):
                raise ValueError(f"expected a string, got {_tname(value)}")
            out = value
        else:  # pragma: no cover - a programming error in a loop's declaration
            raise TypeError(f"unsupported option type {t!r}")
        if isinstance(out, float) and not math.isfinite(out):   # NaN would pass every min and max below
            raise ValueError(f"expected a finite number, got {out!r}")
        if self.choices and out not in self.choices:
            raise ValueError(f"must be one of {', '.join(map(repr, self.choices))}, got {out!r}")
        if self.min is not None and out < self.min:
            raise ValueError(f"must be >= {_num(self.min)}, got {_num(out)}")
        if self.max is not None and out > self.max:
            raise ValueError(f"must be <= {_num(self.max)}, got {_num(out)}")
        return out


def _tname(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)


def _float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:       # an integer beyond a float's range (TOML's integers have no bound)
        raise ValueError(f"{_num(value)} is too large a number") from None


def _num(x: float) -> str:
    if isinstance(x, int) and len(digits := str(abs(x))) > 15:   # f"{x:g}" fails past a float's range
        return f"{'-' if x < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
    return f"{x:g}"


# Every loop has these two; the loop declares the rest.
COMMON_LOOP_OPTIONS = (
    Option("enabled", bool, False, "run this loop"),
    Option("interval", Duration, Duration(1.0), "how often the loop decides", min=0.05, max=3600),
)


class ClassList(Option):
    """An array of class names, each one of `choices`, kept as a tuple without repeats."""

    def convert(self, value):
        if not isinstance(value, (list, tuple)) or not all(isinstance(c, str) for c in value):
            raise ValueError("expected an array of class names (strings)")
        bad = [c for c in value if c not in self.choices]
        if bad:
            raise ValueError(f"{bad[0]!r} is not one of the classes this option takes ({', '.join(self.choices)})")
        return tuple(dict.fromkeys(value))


class PatternList(Option):
    """An array of cgroup path patterns (globs per path component), kept as a tuple. Converting twice
    gives the same value (the config loader converts, then builds the settings from the result)."""

    def convert(self, value):
        if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
            raise ValueError("expected an array of cgroup path patterns (strings)")
        return tuple(normalize_pattern(p) for p in value)
