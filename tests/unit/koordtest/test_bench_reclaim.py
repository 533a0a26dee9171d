"""scripts/bench-reclaim's pure parts (koordtest/bench/reclaim.py): the parsers of the cgroup files and the workload's rate log, the
window's arithmetic, koordd's config, the run order, the per-arm summary, the verdict and the report.
No root, no VM: made-up runs."""
from __future__ import annotations

import tomllib

import pytest

from koordd.core.config import parse_config
from koordd.runtime.docs import shipped_loops
from koordtest.bench import reclaim as br
MiB = 1 << 20


def run(arm: str, rep: int, rates: list[float], start_mib: int = 360, end_mib: int = 360,
        applied_mib: int | None = None, refault_pages: int = 0, busy: float = 1.0, koordd: float = 0.0) -> dict:
    """A run record as run_one writes it."""
    return {"rep": rep, "arm": arm, "seconds": 30.0,
            "throughput": {"median": sorted(rates)[len(rates) // 2], "min": min(rates), "max": max(rates),
                           "n": len(rates)},
            "memory": {"start": start_mib * MiB, "end": end_mib * MiB},
            "psi": {"some_percent": 0.01, "full_percent": 0.0, "some_avg10_end": 0.0},
            "stat_delta": {"workingset_refault_file": refault_pages, "pgsteal": (applied_mib or 0) * 256},
            "cpu": {"workload": 0.98, "koordd": koordd, "koordd_sys": koordd / 2, "node_busy": busy},
            "reclaim": None if applied_mib is None else {"outcomes": {"applied": 5}, "steps": 5,
                                                         "asked_bytes": applied_mib * MiB,
                                                         "applied_bytes": applied_mib * MiB,
                                                         "psi_at_decisions_max": 0.1}}


def test_parse_flat_reads_key_value_lines_and_skips_the_rest():
    text = "anon 1000\nfile 2000\nworkingset_refault_file 7\nbogus line here\nnan x\n"
    assert br.parse_flat(text) == {"anon": 1000, "file": 2000, "workingset_refault_file": 7}


def test_counter_deltas_only_for_counters_both_samples_have():
    before = {"pgscan": 10, "pgsteal": 5, "workingset_refault_file": 1}
    after = {"pgscan": 30, "pgsteal": 9, "workingset_refault_file": 1, "pgscan_proactive": 4}
    assert br.counter_deltas(before, after) == {"pgscan": 20, "pgsteal": 4, "workingset_refault_file": 0}


def test_psi_fields_from_the_kernels_text():
    text = ("some avg10=1.50 avg60=0.20 avg300=0.00 total=123456\n"
            "full avg10=0.50 avg60=0.10 avg300=0.00 total=6543\n")
    assert br.psi_fields(text) == {"psi_some_total": 123456, "psi_some_avg10": 1.5, "psi_full_total": 6543}
    assert br.psi_fields("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n")["psi_full_total"] == 0


def test_rate_log_ready_line_samples_and_a_torn_last_line():
    text = "ready 100.000\n101.0 120.5\n102.0 119.0\n103.0 1"
    ready, samples = br.parse_rate_log(text + "\n103.5")
    assert ready == 100.0
    assert samples == [(101.0, 120.5), (102.0, 119.0), (103.0, 1.0)]
    assert br.parse_rate_log("") == (None, [])


def test_rate_times_count_only_seconds_wholly_inside_the_window():
    samples = [(100.0, 1.0), (101.0, 2.0), (102.0, 3.0), (103.0, 4.0), (104.0, 5.0)]
    # Window 100.5..103.5: the second ending at 101.0 began before it; 102 and 103 lie inside.
    assert br.rate_times(samples, 100.5, 103.5) == [(1.5, 3.0), (2.5, 4.0)]
    assert br.rate_times(samples, 100.0, 104.0) == [(1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0)]


def test_split_by_reclaim_judges_each_second_by_the_memory_samples_around_it():
    trajectory = [(0.0, 300 * MiB), (1.0, 290 * MiB), (2.0, 290 * MiB), (3.0, 280 * MiB), (4.0, 280 * MiB)]
    rates_at = [(1.02, 100.0), (2.0, 120.0), (3.01, 90.0), (4.0, 118.0), (5.0, 99.0)]
    active, quiet = br.split_by_reclaim(rates_at, trajectory)
    assert active == [100.0, 90.0] and quiet == [120.0, 118.0]         # 5.0: no sample after it


def test_reclaim_seconds_note_pools_the_runs():
    r = run("koordd", 1, [100, 120], applied_mib=10)
    r["rates_at"] = [(1.0, 100.0), (2.0, 120.0)]
    r["trajectory"] = [(0.0, 300 * MiB), (1.0, 290 * MiB), (2.0, 290 * MiB)]
    assert br.reclaim_seconds_note([r]) == ("`koordd` per second: 100.0 passes/s (median of 1 s) in the seconds "
                                            "memory.current fell by more than 1 MiB, 120.0 (of 1 s) in the others")
    assert br.reclaim_seconds_note([run("koordd", 1, [100])]) is None


def test_parse_options_reads_values_as_toml():
    got = br.parse_options(["psi_target=0.5", "min_step=\"4M\"", "max_step_percent = 5", "grow_percent=100",
                            "backoff=10s"])
    assert got == {"psi_target": 0.5, "min_step": "4M", "max_step_percent": 5, "grow_percent": 100,
                   "backoff": "10s"}


@pytest.mark.parametrize("bad", ["psi_target", "=1", "x=", "enabled=false", "classes=[\"LS\"]"])
def test_parse_options_refuses(bad):
    with pytest.raises(ValueError):
        br.parse_options([bad])


def test_loop_section_is_the_shipped_one_enabled_with_the_options_over_it():
    shipped = tomllib.loads(br.SHIPPED_CONFIG.read_text())["loops"]["proactive_reclaim"]
    section = br.loop_section(br.SHIPPED_CONFIG, {"psi_target": 0.5})
    assert section["enabled"] is True and section["psi_target"] == 0.5
    assert section["min_step"] == shipped["min_step"] and section["interval"] == shipped["interval"]


@pytest.mark.parametrize("dry", [False, True])
def test_koordd_config_is_accepted_by_koordd_with_one_class_and_one_loop(tmp_path, dry):
    section = br.loop_section(br.SHIPPED_CONFIG, br.parse_options(["psi_target=0.5", "min_step=4M"]))
    text = br.koordd_config(tmp_path / "state", section, dry_run=dry)
    config = parse_config(text, "bench.toml", shipped_loops())
    assert [(r.name, r.patterns) for r in config.classes] == [("BE", (br.SLICE,))]
    assert config.daemon.state_dir == str(tmp_path / "state") and config.daemon.dry_run is dry
    assert [name for name, s in config.loops.items() if s.enabled] == ["proactive_reclaim"]
    pr = config.loops["proactive_reclaim"]
    assert pr.psi_target == 0.5 and pr.min_step == "4M" and pr.classes == ("BE",)


def test_koordd_config_refuses_a_bad_option_through_koordds_loader(tmp_path):
    from koordd.core.config import ConfigError
    section = br.loop_section(br.SHIPPED_CONFIG, {"psi_target": -1})
    with pytest.raises(ConfigError):
        parse_config(br.koordd_config(tmp_path, section, False), "bench.toml", shipped_loops())


def test_run_order_rotates_the_arms_every_repetition():
    assert br.run_order(["off", "koordd"], 3) == [(1, "off"), (1, "koordd"), (2, "koordd"), (2, "off"),
                                                  (3, "off"), (3, "koordd")]
    order = br.run_order(["off", "koordd", "dry"], 3)
    assert [arm for _, arm in order] == ["off", "koordd", "dry", "koordd", "dry", "off", "dry", "off", "koordd"]


def test_reclaim_decisions_counts_the_window_and_the_cgroup_only():
    cg = "reclaimbench.slice/reclaimbench-1-koordd.service"

    def d(t, outcome="applied", ask=4 * MiB, cgroup=cg, knob="memory.reclaim", psi=0.1):
        return {"time": t, "loop": "proactive_reclaim", "cgroup": cgroup, "knob": knob, "outcome": outcome,
                "reason": {"reclaim_bytes": ask, "psi_some_percent": psi}}
    decisions = [d(9.0), d(10.0), d(11.0, psi=0.3), d(12.0, "refused", 8 * MiB), d(12.5, cgroup="be.slice"),
                 d(13.0, knob="memory.swap.max"), d(21.0)]
    got = br.reclaim_decisions(decisions, cg, 10.0, 20.0)
    assert got == {"outcomes": {"applied": 2, "refused": 1}, "steps": 3, "asked_bytes": 16 * MiB,
                   "applied_bytes": 8 * MiB, "psi_at_decisions_max": 0.3,
                   "timeline": [(0.0, 4 * MiB, "applied", 0.1), (1.0, 4 * MiB, "applied", 0.3),
                                (2.0, 8 * MiB, "refused", 0.1)]}
    assert br.reclaim_decisions([], cg, 0, 1)["psi_at_decisions_max"] is None


def test_window_record_from_two_snapshots(monkeypatch):
    monkeypatch.setattr(br.os, "cpu_count", lambda: 2)
    a = {"mono": 100.0, "wall": 1e9, "current": 360 * MiB, "stat": {"pgsteal": 0, "workingset_refault_file": 0},
         "usage_usec": 0, "psi_some_total": 0, "psi_some_avg10": 0.0, "psi_full_total": 0,
         "node": (1000, 4000), "koordd": (1.0, 0.5)}
    b = {"mono": 110.0, "wall": 1e9 + 10, "current": 200 * MiB,
         "stat": {"pgsteal": 256 * 160, "workingset_refault_file": 256, "file": 50 * MiB},
         "usage_usec": 9_500_000, "psi_some_total": 20_000, "psi_some_avg10": 0.12, "psi_full_total": 10_000,
         "node": (1600, 5000), "koordd": (1.5, 1.5)}
    w = br.window_record(a, b)
    assert w["memory"] == {"start": 360 * MiB, "end": 200 * MiB}
    assert w["psi"] == {"some_percent": pytest.approx(0.2), "full_percent": pytest.approx(0.1),
                        "some_avg10_end": 0.12}
    assert w["stat_delta"] == {"pgsteal": 256 * 160, "workingset_refault_file": 256}
    assert w["stat_end"] == {"file": 50 * MiB}
    assert w["cpu"] == {"workload": pytest.approx(0.95), "koordd": pytest.approx(0.15),
                        "koordd_sys": pytest.approx(0.1), "node_busy": pytest.approx(1.2)}


RUNS = [run("off", 1, [120, 124, 126]), run("koordd", 1, [110, 118, 121], 360, 150, 200, 256, 1.2, 0.2),
        run("koordd", 2, [115, 119, 125], 360, 160, 190, 0, 1.15, 0.15), run("off", 2, [118, 122, 127]),
        run("off", 3, [119, 125, 128]), run("koordd", 3, [100, 112, 118], 360, 140, 210, 512, 1.25, 0.25)]


def test_summarise_gives_each_arm_median_and_range_over_runs():
    s = br.summarise(RUNS, ["off", "koordd"])
    assert s["off"]["throughput"] == br.Spread(124, 122, 125, 3)
    assert s["koordd"]["throughput"] == br.Spread(118, 112, 119, 3)
    assert s["koordd"]["mem_drop_mib"] == br.Spread(210, 200, 220, 3)
    assert s["koordd"]["reclaim_applied_mib"] == br.Spread(200, 190, 210, 3)
    assert s["koordd"]["refault_file_mib"] == br.Spread(1, 0, 2, 3)
    assert s["off"]["reclaim_applied_mib"] is None                 # no koordd, no decisions: not a zero
    assert s["off"]["throughput_min"] == br.Spread(119, 118, 120, 3)


def test_verdict_not_within_when_the_median_run_is_under_the_lowest_off_run():
    v = br.verdict(RUNS)
    assert v.within is False
    assert "`koordd` median 118.0 passes/s against `off`'s 124.0 (its runs 122.0-125.0): 0.952x" in v.text
    assert "3 of 3 `koordd` runs under `off`'s lowest" in v.text
    assert "paired ratios (same repetition) 0.952, 0.975, 0.896" in v.text
    assert "**Not within the spread of `off`**" in v.text


def test_verdict_within_and_above():
    runs = [run("off", 1, [100]), run("off", 2, [110]), run("koordd", 1, [105]), run("koordd", 2, [101])]
    v = br.verdict(runs)
    assert v.within is True and "**Within the spread of `off`**." in v.text and "0 of 2" in v.text
    above = br.verdict([run("off", 1, [100]), run("koordd", 1, [120])])
    assert above.within is True and "(above its highest)" in above.text


def test_verdict_without_both_arms():
    assert br.verdict([run("off", 1, [100])]).within is None


def test_markdown_has_the_command_the_table_the_verdict_and_every_run():
    text = br.markdown(RUNS, ["off", "koordd"], "python scripts/bench-reclaim --reps 3", ["host: test"], ["a note"])
    lines = text.splitlines()
    assert "python scripts/bench-reclaim --reps 3" in lines and "- host: test" in lines and "- a note" in lines
    assert "| | `off` | `koordd` |" in lines
    assert "| passes/s (median of runs' medians) | 124.0 (122.0-125.0) | 118.0 (112.0-119.0) |" in lines
    assert "| koordd: reclaim written (applied), MiB | - | 200 (190-210) |" in lines
    assert any(line.startswith("- `koordd` median 118.0") for line in lines)
    rows = [line for line in lines if line.startswith("| 1 | ") or line.startswith("| 2 | ") or line.startswith("| 3 | ")]
    assert len(rows) == 6
    assert "| 1 | koordd | 118.0 (110.0-121.0) | 360 → 150 | 200 (5) | 1.0 | 0.010 | 0.200 (0.100) | 1.20 |" in rows
    assert "| 1 | off | 124.0 (120.0-126.0) | 360 → 360 | - | 0.0 | 0.010 | 0.000 (0.000) | 1.00 |" in rows


def test_parse_args_checks_arms_and_sizes():
    args = br.parse_args(["--arms", "off,dry,koordd", "--option", "psi_target=0.5"])
    assert args.arms == ["off", "dry", "koordd"] and args.options == {"psi_target": 0.5}
    for bad in (["--arms", "off,bogus"], ["--arms", "off,off"], ["--hot-cache-mib", "300"], ["--reps", "0"],
                ["--option", "enabled=false"]):
        with pytest.raises(SystemExit):
            br.parse_args(bad)
