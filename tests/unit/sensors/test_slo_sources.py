"""Declared SLO sources (core/slo.py's SOURCES "prometheus" and "probe"): their config, the exposition
parser, quantiles from bucket deltas, the sensors against real servers on 127.0.0.1, and be_suppress
acting on what they measure. Loopback only, no BPF."""
from __future__ import annotations

import dataclasses
import http.server
import logging
import socket
import threading
import time

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from koordd.core.config import ConfigError, parse_config
from koordd.core.catalogue import BUILTIN, SENSORS, builtin, load_registry
from koordd.core.slo import SOURCES, SloTarget, sensor_users
from koordd.core.snapshot import CgroupSample, NodeSample, Snapshot
from koordd.sensors import slo_prometheus as prom
from koordd.sensors.contract import SensorContext
from koordd.sensors.declared import slot_of_us
from koordd.sensors.slo_probe import Prober, SloProbeSensor, probe_once
from koordd.sensors.slo_prometheus import (ScrapeError, Scraper, SloPrometheusSensor, bucket_quantile, latency,
                                           parse_buckets)

LOOPS = load_registry()
HEAD = "[[classes]]\nname = 'LS'\ncgroups = ['ls.slice']\n[classes.slo]\nlatency_p99 = '5ms'\n"


def slo_of(text):
    return parse_config(HEAD + text, "koordd.toml", LOOPS).rule_for("ls.slice").slo


def errors(text):
    with pytest.raises(ConfigError) as ei:
        parse_config(HEAD + text, "koordd.toml", LOOPS)
    return ei.value.errors


# --- config ----------------------------------------------------------------------------------------

def test_a_prometheus_source_is_read_with_its_labels():
    t = slo_of("source = 'prometheus'\nurl = 'http://127.0.0.1:8080/metrics'\nmetric = 'http_request_duration_seconds'\n"
               "labels = {handler = '/api', code = '200'}\n")
    assert (t.source, t.url, t.metric, t.labels) == ("prometheus", "http://127.0.0.1:8080/metrics",
                                                     "http_request_duration_seconds",
                                                     (("code", "200"), ("handler", "/api")))
    assert t.section == SOURCES["prometheus"] == "slo_prometheus"


def test_a_probe_source_takes_its_defaults_and_a_timeout_from_the_target():
    t = slo_of("source = 'probe'\nprobe = 'tcp://127.0.0.1:6379'\n")
    assert (t.probe, t.probe_send, t.probe_expect, t.probe_interval) == ("tcp://127.0.0.1:6379", "PING\r\n", "", 1.0)
    assert t.timeout == pytest.approx(0.05)                        # 5 ms x 10
    assert SloTarget(1e6, source="probe").timeout == 5.0           # at most 5 s
    assert slo_of("source = 'probe'\nprobe = 'unix:/run/app.sock'\nprobe_timeout = '200ms'\n").timeout == 0.2
    assert slo_of("").probe == "" and slo_of("") == SloTarget(5000.0)


@pytest.mark.parametrize("text, want", [
    ("source = 'prometheus'\nmetric = 'm'\n",
     ["koordd.toml:4: classes[0].slo: missing 'url' (source = 'prometheus' requires it)"]),
    ("source = 'prometheus'\nurl = 'http://h:1/m'\n",
     ["koordd.toml:4: classes[0].slo: missing 'metric' (source = 'prometheus' requires it)"]),
    ("source = 'probe'\n", ["koordd.toml:4: classes[0].slo: missing 'probe' (source = 'probe' requires it)"]),
    ("url = 'http://h:1/m'\n",
     ["koordd.toml:6: classes[0].slo.url: is an option of source = 'prometheus', not of 'measured'"]),
    ("source = 'prometheus'\nurl = 'http://h:1/m'\nmetric = 'm'\nprobe_send = 'x'\n",
     ["koordd.toml:9: classes[0].slo.probe_send: is an option of source = 'probe', not of 'prometheus'"]),
    ("source = 'prometheus'\nurl = 'ftp://h/m'\nmetric = 'm'\n",
     ["koordd.toml:7: classes[0].slo.url: must start with http://, got 'ftp://h/m'"]),
    ("source = 'prometheus'\nurl = 'http://h:1/m'\nmetric = '1bad'\n",
     ["koordd.toml:8: classes[0].slo.metric: not a metric name: '1bad'"]),
    ("source = 'prometheus'\nurl = 'http://h:1/m'\nmetric = 'm'\nlabels = {le = '1'}\n",
     ["koordd.toml:9: classes[0].slo.labels: 'le' is not a label name a histogram series can be matched on"]),
    ("source = 'prometheus'\nurl = 'http://h:1/m'\nmetric = 'm'\nlabels = {a = 1}\n",
     ["koordd.toml:9: classes[0].slo.labels: label a: expected a string, got int"]),
    ("source = 'probe'\nprobe = 'tcp://h'\n",
     ["koordd.toml:7: classes[0].slo.probe: expected \"tcp://host:port\" with a port of 1 to 65535, got 'tcp://h'"]),
    ("source = 'probe'\nprobe = 'unix:rel'\n",
     ["koordd.toml:7: classes[0].slo.probe: expected \"unix:/absolute/path\" (at most 107 bytes), got 'unix:rel'"]),
    ("source = 'probe'\nprobe = 'udp://h:1'\n",
     ["koordd.toml:7: classes[0].slo.probe: expected \"tcp://host:port\" or \"unix:/path\", got 'udp://h:1'"]),
    ("source = 'probe'\nprobe = 'tcp://h:1'\nprobe_interval = '2m'\n",
     ["koordd.toml:8: classes[0].slo.probe_interval: must be <= 60, got 120"]),
    ("source = 'probe'\nprobe = 'tcp://h:1'\nprobe_timeout = '30s'\n",
     ["koordd.toml:8: classes[0].slo.probe_timeout: must be <= 10, got 30"]),
    ("source = 'probe'\nprobe = 'tcp://h:1'\nprobe_send = ''\n",
     ["koordd.toml:8: classes[0].slo.probe_send: must not be empty: the probe times the answer to a request"]),
])
def test_source_errors_name_the_file_and_line(text, want):
    assert errors(text) == want


def test_the_daemon_runs_the_sensor_of_each_declared_source():
    slos = [("LS", SloTarget(5000.0, source="prometheus", url="http://h/m", metric="m")),
            ("LSR", SloTarget(5000.0, source="probe", probe="tcp://h:1")), ("LSE", SloTarget(5000.0))]
    assert sensor_users(slos) == {"slo_prometheus": ["the SLO of class LS"], "slo_probe": ["the SLO of class LSR"],
                                  "app_latency": ["the SLO of class LSE"]}
    sensors = builtin(SENSORS)
    assert set(SOURCES.values()) <= set(BUILTIN[SENSORS])
    assert sensors["slo_prometheus"] is SloPrometheusSensor and sensors["slo_probe"] is SloProbeSensor


# --- the exposition format -----------------------------------------------------------------------------

EXPO = """\
# HELP req_seconds Request latency.
# TYPE req_seconds histogram
req_seconds_bucket{handler="/a",le="0.001"} {a1}
req_seconds_bucket{handler="/a",le="0.01"} {a2}
req_seconds_bucket{handler="/a",le="+Inf"} {a2}
req_seconds_bucket{handler="/b",le="0.001"} 7 1700000000000
req_seconds_bucket{handler="/b",le="0.01"} 7
req_seconds_bucket{handler="/b",le="+Inf"} 9
req_seconds_sum{handler="/a"} 0.5
req_seconds_count{handler="/a"} {a2}
other_bucket{le="bad"} garbage
"""


def expo(a1, a2):
    return EXPO.replace("{a1}", str(a1)).replace("{a2}", str(a2))


def test_the_parser_keeps_the_matching_series_and_sums_them_per_bound():
    assert parse_buckets(expo(10, 100), "req_seconds", {"handler": "/a"}) == \
        ((0.001, 10.0), (0.01, 100.0), (float("inf"), 100.0))
    assert parse_buckets(expo(10, 100), "req_seconds") == ((0.001, 17.0), (0.01, 107.0), (float("inf"), 109.0))
    assert parse_buckets('m_bucket{le="1",x="a\\"b,}"} 3\n', "m", {"x": 'a"b,}'}) == ((1.0, 3.0),)
    assert parse_buckets("m_bucket{le=\"1\",} 3\nm_bucketx{le=\"2\"} 9\n", "m") == ((1.0, 3.0),)


@pytest.mark.parametrize("text, kind", [
    ("", "no series"),
    ('m_bucket{le="1",a="b"} 3\n', "no series"),                 # labels {a: c} match nothing
    ('m_bucket{le="1",a="c"} x\n', "garbled"),
    ('m_bucket{a="c"} 3\n', "garbled"),                          # no le
    ('m_bucket{le="1",a="c"x} 3\n', "garbled"),
    ('m_bucket{le="1",a="c} 3\n', "no series"),                 # holds no a="c": not the wanted series' line,
                                                                  # never parsed (family_lines)
    ('m_bucket{le="1",a="c"} -3\n', "garbled"),
    ('m_bucket{le="1",a="c"} NaN\n', "garbled"),
    ('m_bucket{le="1",a="c"} 3 4 5\n', "garbled"),
    ('m_bucket{le="1",a="c"} 5\nm_bucket{le="2",a="c"} 4\n', "garbled"),   # cumulative counts fall
    ('m_bucket{le="1",le="2",a="c"} 3\n', "garbled"),
])
def test_garbled_or_unmatched_input_is_a_scrape_error(text, kind):
    with pytest.raises(ScrapeError) as ei:
        parse_buckets(text, "m", {"a": "c"})
    assert ei.value.kind == kind


@hsettings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from('m_bucket{le="+Inf1.0}, \n\\#a=x9e-'), max_size=120))
def test_no_input_breaks_the_parser(text):
    try:
        got = parse_buckets(text, "m")
    except ScrapeError:
        return
    assert all(b[1] >= a[1] for a, b in zip(got, got[1:]))


@hsettings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from('m_bucket{a="x"}b=, \n\t\r'), max_size=80),
       st.lists(st.sampled_from(['a="x"', 'b="x"', "m_b", "\n"]), max_size=2))
def test_family_lines_finds_what_a_plain_split_finds(text, needles):
    """Whichever occurrences it walks (the name's or a needle's), the lines are those of a plain split."""
    body, wanted = text.encode(), tuple(x.encode() for x in needles)
    plain = [ln[len(b"m_bucket"):].rstrip(b"\r") for ln in body.split(b"\n")
             if ln.startswith(b"m_bucket") and ln[len(b"m_bucket"):len(b"m_bucket") + 1] in (b"{", b" ", b"\t")
             and all(x in ln[len(b"m_bucket"):] for x in wanted)]
    assert prom.family_lines(body, "m_bucket", wanted) == plain


# --- quantiles from bucket deltas ------------------------------------------------------------------------

def test_quantiles_are_interpolated_within_their_bucket():
    counts = ((0.001, 50.0), (0.01, 50.0), (float("inf"), 0.0))
    assert bucket_quantile(counts, 0.5) == pytest.approx(0.001)
    assert bucket_quantile(counts, 0.99) == pytest.approx(0.001 + 0.009 * 49 / 50)
    assert bucket_quantile(((0.001, 0.0), (float("inf"), 5.0)), 0.99) == 0.001     # +Inf: the largest bound
    assert bucket_quantile(((0.001, 0.0),), 0.99) is None


def test_the_latency_is_of_the_delta_between_two_scrapes():
    before = parse_buckets(expo(1000, 1000), "req_seconds", {"handler": "/a"})     # 1000 old fast ones
    after = parse_buckets(expo(1000, 2000), "req_seconds", {"handler": "/a"})      # then 1000 in 1..10 ms
    app = latency(before, after)
    assert app.count == 1000 and app.p50_us == pytest.approx(5500) and app.p99_us == pytest.approx(9910)
    assert app.max_us == 10_000 and sum(app.slots) == 1000
    from koordd.core.histogram import quantile_us        # the slots: the same log2 slot, as app_latency's resolve
    assert slot_of_us(quantile_us(app.slots, 0.99)) == slot_of_us(9910)
    assert latency(after, after) is None


# --- the Prometheus sensor against real servers -----------------------------------------------------------

class Server:
    """An HTTP server on 127.0.0.1 whose answer `handle(handler)` writes."""

    def __init__(self, handle):
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                handle(self)

            def log_message(self, *a):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        outer.hits = 0

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def reply(h, status, body):
    data = body.encode()
    h.send_response(status)
    h.send_header("Content-Type", "text/plain")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(prom, "SCRAPE_INTERVAL", 0.05)
    monkeypatch.setattr(prom, "TIMEOUT", 0.3)


def ctx(target, now=0.0):
    return SensorContext(now, {"ls.slice": "LS"}, {"ls.slice": target, "other.slice": SloTarget(5000.0)})


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (got := cond()) is not None:
            return got
        time.sleep(0.02)
    return None


def test_a_histogram_whose_buckets_advance_gives_its_p99(fast):
    state = {"n": 0}

    def handle(h):
        state["n"] += 1            # each scrape: 100 more requests, 90 under 1 ms and 10 in 1..10 ms
        n = state["n"]
        reply(h, 200, expo(90 * n, 100 * n).replace('"/b"', '"/c"'))
    srv = Server(handle)
    try:
        target = SloTarget(5000.0, source="prometheus", url=srv.url, metric="req_seconds", labels=(("handler", "/a"),))
        sensor = SloPrometheusSensor()
        sensor.start()
        try:
            assert sensor.sample(ctx(target)) == {}         # nothing scraped yet
            got = wait_for(lambda: sensor.sample(ctx(target)).get("ls.slice"))
            assert got is not None and got.count % 100 == 0
            # 10% of them in 1..10 ms: the p99 is 90% of the way through that bucket
            assert got.p99_us == pytest.approx(1000 + 9000 * 0.9) and got.p50_us < 1000
            assert set(sensor.sample(ctx(target))) <= {"ls.slice"}    # only the root that declares it
        finally:
            sensor.stop()
    finally:
        srv.close()


def test_a_hanging_target_never_stalls_the_round_and_is_unknown(fast, caplog):
    release = threading.Event()
    srv = Server(lambda h: release.wait(5))
    try:
        target = SloTarget(5000.0, source="prometheus", url=srv.url, metric="req_seconds")
        sensor = SloPrometheusSensor()
        try:
            with caplog.at_level(logging.WARNING, "koordd.slo"):
                for _ in range(10):
                    began = time.monotonic()
                    assert sensor.sample(ctx(target)) == {}
                    assert time.monotonic() - began < 0.05
                    time.sleep(0.1)
            assert [r.getMessage() for r in caplog.records if "took over" in r.getMessage()] != []
        finally:
            sensor.stop()
            release.set()
    finally:
        srv.close()


@pytest.mark.parametrize("status, body, kind", [(500, "oops", "HTTP 500"),
                                                (200, 'req_seconds_bucket{le="1"} lots\n', "cannot be read")])
def test_an_error_or_garbage_answer_is_unknown_and_logged_once(fast, caplog, status, body, kind):
    srv = Server(lambda h: reply(h, status, body))
    try:
        target = SloTarget(5000.0, source="prometheus", url=srv.url, metric="req_seconds")
        w = Scraper(target, 0.02, 0.3)
        with caplog.at_level(logging.WARNING, "koordd.slo"):
            for _ in range(5):
                w.once()
        assert w.take() is None
        lines = [r.getMessage() for r in caplog.records if r.name == "koordd.slo"]
        assert len(lines) == 1 and kind in lines[0]
    finally:
        srv.close()


def test_a_counter_reset_is_unknown_then_measures_again(fast):
    counts = iter([(10, 100), (20, 200), (1, 2), (11, 102)])
    srv = Server(lambda h: reply(h, 200, expo(*next(counts))))
    try:
        w = Scraper(SloTarget(5000.0, source="prometheus", url=srv.url, metric="req_seconds",
                              labels=(("handler", "/a"),)), 0.02, 0.3)
        w.once()
        w.once()
        assert w.take().count == 100
        w.once()                                # the service restarted: its counters start again
        assert w.take() is None
        w.once()
        assert w.take().count == 100
    finally:
        srv.close()


BAD_HISTOGRAMS = {
    # a bound of 1e303 s: finite, but 1e309 µs is not
    "absurd bound": lambda n: f'req_seconds_bucket{{le="1"}} {n}\nreq_seconds_bucket{{le="1e303"}} {2 * n}\n'
                              f'req_seconds_bucket{{le="+Inf"}} {2 * n}\n',
    # two series whose counts, summed per bound, overflow a float
    "overflowing counts": lambda n: "".join(f'req_seconds_bucket{{s="{s}",le="{b}"}} {1.5e308 if n > 1 else 1e307}\n'
                                            for s in "ab" for b in ("1", "+Inf")),
}


@pytest.mark.parametrize("bad", list(BAD_HISTOGRAMS))
def test_one_services_absurd_histogram_never_blinds_another(fast, bad):
    state = {"bad": 0, "good": 0}

    def handler(which, body):
        def handle(h):
            state[which] += 1
            reply(h, 200, body(state[which]))
        return handle
    bad_srv = Server(handler("bad", BAD_HISTOGRAMS[bad]))
    good_srv = Server(handler("good", lambda n: expo(90 * n, 100 * n)))
    slos = {"bad.slice": SloTarget(5000.0, source="prometheus", url=bad_srv.url, metric="req_seconds"),
            "good.slice": SloTarget(5000.0, source="prometheus", url=good_srv.url, metric="req_seconds",
                                    labels=(("handler", "/a"),))}
    sensor = SloPrometheusSensor()
    try:
        measured = 0
        for _ in range(40):
            got = sensor.sample(SensorContext(0.0, {"bad.slice": "LS", "good.slice": "LS"}, slos))
            if "good.slice" in got:
                measured += 1
            if state["bad"] >= 4 and measured >= 3:
                break
            time.sleep(0.1)
        assert state["bad"] >= 2 and measured >= 3
        app = got.get("bad.slice")
        assert app is None or (app.p99_us <= 2 ** 31 and app.max_us <= 2 ** 31)    # clamped, never inf
    finally:
        sensor.stop()
        bad_srv.close()
        good_srv.close()


def test_the_latency_arithmetic_takes_any_bound_a_target_answers():
    before = ((1.0, 0.0), (1e303, 0.0), (float("inf"), 0.0))
    app = latency(before, ((1.0, 5.0), (1e303, 10.0), (float("inf"), 10.0)))
    assert app.count == 10 and app.p99_us == 2 ** 31 and sum(app.slots) == 10
    app = latency(((-1e308, 0.0), (1.7e308, 0.0)), ((-1e308, 1.0), (1.7e308, 9.0)))
    assert app.count == 9 and app.p99_us <= 2 ** 31


@pytest.mark.parametrize("text", ['m_bucket{le="1"} 1e308\n', 'm_bucket{le="1"} 18014398509481984\n'])
def test_a_count_past_a_floats_integers_is_garbled(text):
    with pytest.raises(ScrapeError, match="count"):
        parse_buckets(text, "m")


def test_only_the_wanted_series_lines_are_parsed():
    noise = "".join(f'other_metric{{i="{i}"}} {i}\n' for i in range(1000)) + "\xff garbage {{{\n"
    text = noise + 'm_bucket{h="b",le="1"} oops\n' + 'm_bucket{h="a",le="1"} 3\nm_bucket{h="a",le="+Inf"} 4\n'
    assert parse_buckets(text.encode("latin-1"), "m", {"h": "a"}) == ((1.0, 3.0), (float("inf"), 4.0))
    with pytest.raises(ScrapeError, match="cannot be read"):
        parse_buckets(text.encode("latin-1"), "m")          # all series: h="b" is one, and garbled
    many = "".join(f'm_bucket{{i="{i}",le="1"}} 1\n' for i in range(prom.MAX_LINES + 1))
    with pytest.raises(ScrapeError) as ei:
        parse_buckets(many, "m")
    assert ei.value.kind == "too large"


# --- the probe against real servers ----------------------------------------------------------------------

class TcpServer:
    """A TCP server on 127.0.0.1 that answers each request after `delay` (None: never)."""

    def __init__(self, delay, answer=b"+PONG\r\n"):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.delay, self.answer, self.done = delay, answer, threading.Event()
        self.conns = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        self.sock.settimeout(0.1)
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            threading.Thread(target=self.answer_one, args=(conn,), daemon=True).start()

    def answer_one(self, conn):
        try:
            conn.recv(100)
            if self.delay is not None:
                time.sleep(self.delay)
                conn.sendall(self.answer)
            else:
                self.done.wait(5)
        except OSError:
            pass

    def close(self):
        self.done.set()
        self.sock.close()
        for c in self.conns:
            c.close()


def test_the_probe_times_a_delayed_answer():
    srv = TcpServer(0.02)
    try:
        target = SloTarget(5000.0, source="probe", probe=srv.address, probe_expect="+PONG", probe_interval=0.05)
        sensor = SloProbeSensor()
        try:
            sensor.sample(ctx(target))
            time.sleep(0.4)
            got = sensor.sample(ctx(target))["ls.slice"]
        finally:
            sensor.stop()
        assert got.count >= 3
        assert slot_of_us(got.p50_us) == slot_of_us(20_000) and 20_000 <= got.p50_us
        assert max(range(len(got.slots)), key=got.slots.__getitem__) == slot_of_us(20_000)
    finally:
        srv.close()


def test_a_wrong_answer_is_unknown():
    srv = TcpServer(0.0, b"-ERR\r\n")
    try:
        w = Prober(SloTarget(5000.0, source="probe", probe=srv.address, probe_expect="+PONG"))
        with pytest.raises(Exception, match="answered"):
            probe_once(srv.address, b"PING\r\n", b"+PONG", 1.0)
        assert w.take() is None
    finally:
        srv.close()


def test_a_closed_port_is_unknown_and_logged_once(caplog):
    s = socket.create_server(("127.0.0.1", 0))
    address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    w = Prober(SloTarget(5000.0, source="probe", probe=address, probe_interval=0.02))
    with caplog.at_level(logging.WARNING, "koordd.slo"):
        w.start()
        time.sleep(0.2)
        w.stop()
        w.join(1)
    assert w.take() is None
    lines = [r.getMessage() for r in caplog.records if r.name == "koordd.slo"]
    assert len(lines) == 1 and "refused" in lines[0]


def test_a_server_that_never_answers_counts_at_the_timeout():
    srv = TcpServer(None)
    try:
        w = Prober(SloTarget(5000.0, source="probe", probe=srv.address, probe_interval=0.05, probe_timeout=0.1))
        w.start()
        time.sleep(0.35)
        w.stop()
        w.join(1)
        got = w.take()
        assert got is not None and got.count >= 2
        assert got.mean_us == pytest.approx(100_000, rel=0.05) and got.p99_us > 65_536
        assert sum(got.slots) == got.count == got.slots[slot_of_us(100_000)]
    finally:
        srv.close()


# --- end to end: a declared source's latency over its target shrinks BE -------------------------------------

def test_a_declared_source_over_its_target_shrinks_be():
    from koordd.core.health import ls_signals
    from koordd.core.options import Duration  # noqa: F401
    from koordd.core.config import loop_options, make_settings
    from koordd.core.snapshot import RUNQ_LATENCY, RunqLatency
    from koordd_plugins.be_suppress import BeSuppress
    slo = SloTarget(5000.0, source="prometheus", url="http://127.0.0.1:1/m", metric="req_seconds")
    before = parse_buckets(expo(0, 0), "req_seconds", {"handler": "/a"})
    slow = latency(before, parse_buckets(expo(0, 1000), "req_seconds", {"handler": "/a"}))   # all 1..10 ms
    assert slow.p99_us > 5000

    def snap(t, app):
        cgs = {"ls": CgroupSample(path="ls", cls="LS", cpu_usage=1.0),
               "be": CgroupSample(path="be", cls="BE", cpu_usage=0.5, cpu_max="200000 100000")}
        sections = {RUNQ_LATENCY: {"ls": RunqLatency("ebpf", 100, 250, 250, 500, 500)}}
        if app is not None:
            sections[slo.section] = {"ls": app}
        return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=4, cpu_used=1.5), cgroups=cgs,
                        sections=sections, slo={"ls": slo})
    signals = ls_signals(snap(1.0, slow), {"ls": RunqLatency("ebpf", 100, 250, 250, 500, 500)})
    assert ("ls", "app_p99_us") in {(c, n) for c, n, _, _ in signals}
    s = make_settings(loop_options(BeSuppress), {"enabled": True, "rule": "slack"})
    state = BeSuppress.initial_state(s)
    # confirming: hold (a cut needs the signal over and seen for half the experiment window, 2.5 s)
    assert [a for a in BeSuppress.decide(snap(0.0, slow), s, state) if a.value] == []
    [act] = [a for a in BeSuppress.decide(snap(2.5, slow), s, state) if a.value]
    assert act.reason["worst"]["signal"] == "app_p99_us" and act.reason["slack"] < 0
    assert int(act.value.split()[0]) < 200_000
    # A round between two values (the source answered 1 s ago): neither late nor healthy, BE stays at its floor.
    [act] = [a for a in BeSuppress.decide(snap(3.5, None), s, state) if a.value]
    assert act.value == "2000 100000" and act.reason["step"] != "grow", act.reason
    # The source never measured (a scrape that fails: no entry): the run queue's 75% slack decides, BE grows.
    state = BeSuppress.initial_state(s)
    [act] = [a for a in BeSuppress.decide(snap(1.0, None), s, state) if a.value]
    assert act.reason["worst"]["signal"] == "runq_p99_us" and int(act.value.split()[0]) > 200_000


def test_a_costly_answer_stretches_the_scrape_interval_to_the_cpu_budget(caplog):
    w = Scraper(SloTarget(5000.0, source="prometheus", url="http://127.0.0.1:1/m", metric="m"), 1.0, 2.0)
    assert w.pause(0.1, 0.005) == pytest.approx(0.9)                 # cheap: the interval's rest
    with caplog.at_level(logging.INFO, "koordd.slo"):
        assert w.pause(0.3, 0.3) == pytest.approx(0.3 / prom.CPU_BUDGET - 0.3)   # 300 ms of CPU: 2% of 15 s
        w.pause(0.3, 0.3)
        w.pause(0.1, 0.005)
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2 and "scraped every 15.0s" in msgs[0] and "every 1s again" in msgs[1]
