"""The node report (koordd/core/report.py, README "Node report"): shares, dominant share, Jain's index, the
violation rate over the window, tenants from patterns; [report]'s config; status.json and koordctl status;
the metrics series; and the push, against a real HTTP server on 127.0.0.1."""
from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from koordctl.cli import main
from koordd.core.config import ConfigError, METRICS_OPTIONS, make_settings, parse_config
from koordd.core.feeds import STATUS_FILE
from koordd.core.loop import Loop
from koordd.core.reclaimable import Capacity, Reclaimable
from koordd.core.report import (REPORT_OPTIONS, SCHEMA, WINDOW, ReportWindow, build, dominant_share, jain_index,
    tenant_of, url_problem)
from koordd.core.slo import SloTarget
from koordd.core.snapshot import APP_LATENCY, AppLatency, CgroupSample, NodeSample, Snapshot
from koordd.runtime.daemon import Daemon
from koordd.runtime.metrics import Published, families, generate_latest
from koordd.runtime.reportpush import ReportPusher
from koordd.runtime.result import RoundResult
from koordd.runtime.statusfile import StatusFile
from koordtest.fakes.cgroup import FakeCgroups

GIB = 1 << 30


def settings(**kw):
    return make_settings(REPORT_OPTIONS, kw)


def node(cpu_used=2.0) -> NodeSample:
    return NodeSample(cpu_count=4, cpu_used=cpu_used, memory_total=8 * GIB, memory_available=5 * GIB)


def snap(t: float = 100.0, app=None, slo=None, roots=None) -> Snapshot:
    roots = roots if roots is not None else (
        CgroupSample("web.slice", "LS", cpu_usage=1.0, memory_current=2 * GIB),
        CgroupSample("cache.slice", "LS", cpu_usage=0.2, memory_current=1 * GIB),
        CgroupSample("be.slice", "BE", cpu_usage=0.6, memory_current=0))
    return Snapshot(time=t, wall=1_700_000_000.0 + t, node=node(), cgroups={c.path: c for c in roots},
                    sections={APP_LATENCY: app} if app is not None else {},
                    slo=slo if slo is not None else {"web.slice": SloTarget(1000.0, 5000.0)})


def hist(**slots) -> tuple[int, ...]:
    """A log2 histogram: slot k holds responses of [2^(k-1), 2^k) µs."""
    out = [0] * 20
    for k, n in slots.items():
        out[int(k[1:])] = n
    return tuple(out)


def app(slots) -> AppLatency:
    return AppLatency(sum(slots), 0.0, 0.0, 0.0, 0.0, 0.0, slots=slots)


# --- the pure computation -------------------------------------------------------------------------------

@pytest.mark.parametrize("shares, want", [
    ([], None), ([0.3], 1.0), ([0.25, 0.25, 0.25], 1.0), ([0.0, 0.0], 1.0), ([0.0], 1.0),
    ([1.0, 0.0, 0.0, 0.0], 0.25), ([0.5, 0.25], (0.75 ** 2) / (2 * (0.25 + 0.0625)))])
def test_jain_index(shares, want):
    got = jain_index(shares)
    assert got == (None if want is None else pytest.approx(want))


def test_dominant_share_is_the_larger_known_share():
    assert dominant_share(0.2, 0.5) == 0.5 and dominant_share(0.7, 0.1) == 0.7
    assert dominant_share(None, 0.3) == 0.3 and dominant_share(None, None) is None


def test_each_class_root_is_its_own_tenant_by_default():
    r = build(snap(), settings(), ReportWindow(), node="n1")
    by = {t.name: t for t in r.tenants}
    assert set(by) == {"web.slice", "cache.slice", "be.slice"}
    web = by["web.slice"]
    assert web.cpu_share == pytest.approx(0.25) and web.memory_share == pytest.approx(0.25)
    assert by["be.slice"].cpu_share == pytest.approx(0.15) and by["be.slice"].memory_share == 0
    assert by["be.slice"].dominant_share == pytest.approx(0.15)
    assert by["cache.slice"].dominant_share == pytest.approx(0.125)          # memory 1/8 > cpu 0.05
    assert r.fairness == pytest.approx(jain_index([0.25, 0.125, 0.15]))
    assert (r.cpu_cores, r.memory_bytes, r.cpu_used, r.memory_used) == (4.0, 8 * GIB, 2.0, 3 * GIB)


def test_tenants_from_patterns_first_match_wins_and_the_rest_are_their_own():
    s = settings(tenants={"front": ["web.slice", "cache.*"], "all": ["*"]})
    r = build(snap(), s, ReportWindow())
    by = {t.name: t for t in r.tenants}
    assert list(by) == ["front", "all"]
    assert by["front"].cgroups == ("cache.slice", "web.slice")
    assert by["front"].cpu_cores == pytest.approx(1.2) and by["front"].memory_bytes == 3 * GIB
    assert by["all"].cgroups == ("be.slice",)
    # a pattern naming a cgroup above the roots groups them; a root no tenant names is its own
    nested = (CgroupSample("team-a/web", "LS", cpu_usage=1.0, memory_current=0),
              CgroupSample("team-a/batch", "BE", cpu_usage=1.0, memory_current=0),
              CgroupSample("other", "BE", cpu_usage=2.0, memory_current=0))
    r = build(snap(roots=nested), settings(tenants=[{"name": "a", "cgroups": ["team-a"]}]), ReportWindow())
    assert [(t.name, t.cpu_share) for t in r.tenants] == [("a", 0.5), ("other", 0.5)] and r.fairness == 1.0
    assert tenant_of("x/y", (("t", ("x",)),)) == "t" and tenant_of("x/y", ()) == "x/y"


def test_a_nested_root_counts_once_and_unknown_usage_is_none():
    roots = (CgroupSample("be.slice", "BE", cpu_usage=2.0, memory_current=GIB),
             CgroupSample("be.slice/ls-job", "LS", cpu_usage=0.5, memory_current=0),
             CgroupSample("fresh", "LS", cpu_usage=None, memory_current=None))
    r = build(snap(roots=roots), settings(), ReportWindow())
    by = {t.name: t for t in r.tenants}
    assert by["be.slice"].cpu_cores == 1.5 and by["be.slice/ls-job"].cpu_cores == 0.5
    assert by["fresh"].dominant_share is None
    assert r.fairness == pytest.approx(jain_index([1.5 / 4, 0.5 / 4]))      # unknown left out


def test_the_violation_rate_is_over_the_window_of_rounds():
    w = ReportWindow()
    # 1000 µs target: slot 10 holds [512, 1024), slot 11 [1024, 2048): all of slot 11 is over target.
    r1 = build(snap(100.0, app={"web.slice": app(hist(s10=90, s11=10))}), settings(), w)
    [wl] = r1.workloads
    assert wl.cgroup == "web.slice" and wl.requests == 100 and wl.quantile == 0.99
    assert wl.violation_rate == pytest.approx(0.1 + 90 * (1024 - 1000) / 512 / 100)
    # the next round adds its responses to the window's
    r2 = build(snap(101.0, app={"web.slice": app(hist(s10=100))}), settings(), w)
    [wl] = r2.workloads
    assert wl.requests == 200
    assert wl.violation_rate == pytest.approx((10 + 190 * 24 / 512) / 200)
    # a round without responses keeps the window's; past the window they drop out
    [wl] = build(snap(105.0), settings(), w).workloads
    assert wl.requests == 200
    assert build(snap(101.0 + WINDOW + 0.5), settings(), w).workloads == ()
    # a root without an SLO is no workload; one whose SLO went away is forgotten
    build(snap(120.0, app={"web.slice": app(hist(s10=5))}, slo={}), settings(), w)
    assert "web.slice" not in w.rounds


def test_the_report_as_json_has_the_documented_schema():
    rec = Reclaimable(Capacity(0.8, 4, 2, 1.1, 1.0, 0.1), None, 1, 60.0)
    r = build(snap(app={"web.slice": app(hist(s10=100))}), settings(), ReportWindow(), rec, node="n1")
    d = json.loads(json.dumps(r.as_dict()))
    assert_schema(d)
    assert d["node"] == "n1" and d["reclaimable"]["cpu_cores"]["reclaimable"] == 0.8
    assert d["workloads"][0]["violation_rate"] == pytest.approx(100 * 24 / 512 / 100, abs=1e-6)


def assert_schema(d: dict) -> None:
    assert d["schema"] == SCHEMA == 1 and d["window_seconds"] == WINDOW
    assert set(d) == {"schema", "node", "time", "window_seconds", "capacity", "usage", "reclaimable",
                      "workloads", "tenants", "fairness"}
    assert set(d["capacity"]) == set(d["usage"]) == {"cpu_cores", "memory_bytes"}
    for w in d["workloads"]:
        assert set(w) == {"cgroup", "class", "requests", "quantile", "latency_us", "latency_p999_us", "target_us",
                          "target_p999_us", "violation_rate", "violation_target"}
    for t in d["tenants"]:
        assert set(t) == {"name", "cgroups", "cpu_cores", "memory_bytes", "cpu_share", "memory_share",
                          "dominant_share"}
    assert set(d["fairness"]) == {"jain_index", "tenants"}


# --- [report] in the config -------------------------------------------------------------------------------

def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_config(text, "koordd.toml", {})
    return e.value.errors


def test_report_config_defaults_and_values():
    c = parse_config("", "koordd.toml", {})
    assert (c.report.url, c.report.interval, c.report.timeout, c.report.tenants) == ("", 10.0, 2.0, ())
    c = parse_config('[report]\nurl = "https://sched.example:8443/v1/report?x=1"\ninterval = "30s"\n'
                     '[report.tenants]\nweb = ["web.slice", "/cache.slice/"]\nbatch = "be.slice"\n',
                     "koordd.toml", {})
    assert c.report.url.startswith("https://") and c.report.interval == 30.0
    assert c.report.tenants == (("web", ("web.slice", "cache.slice")), ("batch", ("be.slice",)))
    c = parse_config('[[report.tenants]]\nname = "a"\ncgroups = ["x"]\n', "koordd.toml", {})
    assert c.report.tenants == (("a", ("x",)),)


@pytest.mark.parametrize("body, want", [
    ('[report]\nurl = "ftp://h/x"\n', 'koordd.toml:2: report.url: must start with http:// or https://'),
    ('[report]\n\nurl = "file:///etc/passwd"\n', 'koordd.toml:3: report.url: must start with http://'),
    ('[report]\nurl = "http:///nohost"\n', "koordd.toml:2: report.url: names no host"),
    ('[report]\nurl = "http://h:99999/"\n', "koordd.toml:2: report.url: not a URL"),
    ('[report]\ninterval = "-1s"\n', "koordd.toml:2: report.interval: not a duration"),
    ('[report]\ninterval = -1\n', "koordd.toml:2: report.interval: must be >= 0.1, got -1"),
    ('[report]\ntimeout = 0\n', "koordd.toml:2: report.timeout: must be >= 0.01"),
    ('[report]\ntimeout = "35s"\n', "koordd.toml:2: report.timeout: must be <= 10"),   # WatchdogSec=30s
    ('[report]\nurll = "http://h/"\n', "koordd.toml:2: report.urll: unknown key (did you mean 'url'?)"),
    ('[report]\ntenants = ["x"]\n', "koordd.toml:2: report.tenants: entry 0: expected a table"),
    ('[report]\ntenants = {a = []}\n', "koordd.toml:2: report.tenants: tenant 'a': expected a non-empty array"),
    ('[report]\ntenants = {a = ["/"]}\n', "koordd.toml:2: report.tenants: tenant 'a': pattern names the root"),
    ('report = 3\n', "koordd.toml:1: report: expected a table"),
])
def test_report_config_errors_name_file_and_line(body, want):
    got = errors(body)
    assert any(e.startswith(want) for e in got), got


def test_url_problem():
    assert url_problem("") is None and url_problem("http://127.0.0.1:9/x") is None
    assert url_problem("http://[::1]:80/") is None and url_problem("https://sched/") is None
    assert "white space" in url_problem("http://h/a b")


# --- status.json and koordctl status ----------------------------------------------------------------------

def a_report():
    return build(snap(app={"web.slice": app(hist(s10=90, s11=10))}), settings(tenants={"front": ["web.slice"]}),
                 ReportWindow(), node="n1")


def test_status_json_and_koordctl_status_show_the_report(tmp_path, capsys):
    sf = StatusFile(tmp_path, time.time(), "/etc/koordd/koordd.toml", False, "v2", lambda: None)
    sf.write(RoundResult(snap(), report=a_report()))
    status = json.loads((tmp_path / STATUS_FILE).read_text())
    assert_schema(status["report"])
    assert status["report"]["tenants"][0]["name"] == "front"
    assert main(["status", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "node report (schema 1): 3 tenants, fairness (Jain) " in out
    assert "node: 2.00 of 4 CPUs, 3.0 of 8.0 GiB used" in out
    assert "TENANT" in out and "front" in out and "25.0%" in out
    assert "web.slice" in out and "LS" in out and "1.00ms" in out and "(of 1.0%)" in out
    sf.write(RoundResult(snap()))           # no report: null, and koordctl status says nothing of it
    assert json.loads((tmp_path / STATUS_FILE).read_text())["report"] is None
    main(["status", "--state-dir", str(tmp_path)])
    assert "node report" not in capsys.readouterr().out


# --- metrics ----------------------------------------------------------------------------------------------

def scrape(p: Published) -> dict:
    class One:
        def collect(self):
            return families(p)
    from prometheus_client import CollectorRegistry
    reg = CollectorRegistry(auto_describe=False)
    reg.register(One())
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_report_series(tmp_path):
    p = Published(settings=make_settings(METRICS_OPTIONS, {"enable": True}), started=1.0, report=a_report())
    s = scrape(p)
    wl = (("cgroup", "web.slice"), ("class", "LS"))
    assert s[("koordd_report_workload_requests", wl)] == 100
    assert s[("koordd_report_workload_target_seconds", wl)] == pytest.approx(0.001)
    assert s[("koordd_report_workload_violation_ratio", wl)] == pytest.approx(0.1 + 90 * 24 / 512 / 100)
    assert ("koordd_report_workload_latency_seconds", wl + (("quantile", "0.99"),)) in s
    assert ("koordd_report_workload_latency_seconds", wl + (("quantile", "0.999"),)) in s
    assert s[("koordd_report_tenant_share_ratio", (("resource", "dominant"), ("tenant", "front")))] == 0.25
    assert s[("koordd_report_tenants", ())] == 3
    assert 0 < s[("koordd_report_fairness_index", ())] <= 1
    # bounded: the cap and the allow-list apply as to cgroup series
    capped = Published(settings=make_settings(METRICS_OPTIONS, {"enable": True, "max_cgroups": 1,
                                                                "cgroup_classes": ["BE"]}),
                       started=1.0, report=a_report())
    s = scrape(capped)
    assert not any(name == "koordd_report_workload_requests" for name, _ in s)
    assert s[("koordd_metrics_series_dropped", (("what", "report_tenants"),))] == 2
    assert len([k for k in s if k[0] == "koordd_report_tenant_share_ratio"]) == 3     # one tenant, 3 resources


# --- the push, against a real HTTP server -----------------------------------------------------------------

class Receiver:
    """An HTTP server on 127.0.0.1 in a thread, keeping what is POSTed to it."""

    def __init__(self, status: int = 204):
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.bodies.append(json.loads(body))
                outer.headers.append(dict(self.headers))
                self.send_response(status)
                if status in (301, 302, 307):
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "5")
                self.end_headers()
                self.wfile.write(b"body!")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/report"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def report_lines(caplog):
    return [r for r in caplog.records if r.getMessage().startswith("report: push to")]


def test_push_posts_the_report_json(receiver, caplog):
    pusher = ReportPusher()
    pusher.configure(settings(url=receiver.url, interval=0.1, timeout=2))
    try:
        pusher.published(RoundResult(snap(), report=a_report()))
        assert wait(lambda: receiver.bodies)
    finally:
        pusher.stop()
    assert_schema(receiver.bodies[0])
    assert receiver.bodies[0]["tenants"][0]["name"] == "front"
    assert receiver.headers[0]["Content-Type"] == "application/json"
    assert pusher.thread is None and not report_lines(caplog)


def test_a_redirect_is_not_followed_and_an_error_status_logs_once(caplog):
    caplog.set_level(logging.INFO, "koordd")
    r = Receiver(status=302)
    pusher = ReportPusher()
    try:
        s = settings(url=r.url, timeout=2)
        for _ in range(3):
            assert not pusher.push_once(s, a_report())
        assert len(r.bodies) == 3                       # never the Location's
        [line] = report_lines(caplog)
        assert "HTTP 302 (redirects are not followed)" in line.getMessage()
    finally:
        r.close()
    ok = Receiver(status=200)
    try:
        assert pusher.push_once(settings(url=ok.url, timeout=2), a_report())
    finally:
        ok.close()
    assert any("work again" in x.getMessage() for x in caplog.records)


def test_a_receiver_that_never_answers_costs_one_line_and_never_stalls_a_round(tmp_path, caplog):
    caplog.set_level(logging.INFO, "koordd")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)                        # accepts (the kernel does), never reads or answers
    port = silent.getsockname()[1]
    d = daemon(tmp_path, f'[report]\nurl = "http://127.0.0.1:{port}/r"\ninterval = "100ms"\ntimeout = "300ms"\n')
    d.pusher.configure(d.config.report)      # as run() does
    d.start()
    try:
        d.round(list(d.runner.runs.values()))
        started = time.monotonic()
        for _ in range(5):
            t = time.monotonic()
            d.round(list(d.runner.runs.values()))
            assert time.monotonic() - t < 0.25           # a round never waits for the receiver
            time.sleep(0.2)
        assert wait(lambda: d.pusher.failed >= 2, 5)
    finally:
        t = time.monotonic()
        d.stop()
        silent.close()
    assert time.monotonic() - t < 3                       # the stop waits at most about the timeout
    assert time.monotonic() - started < 10
    lines = report_lines(caplog)
    assert len(lines) == 1 and "timed out after 0.3s" in lines[0].getMessage(), [x.getMessage() for x in lines]
    # status.json has the report all the same
    assert_schema(json.loads((d.state_dir / STATUS_FILE).read_text())["report"])


def test_an_unreachable_port_logs_once(tmp_path, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]            # closed again: nothing listens there
    pusher = ReportPusher()
    pusher.configure(settings(url=f"http://127.0.0.1:{port}/", interval=0.1, timeout=1))
    try:
        pusher.published(RoundResult(snap(), report=a_report()))
        assert wait(lambda: pusher.failed >= 4)
    finally:
        pusher.stop()
    [line] = report_lines(caplog)
    assert "connection refused" in line.getMessage()


def test_the_daemon_pushes_and_a_reload_stops_the_push(tmp_path, receiver):
    d = daemon(tmp_path, f'[report]\nurl = "{receiver.url}"\ninterval = "100ms"\n'
                         '[report.tenants]\nbatch = ["be.*"]\n')
    d.pusher.configure(d.config.report)      # as run() does
    d.start()
    try:
        d.round(list(d.runner.runs.values()))
        assert wait(lambda: receiver.bodies)
        got = receiver.bodies[-1]
        assert_schema(got)
        assert [t["name"] for t in got["tenants"]] == ["batch"] and got["tenants"][0]["cgroups"] == ["be.slice"]
        d.config.path.write_text(d.config.path.read_text().replace(receiver.url, ""))
        d.reload()
        assert d.pusher.thread is None and d.report.settings.url == ""
    finally:
        d.stop()


def test_a_reload_that_changes_the_report_never_waits_for_a_trickling_receiver(tmp_path, receiver):
    """The review's stall: a push in flight to a receiver that trickles its head, timeout 10 s (the most the
    config takes); a reload that changes [report] cancels it and the main loop goes on at once."""
    from koordtest.hostile import HostileServer
    with HostileServer("trickle_head") as srv:
        d = daemon(tmp_path, f'[report]\nurl = "{srv.url}"\ninterval = "100ms"\ntimeout = "10s"\n')
        d.pusher.configure(d.config.report)      # as run() does
        d.start()
        try:
            d.round(list(d.runner.runs.values()))
            assert wait(lambda: srv.connections >= 1)
            time.sleep(0.3)                      # the push is in flight, trickled
            old = d.pusher.thread
            d.config.path.write_text(d.config.path.read_text().replace(srv.url, receiver.url))
            t = time.monotonic()
            d.reload()
            seconds = time.monotonic() - t
            assert not old.is_alive()            # ended, not abandoned
            assert wait(lambda: receiver.bodies)     # the new receiver gets the report
        finally:
            d.stop()
    assert seconds < 5                           # generous: the bound is netpeer's cancel (at once) + 1 s
    assert d.pusher.thread is None


class Idle(Loop):
    name = "idle"

    @staticmethod
    def needs(settings):
        return frozenset({"cpu_usage"})

    @staticmethod
    def decide(snapshot, settings, state):
        return []


def daemon(tmp_path, extra: str) -> Daemon:
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    path = tmp_path / "koordd.toml"
    path.write_text(f'[daemon]\ncgroup_root = "{tree.root}"\nstate_dir = "{tmp_path / "state"}"\n'
                    f'[[classes]]\nname = "BE"\ncgroups = ["be.slice"]\n[loops.idle]\nenabled = true\n{extra}')
    return Daemon(parse_config(path.read_text(), path, {"idle": Idle}), {"idle": Idle})
