"""scripts/bench-steal's pure parts (koordtest/bench/steal_sweep.py): the spinners' quota for a share of the
node and the report's table. The trials themselves need root and a cgroup (run by hand; docs/be-control.md)."""
from __future__ import annotations

import pytest

import subprocess
import sys

from koordtest.bench.steal_sweep import SPINNERS, Trial, main, quota, table


def test_a_share_of_the_node_is_a_quota_over_every_cpu_and_100_percent_none():
    assert quota(100, 2) == "max 100000"
    assert quota(90, 2) == "180000 100000"
    assert quota(25, 16) == "400000 100000"
    assert quota(0, 2) == "1000 100000"              # the kernel's least; no spinner runs at 0 anyway


def test_the_table_gives_stalls_and_steal_a_minute_per_share_median_and_range_over_rounds():
    trials = [Trial(100, 60.0, (100.2, 99.8), 0.2), Trial(100, 60.0, (101.0, 98.0, 100.0, 97.0), 3.0),
              Trial(90, 60.0, (), 0.02), Trial(90, 60.0, (), 5.7), Trial(0, 30.0, (), 0.01)]
    rows = table(trials, 20.0)
    assert rows[0].startswith("| spinners' quota | rounds | stalls over 20 ms a minute |")
    assert rows[2] == "| none (no quota) | 2 | 3.0 (2.0-4.0) | 101 | 1.60 (0.20-3.00) |"
    assert rows[3] == "| 90% of the node | 2 | 0.0 | - | 2.86 (0.02-5.70) |"
    assert rows[4] == "| no spinner | 1 | 0.0 | - | 0.02 |"


def test_a_share_outside_0_to_100_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        main(["--shares", "100,120"])
    assert "--shares: percents from 0 to 100" in capsys.readouterr().err


@pytest.mark.parametrize("kind", sorted(SPINNERS))
def test_each_spinner_is_a_program_that_runs_until_killed(kind):
    """A spinner that ended (a syntax error, memory refused) would leave its share idle and the table would
    compare nothing."""
    p = subprocess.Popen([sys.executable, "-c", SPINNERS[kind]], stderr=subprocess.PIPE)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=0.5)
    finally:
        p.kill()
        p.wait()
