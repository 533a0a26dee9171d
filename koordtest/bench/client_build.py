"""The compiled open-loop engine (koordtest/bench/client/openloop.c) built with the host's C compiler:
statically linked where the C library allows it, so that the one binary runs on a machine with no
compiler (the 16-CPU proof carries it; scripts/proof-frontier --gather builds it), dynamically otherwise.

    scripts/build-client [--out PATH] [--dynamic]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from koordtest.bench.common import REPO

SOURCE = Path(__file__).resolve().parent / "client" / "openloop.c"
DEFAULT_BINARY = REPO / "build" / "openloop-c"
FLAGS = ("-O2", "-Wall", "-Wextra", "-Werror")


def cc_command(binary: Path, static: bool = True, compiler: str = "cc", source: Path = SOURCE) -> list[str]:
    return [compiler, *FLAGS, *(["-static"] if static else []), "-o", str(binary), str(source), "-lm"]


def stale(binary: Path, source: Path = SOURCE) -> bool:
    """Missing, or older than its source."""
    return not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime


def build(binary: Path = DEFAULT_BINARY, static: bool = True) -> str:
    """Compile to `binary`; returns how it was linked ("static" or "dynamic"). A static link that fails
    (no libc.a) falls back to a dynamic one; no compiler is a RuntimeError."""
    compiler = os.environ.get("CC", "cc")
    if not shutil.which(compiler):
        raise RuntimeError(f"no C compiler ({compiler}) to build {SOURCE.name}: build it where there is one "
                           f"(scripts/build-client) and bring the binary")
    binary.parent.mkdir(parents=True, exist_ok=True)
    for linking in ((True, False) if static else (False,)):
        done = subprocess.run(cc_command(binary, linking, compiler), capture_output=True, text=True)
        if done.returncode == 0:
            return "static" if linking else "dynamic"
    raise RuntimeError(f"building {SOURCE.name} failed:\n{done.stderr}")


def ensure(binary: Path = DEFAULT_BINARY) -> Path:
    """`binary`, built first when it is missing or stale and a compiler is there; an existing binary is used
    as it is on a machine without one."""
    if stale(binary) and (shutil.which(os.environ.get("CC", "cc")) or not binary.exists()):
        build(binary)
    return binary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build the compiled open-loop client of scripts/bench-qos "
                                "(koordtest/bench/client/openloop.c), statically linked where possible: see "
                                "koordtest/bench/client_build.py.")
    p.add_argument("--out", type=Path, default=DEFAULT_BINARY, help=f"the binary (default {DEFAULT_BINARY})")
    p.add_argument("--dynamic", action="store_true", help="link dynamically")
    args = p.parse_args(argv)
    print(f"{args.out}: {build(args.out, static=not args.dynamic)}ally linked")
    return 0
