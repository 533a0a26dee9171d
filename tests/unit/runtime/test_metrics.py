"""The metrics endpoint: its config (loopback unless allowed, errors at their line), the series a published
state makes (parsed back from the exposition text), the allow-list and the cap, names a workload
chooses, /healthz, a scrape that fails, a port already taken, and a koordd process on a fake tree."""
from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from koordd.act.journal import Held
from koordd.core.config import ConfigError, METRICS_OPTIONS, make_settings, parse_config
from koordd.core.histogram import merged
from koordd.core.reclaimable import Capacity, Reclaimable
from koordd.core.catalogue import load_registry
from koordd.core.report import REPORT_OPTIONS, ReportWindow, build as build_report
from koordd.core.slo import SloTarget
from koordd.core.snapshot import (APP_LATENCY, AppLatency, CPI, CgroupSample, CpiSample, NodeSample, Pressure, PressureStat, RUNQ_LATENCY,
    RunqLatency, Snapshot, Throttling)
from koordd.runtime.capabilities import Capability
from koordd.runtime.metrics import (Exporter, HEALTH_STALE, MetricsServer, Published, RoundStats, SERIES, families,
    knob_number, label, selected)
from koordd.runtime.runner import Runner
from koordtest.metricsnode import free_port, get, run_koordd, wait_for

REGISTRY = load_registry()


def metrics_settings(**kw):
    return make_settings(METRICS_OPTIONS, {"enable": True, **kw})


def psi(avg10, total_us=2_000_000):
    line = Pressure(avg10, 0.0, 0.0, total_us)
    return PressureStat(some=line, full=None)


def snapshot(cgroups=(), members=None, sections=None) -> Snapshot:
    node = NodeSample(cpu_count=4, cpu_used=1.5, memory_total=8 << 30, memory_available=6 << 30,
                      cpu_pressure=psi(3.0), steal_worst=0.1)
    return Snapshot(time=10.0, wall=1_700_000_000.0, node=node, cgroups={c.path: c for c in cgroups},
                    members=members or {}, sections=sections or {})


LS = CgroupSample("ls.slice", "LS", cpu_usage=1.0, cpu_max="200000 100000", memory_current=1 << 30,
                  memory_max=str(2 << 30), cpu_pressure=psi(12.5), throttling=Throttling(10, 3, 1500))
BE = CgroupSample("be.slice", "BE", cpu_usage=0.5, cpu_max="50000 100000", memory_current=1 << 29)
SYSTEM = CgroupSample("system.slice", "SYSTEM", cpu_usage=0.1)


def published(snap=None, settings=None, **kw) -> Published:
    return Published(settings=settings or metrics_settings(), started=1_600_000_000.0,
                     info={"version": "0.1.0", "cgroups": "v2", "dry_run": "false"}, snapshot=snap, **kw)


def scrape(p: Published) -> dict[str, list]:
    """name -> samples, from the exposition text prometheus-client writes (parsed back by its parser)."""
    exporter = Exporter()
    exporter.publish(p)
    text = exporter.exposition().decode()
    return {s.name: s for fam in text_string_to_metric_families(text) for s in fam.samples} | \
        {"_all": [s for fam in text_string_to_metric_families(text) for s in fam.samples]}


def samples(p: Published, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for s in scrape(p)["_all"] if s.name == name}


# --- config -------------------------------------------------------------------------------------------

def config_errors(text: str) -> list[str]:
    try:
        parse_config(text, "koordd.toml", REGISTRY)
    except ConfigError as e:
        return e.errors
    return []


def test_off_by_default_on_loopback():
    c = parse_config("", "koordd.toml", REGISTRY)
    assert c.metrics.enable is False and c.metrics.listen == "127.0.0.1:9316"


@pytest.mark.parametrize("listen", ["127.0.0.1:9316", "[::1]:9316", "localhost:1", "127.1.2.3:65535"])
def test_loopback_addresses_are_taken(listen):
    assert config_errors(f'[metrics]\nenable = true\nlisten = "{listen}"\n') == []


@pytest.mark.parametrize("listen, why", [
    ("0.0.0.0:9316", "0.0.0.0 is not a loopback address"),
    ("[::]:9316", ":: is not a loopback address"),
    ("10.1.2.3:9316", "10.1.2.3 is not a loopback address"),
    ("example.com:9316", "'example.com' is not an IP address"),
    ("127.0.0.1", 'expected "address:port"'),
    ("127.0.0.1:0", "port must be 1..65535"),
    ("127.0.0.1:http", "port must be 1..65535"),
    ("::1:9316", "an IPv6 address goes in brackets"),
])
def test_other_addresses_are_refused_at_their_line(listen, why):
    [error] = config_errors(f'[daemon]\nlog_level = "info"\n\n[metrics]\nenable = true\nlisten = "{listen}"\n')
    assert error.startswith("koordd.toml:6: metrics.listen: ") and why in error


def test_allow_remote_lets_any_address_through():
    assert config_errors('[metrics]\nlisten = "0.0.0.0:9316"\nallow_remote = true\n') == []


def test_allow_list_options_are_checked():
    errors = config_errors('[metrics]\ncgroup_classes = ["LS", "GOLD"]\nmax_cgroups = -1\nbogus = 1\n')
    assert [e.split(": ")[0] for e in errors] == ["koordd.toml:2", "koordd.toml:3", "koordd.toml:4"]


# --- series -------------------------------------------------------------------------------------------

def node_report():
    """A node report with one workload (an SLO and its responses) and the class roots as tenants."""
    ls = CgroupSample("ls.slice", "LS", cpu_usage=1.0, memory_current=1 << 30)
    snap = Snapshot(time=10.0, wall=1.0, node=NodeSample(4, 1.5, 8 << 30, 6 << 30), cgroups={"ls.slice": ls},
                    sections={APP_LATENCY: {"ls.slice": AppLatency(100, 1, 1, 1, 1, 1, slots=(0,) * 10 + (100,))}},
                    slo={"ls.slice": SloTarget(1000.0)})
    return build_report(snap, make_settings(REPORT_OPTIONS, {}), ReportWindow())


def test_every_series_made_is_declared_with_its_labels():
    runq = {"ls.slice": RunqLatency("ebpf", 300, 40.0, 30.0, 900.0, 2048.0, slots=(0, 10, 100, 150, 40))}
    cpi = {"ls.slice": CpiSample(3e9, 2e9, 1.0)}
    p = published(snapshot((LS, BE, SYSTEM), sections={RUNQ_LATENCY: runq, CPI: cpi}),
                  loops={"be_suppress": {"interval": 1.0, "ticks": 5, "errors": 1, "failures": 0, "last_seconds": 0.001,
                                         "seconds_total": 0.01, "cpu_seconds_total": 0.009, "last_ok": 1.7e9,
                                         "last_changes": 1, "report": {"levers": {"be_cap": {"by_signal": {
                                             "app_p99_us": {"helped": 2, "bought_nothing": 1, "retracted": 1, "mean_gain": 900.0,
                                                            "mean_be_cores_given_up": 0.5}}}}}}},
                  decisions={("be_suppress", "applied", "cpu.max"): 3},
                  held=(Held("be.slice", "cpu.max", "max 100000", "be_suppress", 1.0),),
                  held_values={("cgroup", "be.slice", "cpu.max"): "50000 100000"},
                  capabilities=(Capability("psi", True, ""), Capability("perf", False, "")),
                  sensors={"runq_latency": {"state": "running"}}, rounds=RoundStats(3, 0.002, 0.006, 0.005),
                  reclaimable=Reclaimable(Capacity(0.8, 4, 2, 1.1, 1.0, 0.1), None, 1, 60.0),
                  report=node_report())
    made = {fam.name for fam in families(p)}
    for fam in families(p):
        kind, labels, _ = SERIES[fam.name + ("_total" if fam.type == "counter" else "")]
        assert fam.type == kind
        assert all(tuple(s.labels) == labels for s in fam.samples), fam.name
    # everything this state holds shows
    wanted = {n.removesuffix("_total") if SERIES[n][0] == "counter" else n for n in SERIES}
    missing = wanted - made - {"koordd_metrics_scrape_errors", "koordd_reclaimable_memory_bytes",
                               "koordd_cgroup_memory_anon_bytes", "koordd_cgroup_oom_kills", "koordd_cgroup_cpu_weight"}
    assert not missing


def test_values_and_units():
    runq = {"ls.slice": RunqLatency("ebpf", 300, 40.0, 30.0, 900.0, 2048.0, slots=(0, 10, 100, 150, 40)),
            "be.slice": RunqLatency("schedstat", 50, 120.0)}
    p = published(snapshot((LS, BE, SYSTEM), sections={RUNQ_LATENCY: runq, CPI: {"ls.slice": CpiSample(3e9, 2e9, 1)}}),
                  held=(Held("be.slice", "cpu.max", "max 100000", "be_suppress", 1.0),),
                  held_values={("cgroup", "be.slice", "cpu.max"): "50000 100000"},
                  reclaimable=Reclaimable(Capacity(0.8, 4, 2, 1.1, 1.0, 0.1), None, 1, 60.0))
    s = scrape(p)
    assert samples(p, "koordd_cgroup_cpu_limit_cores") == {(("cgroup", "be.slice"), ("class", "BE")): 0.5,
                                                           (("cgroup", "ls.slice"), ("class", "LS")): 2.0}
    assert samples(p, "koordd_class_cpu_usage_cores")[(("class", "LS"),)] == 1.0
    assert samples(p, "koordd_cgroup_pressure_ratio")[
        (("cgroup", "ls.slice"), ("class", "LS"), ("kind", "some"), ("resource", "cpu"))] == 0.125
    assert samples(p, "koordd_cgroup_cpu_throttled_seconds_total")[(("cgroup", "ls.slice"), ("class", "LS"))] == 0.0015
    assert samples(p, "koordd_cgroup_runq_latency_seconds")[
        (("cgroup", "ls.slice"), ("class", "LS"), ("quantile", "0.99"))] == pytest.approx(900e-6)
    assert samples(p, "koordd_cgroup_runq_latency_mean_seconds") == {
        (("cgroup", "be.slice"), ("class", "BE"), ("source", "schedstat")): pytest.approx(120e-6),
        (("cgroup", "ls.slice"), ("class", "LS"), ("source", "ebpf")): pytest.approx(40e-6)}
    assert samples(p, "koordd_class_cpi") == {(("class", "LS"),): 1.5}
    assert samples(p, "koordd_held_knob_value") == {
        (("kind", "cgroup"), ("knob", "cpu.max"), ("owner", "be_suppress"), ("target", "be.slice")): 0.5}
    assert samples(p, "koordd_held_knob_original")[
        (("kind", "cgroup"), ("knob", "cpu.max"), ("owner", "be_suppress"), ("target", "be.slice"))] == float("inf")
    assert s["koordd_reclaimable_cpu_cores"].value == 0.8
    assert samples(p, "koordd_reclaimable_basis")[(("part", "needs"), ("resource", "cpu"))] == 1.1
    assert s["koordd_node_memory_total_bytes"].value == 8 << 30
    assert s["koordd_node_steal_worst_seconds"].value == 0.1
    assert s["koordd_last_round_timestamp_seconds"].value == 1_700_000_000.0
    # the class's quantiles come from its roots' merged histograms
    assert merged([(0, 10, 100, 150, 40)]) == [0, 10, 100, 150, 40]
    assert (("class", "LS"), ("quantile", "0.99")) in samples(p, "koordd_class_runq_latency_seconds")


@pytest.mark.parametrize("knob, value, want", [
    ("cpu.max", "50000 100000", 0.5), ("cpu.max", "max 100000", float("inf")), ("memory.max", "4096", 4096.0),
    ("memory.high", "max", float("inf")), ("cpuset.cpus", "0-3,8", 5.0), ("cpu.weight", "100", 100.0),
    ("schemata.L3", "L3:0=ff", None), ("sched_policy", "idle", None), ("cpu.max", None, None),
])
def test_knob_number(knob, value, want):
    assert knob_number(knob, value) == want


def test_nothing_published_yet_is_an_empty_but_valid_page():
    exporter = Exporter()
    text = exporter.exposition().decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "koordd_metrics_scrape_errors" in names and "koordd_info" not in names


# --- names a workload chooses, the allow-list and the cap ----------------------------------------------

ODD = ['be.slice/a"b', "be.slice/new\nline", "be.slice/back\\slash", "be.slice/{x=\"1\"}",
       "be.slice/\udcff\udcfe-not-utf8", "be.slice/ünï"]


def test_odd_cgroup_names_are_label_values_that_parse_back():
    members = {"be.slice": tuple(CgroupSample(n, "BE", cpu_usage=0.25) for n in ODD)}
    p = published(snapshot((BE,), members=members))
    got = {dict(k)["cgroup"] for k in samples(p, "koordd_cgroup_cpu_usage_cores")}
    assert got == {"be.slice"} | {label(n) for n in ODD}
    assert label("be.slice/\udcff\udcfe-not-utf8") == "be.slice/\\xff\\xfe-not-utf8"
    assert label('be.slice/a"b') == 'be.slice/a"b'          # prometheus-client escapes it, not koordd


def test_the_cap_bounds_per_cgroup_series_and_counts_the_rest():
    members = {"be.slice": tuple(CgroupSample(f"be.slice/pod{i:04}", "BE", cpu_usage=0.01) for i in range(5000))}
    p = published(snapshot((LS, BE), members=members), settings=metrics_settings(max_cgroups=50),
                  held=tuple(Held(f"be.slice/pod{i:04}", "cpu.idle", "0", "qos_baseline", 1.0) for i in range(500)),
                  held_values={})
    usage = samples(p, "koordd_cgroup_cpu_usage_cores")
    assert len(usage) == 50
    # class roots first, then pods by path
    assert (("cgroup", "be.slice"), ("class", "BE")) in usage and (("cgroup", "ls.slice"), ("class", "LS")) in usage
    assert samples(p, "koordd_metrics_series_dropped") == {(("what", "cgroups"),): 4952.0,
                                                           (("what", "held_knobs"),): 450.0}
    assert len(samples(p, "koordd_held_knob_original")) == 50
    assert samples(p, "koordd_held_knobs") == {(("knob", "cpu.idle"), ("owner", "qos_baseline")): 500.0}
    # per-class series still count every cgroup's root
    assert samples(p, "koordd_class_cgroups")[(("class", "BE"),)] == 1.0


def test_pods_only_listed_take_no_place_under_the_cap():
    listed = tuple(CgroupSample(f"be.slice/a{i}", "BE") for i in range(10))       # nothing read of them
    read = (CgroupSample("be.slice/z", "BE", memory_current=1),)
    shown, dropped = selected(snapshot((BE,), members={"be.slice": listed + read}), metrics_settings(max_cgroups=2))
    assert [c.path for c in shown] == ["be.slice", "be.slice/z"] and dropped == 0
    runq_only = {RUNQ_LATENCY: {"be.slice/a3": RunqLatency("schedstat", 5, 10.0)}}
    shown, _ = selected(snapshot((BE,), members={"be.slice": listed}, sections=runq_only), metrics_settings())
    assert [c.path for c in shown] == ["be.slice", "be.slice/a3"]


def test_the_allow_list_picks_classes_and_patterns():
    members = {"be.slice": (CgroupSample("be.slice/batch-1", "BE", cpu_usage=0.1),
                            CgroupSample("be.slice/other", "BE", cpu_usage=0.1))}
    snap = snapshot((LS, BE, SYSTEM), members=members)
    shown, dropped = selected(snap, metrics_settings(cgroup_classes=["LS"], cgroup_patterns=["be.slice/batch-*"]))
    assert [c.path for c in shown] == ["ls.slice", "be.slice/batch-1"] and dropped == 0
    shown, _ = selected(snap, metrics_settings(cgroup_classes=[], cgroup_patterns=["be.slice"]))
    assert [c.path for c in shown] == ["be.slice", "be.slice/batch-1", "be.slice/other"]    # and below it
    shown, _ = selected(snap, metrics_settings(cgroup_classes=[], cgroup_patterns=[]))
    assert shown == []


# --- health -------------------------------------------------------------------------------------------

def test_health():
    e = Exporter()
    assert e.health(100.0)[0] == 503                     # before the first tick
    e.beat(100.0, True)
    assert e.health(100.0 + HEALTH_STALE - 1) == (200, "ok\n")
    assert e.health(100.0 + HEALTH_STALE + 1)[0] == 503  # the main loop stopped ticking
    e.beat(200.0, False)
    assert e.health(200.5)[0] == 503                     # it ticks, but a loop is overdue


# --- the server ---------------------------------------------------------------------------------------

@pytest.fixture
def server():
    exporter = Exporter()
    srv = MetricsServer.start(f"127.0.0.1:{free_port()}", exporter)
    assert srv is not None
    yield srv, exporter, f"http://127.0.0.1:{srv.port}"
    srv.stop()


def test_serves_metrics_and_health(server):
    srv, exporter, url = server
    exporter.publish(published(snapshot((LS, BE))))
    exporter.beat(time.monotonic(), True)
    status, text = get(url + "/metrics")
    assert status == 200 and 'koordd_cgroup_cpu_usage_cores{cgroup="ls.slice",class="LS"} 1.0' in text
    assert "process_cpu_seconds_total" in text
    assert get(url + "/healthz") == (200, "ok\n")
    assert get(url + "/nope")[0] == 404


def test_a_failing_scrape_is_a_500_and_the_next_one_works(server, caplog):
    srv, exporter, url = server
    exporter.publish(published(snapshot((LS,)), settings=object()))      # no max_cgroups: families() raises
    with caplog.at_level(logging.ERROR, logger="koordd.metrics"):
        assert get(url + "/metrics")[0] == 500
    assert "a scrape failed" in caplog.text
    exporter.publish(published(snapshot((LS,))))
    status, text = get(url + "/metrics")
    assert status == 200 and "koordd_metrics_scrape_errors_total 1.0" in text


def test_a_port_in_use_is_one_log_line(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="koordd.metrics"):
            assert MetricsServer.start(f"127.0.0.1:{port}", Exporter()) is None
    [record] = [r for r in caplog.records if r.name == "koordd.metrics"]
    assert f"cannot listen on 127.0.0.1:{port}" in record.getMessage() and "runs on without" in record.getMessage()


def test_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        srv = MetricsServer.start(f"[::1]:{free_port()}", Exporter())
    except OSError:
        srv = None
    if srv is None:
        pytest.skip("::1 is not configured on this host")
    try:
        assert get(f"http://[::1]:{srv.port}/healthz")[0] == 503
    finally:
        srv.stop()


# --- the runner's figures -------------------------------------------------------------------------------

def test_runner_counts_time_and_errors_per_loop():
    from koordd.core.config import loop_options
    from koordd.core.loop import Loop

    class Flaky(Loop):
        name = "flaky"
        calls = 0

        @classmethod
        def decide(cls, snapshot, settings, state):
            cls.calls += 1
            if cls.calls == 2:
                raise RuntimeError("boom")
            sum(range(20000))
            return []

    class Actuator:
        def protect(self, classes):
            pass

        def apply_round(self, batch):
            return {name: [] for name, _ in batch}

        def restore_where(self, keep, why):
            return []

        def waiting(self, loop):            # nothing runs beside the round (a prekill hook)
            return []

        backends = None

    runner = Runner({"flaky": Flaky}, Actuator())
    config = parse_config("[loops.flaky]\nenabled = true\n", "k.toml", {"flaky": Flaky})
    runner.configure(config)
    for _ in range(3):
        runner.tick(list(runner.runs.values()), snapshot())
    st = runner.status()["flaky"]
    assert st["ticks"] == 3 and st["errors"] == 1 and st["failures"] == 0
    assert st["seconds_total"] > 0 and st["cpu_seconds_total"] > 0 and st["last_seconds"] > 0
    assert loop_options(Flaky)


# --- koordd itself, on a fake tree -----------------------------------------------------------------------

def test_koordd_serves_its_state_and_status_has_reclaimable(tmp_path):
    port = free_port()
    proc, state = run_koordd(tmp_path, port)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/healthz", "ok", proc)
        body = wait_for(url + "/metrics", 'koordd_decisions_total{knob="cpu.max",loop="be_suppress",outcome="applied"}', proc)
        assert 'koordd_held_knob_value{kind="cgroup",knob="cpu.max",owner="be_suppress",target="be.slice"}' in body
        assert 'koordd_class_cpu_limit_cores{class="LS"} 1.0' in body
        assert "koordd_reclaimable_cpu_cores" in body
        status = json.loads((state / "status.json").read_text())
        assert status["metrics"] == f"127.0.0.1:{port}"
        r = status["reclaimable"]
        assert r["ls_cgroups"] == 1 and r["cpu_cores"]["given"] == 1.0 and r["cpu_cores"]["reclaimable"] >= 0
        ctl = subprocess.run([sys.executable, "-m", "koordctl.cli", "status", "--json", "--state-dir", str(state)],
                             capture_output=True, text=True, timeout=60)
        assert json.loads(ctl.stdout)["reclaimable"]["cpu_cores"]["given"] == 1.0
        text = subprocess.run([sys.executable, "-m", "koordctl.cli", "status", "--state-dir", str(state)],
                              capture_output=True, text=True, timeout=60).stdout
        assert f"http://127.0.0.1:{port}/metrics" in text and "of 1 LS cgroups' limits" in text
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert "metrics: stopped serving" in (tmp_path / "stderr").read_text()


def test_koordd_runs_on_when_its_port_is_taken(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc, state = run_koordd(tmp_path, port)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (state / "status.json").exists():
                time.sleep(0.2)
            time.sleep(0.5)
            assert proc.poll() is None
            assert json.loads((state / "status.json").read_text())["metrics"] is None
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
    log = (tmp_path / "stderr").read_text()
    assert log.count(f"cannot listen on 127.0.0.1:{port}") == 1


def test_docs_list_every_series():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    missing = [name for name in SERIES if f"`{name}`" not in doc]
    assert not missing, f"docs/metrics.md does not list {missing}"


def test_a_reload_moves_and_stops_the_endpoint(tmp_path):
    first, second = free_port(), free_port()
    proc, state = run_koordd(tmp_path, first)
    config = tmp_path / "koordd.toml"
    try:
        wait_for(f"http://127.0.0.1:{first}/healthz", "ok", proc)
        config.write_text(config.read_text().replace(f"127.0.0.1:{first}", f"127.0.0.1:{second}"))
        wait_for(f"http://127.0.0.1:{second}/healthz", "ok", proc)
        with pytest.raises(OSError):
            get(f"http://127.0.0.1:{first}/healthz")
        config.write_text(config.read_text().replace("enable = true", "enable = false"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and json.loads((state / "status.json").read_text())["metrics"]:
            time.sleep(0.2)
        with pytest.raises(OSError):
            get(f"http://127.0.0.1:{second}/healthz")
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
