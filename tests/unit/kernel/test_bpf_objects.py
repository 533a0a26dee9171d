"""koordd's BPF files have one home each: the sources in the tree's bpf/, what is shipped in koordd/bpf/ (made
by scripts/build-bpf; `scripts/build-bpf --check` compares it byte for byte), and one Python module,
koordd/kernel/bpf_objects.py, that every loader of a program (sensors and kernel adapters) finds it through."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from koordd.kernel import bpf_objects, netclass, sched_ext_scheduler
from koordd.sensors import app_latency, runq

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "bpf"
SHIPPED = ROOT / "koordd" / "bpf"


def test_every_source_has_its_shipped_object_and_its_name_in_bpf_objects():
    programs = sorted(p.name.removesuffix(".c") for p in SOURCES.glob("*.bpf.c"))
    assert programs == ["app_latency.bpf", "koordd_sched.bpf", "net_classify.bpf", "runq_latency.bpf"]
    assert sorted(p.name for p in SHIPPED.glob("*.bpf.o")) == [f"{name}.o" for name in programs]
    assert sorted(p.name for p in bpf_objects.OBJECTS) == [f"{name}.o" for name in programs]
    assert all(p.is_file() and p.parent == SHIPPED for p in bpf_objects.OBJECTS), bpf_objects.OBJECTS


def test_sources_are_in_bpf_and_only_build_outputs_in_the_package():
    assert {p.name for p in SOURCES.glob("*.h")} == {"koordd_shared.h", "cgroup_hist.h", "scx.h", "vmlinux.h"}
    assert not [p.name for p in SHIPPED.iterdir() if p.suffix in (".c", ".h") and p.name != "koordd_shared.h"]
    assert not (ROOT / "koordd" / "kernel" / "bpf").exists() and not (ROOT / "koordd" / "sensors" / "bpf").exists()


def test_each_loader_opens_the_object_bpf_objects_names():
    assert runq.PROGRAM == bpf_objects.RUNQ_LATENCY and app_latency.PROGRAM == bpf_objects.APP_LATENCY
    assert netclass.PROGRAM == bpf_objects.NET_CLASSIFY and sched_ext_scheduler.OBJECT == bpf_objects.KOORDD_SCHED


def test_no_other_module_finds_a_bpf_file_itself():
    # A module that named koordd.bpf or an object's file itself would be a second place to change when one
    # moves: bpf_objects.py is the one.
    own = ROOT / "koordd" / "kernel" / "bpf_objects.py"
    found = []
    for module in [*(ROOT / "koordd").rglob("*.py"), *(ROOT / "koordctl").rglob("*.py")]:
        if module == own:
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            called = getattr(node, "func", None)
            if isinstance(node, ast.Call) and "files" in (getattr(called, "id", ""), getattr(called, "attr", "")) \
                    and any(isinstance(a, ast.Constant) and a.value == "koordd.bpf" for a in node.args):
                found.append(f"{module.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    re.fullmatch(r"[\w./-]*\.bpf\.o|koordd_shared\.h", node.value):
                found.append(f"{module.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, found
