"""Hypervisor steal in bench-qos (koordtest/bench/steal.py): read per vCPU, placed in the client's windows,
and summed up in the frontier report against the windows that were slow."""
from __future__ import annotations

from koordd.sensors.node import CLOCK_TICKS as TICK
from koordtest.bench.steal import STOLEN_MS, StealSampler, steal_line, window_steal

TICK_MS = 1000 / TICK


def test_each_samples_growth_goes_to_the_window_it_falls_in_and_the_worst_vcpu_names_the_window():
    samples = [(10.0, [0, 0]), (11.0, [1, 0]),          # 1 tick on cpu0 in window 0
               (16.0, [1, 10]),                         # 10 ticks on cpu1 in window 1 (a 100 ms stall)
               (19.0, [3, 10]),                         # 2 more on cpu0 in window 1
               (25.0, [9, 10])]                         # after the window: not counted
    got = window_steal(samples, start=10.0, seconds=10.0, windows=2)
    assert got["windows_ms"] == [round(1 * TICK_MS), round(10 * TICK_MS)]
    assert got["ms"] == round(13 * TICK_MS)
    # a counter that went backwards (a CPU taken offline and back) adds nothing, rather than a negative
    assert window_steal([(0.0, [5]), (1.0, [2])], 0.0, 2.0, 1)["ms"] == 0


def test_the_sampler_reads_at_start_in_its_thread_and_at_stop():
    reads = iter([[0], [4], [4], [4], [4], [4], [4], [4], [4], [4], [4], [4]])
    sampler = StealSampler(read=lambda: next(reads, [4]), period=0.001).start()
    samples = sampler.stop()
    assert samples[0][1] == [0] and samples[-1][1] == [4] and len(samples) >= 2
    assert [t for t, _ in samples] == sorted(t for t, _ in samples)


def _run(setup, windows_p99_ms, stolen_ms, be=True, load=50):
    return {"setup": setup, "load": load, "be_work": 1.0 if be else None,
            "ls": {"windows": [{"count": 10, "p99": p / 1000} for p in windows_p99_ms]},
            "steal": {"ms": sum(stolen_ms), "windows_ms": stolen_ms}}


def test_the_report_line_counts_stolen_windows_with_be_and_alone_and_the_slow_ones_among_them():
    runs = [_run("ls-alone", [2, 2], [0, 0], be=False),
            _run("be-idle", [2, 40], [0, 100]),             # slow and stolen
            _run("koordd-slo-2", [30, 2], [0, STOLEN_MS]),  # slow, not stolen; a stolen one that was not slow
            _run("be-idle", [2, 2], [0, 0], load=20),       # another load: not counted
            {"setup": "be-alone", "load": None, "ls": None, "be_work": 1.0}]
    line = steal_line(runs, 50, alone_p99=0.002)
    assert "2 of 4 with BE, 0 of 2 with LS alone" in line
    assert "of the 2 windows whose p99 was over 3x LS alone's, 1 had lost one" in line
    assert steal_line([_run("be-idle", [2], [0], load=20)], 50, 0.002) is None
    # results from before steal was recorded (no "steal") give no line rather than zeros
    old = _run("be-idle", [2], [0])
    del old["steal"]
    assert steal_line([old], 50, 0.002) is None
