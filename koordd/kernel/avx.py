"""AVX use of threads and what it does to the frequency of the CPUs around them.

Wide vector instructions make an Intel core drop to a lower turbo "licence" level: the frequency falls
while they run, stays down ~2 ms after the last one, and the core's SMT sibling runs at the same lowered
frequency (the licence is the core's). Equal CPU time then buys unequal work: in Gottschlag et al.
(ATC'21) scalar tasks next to AVX-512 tasks were 24.9% slower on average. A loop can make up for it by
raising the `cpu.weight` of the victims by f_nominal / f_effective; this module reads what it needs:

- the observation, from /proc: `arch_status`'s `AVX512_elapsed_ms` (ms since AVX-512 state was last seen
  in use at a context switch; -1 never; x86 kernels 5.3+ on CPUs with AVX-512 only) and the CPU a thread
  last ran on (field 39 of `stat`).
- the model (koordd/core/avx.py, pure, what the avx_weight loop computes with): licence level -> MHz
  (DEFAULT_MHZ, the paper's measurements on one Intel host), the frequency a CPU runs at given what runs on
  it and on its siblings, and the compensation factor and weight.
- the measurement where the host allows it: APERF/MPERF through /dev/cpu/<n>/msr, the average frequency a
  CPU actually ran at while busy; None where unreadable, and then the model is all there is.

arch_status sees AVX-512 register state only: AVX2 (256-bit) use, which lowers the licence too, is
invisible to it, and glibc's EVEX string functions leave AVX-512 state in ordinary threads. The PMU tells
them apart where it has Intel's licence events: CORE_POWER.LVL1_TURBO_LICENSE and LVL2_TURBO_LICENSE count
the cycles a core spent at licence 1 (AVX2 heavy, AVX-512 light) and 2 (AVX-512 heavy). Counted per cgroup
with `cycles` (sensors/avx.py), their shares of its cycles give its level: licence_of() in koordd/core/avx.py, with the model.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from koordd.kernel.kfiles import read_small
from koordd.kernel.perf import CYCLES, raw_event

NEVER = -1                  # AVX512_elapsed_ms of a thread never seen using AVX-512

# --- observing threads --------------------------------------------------------------------------------


def parse_arch_status(text: str) -> int | None:
    """AVX512_elapsed_ms (NEVER = -1) from an arch_status file; None when the line is absent or garbled."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "AVX512_elapsed_ms":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def stat_fields(text: str) -> list[str] | None:
    """The fields of a /proc stat line after comm, so field n (1-based, as in proc(5)) is [n - 3]. comm
    is split off at the last ")": it may hold spaces and parentheses of its own."""
    head, sep, rest = text.rpartition(")")
    return rest.split() if sep and "(" in head else None


def _read_small(path: str) -> str | None:
    """A small proc file; None once the thread has exited (or the file is not there)."""
    try:
        return read_small(path)
    except OSError:
        return None


@dataclass(frozen=True)
class TaskStat:
    state: str              # field 3: "R" running or runnable, "S" sleeping, ...
    cpu_ticks: int          # utime + stime (fields 14, 15), in clock ticks: grows while it runs
    cpu: int                # field 39, "processor": the CPU it last ran on


def parse_stat(text: str) -> TaskStat | None:
    fields = stat_fields(text)
    try:
        return TaskStat(fields[3 - 3], int(fields[14 - 3]) + int(fields[15 - 3]), int(fields[39 - 3]))
    except (TypeError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ThreadAvx:
    elapsed_ms: int         # AVX512_elapsed_ms; NEVER when never seen
    stat: TaskStat


def read_thread(proc: Path | str, tid: int) -> ThreadAvx | None:
    """A thread's AVX-512 recency and where it last ran, from its two small files under
    <proc>/<tid>/task/<tid>/ (the thread's own, not its process's); None when it has exited or either file
    is missing or garbled."""
    # The task's own directory: <proc>/<tid>/stat sums the times of all the process's threads, 80 µs a read
    # in a process of 2000 threads against 5 µs here.
    base = f"{proc}/{tid}/task/{tid}"
    status = _read_small(f"{base}/arch_status")
    elapsed = parse_arch_status(status) if status is not None else None
    if elapsed is None:
        return None
    text = _read_small(f"{base}/stat")
    stat = parse_stat(text) if text is not None else None
    return ThreadAvx(elapsed, stat) if stat is not None else None


# --- the frequency model ----------------------------------------------------------------------------------


# --- measured frequency: APERF / MPERF --------------------------------------------------------------------

IA32_MPERF, IA32_APERF = 0xE7, 0xE8


def read_aperf_mperf(cpu: int, dev_root: Path | str = "/dev/cpu") -> tuple[int, int] | None:
    """(APERF, MPERF) of a CPU: cycles at the actual and at the TSC's frequency, both counted only while
    the CPU is not idle. Reads /dev/cpu/<n>/msr, which needs the msr module (modprobe msr) and root
    (CAP_SYS_RAWIO); None where that is not so, or the CPU has no such MSRs (non-x86, some VMs)."""
    try:
        fd = os.open(f"{dev_root}/{cpu}/msr", os.O_RDONLY)
    except OSError:
        return None
    try:
        aperf, mperf = os.pread(fd, 8, IA32_APERF), os.pread(fd, 8, IA32_MPERF)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(aperf) != 8 or len(mperf) != 8:
        return None
    return int.from_bytes(aperf, "little"), int.from_bytes(mperf, "little")


def measured_mhz(before: tuple[int, int], after: tuple[int, int], tsc_mhz: float) -> float | None:
    """The average frequency a CPU ran at while busy between two readings: tsc_mhz × ΔAPERF / ΔMPERF (the
    TSC's rate is the CPU's base frequency, e.g. "@ 2.10GHz" in cpuinfo's model name). None when the CPU
    was idle throughout."""
    d_aperf, d_mperf = after[0] - before[0], after[1] - before[1]
    return tsc_mhz * d_aperf / d_mperf if d_mperf > 0 and d_aperf >= 0 else None


# --- the PMU's licence counters ---------------------------------------------------------------------------

# Intel's CORE_POWER events: core cycles at each turbo licence, event select 0x28 with unit mask 0x07 for
# licence 0 (scalar, SSE, AVX 128-bit, light AVX2; not counted here), 0x18 for licence 1 and 0x20 for
# licence 2. Source: Linux's tools/perf/pmu-events/arch/x86/{skylakex,cascadelakex,icelakex,icelake}/
# other.json, the same encodings in all four.
LVL1_TURBO_LICENSE = raw_event("core_power.lvl1_turbo_license", 0x28, 0x18)
LVL2_TURBO_LICENSE = raw_event("core_power.lvl2_turbo_license", 0x28, 0x20)
LICENCE_EVENTS = (CYCLES, LVL1_TURBO_LICENSE, LVL2_TURBO_LICENSE)     # one group: the shares are of `cycles`
# Intel family 6 models with those events, from the same tree's mapfile.csv (GenuineIntel-6-55-[01234]
# skylakex, 6-55-[56789ABCDEF] cascadelakex, 6-6[AC] icelakex, 6-7[DE] icelake). Sapphire Rapids' list
# (6-8F) has no CORE_POWER events; models not here are not tried.
LICENCE_MODELS: Mapping[int, str] = {0x55: "Skylake-SP/X, Cascade Lake, Cooper Lake", 0x6A: "Ice Lake-SP",
                                     0x6C: "Ice Lake-D", 0x7D: "Ice Lake", 0x7E: "Ice Lake"}


@dataclass(frozen=True)
class CpuId:
    vendor: str             # vendor_id: GenuineIntel, AuthenticAMD, ...
    family: int
    model: int

    def __str__(self) -> str:
        return f"{self.vendor} family {self.family} model {self.model:#x}"


def parse_cpuinfo(text: str) -> CpuId | None:
    """The first CPU's vendor, family and model from /proc/cpuinfo; None where it does not say (not x86)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() and fields:
            break                       # the first CPU's block ends at its blank line
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    try:
        return CpuId(fields["vendor_id"], int(fields["cpu family"]), int(fields["model"]))
    except (KeyError, ValueError):
        return None


def licence_events_missing(cpu: CpuId | None) -> str | None:
    """Why this CPU has no licence events koordd knows; None when it has them."""
    if cpu is None:
        return "CPU model unknown (no vendor_id, cpu family and model in cpuinfo)"
    if cpu.vendor == "GenuineIntel" and cpu.family == 6 and cpu.model in LICENCE_MODELS:
        return None
    known = ", ".join(f"{m:#x}" for m in LICENCE_MODELS)
    return f"{cpu} has no CORE_POWER licence events koordd knows of (Intel family 6 models {known} have them)"

