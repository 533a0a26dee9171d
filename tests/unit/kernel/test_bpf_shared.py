"""The constants C and Python share come from one header (bpf/koordd_shared.h, shipped as the copy
koordd/bpf/koordd_shared.h): every define there reaches Python, the shipped copy is the source's, and no BPF
program defines a shared name again (a second value would drift)."""
from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

from koordd.core.classes import BE, LATENCY_SENSITIVE
from koordd.kernel import bpf_shared
from koordd.kernel.bpf_shared import HEADER, read_defines
from koordd.kernel.sched_ext_scheduler import CLASS_VALUES
from koordd.sensors.app_latency import SLOTS as APP_SLOTS
from koordd.sensors.runq import SLOTS

SOURCES = Path(__file__).resolve().parents[3] / "bpf"      # the tree's BPF sources


def test_each_define_of_the_header_is_read_and_exported():
    shared = read_defines(HEADER.read_text())
    assert shared == {"CLASS_LS": 1, "CLASS_BE": 2, "RUNQ_SLOTS": 32, "APP_SLOTS": 32}
    assert {name: getattr(bpf_shared, name) for name in shared} == shared


def test_python_reads_the_shipped_copy_of_the_source_header():
    # scripts/build-bpf copies it next to the objects (package data: an installed koordd has no bpf/);
    # a header edited without a rebuild would give C and Python different values.
    assert HEADER == Path(str(files("koordd.bpf") / "koordd_shared.h"))
    assert HEADER.read_bytes() == (SOURCES / "koordd_shared.h").read_bytes(), "run scripts/build-bpf and commit"


def test_the_reader_takes_integer_defines_and_skips_the_rest():
    text = "#ifndef G\n#define G\n#define A 7  // why\n#define B (1 << 2)\n  #define C 3\n#define D 12\n"
    assert read_defines(text) == {"A": 7, "D": 12}


def test_python_uses_the_headers_values():
    assert CLASS_VALUES == {**{c: bpf_shared.CLASS_LS for c in LATENCY_SENSITIVE}, BE: bpf_shared.CLASS_BE}
    assert SLOTS == bpf_shared.RUNQ_SLOTS and APP_SLOTS == bpf_shared.APP_SLOTS


def test_no_bpf_program_defines_a_shared_name_itself():
    shared = read_defines(HEADER.read_text())
    for source in (p for p in SOURCES.iterdir() if p.name.endswith((".c", ".h")) and p.name != "koordd_shared.h"):
        again = set(re.findall(r"^\s*#define\s+(\w+)", source.read_text(), re.M)) & set(shared)
        assert not again, f"{source.name} defines {sorted(again)} again: include koordd_shared.h instead"
