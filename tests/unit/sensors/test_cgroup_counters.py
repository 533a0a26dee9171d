"""CgroupCounters over a fake perf (koordtest/fakes/perf.py): the arithmetic of a round, and when fds open and close."""
from __future__ import annotations

import errno
import logging
import resource

import pytest

from koordtest.fakes.perf import FakePerf
from koordd.kernel.perf import CYCLES, GroupReading, INSTRUCTIONS
from koordd.sensors.cgroup_counters import CgroupCounters, Counts, fd_budget, scaled_growth

EVENTS = (CYCLES, INSTRUCTIONS)


@pytest.fixture
def v2(tmp_path):
    root = tmp_path / "unified"
    for cg in ("ls.slice", "be.slice/job1", "be.slice/job2"):
        (root / cg).mkdir(parents=True)
    return root


def counters(v2, cpus=(0, 1), limit=None):
    perf = FakePerf(v2, limit)
    return CgroupCounters(EVENTS, v2, cpus, open_group=perf), perf


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# --- arithmetic -----------------------------------------------------------------------------------

@pytest.mark.parametrize("before, after, expected", [
    (GroupReading(0, 0, (0, 0)), GroupReading(1000, 1000, (300, 100)), ((300.0, 100.0), 1000, 1000)),
    # On the PMU half the time it was enabled: the counts are half of what ran, so doubled.
    (GroupReading(1000, 1000, (300, 100)), GroupReading(3000, 2000, (800, 400)), ((1000.0, 600.0), 2000, 1000)),
    # Enabled but never on the PMU: nothing to scale up from.
    (GroupReading(1000, 1000, (300, 100)), GroupReading(2000, 1000, (300, 100)), ((0.0, 0.0), 1000, 0)),
    # Did not run on that CPU at all.
    (GroupReading(1000, 1000, (300, 100)), GroupReading(1000, 1000, (300, 100)), ((0.0, 0.0), 0, 0)),
    # Times going back (never from one group) or a different group: no growth to speak of.
    (GroupReading(2000, 2000, (300, 100)), GroupReading(1000, 1000, (300, 100)), None),
    (GroupReading(0, 0, (0,)), GroupReading(1000, 1000, (300, 100)), None),
])
def test_scaled_growth(before, after, expected):
    assert scaled_growth(before, after) == expected


def test_a_round_is_the_growth_since_the_last_scaled_per_cpu_and_summed(v2):
    c, perf = counters(v2)
    assert c.update(["ls.slice"]) == {}                         # first seen: the baseline
    assert perf.open_for("ls.slice") == [0, 1]
    perf.set("ls.slice", 0, 1_000, 1_000, 3_000, 1_000)
    perf.set("ls.slice", 1, 1_000, 500, 1_000, 500)             # multiplexed: x2
    got = c.update(["ls.slice"])["ls.slice"]
    assert got == Counts({"cycles": 5_000.0, "instructions": 2_000.0}, 2_000, 1_500)
    assert got.running_fraction == 0.75
    perf.set("ls.slice", 0, 3_000, 3_000, 9_000, 3_000)
    perf.set("ls.slice", 1, 1_000, 500, 1_000, 500)             # idle on CPU 1 this round
    got = c.update(["ls.slice"])["ls.slice"]
    assert got == Counts({"cycles": 6_000.0, "instructions": 2_000.0}, 2_000, 2_000)
    assert got.running_fraction == 1.0


def test_a_cgroup_that_did_not_run_counts_zero_with_no_running_fraction(v2):
    c, perf = counters(v2)
    c.update(["be.slice/job1"])
    got = c.update(["be.slice/job1"])["be.slice/job1"]
    assert got == Counts({"cycles": 0.0, "instructions": 0.0}, 0, 0) and got.running_fraction is None


def test_the_root_cgroup_is_the_v2_root_itself(v2):
    c, perf = counters(v2)
    c.update([""])
    assert perf.open_for("") == [0, 1]
    perf.set("", 0, 10, 10, 7, 5)
    assert c.update([""])[""].values == {"cycles": 7.0, "instructions": 5.0}


def test_a_baseline_counter_already_counting_is_not_reported(v2):
    c, perf = counters(v2)
    perf.set("ls.slice", 0, 5_000, 5_000, 99_000, 33_000)       # counted between open and first read
    c.update(["ls.slice"])
    perf.set("ls.slice", 0, 6_000, 6_000, 100_000, 33_500)
    assert c.update(["ls.slice"])["ls.slice"].values == {"cycles": 1_000.0, "instructions": 500.0}


def test_an_unreadable_cpu_is_left_out_said_once(v2, caplog):
    c, perf = counters(v2)
    c.update(["ls.slice"])
    perf.set("ls.slice", 0, 1_000, 1_000, 300, 100)
    perf.readings[("ls.slice", 1)] = OSError(errno.EIO, "Input/output error")
    assert c.update(["ls.slice"])["ls.slice"].values == {"cycles": 300.0, "instructions": 100.0}
    perf.set("ls.slice", 0, 2_000, 2_000, 600, 200)
    assert c.update(["ls.slice"])["ls.slice"].values == {"cycles": 300.0, "instructions": 100.0}
    said = warnings(caplog)
    assert len(said) == 1 and "ls.slice on CPU 1 unreadable" in said[0] and "Input/output error" in said[0]


# --- which fds are open ---------------------------------------------------------------------------

def test_fds_are_cgroups_times_cpus_times_events_and_stay_open_between_rounds(v2):
    c, perf = counters(v2, cpus=(0, 1, 2))
    c.update(["ls.slice", "be.slice/job1"])
    c.update(["ls.slice", "be.slice/job1"])
    assert c.fds == perf.fds == 2 * 3 * 2
    assert len(perf.tries) == 6                                  # opened once, read since


def test_a_cgroup_leaving_the_context_is_closed(v2):
    c, perf = counters(v2)
    c.update(["ls.slice", "be.slice/job1"])
    c.update(["ls.slice"])
    assert perf.open_for("be.slice/job1") == [] and perf.open_for("ls.slice") == [0, 1]
    assert c.fds == 4


def test_a_vanished_cgroup_is_closed_and_absent(v2):
    c, perf = counters(v2)
    c.update(["ls.slice", "be.slice/job1"])
    (v2 / "be.slice/job1").rmdir()
    got = c.update(["ls.slice", "be.slice/job1"])
    assert set(got) == {"ls.slice"}
    assert perf.open_for("be.slice/job1") == [] and c.fds == 4
    assert c.update(["ls.slice", "be.slice/job1"]).keys() == {"ls.slice"}
    assert perf.tries.count(("be.slice/job1", 0)) == 1          # not tried while it is gone


def test_a_cgroup_made_again_under_the_same_name_is_counted_afresh(v2):
    c, perf = counters(v2)
    c.update(["be.slice/job1"])
    (v2 / "be.slice/job1").rmdir()
    (v2 / "be.slice/other").mkdir()                              # keeps the old inode number from coming back
    (v2 / "be.slice/job1").mkdir()
    assert c.update(["be.slice/job1"]) == {}                    # the old groups counted the old cgroup
    assert perf.tries.count(("be.slice/job1", 0)) == 2 and perf.open_for("be.slice/job1") == [0, 1]
    assert "be.slice/job1" in c.update(["be.slice/job1"])


def test_a_cgroup_missing_from_the_v2_tree_is_left_out(v2):
    c, perf = counters(v2)
    assert c.update(["kubepods/pod1"]) == {} and perf.tries == []


def test_close_closes_everything_and_twice_is_harmless(v2):
    c, perf = counters(v2)
    c.update(["ls.slice", "be.slice/job1"])
    c.close()
    c.close()
    assert perf.groups == [] and c.fds == 0


def test_a_failed_open_closes_what_it_opened_says_once_and_spares_the_others(v2, caplog):
    c, perf = counters(v2)
    perf.fail[("be.slice/job1", 1)] = errno.EINVAL
    for _ in range(3):
        got = c.update(["be.slice/job1", "ls.slice"])
    assert set(got) == {"ls.slice"}
    assert perf.open_for("be.slice/job1") == []
    said = warnings(caplog)
    assert len(said) == 1 and "cannot be opened for be.slice/job1" in said[0] and "Invalid argument" in said[0]


def test_a_cgroup_going_while_opened_is_churn_not_news(v2, caplog):
    c, perf = counters(v2)
    perf.fail[("be.slice/job1", 0)] = errno.ENOENT
    assert c.update(["be.slice/job1"]) == {}
    assert warnings(caplog) == [] and perf.groups == []


def test_out_of_fds_adds_no_more_cgroups_until_one_goes_and_says_so_once(v2, caplog):
    c, perf = counters(v2, limit=6)                              # room for one cgroup (4 fds) and a half
    wanted = ["ls.slice", "be.slice/job1", "be.slice/job2"]
    c.update(wanted)
    assert perf.open_for("ls.slice") == [0, 1] and perf.open_for("be.slice/job1") == []
    assert ("be.slice/job2", 0) not in perf.tries                # stopped adding
    tries = len(perf.tries)
    for _ in range(3):
        assert set(c.update(wanted)) == {"ls.slice"}
    assert len(perf.tries) == tries                              # not retried every round
    said = warnings(caplog)
    assert len(said) == 1 and "out of file descriptors (EMFILE) with 1 cgroups counted (4 perf fds" in said[0]
    assert "raise LimitNOFILE" in said[0]
    c.update(wanted[1:])                                         # ls.slice went: room again
    assert perf.open_for("be.slice/job1") == [0, 1] and perf.open_for("ls.slice") == []
    assert len(warnings(caplog)) == 1


def test_a_budget_keeps_fds_for_koordds_other_files(v2, caplog):
    perf = FakePerf(v2)
    c = CgroupCounters(EVENTS, v2, (0, 1), open_group=perf, max_fds=9)     # two cgroups of 4 fds, not three
    wanted = ["ls.slice", "be.slice/job1", "be.slice/job2"]
    c.update(wanted)
    c.update(wanted)
    assert c.fds == perf.fds == 8 and perf.open_for("be.slice/job2") == []
    said = warnings(caplog)
    assert len(said) == 1 and "2 cgroups counted hold 8 fds, and the next would pass the 9 they may" in said[0]
    c.update(wanted[1:])
    assert perf.open_for("be.slice/job2") == [0, 1]


@pytest.mark.parametrize("soft, budget", [(1_048_576, 1_048_576 - 16_384), (1024, 512), (20_000, 10_000)])
def test_fd_budget(monkeypatch, soft, budget):
    monkeypatch.setattr(resource, "getrlimit", lambda which: (soft, 1 << 20))
    assert fd_budget() == budget
