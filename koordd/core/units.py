"""Rates as tc writes them ("1gbit", "250mbit", "1000000" bit/s): parsed the same way by the net_shaping
loop's options and the tc backend's values. Pure."""
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
