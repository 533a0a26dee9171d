"""Every network peer of koordd (a Prometheus endpoint, an SLO probe's target, the report's receiver, the
name lookups of their hosts) is bounded by one total deadline and ends when stopped
(koordd/kernel/netpeer.py, docs/reliability.md "Network peers"). Each hostile shape is a real server on
127.0.0.1 in a thread (koordtest.hostile). The margins are generous on purpose: a bound that holds is
about the deadline, a broken one is the server's whole life (30 s) or for ever."""
from __future__ import annotations

import os
import socket
import stat
import threading
import time

import pytest

from koordd.core.report import REPORT_OPTIONS
from koordd.core.config import make_settings
from koordd.core.slo import SloTarget
from koordd.kernel import netpeer
from koordd.kernel.netpeer import Cancel, Deadline, PeerError, Resolver, http_exchange, open_unix_path
from koordd.runtime.reportpush import PushError, ReportPusher, post
from koordd.sensors.contract import SensorContext
from koordd.sensors.slo_probe import Prober, SloProbeSensor, Unknown, probe_once
from koordd.sensors.slo_prometheus import Scraper, ScrapeError, SloPrometheusSensor, scrape
from koordtest.hostile import HostileServer

DEADLINE = 0.5
MARGIN = 5.0            # seconds over the deadline still taken as "bounded" (a loaded 2-CPU host)
HTTP_SHAPES = ("trickle_head", "endless_continue", "endless_body", "huge_body", "silent")


def took(fn, *args, **kw):
    """(seconds, the exception fn raised or None)."""
    t = time.monotonic()
    try:
        fn(*args, **kw)
    except Exception as e:  # noqa: BLE001
        return time.monotonic() - t, e
    return time.monotonic() - t, None


def peer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t.name.startswith(("prometheus ", "probe ", "koordd-report", "koordd-resolve")) and t.is_alive()]


# --- one deadline, from the connect to the last byte ------------------------------------------------------

@pytest.mark.parametrize("shape", HTTP_SHAPES)
def test_a_scrape_never_outlives_its_deadline(shape):
    with HostileServer(shape) as srv:
        seconds, err = took(scrape, srv.url, DEADLINE)
    assert isinstance(err, ScrapeError), err
    assert err.kind in ("timeout", "too large", "unreachable"), err
    assert seconds < DEADLINE + MARGIN, (shape, seconds)


@pytest.mark.parametrize("shape", HTTP_SHAPES)
def test_a_report_push_never_outlives_its_deadline(shape):
    with HostileServer(shape) as srv:
        seconds, err = took(post, srv.url, b"{}", DEADLINE)
    assert err is None or isinstance(err, PushError), err        # a 200 head is a push that worked
    assert (err is None) == (shape in ("endless_body", "huge_body"))   # (the body is never read)
    assert seconds < DEADLINE + MARGIN, (shape, seconds)


@pytest.mark.parametrize("shape", ["trickle_head", "endless_continue", "silent"])
def test_a_probe_never_outlives_its_deadline(shape):
    with HostileServer(shape) as srv:
        t = time.monotonic()
        try:
            got = probe_once(srv.address, b"GET / HTTP/1.1\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\nyes", DEADLINE)
        except Unknown:
            got = None
        seconds = time.monotonic() - t
    assert got is None or got == DEADLINE        # unknown, or a response at the timeout (a violation)
    assert seconds < DEADLINE + MARGIN, (shape, seconds)


def test_an_endless_run_of_100_continue_is_a_protocol_error_at_once():
    with HostileServer("endless_continue") as srv:
        with pytest.raises(PeerError) as ei:
            http_exchange(srv.url, Deadline(30.0), max_body=1 << 20)
    assert ei.value.kind == "protocol" and "1xx" in str(ei.value)


def test_a_healthy_answer_is_read_whole():
    body = b'm_bucket{le="+Inf"} 3\n' * 1000
    with HostileServer("ok", body=body) as srv:
        assert scrape(srv.url, 2.0) == body
        assert http_exchange(srv.url, Deadline(2.0), method="POST", body=b"{}").status == 200


def test_an_https_peer_that_answers_plain_http_is_a_tls_error():
    """ssl is imported only where a connection goes TLS (koordd/kernel/netpeer.py, Conn.start_tls): its
    errors still reach the caller as PeerError "tls", after the handshake waited for the server's answer
    (the non-blocking handshake's want-read path) - a plain server answering the ClientHello with HTTP."""
    with HostileServer("ok", body=b"plain") as srv:
        url = srv.url.replace("http://", "https://", 1)
        with pytest.raises(PeerError) as ei:
            http_exchange(url, Deadline(10.0), max_body=1 << 10)
    assert ei.value.kind == "tls", ei.value


# --- stop ends the thread, within the deadline --------------------------------------------------------------

@pytest.mark.parametrize("shape", ["trickle_head", "endless_continue", "endless_body", "silent"])
def test_stopping_the_prometheus_sensor_ends_its_thread_in_flight(shape):
    before = peer_threads()
    with HostileServer(shape) as srv:
        sensor = SloPrometheusSensor()
        target = SloTarget(5000.0, source="prometheus", url=srv.url, metric="m")
        sensor.sample(SensorContext(0.0, {"ls": "LS"}, {"ls": target}))
        [worker] = sensor.workers.values()
        worker.timeout = 20.0                        # a scrape that would hold the thread 20 s
        assert wait(lambda: srv.connections >= 1)
        time.sleep(0.2)                               # in flight
        t = time.monotonic()
        sensor.stop()
        seconds = time.monotonic() - t
        assert not worker.is_alive()
    assert seconds < MARGIN
    assert peer_threads() == before


@pytest.mark.parametrize("shape", ["trickle_head", "silent"])
def test_stopping_the_probe_sensor_ends_its_thread_in_flight(shape):
    before = peer_threads()
    with HostileServer(shape) as srv:
        sensor = SloProbeSensor()
        target = SloTarget(5000.0, source="probe", probe=srv.address, probe_timeout=10.0, probe_expect="+PONG")
        sensor.sample(SensorContext(0.0, {"ls": "LS"}, {"ls": target}))
        [worker] = sensor.workers.values()
        assert wait(lambda: srv.connections >= 1)
        time.sleep(0.2)
        t = time.monotonic()
        sensor.stop()
        seconds = time.monotonic() - t
        assert not worker.is_alive()
    assert seconds < MARGIN
    assert peer_threads() == before


def test_a_reload_that_changes_the_report_never_waits_for_the_receiver():
    with HostileServer("trickle_head") as srv, HostileServer("ok") as other:
        pusher = ReportPusher()
        pusher.latest = object.__new__(_Report)
        pusher.configure(make_settings(REPORT_OPTIONS, {"url": srv.url, "interval": 0.1, "timeout": 10.0}))
        old = pusher.thread
        assert wait(lambda: srv.connections >= 1)
        time.sleep(0.2)                               # a push in flight, for up to 10 s
        t = time.monotonic()
        pusher.configure(make_settings(REPORT_OPTIONS, {"url": other.url, "interval": 0.1, "timeout": 10.0}))
        seconds = time.monotonic() - t
        assert not old.is_alive()
        pusher.stop()
    assert seconds < MARGIN
    assert pusher.thread is None and not [t for t in peer_threads() if t.name == "koordd-report"]


class _Report:
    def as_dict(self):
        return {}


def test_a_cancel_wakes_an_exchange_at_once():
    with HostileServer("silent") as srv:
        cancel = Cancel()
        threading.Timer(0.2, cancel.set).start()
        seconds, err = took(http_exchange, srv.url, Deadline(30.0, cancel))
        cancel.close()
    assert isinstance(err, PeerError) and err.kind == "cancelled"
    assert seconds < MARGIN


# --- name lookups: bounded helper threads ------------------------------------------------------------------

@pytest.fixture
def stuck_dns(monkeypatch):
    """getaddrinfo blocks until released, as a resolver whose servers drop every packet."""
    release = threading.Event()
    calls = []
    real = socket.getaddrinfo

    def blocking(host, *a, **kw):
        if not host.endswith(".stuck.invalid"):
            return real(host, *a, **kw)
        calls.append(host)
        release.wait(60)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    monkeypatch.setattr(socket, "getaddrinfo", blocking)
    yield release, calls
    release.set()
    for t in threading.enumerate():
        if t.name.startswith("koordd-resolve"):
            t.join(5)


def test_a_stuck_name_lookup_costs_the_deadline_not_more(stuck_dns):
    release, calls = stuck_dns
    resolver = Resolver()
    for peer in (lambda: scrape("http://a.stuck.invalid:9/metrics", DEADLINE, resolver=resolver),
                 lambda: post("http://a.stuck.invalid:9/r", b"{}", DEADLINE, resolver=resolver),
                 lambda: probe_once("tcp://a.stuck.invalid:9", b"x", b"", DEADLINE, resolver=resolver)):
        seconds, err = took(peer)
        assert err is not None and ("resolve" in str(err) or "dns" in str(err)), err
        assert seconds < DEADLINE + MARGIN
    assert calls == ["a.stuck.invalid"]              # one lookup in flight per resolver, not one per try


def test_lookups_in_flight_are_capped_and_their_threads_end_when_the_resolver_answers(stuck_dns):
    release, calls = stuck_dns
    resolvers = [Resolver() for _ in range(netpeer.MAX_LOOKUPS + 1)]
    errors = []
    for i, r in enumerate(resolvers):
        try:
            r.resolve(f"h{i}.stuck.invalid", 80, Deadline(0.05))
        except PeerError as e:
            errors.append(str(e))
    assert len(calls) == netpeer.MAX_LOOKUPS            # the last one never started a thread
    assert "lookups already in flight" in errors[-1]
    release.set()
    for t in [t for t in threading.enumerate() if t.name.startswith("koordd-resolve")]:
        t.join(5)
        assert not t.is_alive()
    with pytest.raises(PeerError, match="Temporary failure"):   # the slots are free again
        resolvers[-1].resolve("late.stuck.invalid", 80, Deadline(2.0))


def wait(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


# --- a UNIX socket another user could replace is refused ----------------------------------------------------

class UnixServer:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.accepted = 0
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            try:
                conn.recv(100)
                conn.sendall(b"+PONG\r\n")
            except OSError:
                pass
            conn.close()

    def close(self):
        self.sock.close()


@pytest.fixture
def victim(tmp_path):
    """A socket in a directory only root (the test's user) may enter: the service must not reach it."""
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    srv = UnixServer(d / "secret.sock")
    yield d / "secret.sock", srv
    srv.close()


def service_dir(tmp_path, how):
    d = tmp_path / "svc"
    d.mkdir(mode=0o755)
    if how == "world-writable":
        d.chmod(0o777)
    elif how == "another user's":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a directory to another user")
        os.chown(d, 65534, 65534)
    return d


@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_the_probe_never_follows_a_symlink_a_service_put_in_place_of_its_socket(tmp_path, victim, how):
    secret, srv = victim
    d = service_dir(tmp_path, how)
    (d / "app.sock").symlink_to(secret)
    with pytest.raises(Unknown) as ei:
        probe_once(f"unix:{d / 'app.sock'}", b"PING\r\n", b"+PONG", 1.0)
    assert ei.value.kind == "unsafe path" and "symlink" in str(ei.value)
    assert srv.accepted == 0                      # never connected, never written to


def test_a_symlinked_directory_on_the_path_another_user_can_replace_is_refused(tmp_path, victim):
    secret, srv = victim
    d = service_dir(tmp_path, "world-writable")
    (d / "run").symlink_to(secret.parent)
    with pytest.raises(Unknown) as ei:
        probe_once(f"unix:{d / 'run' / 'secret.sock'}", b"PING\r\n", b"+PONG", 1.0)
    assert ei.value.kind == "unsafe path" and srv.accepted == 0


def test_a_socket_of_another_owner_in_a_service_directory_is_refused(tmp_path, victim):
    """A hard link the service made to a socket it may not open: the inode is root's, the directory not."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    secret, srv = victim
    d = service_dir(tmp_path, "another user's")
    os.link(secret, d / "app.sock")
    with pytest.raises(PeerError) as ei:
        os.close(open_unix_path(str(d / "app.sock")))
    assert ei.value.kind == "unsafe path" and "owner" in str(ei.value)


def test_a_socket_swapped_for_another_file_is_refused(tmp_path):
    d = tmp_path / "svc"
    d.mkdir()
    (d / "app.sock").write_text("")
    with pytest.raises(PeerError, match="not a socket"):
        open_unix_path(str(d / "app.sock"))


def test_a_socket_of_the_service_itself_and_a_symlink_only_root_could_place_are_probed(tmp_path):
    d = tmp_path / "svc"
    d.mkdir(mode=0o755)
    if os.geteuid() == 0:
        os.chown(d, 65534, 65534)
    srv = UnixServer(d / "app.sock")
    try:
        if os.geteuid() == 0:
            os.chown(d / "app.sock", 65534, 65534, follow_symlinks=False)     # the service's own socket
        assert 0 <= probe_once(f"unix:{d / 'app.sock'}", b"PING\r\n", b"+PONG", 2.0) < 2.0
        link_dir = tmp_path / "etc"
        link_dir.mkdir(mode=0o755)
        assert not stat.S_IMODE(link_dir.stat().st_mode) & 0o022
        (link_dir / "app.sock").symlink_to(d / "app.sock")        # in a directory only root can write
        assert 0 <= probe_once(f"unix:{link_dir / 'app.sock'}", b"PING\r\n", b"+PONG", 2.0) < 2.0
        assert srv.accepted == 2
    finally:
        srv.close()


def test_a_prober_on_an_unsafe_path_is_unknown_and_logs_it_once(tmp_path, victim, caplog):
    secret, srv = victim
    d = service_dir(tmp_path, "world-writable")
    (d / "app.sock").symlink_to(secret)
    w = Prober(SloTarget(5000.0, source="probe", probe=f"unix:{d / 'app.sock'}", probe_interval=0.02))
    w.start()
    time.sleep(0.2)
    w.stop()
    w.join(5)
    assert w.take() is None and srv.accepted == 0
    assert len([r for r in caplog.records if "unsafe" in r.getMessage() or "symlink" in r.getMessage()]) == 1
