"""The configs scripts/soak and scripts/bench-overhead give koordd (koordtest/bench/soak.py, overhead.py):
koordd accepts each, with LS and BE on the benchmark's own tree and the loops meant on; and soak's
arithmetic of growth. No root: text only."""
from __future__ import annotations

from pathlib import Path

import pytest

from koordd.core.config import parse_config
from koordd.runtime.docs import shipped_loops
from koordtest.bench import overhead, soak

LOOPS = ["be_suppress", "cpu_burst", "qos_baseline", "memory_evict", "avx_weight", "net_shaping", "llc_partition",
         "sched_ext"]


def test_the_soak_config_runs_every_loop_it_names_at_half_a_second_on_its_tree():
    config = parse_config(soak.config_text("koordd-soak-7", Path("/tmp/s"), LOOPS, "kds7"), "soak.toml",
                          shipped_loops())
    assert {name: s.interval for name, s in config.loops.items() if s.enabled} == dict.fromkeys(LOOPS, 0.5)
    assert [(r.name, r.patterns) for r in config.classes] == [("LS", ("koordd-soak-7/ls",)),
                                                              ("BE", ("koordd-soak-7/be",))]
    assert config.daemon.state_dir == "/tmp/s" and config.daemon.cgroup_root == ""
    assert config.loops["memory_evict"].scope == "koordd-soak-7" and config.loops["be_suppress"].rule == "slack"
    assert config.loops["net_shaping"].devices == ("kds7:100000000",)
    fewer = parse_config(soak.config_text("koordd-soak-7", Path("/tmp/s"), LOOPS[:5], None), "soak.toml",
                         shipped_loops())
    assert {name for name, s in fewer.loops.items() if s.enabled} == set(LOOPS[:5])


@pytest.mark.parametrize("shipped", [False, True], ids=["every-loop", "shipped"])
@pytest.mark.parametrize("port", [None, 9100], ids=["no-metrics", "metrics"])
def test_the_overhead_configs_are_koordds_with_or_without_the_metrics_endpoint(shipped, port):
    # --config shipped --metrics on once appended a second [metrics] table to the shipped config's own.
    config = parse_config(overhead.config_for("koordd-bench-7", "/tmp/fake", Path("/tmp/st"), shipped, port),
                          "overhead.toml", shipped_loops())
    assert config.daemon.cgroup_root == "/tmp/fake" and config.daemon.state_dir == "/tmp/st"
    assert {r.name: r.patterns for r in config.classes}["BE"] == ("koordd-bench-7/be",)
    assert (config.metrics.enable, config.metrics.listen) == ((True, "127.0.0.1:9100") if port else
                                                              (False, config.metrics.listen))
    on = {name for name, s in config.loops.items() if s.enabled}
    assert on == ({"be_suppress", "qos_baseline"} if shipped else
                  {"be_suppress", "cpu_burst", "qos_baseline", "memory_evict"})


def test_soak_growth_after_the_warmup_and_its_slope_per_hour():
    samples = [{"t": t, **dict.fromkeys(soak.METRICS, 100)} for t in (0.0, 60.0, 120.0, 180.0)]
    for s in samples:
        s["rss_kib"] = 1000 + 2 * int(s["t"])           # 2 KiB a second: 7200 an hour
    summary = soak.summarize(samples, warmup=60.0)
    assert summary["rss_kib"] == {"at_start": 1000, "after_warmup": 1120, "end": 1360, "peak": 1360, "growth": 240,
                                  "slope_per_hour": 7200.0}
    assert summary["fds"]["growth"] == 0 and summary["fds"]["slope_per_hour"] == 0.0
    assert soak.slope_per_hour([(0.0, 1.0), (1.0, 2.0)]) is None       # too few points to say
