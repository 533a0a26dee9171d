"""The daemon's side of koordctl top: what a view's request makes koordd read and publish, and that
without one nothing is."""
from __future__ import annotations

import json
import os
import time

import pytest

from koordtest.fakes.cgroup import FakeCgroups, psi
from koordctl.top import write_request
from koordd.act.journal import Held
from koordd.core.config import parse_config
from koordd.core.feeds import FRESH_AT_LEAST, REQUEST_FILE, TOP_FILE, TopRequest, parse_request
from koordd.core.snapshot import CPI, CpiSample, RUNQ_LATENCY, RunqLatency
from koordd.runtime.daemon import Daemon
from koordd.runtime.topfeed import TopFeed, VIEW_FIELDS
from koordd.sensors.contract import OptionalSensor, SensorUnavailable
from unit.runtime.test_round import UsageLoop

CALLS: list[str] = []       # what the fake sensors were asked, in order ("start runq_latency", ...)


class FakeRunq(OptionalSensor):
    name = RUNQ_LATENCY
    unavailable: str | None = None

    def start(self):
        CALLS.append(f"start {self.name}")
        if FakeRunq.unavailable:
            raise SensorUnavailable(FakeRunq.unavailable)

    def sample(self, context):
        return {cg: RunqLatency("ebpf", 12, 40.0, 32.0, 512.0, 1024.0) for cg in context.cgroups}

    def stop(self):
        CALLS.append(f"stop {self.name}")


class FakeCpi(FakeRunq):
    name = CPI

    def sample(self, context):
        return {"ls.slice": CpiSample(cycles=3e9, instructions=2e9, running_fraction=0.5), "be.slice": "not a sample"}


CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"
[[classes]]
name = "BE"
cgroups = ["be.slice"]
[[classes]]
name = "LS"
cgroups = ["ls.slice"]
[loops.usage_loop]
enabled = true
interval = "1s"
"""


@pytest.fixture
def tree(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice", memory_current=3 << 30)
    tree.add("be.slice/pod1", memory_current=1 << 30).add("ls.slice", memory_current=5 << 30)
    tree.set("ls.slice", None, "cpu.pressure", psi(avg10=12.5))
    tree.set("be.slice", None, "memory.pressure", psi(avg10=3.25))
    return tree


@pytest.fixture
def daemon(tree, tmp_path, monkeypatch):
    CALLS.clear()
    monkeypatch.setattr(FakeRunq, "unavailable", None)
    for where in ("koordd.runtime.wiring", "koordd.runtime.capabilities"):
        monkeypatch.setattr(f"{where}.load_sensor_registry", lambda: {RUNQ_LATENCY: FakeRunq, CPI: FakeCpi})
    path = tmp_path / "koordd.toml"
    path.write_text(CONFIG.format(root=tree.root, state=tmp_path / "state"))
    d = Daemon(parse_config(path.read_text(), path, {"usage_loop": UsageLoop}), {"usage_loop": UsageLoop})
    d.start()
    yield d
    d.stop()


def rounds(d: Daemon, n: int, for_view: bool = True) -> None:
    for _ in range(n):
        d.round(list(d.runner.runs.values()), for_view)


def seen(d: Daemon):
    """The last snapshot the loop was given."""
    return d.runner.runs["usage_loop"].state[-1]


def published(d: Daemon) -> dict:
    return json.loads((d.state_dir / TOP_FILE).read_text())


def ask(d: Daemon, **request) -> None:
    write_request(d.state_dir, TopRequest(**request))
    d.poll_view()


def make_stale(d: Daemon) -> None:
    old = time.time() - 10 * FRESH_AT_LEAST
    os.utime(d.state_dir / REQUEST_FILE, (old, old))
    d.poll_view()


def test_without_a_view_nothing_more_is_read_nor_written(daemon):
    daemon.poll_view()
    rounds(daemon, 3)
    assert not (daemon.state_dir / TOP_FILE).exists()
    assert daemon.runner.needs() | daemon.top.needs() == {"cpu_usage"}
    be = seen(daemon).cgroups["be.slice"]
    # The loops' fields, and the class roots' few the reclaimable capacity reads every round (memory_current
    # among them); nothing the view shows.
    assert be.cpu_usage is not None and be.memory_current is not None
    assert (be.cpu_pressure, be.io_pressure, be.throttling) == (None, None, None)
    assert seen(daemon).sections == {} and CALLS == []          # the view's sensors never start


def test_a_view_asking_gets_its_fields_sampled_and_a_round_published(daemon, tree):
    daemon.journal.add(Held("be.slice", "cpu.max", "max 100000", "be_suppress", 1000.0))
    tree.set("be.slice", "cpu", "cpu.max", "50000 100000\n")
    daemon.journal.add(Held("be.slice/pod1", "cgroup.freeze", "0", "memory_evict", 1001.0))
    ask(daemon, interval=2.0)
    assert CALLS == [f"start {CPI}", f"start {RUNQ_LATENCY}"]
    rounds(daemon, 1)
    assert not (daemon.state_dir / TOP_FILE).exists()        # the first round is only the rates' baseline
    assert seen(daemon).cgroups["ls.slice"].memory_current == 5 << 30
    rounds(daemon, 1)
    doc = published(daemon)
    assert doc["pid"] == os.getpid() and doc["interval"] == 2.0 and doc["members"] is False
    assert doc["time"] == pytest.approx(time.time(), abs=60)
    assert set(doc["node"]) == {"cpus", "cpu_used", "memory_total", "memory_available", "psi"}
    assert doc["node"]["cpus"] >= 1
    assert doc["sensors"] == {RUNQ_LATENCY: {"state": "running", "reason": None, "loops": ["koordctl top"]},
                              CPI: {"state": "running", "reason": None, "loops": ["koordctl top"]}}
    rows = {r["path"]: r for r in doc["cgroups"]}
    assert set(rows) == {"be.slice", "ls.slice", "be.slice/pod1"}
    ls, be, pod = rows["ls.slice"], rows["be.slice"], rows["be.slice/pod1"]
    assert (ls["class"], ls["kind"], ls["member_of"], ls["memory"]) == ("LS", "cgroup", None, 5 << 30)
    assert isinstance(ls["cpu"], float)
    assert ls["psi"] == {"cpu": 12.5, "memory": 0.0, "io": 0.0} and be["psi"]["memory"] == 3.25
    assert ls["runq"] == {"source": "ebpf", "count": 12, "mean_us": 40.0, "p50_us": 32.0, "p99_us": 512.0,
                          "max_us": 1024.0}
    assert ls["cpi"] == {"cycles": 3e9, "instructions": 2e9, "running_fraction": 0.5, "cpi": 1.5}
    assert be["cpi"] is None                                  # a value of another shape is left out
    assert be["knobs"] == {"cpu.max": {"current": "50000 100000", "original": "max 100000",
                                       "owner": "be_suppress", "since": 1000.0}}
    # a knob held on a pod the view does not list still shows, on a row of its own, with its class
    assert (pod["class"], pod["member_of"], pod["cpu"], pod["memory"]) == ("BE", None, None, None)
    assert pod["knobs"]["cgroup.freeze"]["current"] == "0" and pod["knobs"]["cgroup.freeze"]["owner"] == "memory_evict"


def test_rounds_in_between_read_the_view_fields_but_publish_only_when_the_view_is_due(daemon):
    ask(daemon)
    rounds(daemon, 2)
    first = published(daemon)["time"]
    rounds(daemon, 1, for_view=False)                           # a loop's round: sampled, not published
    assert seen(daemon).cgroups["be.slice"].memory_current == 3 << 30
    assert published(daemon)["time"] == first


def test_when_the_view_goes_away_its_sensors_stop_and_nothing_more_is_read_or_written(daemon):
    ask(daemon)
    rounds(daemon, 2)
    assert (daemon.state_dir / TOP_FILE).exists()
    make_stale(daemon)
    assert CALLS[-2:] == [f"stop {CPI}", f"stop {RUNQ_LATENCY}"]
    assert not (daemon.state_dir / TOP_FILE).exists()
    rounds(daemon, 2)
    assert not (daemon.state_dir / TOP_FILE).exists()
    # (memory_current is read on: the reclaimable capacity reads it every round)
    assert seen(daemon).cgroups["ls.slice"].cpu_pressure is None and seen(daemon).sections == {}
    assert daemon.sensors.optional.status()[RUNQ_LATENCY] == {"state": "stopped", "reason": None, "loops": []}


def test_a_view_asking_for_members_gets_them_and_the_loops_do_not(daemon):
    ask(daemon, members=True)
    rounds(daemon, 2)
    rows = {r["path"]: r for r in published(daemon)["cgroups"]}
    assert (rows["be.slice/pod1"]["member_of"], rows["be.slice/pod1"]["class"]) == ("be.slice", "BE")
    assert rows["be.slice/pod1"]["memory"] == 1 << 30 and isinstance(rows["be.slice/pod1"]["cpu"], float)
    assert seen(daemon).members == {}                           # units("BE") are still the roots for the loop


def test_a_sensor_unavailable_for_the_view_says_why_in_the_document(daemon, caplog):
    FakeRunq.unavailable = "libbpf.so.1 is not installed"
    ask(daemon)
    rounds(daemon, 2)
    doc = published(daemon)
    assert doc["sensors"][RUNQ_LATENCY] == {"state": "unavailable", "reason": "libbpf.so.1 is not installed",
                                            "loops": ["koordctl top"]}
    assert all(r["runq"] is None for r in doc["cgroups"])
    assert f"sensor {RUNQ_LATENCY} unavailable (libbpf.so.1 is not installed): koordctl top runs without it" in caplog.text


def test_stop_removes_what_was_published(daemon):
    ask(daemon)
    rounds(daemon, 2)
    daemon.stop()
    assert not (daemon.state_dir / TOP_FILE).exists()


# --- the request and the rhythm, with explicit times ----------------------------------------------

@pytest.mark.parametrize("text, request_", [
    ('{"interval": 3, "members": true}', TopRequest(3.0, True)),
    ('{"interval": 0.01}', TopRequest(0.5, False)),           # koordd samples for a view at most every 0.5 s
    ('{"interval": 1e9}', TopRequest(60.0, False)),           # and a dead view's request is stale within 3 min
    ('{"interval": "NaN"}', TopRequest()),
    ('{"members": "yes"}', TopRequest()),
    ("[1, 2]", TopRequest()),
    ("", TopRequest()),                                        # still a request, with the defaults
])
def test_parse_request(text, request_):
    assert parse_request(text) == request_


def test_a_request_stays_fresh_three_intervals_and_at_least_five_seconds():
    assert TopRequest(1.0).fresh_for == 5.0 and TopRequest(10.0).fresh_for == 30.0


def test_the_feed_publishes_every_interval_after_an_unpublished_first_round(tmp_path):
    feed = TopFeed(tmp_path)
    assert feed.check(100.0) is False and not feed.active and feed.next_wake() == 101.0   # one stat a second
    write_request(tmp_path, TopRequest(interval=4.0))
    assert feed.check(101.0) is True and feed.needs() == VIEW_FIELDS and feed.due(101.0)
    assert feed.settle(101.0, for_view=True) is False                  # the baseline
    assert not feed.due(101.5) and feed.due(102.0)                    # the first published one comes soon
    assert feed.settle(102.0, for_view=True) is True
    assert feed.next_publish == 106.0 and feed.next_wake() == 102.0   # the next look at the request: 1 s after the last
    assert feed.settle(103.0, for_view=False) is False and feed.next_publish == 106.0
    write_request(tmp_path, TopRequest(interval=1.0))                  # a second view, faster
    assert feed.check(103.5) is False and feed.next_publish == 104.5
    feed.skip(104.5)                                                   # a failed round: not again at once
    assert feed.next_publish == 105.5


def test_members_are_read_only_when_asked(tmp_path):
    feed = TopFeed(tmp_path)
    write_request(tmp_path, TopRequest())
    feed.check(0.0)
    assert feed.member_classes() == frozenset() and feed.member_needs() == frozenset()
    feed.settle(0.0, for_view=True)
    write_request(tmp_path, TopRequest(members=True))
    assert feed.check(1.0) is False                                  # the same view, the same sensors
    assert feed.member_classes() == {"SYSTEM", "LSE", "LSR", "LS", "BE"} and feed.member_needs() == VIEW_FIELDS
    assert feed.due(1.0) and feed.settle(1.0, for_view=True) is False  # a new baseline: the members' rates
