"""The steering cases' clients (koordtest/apps.py, scripts/bench-app-latency --steering and
tests/kernel/test_app_latency_kernel.py) against its server, without the kernel side, and the bench's report
cell. The kernel side (the program's cost, the sensor's p99) needs root and BPF: the kernel test and the
benchmark itself measure it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from koordtest.apps import STEERED_SERVER, half_sent, pings
from koordtest.bench import app_latency


@pytest.fixture
def address():
    proc = subprocess.Popen([sys.executable, "-c", STEERED_SERVER, "tcp", "-"], stdout=subprocess.PIPE)
    try:
        yield proc.stdout.readline().decode().strip()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_the_ping_case_gets_an_answer_to_each_of_its_300_pings(address):
    got = pings("tcp", address)
    assert len(got) == 300 and all(us > 0 for us in got)


def test_the_half_sent_case_adds_two_answers_from_each_of_its_30_slow_clients(address):
    got = half_sent("tcp", address)
    assert len(got) == 300 + 30 * 2 and all(us > 0 for us in got)


def test_a_cell_is_the_median_and_range_with_thousands_separated():
    assert app_latency.fmt([1000.0, 2500.4, 1200.0]) == "1,200 (1,000-2,500)"
