"""Cgroups as text, with no file touched: paths and patterns, CPU lists and cpu.max values.

What the config, the loops, the guard and the kernel adapters all parse and format the same way. Pure:
koordd/kernel/cgroupfs.py reads and writes the files, koordd/backends/cgroup_knobs.py holds the knob table.
"""
from __future__ import annotations

import fnmatch

from koordd.core.backend import InvalidValue

CGROUP_MOUNT = "/sys/fs/cgroup"      # where the hierarchies are mounted (kernel/cgroupfs.py: DEFAULT_ROOT)


def normalize_cgroup(name: str) -> str:
    """"/be.slice/" -> "be.slice"; "" is the root. Rejects ".." so nothing escapes the hierarchy."""
    parts = [p for p in name.strip().split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"cgroup path may not contain '..': {name!r}")
    return "/".join(parts)


def normalize_pattern(pattern: str, where: str = "") -> str:
    """A cgroup path pattern as normalize_cgroup gives it; ValueError (after `where`) for one naming the
    root cgroup, whose knobs koordd never writes."""
    norm = normalize_cgroup(pattern)
    if not norm:
        raise ValueError(f"{where}pattern names the root cgroup: {pattern!r}")
    return norm


def parent_of(cgroup: str) -> str | None:
    return None if cgroup == "" else cgroup.rpartition("/")[0]


def depth(cgroup: str) -> int:
    return 0 if cgroup == "" else cgroup.count("/") + 1


def match_pattern(pattern: str, cgroup: str) -> bool:
    """Glob per path component: "kubepods.slice/*" matches one level below kubepods.slice."""
    pp, cp = pattern.split("/"), cgroup.split("/")
    return len(pp) == len(cp) and all(fnmatch.fnmatchcase(c, p) for p, c in zip(pp, cp))


def pattern_rank(cgroup: str, patterns) -> int:
    """Index of the first pattern naming the cgroup or one of its ancestors; len(patterns) if none."""
    parts = cgroup.split("/")
    for i, p in enumerate(patterns):
        n = p.count("/") + 1
        if n <= len(parts) and match_pattern(p, "/".join(parts[:n])):
            return i
    return len(patterns)


# Far above any kernel's NR_CPUS (8192 at most on x86 and arm64): a CPU number beyond it is garbage, and
# a range up to it ("0-4294967295") would be a set of billions before anything could refuse it.
MAX_CPUS = 1 << 16


def parse_cpulist(text: str) -> frozenset[int]:
    """"0-3,8,10-11" -> {0,1,2,3,8,10,11}; "" -> empty. ValueError for anything else, or a CPU at
    MAX_CPUS or beyond."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep:
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"bad cpu range {part!r}")
            if b >= MAX_CPUS:
                raise ValueError(f"cpu {b} is beyond any machine's (at most {MAX_CPUS - 1})")
            cpus.update(range(a, b + 1))
        else:
            cpus.add(int(lo))
            if int(lo) >= MAX_CPUS:
                raise ValueError(f"cpu {int(lo)} is beyond any machine's (at most {MAX_CPUS - 1})")
    if any(c < 0 for c in cpus):
        raise ValueError(f"negative cpu in {text!r}")
    return frozenset(cpus)


def format_cpulist(cpus) -> str:
    """{0,1,2,3,8} -> "0-3,8" (the kernel's own form)."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


CFS_PERIOD_RANGE = (1000, 1_000_000)        # µs, kernel's min/max cfs period


CFS_QUOTA_MIN = 1000                        # µs


def parse_cpu_max(text: str) -> tuple[int | None, int]:
    """"max 100000" -> (None, 100000); "50000 100000" -> (50000, 100000)."""
    parts = text.split()
    if len(parts) != 2:
        raise InvalidValue(f"cpu.max wants \"<quota|max> <period>\", got {text!r}")
    quota = None if parts[0] == "max" else parse_int(parts[0], "cpu.max quota")
    period = parse_int(parts[1], "cpu.max period")
    return quota, period


def format_cpu_max(quota: int | None, period: int) -> str:
    return f"{'max' if quota is None else int(quota)} {int(period)}"


def parse_int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidValue(f"{what} must be an integer, got {text!r}") from None
