"""What BPF programs cost inside the kernel, for the benchmarks: kernel.bpf_stats_enabled switched on for a
measurement and put back after it, and a loaded program's counters read by its id, also another process's
(koordd's, whose ids its status file names under "bpf").

The kernel adds up a program's run time and run count only while the switch is on; counting costs two clock
reads a run (an empty program read 32 ns a run with it on the 2-CPU host, docs/benchmarks.md), so what is
measured with it on runs a little slower than without.
"""
from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Mapping

STATS_SWITCH = Path("/proc/sys/kernel/bpf_stats_enabled")
BEFORE = Path("/run/koordtest/bpf_stats_enabled.before")     # the switch as counting() found it, while it counts
Counters = dict[int, tuple[int, int]]       # program id -> (run_time_ns, run_cnt)


@contextmanager
def counting(switch: Path = STATS_SWITCH, before: Path = BEFORE) -> Iterator[None]:
    """kernel.bpf_stats_enabled at 1 inside, at what it was before after.

    What it was is kept in `before` until it is put back: a benchmark killed with -9 cannot put it back,
    and the next one to count then restores what the killed one found, not the 1 it left behind (until
    then every BPF program on the host pays for the counting)."""
    was = _left_by_a_killed_run(before) or switch.read_text().strip()
    before.parent.mkdir(parents=True, exist_ok=True)
    before.write_text(was)
    switch.write_text("1")
    try:
        yield
    finally:
        switch.write_text(was)
        before.unlink(missing_ok=True)


def _left_by_a_killed_run(before: Path) -> str | None:
    """The switch's value a run killed inside counting() found, where its note is there and says 0 or 1."""
    try:
        with before.open() as f:
            was = f.read(8).strip()
    except OSError:
        return None
    return was if was in ("0", "1") else None


def koordd_programs(status: dict) -> dict[int, str]:
    """Program id -> "object:program" of each program koordd's status file says it has loaded."""
    out = {}
    for obj in (status.get("bpf") or {}).get("objects") or ():
        for prog in obj.get("programs") or ():
            out[int(prog["id"])] = f"{str(obj['object']).removesuffix('.bpf.o')}:{prog['name']}"
    return out


def read_counters(ids: Iterable[int]) -> Counters:
    """Each program's counters by its id; a program gone (its loader stopped) is left out."""
    from koordd.kernel.libbpf import ProgInfo, libbpf
    lib = libbpf()
    by_id = lib.bpf_prog_get_fd_by_id
    by_id.restype, by_id.argtypes = ctypes.c_int, [ctypes.c_uint32]
    out = {}
    for prog_id in ids:
        fd = by_id(prog_id)
        if fd < 0:
            continue
        try:
            info, size = ProgInfo(), ctypes.c_uint32(ctypes.sizeof(ProgInfo))
            if lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)) == 0:
                out[prog_id] = (info.run_time_ns, info.run_cnt)
        finally:
            os.close(fd)
    return out


def cost(names: Mapping[int, str], before: Counters, after: Counters, seconds: float) -> list[dict]:
    """Each named program's runs a second, CPU in ms a second and ns a run between two readings."""
    out = []
    for prog_id, name in sorted(names.items(), key=lambda kv: kv[1]):
        if prog_id not in before or prog_id not in after:
            continue
        ns = after[prog_id][0] - before[prog_id][0]
        runs = after[prog_id][1] - before[prog_id][1]
        out.append({"program": name, "runs_per_s": runs / seconds, "ms_per_s": ns / 1e6 / seconds,
                    "ns_per_run": ns / runs if runs else None})
    return out


def words(costs: list[dict]) -> str:
    """One reading's cost in words: the total, then each program that ran."""
    total = sum(c["ms_per_s"] for c in costs)
    each = [f"{c['program']} {c['runs_per_s'] / 1000:.1f}k runs/s at {c['ns_per_run']:.0f} ns"
            for c in costs if c["ns_per_run"] is not None]
    return f"{total:.1f} ms/s" + (f" ({'; '.join(each)})" if each else "")
