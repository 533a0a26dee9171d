"""BE antagonists of scripts/bench-qos, one kind per benchmark: bench-qos starts one worker per CPU in
the BE cgroup, each doing its kind of work in small chunks and adding what it completed to its own
8-byte slot of a shared counter file. BE work done is read from those counters (work, not CPU time:
a BE that gets CPU but spends it waiting on memory does less).

- cpu: integer arithmetic in a pure-Python loop; its working set fits in the L1 cache, so it competes
  for CPU time only. Counts iterations.
- membw: copies a 32 MiB buffer into another, again and again (64 MiB per worker, more than the last
  level cache): competes for cache and memory bandwidth. Counts bytes copied.
- memory: grows anonymous memory 64 MiB at a time, writing one byte per page (a page fault and a
  zeroed page each), up to its share of --memory, then releases it all and grows again: page-fault
  and page-zeroing work in the kernel, and reclaim wherever the node's free memory runs short.
  Counts bytes faulted in.

    python -m koordtest.bench.antagonist --kind cpu --counters FILE --slot 0 [--memory BYTES]
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import sys
from typing import Callable

SLOT = 8
MEMBW_BUFFER = 32 << 20
MEMORY_STEP = 64 << 20
CPU_CHUNK = 20000
UNITS = {"cpu": "iterations", "membw": "bytes copied", "memory": "bytes faulted in"}


class Counter:
    """This worker's slot: a running total, stored with one aligned 8-byte write so a reader never
    sees half of it."""

    def __init__(self, path: str, slot: int):
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        self._cell = ctypes.c_uint64.from_buffer(self._map, slot * SLOT)
        self.total = 0

    def add(self, n: int) -> None:
        self.total += n
        self._cell.value = self.total


def make_counters(path: str, workers: int) -> None:
    with open(path, "wb") as f:
        f.write(bytes(SLOT * workers))


def read_counters(path: str) -> int:
    """Work completed by every worker together so far."""
    with open(path, "rb") as f:
        data = f.read()
    return sum(int.from_bytes(data[i:i + SLOT], "little") for i in range(0, len(data), SLOT))


def cpu_work(counter: Counter, memory: int) -> None:
    x = 1
    while True:
        for _ in range(CPU_CHUNK):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        counter.add(CPU_CHUNK)


def membw_work(counter: Counter, memory: int) -> None:
    source = bytearray(b"\x5a" * MEMBW_BUFFER)
    target = bytearray(MEMBW_BUFFER)
    while True:
        target[:] = source
        counter.add(MEMBW_BUFFER)


def memory_work(counter: Counter, memory: int) -> None:
    page = mmap.PAGESIZE
    while True:
        held = []
        while (len(held) + 1) * MEMORY_STEP <= max(memory, MEMORY_STEP):
            region = mmap.mmap(-1, MEMORY_STEP, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            for offset in range(0, MEMORY_STEP, page):
                region[offset] = 1
            held.append(region)
            counter.add(MEMORY_STEP)
        for region in held:
            region.close()


KINDS: dict[str, Callable[[Counter, int], None]] = {"cpu": cpu_work, "membw": membw_work, "memory": memory_work}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="a BE antagonist worker (see the module docstring)")
    p.add_argument("--kind", choices=sorted(KINDS), required=True)
    p.add_argument("--counters", required=True, help="the shared counter file")
    p.add_argument("--slot", type=int, required=True, help="this worker's slot in it")
    p.add_argument("--memory", type=int, default=0, help="memory: bytes this worker grows to")
    args = p.parse_args(argv)
    KINDS[args.kind](Counter(args.counters, args.slot), args.memory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
