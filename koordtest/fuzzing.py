"""What the fuzz tests share: the hypothesis profile, per-target case counts, and kernel-text mutations.

The profile is "ci" (a modest number of examples, for the unit test run) unless KOORDD_FUZZ_EXAMPLES
asks for more: scripts/fuzz sets it, and KOORDD_FUZZ_COUNTS, the file where each target's count of cases
run goes when the test process exits.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import re
from collections import Counter

from hypothesis import HealthCheck, settings, strategies as st

CI_EXAMPLES = 60
EXAMPLES = int(os.environ.get("KOORDD_FUZZ_EXAMPLES") or CI_EXAMPLES)
# No example database: it would be written into the shared working tree, and a CI run starts bare anyway.
settings.register_profile("koordd-fuzz", max_examples=EXAMPLES, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.filter_too_much])
PROFILE = settings.get_profile("koordd-fuzz")

COUNTS: Counter[str] = Counter()


def _write_counts(path: str) -> None:
    try:
        with open(path) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        earlier = {}
    with open(path, "w") as f:
        json.dump(dict(Counter(earlier) + COUNTS), f, indent=1, sort_keys=True)


if os.environ.get("KOORDD_FUZZ_COUNTS"):
    atexit.register(_write_counts, os.environ["KOORDD_FUZZ_COUNTS"])


def counted(fn):
    """Count each case the property runs under its test's name (for scripts/fuzz's report)."""
    name = fn.__name__.removeprefix("test_")

    @functools.wraps(fn)
    def run(*args, **kwargs):
        COUNTS[name] += 1
        return fn(*args, **kwargs)
    return run


# --- text --------------------------------------------------------------------------------------------

# Numbers as a kernel never writes them, and as a broken one or a bad disk might.
ODD_NUMBERS = ("", "-1", "-0", "0", "1e999", "-1e999", "nan", "NaN", "inf", "-inf", "0x1f", "1_000",
               "18446744073709551616", "9" * 400, "1" + "0" * 4400, "3.5", ".", "-", "+7", "²", "١٢",
               " 12 ", "\x00", "max", "4294967295")


def kernel_text() -> st.SearchStrategy[str]:
    """Arbitrary text as a read of a kernel file could return it: any characters, or bytes decoded the
    way the readers decode them (UTF-8 with surrogate escapes, latin-1)."""
    raw = st.binary(max_size=300)
    return st.one_of(
        st.text(max_size=300),
        st.text(alphabet="0123456789 -=:,;.\n\tabcdefxyzLMB", max_size=200),
        raw.map(lambda b: b.decode("utf-8", "surrogateescape")),
        raw.map(lambda b: b.decode("latin-1")),
    )


_TOKEN = re.compile(r"-?\d+(?:\.\d+)?|[^\s=:,;]+")


@st.composite
def mutated(draw, samples: tuple[str, ...]) -> str:
    """A valid sample, then a few of: truncated, a span cut out, junk inserted, a number or word
    replaced by an odd one, a line doubled or dropped, an extra field, separators swapped."""
    text = draw(st.sampled_from(samples))
    for _ in range(draw(st.integers(0, 4))):
        how = draw(st.integers(0, 7))
        n = len(text)
        if how == 0:
            text = text[:draw(st.integers(0, n))]
        elif how == 1 and n:
            a = draw(st.integers(0, n - 1))
            text = text[:a] + text[draw(st.integers(a, n)):]
        elif how == 2:
            a = draw(st.integers(0, n))
            text = text[:a] + draw(st.one_of(st.sampled_from(ODD_NUMBERS), kernel_text())) + text[a:]
        elif how == 3:
            tokens = list(_TOKEN.finditer(text))
            if tokens:
                m = draw(st.sampled_from(tokens))
                text = text[:m.start()] + draw(st.sampled_from(ODD_NUMBERS)) + text[m.end():]
        elif how == 4:
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines.insert(i, lines[i])
            text = "\n".join(lines)
        elif how == 5:
            lines = text.split("\n")
            del lines[draw(st.integers(0, len(lines) - 1))]
            text = "\n".join(lines)
        elif how == 6:
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines[i] += draw(st.sampled_from((" extra=1", " 7", " x", "=", ":", ";9=ff", ",", "-")))
            text = "\n".join(lines)
        else:
            a, b = draw(st.sampled_from((" ", "=", ":", ",", ";", "-", "\n"))), draw(st.sampled_from(
                (" ", "=", ":", ",", ";", "-", "\t", "")))
            text = text.replace(a, b)
    return text


def text_from(samples: tuple[str, ...]) -> st.SearchStrategy[str]:
    """Mutations of the valid samples, and arbitrary text."""
    return st.one_of(mutated(samples), kernel_text())
