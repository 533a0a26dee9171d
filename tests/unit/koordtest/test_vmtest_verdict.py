"""scripts/vmtest-verdict (koordtest/vmtest/verdict.py): a test that failed is a failure whatever happens after it (a kernel fault, the
VM killed at its limit); only a boot in which no test failed and the emulator faulted (guest oops or
panic, a VM that did not come back) is no result, and scripts/vmtest boots once more only then, for the
tests with no outcome yet. Also scripts/vmtest-plan (koordtest/vmtest/plan.py): the files dealt out to VMs
by their budgets.

The runs here are made up: a console log, the tests' report and the results a boot would leave, as
scripts/vmtest lays them out in its run directory.
"""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from koordtest.vmtest import plan as vmtest_plan, verdict as vmtest_verdict
from koordtest.vmtest.budget import budgets

BOOT = """\
[    0.000000] Linux version 7.2.13+deb14-cloud-amd64
[   16.048936] koordd-systemtest[181]: koordd-systemtest: 7.2.13+deb14-cloud-amd64, 2 CPUs, up 16.03s
[   19.967963] koordd-systemtest[188]: collecting ... collected 3 items
[   64.266166] koordd-systemtest[188]: tests/system/test_a.py::test_one PASSED [ 33%]
"""
# As seen under multi-threaded TCG (scripts/vmtest before single-threaded TCG).
INT3_OOPS = """\
[   50.579248] Oops: int3: 0000 [#1] SMP NOPTI
[   50.579320] CPU: 1 UID: 0 PID: 16 Comm: rcu_preempt Not tainted 7.2.13+deb14-cloud-amd64 #1
[   50.579939] RIP: 0010:__schedule+0x38a/0x1070
[   50.580940] R10: 0000000000000402 R11: 0000000000000002 R12: ffff8b5ffdd32100
[   50.588784] Kernel panic - not syncing: Fatal exception in interrupt
"""
# A test that fails and prints the same words: forwarded unit output carries the unit's name.
TEST_PRINTS_OOPS = """\
[   90.100000] koordd-systemtest[188]: E   AssertionError: Oops: int3 in the journal? Kernel panic - not syncing
[   90.100001] koordd-systemtest[188]: tests/system/test_a.py::test_two FAILED [ 66%]
"""


def junit(passed: int = 0, failed: int = 0, skipped: int = 0) -> str:
    """Cases of tests/system/test_a.py, named as the consoles here name them: test_one passed,
    test_two failed (TEST_PRINTS_OOPS)."""
    case = '<testcase classname="tests.system.test_a" name="{}" time="12.5"'
    cases = ([case.format(n) + "/>" for n in (["test_one"] + [f"test_p{i}" for i in range(passed)])[:passed]]
             + [case.format(n) + '><failure message="boom"/></testcase>'
                for n in (["test_two"] + [f"test_f{i}" for i in range(failed)])[:failed]]
             + [case.format(f"test_s{i}") + '><skipped message="why"/></testcase>' for i in range(skipped)])
    return (f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{passed + failed + skipped}" '
            f'failures="{failed}" errors="0" skipped="{skipped}">{"".join(cases)}</testsuite></testsuites>')


def make_run(tmp_path: Path, console: str, status: str | None = None, junit_xml: str | None = None,
             pytest_log: str | None = None, report: str | None = None) -> Path:
    run = tmp_path / "run"
    (run / "results").mkdir(parents=True)
    (run / "console.log").write_text(console)
    if report is not None:
        (run / "report.log").write_text(report)
    for name, text in (("status", status), ("junit.xml", junit_xml), ("pytest.log", pytest_log)):
        if text is not None:
            (run / "results" / name).write_text(text)
    return run


def run_main(main, *argv: str) -> tuple[int, str, str]:
    """A tool's main(argv) as scripts/vmtest runs it: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def verdict(run: Path, qemu_status: int = 0, *flags: str) -> tuple[list[str], str]:
    code, out, err = run_main(vmtest_verdict.main, *flags, str(run), str(qemu_status))
    assert code == 0, err
    return out.split(), err


def test_a_green_boot_passes(tmp_path):
    run = make_run(tmp_path, BOOT, status="0\n", junit_xml=junit(passed=3))
    assert verdict(run)[0] == ["pass", "3", "0", "0"]


def test_a_simulated_int3_oops_on_the_console_is_a_fault_and_says_which_lines(tmp_path):
    # The VM panicked mid-run (panic=-1 and -no-reboot: qemu exits 0), no test had failed.
    run = make_run(tmp_path, BOOT + INT3_OOPS)
    said, why = verdict(run)
    assert said == ["fault", "1", "0", "0"]
    assert "Oops: int3" in why and "RIP: 0010:__schedule" in why and "Kernel panic" in why, why
    assert "live code patching" in why, why
    # What the next boot leaves out: the test that has its outcome.
    assert (run / "outcomes.tsv").read_text().split("\t")[:2] == ["tests/system/test_a.py::test_one", "passed"]


def test_a_test_that_failed_before_an_oops_is_a_failure_not_a_fault(tmp_path):
    run = make_run(tmp_path, BOOT + TEST_PRINTS_OOPS + INT3_OOPS)
    said, why = verdict(run)
    assert said == ["fail", "1", "1", "0"], why
    assert "test_a.py::test_two" in why and "faulted" in why, why


def test_a_test_that_failed_while_an_oops_left_the_vm_running_is_a_failure(tmp_path):
    # An oops in process context kills a task, not the VM: the run completes, and its failure counts.
    oops = INT3_OOPS.replace("[   50.588784] Kernel panic - not syncing: Fatal exception in interrupt\n", "")
    run = make_run(tmp_path, BOOT + oops, status="1\n", junit_xml=junit(passed=2, failed=1))
    assert verdict(run)[0] == ["fail", "2", "1", "0"]


def test_a_failed_test_is_never_a_fault_even_when_it_prints_oops(tmp_path):
    run = make_run(tmp_path, BOOT + TEST_PRINTS_OOPS, status="1\n", junit_xml=junit(passed=2, failed=1))
    said, why = verdict(run)
    assert said == ["fail", "2", "1", "0"], why
    assert "1 test(s) failed" in why and "pytest inside the VM exited with status 1" in why


REPORT = """\
koordd-vmtest start tests/system/test_a.py::test_one\r
koordd-vmtest result tests/system/test_a.py::test_one passed 40.2\r
koordd-vmtest start tests/system/test_net.py::test_shaping[edt]\r
koordd-vmtest result tests/system/test_net.py::test_shaping[edt] failed 300.0\r
koordd-vmtest start tests/system/test_z.py::test_last\r
"""


@pytest.mark.parametrize("qemu_status", [124, 137], ids=["timeout", "timeout-kill"])
def test_a_failure_before_the_time_limit_is_a_failure_and_the_test_cut_off_failed_too(tmp_path, qemu_status):
    # The run: edt FAILED at 51%, then the VM was killed at its limit. Never a fault.
    run = make_run(tmp_path, BOOT, report=REPORT)
    said, why = verdict(run, qemu_status)
    assert said == ["fail", "1", "2", "0"], why
    assert "test_shaping[edt]" in why and "test_z.py::test_last ran (counted as failed)" in why, why
    assert "time limit" in why, why


def test_a_vm_killed_at_its_limit_while_a_test_ran_failed_that_test(tmp_path):
    report = "koordd-vmtest start tests/system/test_a.py::test_one\n"
    said, why = verdict(make_run(tmp_path, BOOT.replace("PASSED", "RUNNING"), report=report), 124)
    assert said == ["fail", "0", "1", "0"], why


def test_a_vm_killed_at_its_limit_before_any_test_is_a_fault(tmp_path):
    said, why = verdict(make_run(tmp_path, "[    0.000000] Linux version 7.2\n"), 124)
    assert said[0] == "fault" and "time limit before any test ran" in why, why


def test_the_report_channel_counts_without_console_or_results(tmp_path):
    report = REPORT.replace("failed 300.0", "passed 300.0").rsplit("koordd-vmtest start", 1)[0]
    run = make_run(tmp_path, "", status="0\n", junit_xml=junit(passed=1), report=report)
    said, why = verdict(run)
    assert said == ["pass", "2", "0", "0"], why      # test_a's junit case is test_one, the report's too


def test_a_vm_that_never_finished_its_test_unit_is_a_fault(tmp_path):
    run = make_run(tmp_path, BOOT)                    # qemu exited 0, but no status came back
    said, why = verdict(run)
    assert said[0] == "fault" and "never finished" in why, why
    assert verdict(make_run(tmp_path / "q", BOOT), 1)[0][0] == "fault"     # qemu itself failed


def test_skips_and_empty_runs_are_failures_not_faults(tmp_path):
    assert verdict(make_run(tmp_path / "a", BOOT, status="0\n", junit_xml=junit(passed=2, skipped=1)))[0][0] == "fail"
    assert verdict(make_run(tmp_path / "b", "", status="5\n", junit_xml=junit()))[0][0] == "fail"
    # pytest finished but left no junit: a broken run, not the emulator's doing.
    assert verdict(make_run(tmp_path / "c", BOOT, status="0\n"))[0][0] == "fail"


def test_cmd_mode_counts_only_the_exit_status(tmp_path):
    assert verdict(make_run(tmp_path / "a", BOOT, status="0\n"), 0, "--cmd")[0][0] == "pass"
    assert verdict(make_run(tmp_path / "b", BOOT, status="3\n"), 0, "--cmd")[0][0] == "fail"
    assert verdict(make_run(tmp_path / "c", BOOT + INT3_OOPS), 0, "--cmd")[0][0] == "fault"


PACKAGE_TEST = "tests/system/test_package.py::test_install_upgrade_keeps_the_operators_config_and_purge_leaves_nothing"


def test_the_summary_merges_boots_and_puts_the_slowest_test_first_against_its_budget(tmp_path):
    first = make_run(tmp_path / "1", BOOT, report=REPORT)
    verdict(first, 124)
    second = make_run(tmp_path / "2", "", status="0\n", report=(
        f"koordd-vmtest start {PACKAGE_TEST}\n"
        f"koordd-vmtest result {PACKAGE_TEST} passed 9999.0\n"))
    verdict(second, 0)
    _, out, err = run_main(vmtest_verdict.main, "summary", str(first), str(second))
    assert out.split() == ["2", "2", "0"], err
    rows = [line for line in err.splitlines() if "::" in line]
    assert PACKAGE_TEST in rows[0] and "OVER BUDGET" in rows[0], err
    assert "test_shaping[edt] [failed]" in rows[1] and "(no budget)" in rows[1], err


def plan(shards: int, *args: str) -> list[list[str]]:
    code, out, err = run_main(vmtest_plan.main, str(shards), *args)
    assert code == 0, err
    assert "no budget" not in err, f"a system test file without a line in tests/system/budget.txt: {err}"
    return [line.split() for line in out.splitlines()]


def test_the_plan_runs_every_system_test_file_once_in_balanced_vms():
    one, two = plan(1), plan(2)
    files = sorted(f for line in one for f in line[2:])
    assert "tests/system/test_service.py" in files and "tests/kernel/test_runq_kernel.py" in files
    assert sorted(f for line in two for f in line[2:]) == files and len(two) == 2
    limits = [int(line[1]) for line in two]
    # Dealt longest first: each VM's share is within its biggest file of the other's.
    assert max(limits) - min(limits) < int(one[0][1]) / 2, two
    assert plan(2, "-k", "edt") == [["1", one[0][1], *one[0][2:]]]     # pytest selects: one VM, every file


def test_a_bad_budget_line_stops_the_plan_and_the_summary_skips_it(tmp_path):
    path = tmp_path / "budget.txt"
    path.write_text("# seconds nodeid\n12.5 tests/system/test_a.py::test_one  # a comment\n\nfast tests/b.py::x\n")
    assert budgets(path, strict=False) == {"tests/system/test_a.py::test_one": 12.5}
    with pytest.raises(SystemExit, match=r"budget.txt:4: expected 'SECONDS NODEID', got 'fast tests/b.py::x'"):
        budgets(path)
    assert budgets(tmp_path / "none.txt", strict=False) == {}
    with pytest.raises(OSError):
        budgets(tmp_path / "none.txt")
