"""What scripts/vmtest's VMs say: per boot a verdict, and at the end the budget table.

    scripts/vmtest-verdict [--cmd] BOOT_DIR QEMU_EXIT_STATUS
    scripts/vmtest-verdict summary BOOT_DIR...

BOOT_DIR holds one boot's serial console (console.log), the tests' own report (report.log: each test's
start and outcome as it happened, from tests/system/vmreport.py over the VM's second serial port) and
what came back from the VM's results disk (results/status, results/junit.xml, results/pytest.log).

The first form prints one line on stdout, `pass|fail|fault PASSED FAILED SKIPPED`, says why on stderr,
and writes BOOT_DIR/outcomes.tsv (NODEID, outcome, seconds). Outcomes are read as the tests reported
them, so a test that failed is a failure whatever happened after it:
- `fail`: a test failed or was skipped, a test was still running when qemu was killed at the VM's time
  limit (it is counted as failed: the limit is part of the contract, and a second boot would meet the
  same limit), pytest exited non-zero, or no test ran;
- `fault`: no test failed, and the boot is no result: the guest kernel oopsed or panicked (a
  timestamped kernel line on the console, never a line a test printed: those carry the unit's name),
  qemu failed, or the test unit never finished. Only then does scripts/vmtest boot again, and that boot
  runs only the tests that have no outcome yet;
- `pass`: everything ran and passed.
With --cmd the boot ran a command instead of pytest and only its exit status counts.

The second form merges the outcomes of the boots given and prints, on stderr, each test's time against
its budget (tests/system/budget.txt), slowest first, and on stdout `PASSED FAILED SKIPPED`.
"""
from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from koordtest.vmtest.budget import budgets

# printk lines: "[   50.579248] Oops: int3: 0000 [#1] SMP NOPTI". A unit's output forwarded to the
# console reads "[   19.08] koordd-systemtest[188]: ...", so a test printing these words never matches.
KERNEL_FAULT = re.compile(r"^\[\s*\d+\.\d+\] (Oops: |Kernel panic - not syncing|kernel BUG at |"
                          r"BUG: unable to handle|BUG: kernel NULL pointer|general protection fault)")
KERNEL_CONTEXT = re.compile(r"^\[\s*\d+\.\d+\] (RIP: |CPU: \d+ UID)")
# pytest -v's progress line as the test unit forwards it to the console.
CONSOLE_RESULT = re.compile(r"^\[\s*(\d+\.\d+)\] koordd-systemtest\[\d+\]: (\S+::\S+) "
                            r"(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
REPORT = re.compile(r"^koordd-vmtest (start|result) (\S+)(?: (passed|failed|skipped) ([\d.]+))?\s*$")
TIMED_OUT = (124, 137)          # timeout(1) killed qemu
OUTCOME_OF_WORD = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "failed",
                   "SKIPPED": "skipped", "XFAIL": "skipped"}
RANK = {"passed": 0, "skipped": 1, "failed": 2}


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def kernel_fault_lines(console: str, limit: int = 8) -> list[str]:
    """The fault lines and the RIP/CPU lines that go with them, in console order."""
    out = []
    faulted = False
    for line in console.splitlines():
        if KERNEL_FAULT.match(line):
            faulted = True
            out.append(line)
        elif faulted and KERNEL_CONTEXT.match(line):
            out.append(line)
        if len(out) >= limit:
            break
    return out


class Outcomes:
    """nodeid -> (outcome, seconds or None), the worst outcome a test reported winning."""

    def __init__(self) -> None:
        self.of: dict[str, tuple[str, float | None]] = {}
        self.running: str | None = None

    def add(self, nodeid: str, outcome: str, seconds: float | None = None) -> None:
        old = self.of.get(nodeid)
        if old is None or RANK[outcome] > RANK[old[0]]:
            self.of[nodeid] = (outcome, seconds if seconds is not None else (old[1] if old else None))
        elif seconds is not None and old[1] is None:
            self.of[nodeid] = (old[0], seconds)

    def count(self, outcome: str) -> int:
        return sum(1 for o, _ in self.of.values() if o == outcome)

    def named(self, outcome: str) -> list[str]:
        return [n for n, (o, _) in self.of.items() if o == outcome]


def from_report(text: str, into: Outcomes) -> None:
    """The tests' own report: authoritative, and the only place that says what was running."""
    for line in text.replace("\r", "").splitlines():
        m = REPORT.match(line)
        if not m:
            continue
        kind, nodeid, outcome, seconds = m.groups()
        if kind == "start":
            into.running = nodeid
        elif outcome:
            into.add(nodeid, outcome, float(seconds))
            if into.running == nodeid:
                into.running = None


def from_console(text: str, into: Outcomes) -> None:
    """pytest -v's lines on the console (the unit forwards them); seconds between lines."""
    last = None
    for line in text.splitlines():
        if "collected" in line and "koordd-systemtest[" in line:
            last = float(line[1:line.index("]")])
        m = CONSOLE_RESULT.match(line)
        if m:
            t = float(m.group(1))
            into.add(m.group(2), OUTCOME_OF_WORD[m.group(3)], None if last is None else round(t - last, 1))
            last = t


def from_junit(path: Path, into: Outcomes) -> bool:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return False
    for case in root.iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        nodeid = (cls.replace(".", "/") + ".py::" if cls else "::") + name
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        into.add(nodeid, outcome, float(case.get("time", 0) or 0))
    return True


def outcomes_of(boot: Path) -> tuple[Outcomes, bool]:
    """A boot's outcomes from every source that came back (the worst a test reported wins), and
    whether pytest's junit file did: the report line by line as it happened, the junit file (complete
    only when pytest finished) and the console's pytest -v lines, whose times are the coarsest."""
    out = Outcomes()
    from_report(read(boot / "report.log"), out)
    has_junit = from_junit(boot / "results" / "junit.xml", out)
    from_console(read(boot / "console.log"), out)
    return out, has_junit


def verdict(boot: Path, qemu_status: int, cmd: bool = False) -> tuple[str, Outcomes, list[str]]:
    console = read(boot / "console.log")
    status = read(boot / "results" / "status").strip() or None
    out, has_junit = (Outcomes(), True) if cmd else outcomes_of(boot)
    faults = kernel_fault_lines(console)
    timed_out = qemu_status in TIMED_OUT
    if timed_out and out.running:
        out.add(out.running, "failed")       # cut off at the limit: it did not pass
    failed = out.named("failed")

    def fault_lines() -> list[str]:
        hint = (" (int3 in kernel text: the kernel's live code patching racing with the emulator)"
                if any("Oops: int3" in f for f in faults) else "")
        return [f"the guest kernel faulted{hint}:"] + ["    " + f for f in faults]

    if failed:
        reasons = [f"{len(failed)} test(s) failed: " + ", ".join(failed)]
        if status not in (None, "0"):
            reasons.append(f"pytest inside the VM exited with status {status}")
        if timed_out:
            reasons.append("the VM was killed at its time limit" +
                           (f" while {out.running} ran (counted as failed)" if out.running else ""))
        if faults:
            reasons += ["after that, " + fault_lines()[0]] + fault_lines()[1:]
        return "fail", out, reasons
    if faults:
        return "fault", out, fault_lines()
    if timed_out:
        # No test known to be running (a run without the report channel, or the limit came between
        # tests): not finished in its time is a failure once tests ran; before any did, no result.
        if out.of:
            return "fail", out, [f"the VM was killed at its time limit ({len(out.of)} test(s) had finished)"]
        return "fault", out, ["the VM did not come back: qemu was killed at its time limit before any test ran"]
    if qemu_status != 0:
        return "fault", out, [f"the VM did not come back: qemu exited with status {qemu_status}"]
    if status is None:
        return "fault", out, ["the VM did not come back: the test unit never finished (no results/status)"]

    reasons = []
    if status != "0":
        reasons.append(f"{'the command' if cmd else 'pytest'} inside the VM exited with status {status}")
    if not cmd:
        if not has_junit:
            reasons.append("pytest wrote no junit results")
        skipped = out.named("skipped")
        if skipped:
            reasons.append(f"{len(skipped)} test(s) skipped inside the VM, where every system test must run: "
                           + ", ".join(skipped))
        if not out.of:
            reasons.append("no test ran")
    return ("fail" if reasons else "pass"), out, reasons


def write_outcomes(boot: Path, out: Outcomes) -> None:
    lines = [f"{n}\t{o}\t{'' if s is None else s}" for n, (o, s) in out.of.items()]
    (boot / "outcomes.tsv").write_text("".join(line + "\n" for line in lines))


def read_outcomes(boot: Path, into: Outcomes) -> None:
    for line in read(boot / "outcomes.tsv").splitlines():
        nodeid, outcome, seconds = (line.split("\t") + ["", ""])[:3]
        if outcome in RANK:
            into.add(nodeid, outcome, float(seconds) if seconds else None)


def budget_table(out: Outcomes, table: dict[str, float]) -> list[str]:
    """Each test's time against its budget, slowest first; the tests over budget marked."""
    rows = sorted(out.of.items(), key=lambda kv: -(kv[1][1] or 0))
    lines = [f"{'seconds':>8} {'budget':>7}  test"]
    total = over = 0
    for nodeid, (outcome, seconds) in rows:
        budget = table.get(nodeid)
        mark = ""
        if budget is None:
            mark = "  (no budget)"
        elif seconds is not None and seconds > budget:
            mark, over = "  OVER BUDGET", over + 1
        total += seconds or 0
        shown = "?" if seconds is None else f"{seconds:.0f}"
        lines.append(f"{shown:>8} {'-' if budget is None else f'{budget:.0f}':>7}  {nodeid}"
                     f"{'' if outcome == 'passed' else f' [{outcome}]'}{mark}")
    lines.append(f"{total:8.0f} {sum(table.get(n, 0) for n in out.of):7.0f}  total of the test times "
                 f"(the VMs ran side by side){f'; {over} test(s) over budget' if over else ''}")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "summary":
        out = Outcomes()
        for boot in argv[1:]:
            read_outcomes(Path(boot), out)
        print("--- system test times against their budgets (tests/system/budget.txt), slowest first ---",
              file=sys.stderr)
        for line in budget_table(out, budgets(strict=False)):
            print(line, file=sys.stderr)
        print(out.count("passed"), out.count("failed"), out.count("skipped"))
        return 0
    cmd = bool(argv) and argv[0] == "--cmd"
    if cmd:
        argv = argv[1:]
    if len(argv) != 2 or not argv[1].lstrip("-").isdigit():
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    boot = Path(argv[0])
    result, out, reasons = verdict(boot, int(argv[1]), cmd)
    if boot.is_dir():
        write_outcomes(boot, out)
    for r in reasons:
        print(f"scripts/vmtest: {r}", file=sys.stderr)
    print(result, out.count("passed"), out.count("failed"), out.count("skipped"))
    return 0
