"""scripts/bench-wakeup's logic (koordtest/bench/wakeup.py): the ABBA order, the request held only in the
"held" mode and dropped after it (a stand-in device file), the table and the same-run differences. No
timing is asserted: the numbers are the benchmark's, on the real device."""
from __future__ import annotations

import struct

from koordtest.bench import wakeup
from koordtest.bench.wakeup import Measure, order, paired, table
from unit.backends.test_pm_qos import fds_on


def test_the_mode_that_goes_first_alternates():
    assert [order(r) for r in range(4)] == [("released", "held"), ("held", "released")] * 2


def test_the_request_is_held_only_while_the_held_mode_runs(tmp_path, monkeypatch):
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(struct.pack("i", 2_000_000_000))
    seen = []

    def probe(name):
        def run(*args):
            seen.append((name, fds_on(device)))
            return [1.0, 2.0, 3.0]
        return run
    monkeypatch.setattr(wakeup, "pingpong", probe("pingpong"))
    monkeypatch.setattr(wakeup, "timer", probe("timer"))
    got = wakeup.bench(2, 3, 100.0, device=device, log=lambda line: None)
    assert [(m.run, m.mode, m.probe) for m in got] == [
        (0, "released", "pingpong"), (0, "released", "timer"), (0, "held", "pingpong"), (0, "held", "timer"),
        (1, "held", "pingpong"), (1, "held", "timer"), (1, "released", "pingpong"), (1, "released", "timer")]
    assert [n for _, n in seen] == [0, 0, 1, 1, 1, 1, 0, 0]
    assert struct.unpack("i", device.read_bytes()[:4])[0] == 0 and fds_on(device) == 0
    assert {(m.p50, m.p99) for m in got} == {(2.0, 3.0)}


def test_the_probes_run():
    """One real round of each probe, a handful of samples: values come back, the child is reaped."""
    rt = wakeup.pingpong(5, 100.0)
    over = wakeup.timer(5, 100.0)
    assert len(rt) == 5 and all(v > 0 for v in rt) and len(over) == 5


def test_the_report_gives_medians_ranges_and_same_run_differences():
    ms = [Measure(r, mode, probe, p50, p99, 0.1) for r, (a, b) in enumerate([(90, 70), (100, 75), (95, 96)])
          for mode, (p50, p99) in (("released", (50, a)), ("held", (40, b))) for probe in ("pingpong", "timer")]
    rows = table(ms)
    assert "| pingpong | released | 3 | 50.0 | 95.0 (90.0-100.0) | 0.1 |" in rows
    assert "| pingpong | held | 3 | 40.0 | 75.0 (70.0-96.0) | 0.1 |" in rows
    lines = paired(ms)
    assert "pingpong p99: held - released, same run: median -20.0 µs (range -25.0 to +1.0); held lower in 2 of 3 runs" \
        in lines
