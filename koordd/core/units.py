"""Rates as tc writes them ("1gbit", "250mbit", "1000000" bit/s): parsed the same way by the net_shaping
loop's options and the tc backend's values; memory settings ("512M", "50%", "max") as the qos_baseline and
proactive_reclaim loops take them. Pure."""
from __future__ import annotations

import math
import re

from koordd.core.backend import InvalidValue

_UNITS = {"": 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def parse_rate(text: str | int) -> int:
    """Bit/s from "1gbit", "250mbit", "1000000" (tc's units, decimal)."""
    if isinstance(text, int) and not isinstance(text, bool):
        rate = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?bit)?\s*", str(text).lower())
        if not m:
            raise InvalidValue(f"not a rate: {text!r} (bit/s, or with kbit, mbit, gbit)")
        rate = float(m[1]) * _UNITS[m[2] or ""]
        if not math.isfinite(rate):         # "999...9" (hundreds of digits) is inf as a float
            raise InvalidValue(f"not a rate: {str(text)[:40]!r}... is too large")
        rate = int(rate)
    if rate < 8:
        raise InvalidValue(f"a rate of {rate} bit/s is too small")
    return rate


_MEMORY_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGT])(?:I?B)?|B)?", re.IGNORECASE)
MAX_BYTES = 2**63           # the kernel's memory knobs are signed 64-bit; float() of more overflows
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")


def parse_memory_value(text: str | int) -> tuple[str, float] | None:
    """A memory setting as ("bytes", n), ("percent", p), ("max", 0); None for 0 / "" (leave alone).
    ValueError for anything else."""
    if isinstance(text, bool):
        raise ValueError("expected a size such as \"512M\", a percentage or \"max\", got a boolean")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"must be >= 0, got {text}")
        if text >= MAX_BYTES:
            raise ValueError(f"a size of {len(str(text))} digits is past any memory (at most 2^63 - 1 bytes)")
        return ("bytes", float(text)) if text else None
    s = text.strip()
    if s in ("", "0"):
        return None
    if s.lower() == "max":
        return ("max", 0.0)
    m = _PERCENT.fullmatch(s)
    if m:
        p = float(m.group(1))
        if p > 100:
            raise ValueError(f"a percentage must be at most 100, got {s!r}")
        if p == 0:
            return None
        return ("percent", p)
    m = _SIZE.fullmatch(s)
    if m:
        n = float(m.group(1)) * _MEMORY_UNITS[(m.group(2) or "").upper()]
        if not n < MAX_BYTES:       # inf too: "999...9G" of hundreds of digits
            raise ValueError(f"{s[:40]!r}{'...' if len(s) > 40 else ''} is past any memory (at most 2^63 - 1 bytes)")
        return ("bytes", n) if n >= 1 else None
    raise ValueError(f"not a memory size: {s!r} (use e.g. \"512M\", \"2G\", \"50%\", \"max\", or 0 to "
                     "leave the knob alone)")
