"""What koordd present costs, as bench-qos measures it, without the kernel: koordtest/bench/bpf_stats.py (the
switch put back, koordd's programs found in its status file, a window's cost from two readings, the report's
line; the kernel side: tests/kernel/test_libbpf_kernel.py), and the report's line on koordd's own process's CPU
(read with koordtest/bench/procstat.py's cpu_seconds, as bench-overhead reads it)."""
from __future__ import annotations

import pytest

from koordtest.bench import bpf_stats
from koordtest.bench.qos_cli import bpf_notes

STATUS = {"bpf": {"stats_enabled": True, "objects": [
    {"object": "app_latency.bpf.o", "programs": [{"name": "app_sent", "id": 41}, {"name": "app_read", "id": 40}]},
    {"object": "runq_latency.bpf.o", "programs": [{"name": "runq_switch", "id": 7}]}]}}


def test_counting_puts_the_switch_back_as_it_was_also_after_an_error(tmp_path):
    switch, before = tmp_path / "bpf_stats_enabled", tmp_path / "run" / "before"
    switch.write_text("0\n")
    with bpf_stats.counting(switch, before):
        assert switch.read_text() == "1" and before.read_text() == "0"
    assert switch.read_text() == "0" and not before.exists()
    with pytest.raises(RuntimeError), bpf_stats.counting(switch, before):
        raise RuntimeError("a benchmark failing")
    assert switch.read_text() == "0" and not before.exists()
    switch.write_text("1")
    with bpf_stats.counting(switch, before):
        pass
    assert switch.read_text() == "1"        # on before: left on


def test_a_run_killed_while_counting_is_mended_by_the_next(tmp_path):
    switch, before = tmp_path / "bpf_stats_enabled", tmp_path / "before"
    switch.write_text("1")                  # left on by a run killed with -9 ...
    before.write_text("0")                  # ... which had found it off
    with bpf_stats.counting(switch, before):
        assert switch.read_text() == "1"
    assert switch.read_text() == "0" and not before.exists()
    for junk in ("2", "", "0" * 10_000):    # a note that is not one of the switch's values: the switch read
        before.write_text(junk)
        switch.write_text("1")
        with bpf_stats.counting(switch, before):
            pass
        assert switch.read_text() == "1"


def test_koordd_programs_are_named_by_object_and_program():
    assert bpf_stats.koordd_programs(STATUS) == {41: "app_latency:app_sent", 40: "app_latency:app_read",
                                                7: "runq_latency:runq_switch"}
    assert bpf_stats.koordd_programs({}) == {} == bpf_stats.koordd_programs({"bpf": None})


def test_a_windows_cost_is_the_difference_of_two_readings_over_its_seconds():
    names = bpf_stats.koordd_programs(STATUS)
    before = {7: (1_000_000, 1_000), 40: (0, 0), 41: (500, 1)}
    after = {7: (9_000_000, 9_000), 40: (0, 0)}         # 41 gone by the end: left out
    costs = bpf_stats.cost(names, before, after, 2.0)
    assert costs == [{"program": "app_latency:app_read", "runs_per_s": 0.0, "ms_per_s": 0.0, "ns_per_run": None},
                     {"program": "runq_latency:runq_switch", "runs_per_s": 4000.0, "ms_per_s": 4.0,
                      "ns_per_run": 1000.0}]
    assert bpf_stats.words(costs) == "4.0 ms/s (runq_latency:runq_switch 4.0k runs/s at 1000 ns)"
    assert bpf_stats.words([]) == "0.0 ms/s"


def test_bench_qos_says_each_koordd_runs_program_cost_in_run_order():
    cost = [{"program": "runq_latency:runq_switch", "runs_per_s": 160_000.0, "ms_per_s": 144.0, "ns_per_run": 900.0}]
    runs = [{"setup": "be-idle", "load": 15, "rep": 0},
            {"setup": "koordd-slo-3", "load": 15, "rep": 1, "koordd_bpf": cost},
            {"setup": "koordd-slo-3", "load": 15, "rep": 0, "koordd_bpf": cost},
            {"setup": "koordd-slo-1.5", "load": 15, "rep": 0}]          # without --bpf-stats: no line
    assert bpf_notes(runs) == [
        "koordd-slo-3's BPF programs in its windows (kernel.bpf_stats_enabled, which adds two clock reads a run): "
        "15% rep 2: 144.0 ms/s (runq_latency:runq_switch 160.0k runs/s at 900 ns); "
        "15% rep 1: 144.0 ms/s (runq_latency:runq_switch 160.0k runs/s at 900 ns)"]


def test_bench_qos_says_what_koordds_own_process_used_beside_other_cpu():
    from koordtest.bench.qos_cli import trust_notes
    base = {"ls": None, "cpu": {"other": 0.1}, "reclaim_scanned": 0}
    runs = [dict(base, setup="be-idle"), dict(base, setup="koordd", koordd_cpu=0.004, be_cpu_max="max 100000"),
            dict(base, setup="koordd", koordd_cpu=0.012, be_cpu_max="max 100000")]
    assert ("of it koordd's own process (all its threads) in its windows: median 8.0 ms/s, 4.0-12.0 over 2 runs; "
            "its BPF programs run in other tasks' time") in trust_notes(runs)
    assert not any("own process" in n for n in trust_notes(runs[:1]))
