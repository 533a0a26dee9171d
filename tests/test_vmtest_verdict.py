"""scripts/vmtest-verdict: an emulator fault (guest oops/panic, a VM that did not come back) is told
apart from a test result, so scripts/vmtest boots once more after a fault and never after a failed test.

The runs here are made up: a console log and the results a boot would leave, as scripts/vmtest lays
them out in its run directory.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "vmtest-verdict"

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
    cases = ([f'<testcase name="p{i}"/>' for i in range(passed)]
             + [f'<testcase name="f{i}"><failure message="boom"/></testcase>' for i in range(failed)]
             + [f'<testcase name="s{i}"><skipped message="why"/></testcase>' for i in range(skipped)])
    return (f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{passed + failed + skipped}" '
            f'failures="{failed}" errors="0" skipped="{skipped}">{"".join(cases)}</testsuite></testsuites>')


def make_run(tmp_path: Path, console: str, status: str | None = None, junit_xml: str | None = None,
             pytest_log: str | None = None) -> Path:
    run = tmp_path / "run"
    (run / "results").mkdir(parents=True)
    (run / "console.log").write_text(console)
    for name, text in (("status", status), ("junit.xml", junit_xml), ("pytest.log", pytest_log)):
        if text is not None:
            (run / "results" / name).write_text(text)
    return run


def verdict(run: Path, qemu_status: int = 0, *flags: str) -> tuple[list[str], str]:
    p = subprocess.run([sys.executable, str(SCRIPT), *flags, str(run), str(qemu_status)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.split(), p.stderr


def test_a_green_boot_passes(tmp_path):
    run = make_run(tmp_path, BOOT, status="0\n", junit_xml=junit(passed=3))
    assert verdict(run)[0] == ["pass", "3", "0", "0"]


def test_a_simulated_int3_oops_on_the_console_is_a_fault_and_says_which_lines(tmp_path):
    # The VM panicked mid-run (panic=-1 and -no-reboot: qemu exits 0), pytest's log cut short.
    log = "tests/system/test_a.py::test_one PASSED [ 33%]\n"
    run = make_run(tmp_path, BOOT + INT3_OOPS, pytest_log=log)
    said, why = verdict(run)
    assert said == ["fault", "1", "0", "0"]
    assert "Oops: int3" in why and "RIP: 0010:__schedule" in why and "Kernel panic" in why, why
    assert "live code patching" in why, why


def test_an_oops_is_a_fault_even_when_the_tests_it_broke_failed(tmp_path):
    # An oops in process context kills a task, not the VM: the run completes, its failures are tainted.
    oops = INT3_OOPS.replace("[   50.588784] Kernel panic - not syncing: Fatal exception in interrupt\n", "")
    run = make_run(tmp_path, BOOT + oops, status="1\n", junit_xml=junit(passed=2, failed=1))
    assert verdict(run)[0][0] == "fault"


def test_a_failed_test_is_never_a_fault_even_when_it_prints_oops(tmp_path):
    run = make_run(tmp_path, BOOT + TEST_PRINTS_OOPS, status="1\n", junit_xml=junit(passed=2, failed=1))
    said, why = verdict(run)
    assert said == ["fail", "2", "1", "0"], why
    assert "1 test(s) failed" in why and "pytest inside the VM exited with status 1" in why


@pytest.mark.parametrize("qemu_status", [124, 137], ids=["timeout", "timeout-kill"])
def test_a_vm_killed_at_its_time_limit_is_a_fault(tmp_path, qemu_status):
    run = make_run(tmp_path, BOOT, pytest_log="tests/system/test_a.py::test_one PASSED\n")
    said, why = verdict(run, qemu_status)
    assert said[0] == "fault" and "did not come back" in why and "time limit" in why, why


def test_a_vm_that_never_finished_its_test_unit_is_a_fault(tmp_path):
    run = make_run(tmp_path, BOOT)                    # qemu exited 0, but no status came back
    said, why = verdict(run)
    assert said[0] == "fault" and "never finished" in why, why
    assert verdict(make_run(tmp_path / "q", BOOT), 1)[0][0] == "fault"     # qemu itself failed


def test_skips_and_empty_runs_are_failures_not_faults(tmp_path):
    assert verdict(make_run(tmp_path / "a", BOOT, status="0\n", junit_xml=junit(passed=2, skipped=1)))[0][0] == "fail"
    assert verdict(make_run(tmp_path / "b", BOOT, status="5\n", junit_xml=junit()))[0][0] == "fail"
    # pytest finished but left no junit: a broken run, not the emulator's doing.
    assert verdict(make_run(tmp_path / "c", BOOT, status="0\n"))[0][0] == "fail"


def test_cmd_mode_counts_only_the_exit_status(tmp_path):
    assert verdict(make_run(tmp_path / "a", BOOT, status="0\n"), 0, "--cmd")[0][0] == "pass"
    assert verdict(make_run(tmp_path / "b", BOOT, status="3\n"), 0, "--cmd")[0][0] == "fail"
    assert verdict(make_run(tmp_path / "c", BOOT + INT3_OOPS), 0, "--cmd")[0][0] == "fault"
