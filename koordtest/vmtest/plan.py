"""Which VM runs which system test, and how long each VM may take: scripts/vmtest's plan.

    scripts/vmtest-plan SHARDS [PYTEST ARGS...]
    scripts/vmtest-plan --limit BUDGET_SECONDS [GUEST_UPTIME_AT_TESTS]

Under single-threaded TCG a VM uses one host CPU, so the suite runs in SHARDS VMs side by side (one per
host CPU). Test files are dealt out by their budget (tests/system/budget.txt, seconds per test as
measured on a development machine), longest first, each to the VM with the least so far: a file's
tests share their fixtures and stay together. Prints one line per VM (a VM with no file is not started):

    SHARD BUDGET_SECONDS FILE [FILE...]

With PYTEST ARGS (e.g. -k edt) the plan is one VM with every file: pytest selects inside it.

--limit prints how long a VM with that budget may run. The emulator's speed differs between machines
(the same suite took twice as long on one host CPU as on another), so the limit scales with it: the
guest's uptime when its tests start, against REFERENCE_UP on the machine the budgets were measured on,
gives the machine's slowness; the limit is that slowness times (the boot allowance plus MARGIN times
the budget). Without an uptime (the VM has not got that far) it is the hard cap: the limit at
MAX_SLOWNESS. A test that grows shows in the budget table (scripts/vmtest-verdict summary) long
before it reaches the limit.
"""
from __future__ import annotations

import sys
from pathlib import Path

from koordtest.vmtest.budget import BUDGET_FILE, REPO as SRC, budgets
# What scripts/vmtest runs inside the VM: every system test, and the run-queue proof on a v2 kernel.
SUITE = ("tests/system", "tests/kernel/test_runq_kernel.py")
BOOT_ALLOWANCE = 120        # seconds: boot, systemd, pytest's collection, the journal dump after
MARGIN = 2.0                # room above the budgets, on a machine as fast as the budgets' once scaled
REFERENCE_UP = 15.0         # the guest's uptime at its tests' start where the budgets were measured
MAX_SLOWNESS = 4.0          # the hard cap's slowness: a VM that has not reported its uptime by then
UNBUDGETED = 120            # seconds assumed for a test file with no budget line (and said so)


def suite_files(src: Path = SRC) -> list[str]:
    files = []
    for entry in SUITE:
        p = src / entry
        files += sorted(str(f.relative_to(src)) for f in p.glob("test_*.py")) if p.is_dir() else [entry]
    return files


def file_budget(file: str, table: dict[str, float]) -> float | None:
    own = [s for nodeid, s in table.items() if nodeid.split("::", 1)[0] == file]
    return sum(own) if own else None


def plan(shards: int, files: list[str], table: dict[str, float]) -> list[tuple[float, list[str]]]:
    """[(budget seconds, files)] per shard, longest-processing-time first."""
    sized = []
    for f in files:
        b = file_budget(f, table)
        if b is None:
            print(f"scripts/vmtest-plan: {f} has no budget in {BUDGET_FILE.relative_to(SRC)}: "
                  f"counted as {UNBUDGETED}s", file=sys.stderr)
            b = UNBUDGETED
        sized.append((b, f))
    out: list[tuple[float, list[str]]] = [(0.0, []) for _ in range(max(1, shards))]
    for b, f in sorted(sized, key=lambda x: (-x[0], x[1])):
        i = min(range(len(out)), key=lambda k: out[k][0])
        out[i] = (out[i][0] + b, out[i][1] + [f])
    return [s for s in out if s[1]]


def limit(budget: float, uptime: float | None = None) -> int:
    slowness = MAX_SLOWNESS if uptime is None else min(MAX_SLOWNESS, max(1.0, uptime / REFERENCE_UP))
    return int(slowness * (BOOT_ALLOWANCE + MARGIN * budget))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--limit" and len(argv) in (2, 3):
        print(limit(float(argv[1]), float(argv[2]) if len(argv) == 3 else None))
        return 0
    if not argv or not argv[0].isdigit() or int(argv[0]) < 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    shards, pytest_args = int(argv[0]), argv[1:]
    table, files = budgets(), suite_files()
    if pytest_args:
        shards = 1
    for n, (budget, chosen) in enumerate(plan(shards, files, table), 1):
        print(n, int(budget), *chosen)
    return 0
