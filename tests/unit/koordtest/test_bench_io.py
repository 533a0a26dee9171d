"""scripts/bench-io's pure parts (koordtest/bench/io_qos.py): fio's command lines and JSON, the kernel's text, the statistics and the
report, koordd's config (koordd must accept it, with io_qos the only loop on), the run order and the
iocost restore. No fio, no root."""
from __future__ import annotations

import json

import pytest

from koordd.core.config import parse_config
from koordd.runtime.docs import shipped_loops
from koordtest.bench import io_qos as bench


def fio_json(direction: str, iops: float, bw: int, p50_ns: int, p99_ns: int, p999_ns: int, jobs: int = 1,
             prefix: str = "") -> str:
    def job(i):
        empty = {"iops": 0, "bw_bytes": 0, "total_ios": 0, "clat_ns": {"percentile": {}}}
        d = {"iops": iops, "bw_bytes": bw, "total_ios": int(iops * 10),
             "clat_ns": {"mean": 1.0, "percentile": {"50.000000": p50_ns * (i + 1), "90.000000": 1,
                                                     "99.000000": p99_ns * (i + 1), "99.900000": p999_ns * (i + 1)}}}
        return {"jobname": "x", "error": 0, "read": d if direction == "read" else empty,
                "write": d if direction == "write" else empty}
    return prefix + json.dumps({"fio version": "fio-3.33", "jobs": [job(i) for i in range(jobs)]})


# --- fio ----------------------------------------------------------------------------------------------

def test_parse_fio_reads_percentiles_in_seconds():
    out = bench.parse_fio(fio_json("read", 400.5, 1_640_000, 120_000, 2_500_000, 9_000_000), "read")
    assert out["iops"] == 400.5 and out["bytes_per_s"] == 1_640_000 and out["ios"] == 4005
    assert out["p50"] == pytest.approx(120e-6) and out["p99"] == pytest.approx(2.5e-3)
    assert out["p999"] == pytest.approx(9e-3)
    assert out["errors"] == 0


def test_parse_fio_skips_warnings_before_the_json():
    text = fio_json("write", 3000, 3_000_000_000, 1, 2, 3, prefix="fio: some warning\nnote: x\n")
    assert bench.parse_fio(text, "write")["bytes_per_s"] == 3_000_000_000


def test_parse_fio_several_jobs_add_up_and_take_the_worst_percentile():
    out = bench.parse_fio(fio_json("read", 100, 1000, 10, 20, 30, jobs=2), "read")
    assert out["iops"] == 200 and out["bytes_per_s"] == 2000
    assert out["p99"] == pytest.approx(40e-9)          # the second job's, the worse one


def test_parse_fio_without_percentiles_gives_none():
    text = json.dumps({"jobs": [{"read": {"iops": 1, "bw_bytes": 1}, "write": {}}]})
    assert bench.parse_fio(text, "read")["p99"] is None


@pytest.mark.parametrize("text", ["", "fio: failed", json.dumps({"jobs": []})])
def test_parse_fio_refuses_what_is_not_a_report(text):
    with pytest.raises(ValueError):
        bench.parse_fio(text, "read")


def jobs(**kw):
    base = dict(device="/dev/loop7", size=1 << 30, ls_jobs=2, ls_iops=400, be_iodepth=16, be_buffered=False,
                warmup=5, seconds=15)
    base.update(kw)
    return bench.Jobs(**base)


def test_ls_job_reads_the_first_half_synchronously_at_its_rate(tmp_path):
    args = bench.fio_ls_args(jobs(), 7, tmp_path / "ls.json")
    assert {"--rw=randread", "--bs=4k", "--direct=1", "--ioengine=psync", "--numjobs=2", "--offset=0",
            f"--size={512 << 20}", "--rate_iops=200", "--randseed=7", "--ramp_time=5", "--runtime=15",
            "--group_reporting", "--output-format=json", f"--output={tmp_path / 'ls.json'}"} <= set(args)
    assert args[0] == "fio" and "--filename=/dev/loop7" in args


def test_be_job_writes_the_second_half_direct_by_default(tmp_path):
    args = bench.fio_be_args(jobs(), tmp_path / "be.json")
    assert {"--rw=write", "--bs=1M", "--direct=1", "--ioengine=libaio", "--iodepth=16", f"--offset={512 << 20}",
            f"--size={512 << 20}", "--ramp_time=5", "--runtime=15"} <= set(args)
    buffered = bench.fio_be_args(jobs(be_buffered=True), tmp_path / "be.json")
    assert "--direct=0" in buffered and not any(a.startswith("--iodepth") for a in buffered)


def test_the_halves_are_mib_aligned():
    assert jobs(size=(100 << 20) + 12345).half == 50 << 20
    assert jobs(size=(101 << 20)).half == 50 << 20


# --- the kernel's text --------------------------------------------------------------------------------

def test_psi_some_total():
    text = "some avg10=1.00 avg60=0.50 avg300=0.10 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=99\n"
    assert bench.psi_some_total(text) == 123456
    with pytest.raises(ValueError):
        bench.psi_some_total("full avg10=0 total=1\n")


def test_wbps_of_io_max():
    text = "7:0 rbps=max wbps=52428800 riops=max wiops=max\n8:0 rbps=max wbps=1 riops=max wiops=max"
    assert bench.wbps_of(text, "7:0") == 52428800
    assert bench.wbps_of(text, "9:0") is None
    assert bench.wbps_of("", "7:0") is None
    assert bench.wbps_of("7:0 rbps=10 wbps=max riops=max wiops=max", "7:0") is None


def test_pressure_over_the_window():
    # 250 ms of stall per second between t=2 and t=6; the samples outside the window are ignored.
    samples = [(0.0, 0, None), (1.0, 9_000_000, None), (2.0, 10_000_000, None), (4.0, 10_500_000, None),
               (6.0, 11_000_000, None), (8.0, 99_000_000, None)]
    assert bench.pressure_percent(samples, 2.0, 6.0) == pytest.approx(25.0)
    assert bench.pressure_percent(samples, 2.5, 3.0) is None          # fewer than two samples
    assert bench.pressure_percent([(2.0, None, None), (3.0, None, None)], 0, 9) is None


def test_limit_stats_weigh_each_value_by_how_long_it_held():
    samples = [(0.0, 0, 100), (1.0, 0, 100), (2.0, 0, 300), (4.0, 0, None)]
    # In [1, 5]: 100 for 1 s, 300 for 2 s, none for 1 s.
    s = bench.limit_stats(samples, 1.0, 5.0)
    assert s["mean"] == pytest.approx((100 * 1 + 300 * 2) / 3)
    assert (s["min"], s["max"]) == (100, 300)
    assert s["unlimited_share"] == pytest.approx(0.25)
    assert bench.limit_stats([(0.0, 0, None)], 0, 1) == {"mean": None, "min": None, "max": None,
                                                         "unlimited_share": 1.0}
    assert bench.limit_stats(samples, 10, 11) is None


# --- koordd's config ----------------------------------------------------------------------------------

def test_koordd_accepts_the_config_with_io_qos_the_only_loop(tmp_path):
    text = bench.koordd_config("koordd-io-1/ls", "koordd-io-1/be", tmp_path / "state", "7:0", 1 << 30,
                               {"io_pressure_target": 20.0, "floor_percent": 2})
    config = parse_config(text, "bench-io.toml", shipped_loops())
    assert {r.name: list(r.patterns) for r in config.classes} == {"LS": ["koordd-io-1/ls"], "BE": ["koordd-io-1/be"]}
    assert config.daemon.state_dir == str(tmp_path / "state")
    assert [name for name, s in config.loops.items() if s.enabled] == ["io_qos"]
    io = config.loops["io_qos"]
    assert io.devices == ("7:0",) and io.dynamic and not io.follow_slo
    assert io.be_io_max == f"rbps=max wbps={1 << 30} riops=max wiops=max"
    assert io.io_pressure_target == 20.0 and io.floor_percent == 2
    assert io.interval == pytest.approx(1.0)      # the loop's default, as an operator gets it


def test_koordd_option_values_read_as_toml():
    assert bench.parse_option("io_pressure_target=20") == ("io_pressure_target", 20)
    assert bench.parse_option(" interval = \"250ms\" ") == ("interval", "250ms")
    assert bench.parse_option("interval=1s") == ("interval", "1s")            # a bare word: a string
    assert bench.parse_option("follow_slo=true") == ("follow_slo", True)
    with pytest.raises(ValueError):
        bench.parse_option("no_equals")


def test_effective_options_are_what_koordd_gets():
    opts = bench.effective_koordd_options({"cut_percent": 30.0})
    assert opts["cut_percent"] == 30.0 and opts["io_pressure_target"] == 10.0 and opts["dynamic"] is True
    assert opts["calm_rounds"] == 3 and opts["interval"] == 1.0           # the loop's defaults, shown


# --- the run order, statistics and report -----------------------------------------------------------------

def test_every_setup_once_per_repetition_in_a_seeded_order():
    setups = ["ls-alone", "none", "static", "koordd"]
    order = bench.run_order(setups, 3, seed=5)
    assert len(order) == 12
    for rep in range(3):
        assert sorted(s for r, s in order if r == rep) == sorted(setups)
    assert [r for r, _ in order] == sorted(r for r, _ in order)          # repetitions do not mix
    assert order == bench.run_order(setups, 3, seed=5)
    assert any(bench.run_order(setups, 3, seed=s) != order for s in range(6, 12))


def run(setup, p99, be=None, pressure=None, limit=None, rep=0):
    rec = {"setup": setup, "rep": rep, "ls": {"p50": p99 / 10, "p99": p99, "p999": p99 * 2, "iops": 400.0,
                                              "errors": 0},
           "ls_io_pressure": pressure, "be_limit": {"mean": limit} if limit else None}
    if be is not None:
        rec["be"] = {"bytes_per_s": be, "errors": 0}
    return rec


RUNS = [run("ls-alone", 0.001, pressure=4.0), run("ls-alone", 0.003, rep=1, pressure=5.0),
        run("none", 0.010, be=2e9, pressure=99.0), run("none", 0.030, be=4e9, rep=1),
        run("static", 0.002, be=5e7, limit=5e7), run("static", 0.004, be=5e7, limit=5e7, rep=1),
        run("koordd", 0.004, be=3e8, limit=2.5e8)]


def test_summarise_medians_ratios_and_spreads():
    rows = {r.setup: r for r in bench.summarise(RUNS, bench.SETUPS)}
    assert list(rows) == ["ls-alone", "none", "static", "koordd"]          # SETUPS order; iocost had no run
    base = 0.002                                                          # ls-alone's median p99
    assert rows["ls-alone"].ls_ms["p99"].median == pytest.approx(2.0)
    assert rows["ls-alone"].p99_ratio.low == pytest.approx(0.5) and rows["ls-alone"].p99_ratio.high == 1.5
    assert rows["none"].p99_ratio.median == pytest.approx(0.020 / base)
    assert rows["none"].be_share.median == pytest.approx(1.0)              # over none's median, 3e9
    assert rows["static"].be_share.median == pytest.approx(5e7 / 3e9)
    assert rows["static"].be_mbps.median == pytest.approx(50)
    assert rows["koordd"].be_limit_mbps.median == pytest.approx(250) and rows["koordd"].reps == 1
    assert rows["ls-alone"].be_mbps is None and rows["ls-alone"].be_share is None
    assert rows["ls-alone"].ls_pressure.median == pytest.approx(4.5)
    assert rows["none"].be_limit_mbps is None


def test_summarise_without_baselines_leaves_ratios_out():
    rows = bench.summarise([run("koordd", 0.004, be=3e8)], bench.SETUPS)
    assert rows[0].p99_ratio is None and rows[0].be_share is None


def test_markdown_page():
    rows = bench.summarise(RUNS, bench.SETUPS)
    page = bench.markdown(rows, "sudo scripts/bench-io --reps 2", ["host: test"], ["a note"])
    assert page.startswith("# koordd IO QoS benchmark")
    assert "```console\nsudo scripts/bench-io --reps 2\n```" in page
    assert "- host: test" in page and "- a note" in page
    lines = [line for line in page.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| setup | LS p50 (ms) | LS p99 (ms)")
    assert len(lines) == 1 + 4
    static = next(line for line in lines if line.startswith("| static "))
    assert "| 3.00 (2.00-4.00) |" in static and "| 50 |" in static
    assert all(line.count("|") == len(bench.COLUMNS) + 1 for line in lines)


def test_decisions_summary():
    decisions = [{"loop": "io_qos", "outcome": "applied", "reason": {"step": "cut: x", "ls_io_pressure": 30.0}},
                 {"loop": "io_qos", "outcome": "applied", "reason": {"step": "raise", "ls_io_pressure": 1.0}},
                 {"loop": "io_qos", "outcome": "applied", "reason": {"step": "raise", "ls_io_pressure": 2.0}},
                 {"loop": "io_qos", "outcome": "restored", "reason": {}}]
    out = bench.summarise_decisions(decisions)
    assert out["decisions"] == {"applied": 3, "restored": 1}
    assert out["steps"] == {"cut: x": 1, "raise": 2}
    assert out["ls_io_pressure_seen"] == [1.0, 2.0, 30.0]


# --- iocost's restore, argument checks -------------------------------------------------------------------

@pytest.mark.parametrize("original, want", [
    (None, "7:0 enable=0"),
    ("7:0 enable=0 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00",
     "7:0 enable=0 ctrl=auto"),
    ("7:0 enable=1 ctrl=user rpct=95.00 rlat=5000 wpct=95.00 wlat=5000 min=50.00 max=150.00",
     "7:0 enable=1 ctrl=user rpct=95.00 rlat=5000 wpct=95.00 wlat=5000 min=50.00 max=150.00"),
])
def test_iocost_line_restore(original, want):
    assert bench.restore_iocost_line("7:0", original) == want


def test_iocost_context_puts_the_line_back(tmp_path):
    qos = tmp_path / "io.cost.qos"
    qos.write_text("7:0 enable=0 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00\n")
    writes = []

    class Recording(bench.Iocost):
        def __enter__(self):
            self.original = self.line()
            writes.append(f"{self.disk} {self.qos}")
            return self

        def __exit__(self, *exc):
            writes.append(bench.restore_iocost_line(self.disk, self.original))

    with Recording("7:0", "enable=1 ctrl=auto", cgroup=tmp_path):
        pass
    assert writes == ["7:0 enable=1 ctrl=auto", "7:0 enable=0 ctrl=auto"]


def test_arguments():
    args = bench.parse_args(["--static-wbps", "20M", "--koordd-option", "floor_percent=2", "--setups",
                             "ls-alone,koordd"])
    assert args.static_rate == (20 << 20, None) and args.koordd_rate == (1 << 30, None) and args.size == 1 << 30
    assert args.koordd_options == {"floor_percent": 2} and args.setups == ["ls-alone", "koordd"]
    for bad in (["--setups", "ls-alone,bogus"], ["--device", "/dev/sdz"], ["--static-wbps", "max"],
                ["--size", "1M"], ["--reps", "0"], ["--koordd-option", "x"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    assert bench.parse_args(["--device", "/dev/sdz", "--destroy-data"]).device == "/dev/sdz"


def test_rates_in_bytes_or_a_share_of_be_alone():
    assert bench.parse_rate("50M") == (50 << 20, None)
    assert bench.parse_rate("10%") == (None, pytest.approx(0.1))
    assert bench.resolve_rate((50 << 20, None), None) == 50 << 20
    assert bench.resolve_rate((None, 0.1), 3e9) == 300_000_000
    for bad in ("max", "0", "0%", "x%"):
        with pytest.raises(ValueError):
            bench.parse_rate(bad)
    with pytest.raises(ValueError):
        bench.resolve_rate((None, 0.1), None)
    assert bench.parse_args(["--static-wbps", "5%"]).static_rate == (None, pytest.approx(0.05))


def test_check_host_refusals(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.os, "geteuid", lambda: 1000)
    with pytest.raises(bench.Refusal, match="root"):
        bench.check_host([])
    monkeypatch.setattr(bench.os, "geteuid", lambda: 0)
    monkeypatch.setattr(bench.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    with pytest.raises(bench.Refusal, match="io controller"):
        bench.check_host([], tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu io memory\n")
    assert bench.check_host([], tmp_path) == bench.Host("v2", ("cpu", "io"), False)
    with pytest.raises(bench.Refusal, match="CONFIG_BLK_CGROUP_IOCOST"):
        bench.check_host(["iocost"], tmp_path)
    (tmp_path / "io.cost.qos").write_text("")
    assert bench.check_host(["iocost"], tmp_path).iocost
    hybrid = tmp_path / "hybrid"
    (hybrid / "blkio").mkdir(parents=True)
    with pytest.raises(bench.Refusal, match="blkio throttle"):
        bench.check_host([], hybrid)
    (hybrid / "blkio" / "blkio.throttle.write_bps_device").write_text("")
    (hybrid / "unified").mkdir()
    (hybrid / "unified" / "cgroup.procs").write_text("")
    assert bench.check_host([], hybrid).mode == "hybrid"
    with pytest.raises(bench.Refusal, match="needs cgroup v2"):
        bench.check_host(["iocost"], hybrid)
    monkeypatch.setattr(bench.shutil, "which", lambda tool: None if tool == "fio" else "/bin/x")
    with pytest.raises(bench.Refusal, match="apt-get install fio"):
        bench.check_host([], hybrid)


def test_a_run_without_percentiles_is_shown_not_a_crash():
    # fio 3.33 left clat percentiles out of one LS report (ramp_time 25 s, runtime 15 s): the run goes on.
    record = {"rep": 0, "setup": "koordd", "ls": {"p50": None, "p99": None, "p999": None, "iops": 400.0}}
    line = bench.progress_line(0, 2, record)
    assert "LS p50      - p99       - p99.9       - ms, 400 IOPS" in line


def test_a_warm_up_longer_than_the_window_is_refused(capsys):
    # fio 3.33 with a rate limit reports no percentiles when ramp_time passes runtime (measured: ramp 6 s,
    # runtime 3 s: no IO counted; ramp 25 s, runtime 15 s: no percentiles).
    with pytest.raises(SystemExit):
        bench.parse_args(["--warmup", "25", "--seconds", "15"])
    assert "--warmup longer than --seconds" in capsys.readouterr().err
    assert bench.parse_args(["--warmup", "15", "--seconds", "15"]).warmup == 15
