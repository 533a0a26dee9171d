"""A pytest plugin for scripts/vmtest's VM: each test's start and outcome, as it happens, on a channel
of their own (the VM's second serial port, a file on the host), so the host knows what passed, what
failed and what was running even when the VM is killed at its time limit or its kernel faults, and
never has to guess from a disk image written half-way.

Loaded by the VM's test runner with `-p tests.system.vmreport` and KOORDD_VMTEST_REPORT=/dev/ttyS1;
without that variable it does nothing. Lines (scripts/vmtest-verdict reads them):

    koordd-vmtest start NODEID
    koordd-vmtest result NODEID passed|failed|skipped SECONDS

A test whose setup or teardown fails is `failed` (pytest calls that an error).
"""
from __future__ import annotations

import os
import time

import pytest

PREFIX = "koordd-vmtest"
_report = None
_started: dict[str, float] = {}
_outcome: dict[str, str] = {}
RANK = {"passed": 0, "skipped": 1, "failed": 2}


def pytest_configure(config) -> None:
    global _report
    path = os.environ.get("KOORDD_VMTEST_REPORT")
    if path:
        # Unbuffered: a line is on the host the moment it is written, whatever happens next.
        _report = open(path, "w", buffering=1, encoding="utf-8", errors="replace")


def _say(line: str) -> None:
    if _report is not None:
        _report.write(f"{PREFIX} {line}\n")
        _report.flush()


def pytest_runtest_logstart(nodeid: str, location) -> None:
    _started[nodeid] = time.monotonic()
    _outcome[nodeid] = "passed"
    _say(f"start {nodeid}")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report) -> None:
    outcome = "failed" if report.failed else "skipped" if report.skipped else "passed"
    if RANK[outcome] > RANK[_outcome.get(report.nodeid, "passed")]:
        _outcome[report.nodeid] = outcome


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    seconds = time.monotonic() - _started.pop(nodeid, time.monotonic())
    _say(f"result {nodeid} {_outcome.pop(nodeid, 'passed')} {seconds:.1f}")
