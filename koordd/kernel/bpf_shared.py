"""The constants koordd's BPF programs and its Python share, read from the one header both sides use
(bpf/koordd_shared.h; shipped as koordd/bpf/koordd_shared.h, the copy scripts/build-bpf makes next to the
objects): a value changed there changes on both sides."""
from __future__ import annotations

import re

from koordd.kernel import bpf_objects

HEADER = bpf_objects.SHARED_HEADER
_DEFINE = re.compile(r"^#define\s+([A-Z][A-Z0-9_]*)\s+(\d+)\s*(?://.*)?$")


def read_defines(text: str) -> dict[str, int]:
    """NAME -> value of each `#define NAME <integer>` line; the include guard (no value) is skipped."""
    return {m[1]: int(m[2]) for m in map(_DEFINE.match, text.splitlines()) if m}


_SHARED = read_defines(HEADER.read_text())
CLASS_LS = _SHARED["CLASS_LS"]
CLASS_BE = _SHARED["CLASS_BE"]
RUNQ_SLOTS = _SHARED["RUNQ_SLOTS"]
APP_SLOTS = _SHARED["APP_SLOTS"]
