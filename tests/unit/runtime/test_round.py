"""The daemon's round and its subscribers: what a reader asks for is read, every subscriber gets the same
result (or hears that the round was skipped), and a reload hands the new config's rules to the parts."""
from __future__ import annotations

import json

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.core.config import parse_config
from koordd.core.feeds import STATUS_FILE
from koordd.core.kubelet import KubeletRule
from koordd.core.loop import Loop
from koordd.runtime.daemon import Daemon
from koordd.runtime.result import RoundResult, Subscriber


class UsageLoop(Loop):
    """Needs CPU usage only, and keeps every snapshot it is given."""
    name = "usage_loop"

    @staticmethod
    def needs(settings):
        return frozenset({"cpu_usage"})

    @staticmethod
    def initial_state(settings):
        return []

    @staticmethod
    def decide(snapshot, settings, state):
        state.append(snapshot)
        return []


REGISTRY = {"usage_loop": UsageLoop}
CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"
{extra}
[[classes]]
name = "BE"
cgroups = ["be.slice"]
[loops.usage_loop]
enabled = true
interval = "1s"
"""


class Recorder(Subscriber):
    """A subscriber that asks for cpu.weight of the class roots, and keeps what it is handed."""

    def __init__(self):
        self.got: list[RoundResult | str] = []

    def needs(self):
        return frozenset({"cpu_weight"})

    def published(self, result):
        self.got.append(result)

    def skipped(self, now):
        self.got.append("skipped")


@pytest.fixture
def node(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    path = tmp_path / "koordd.toml"

    def daemon(extra: str = "") -> Daemon:
        path.write_text(CONFIG.format(root=tree.root, state=tmp_path / "state", extra=extra))
        return Daemon(parse_config(path.read_text(), path, REGISTRY), REGISTRY)
    return daemon


def test_a_subscriber_gets_what_it_asked_read_and_the_same_result_as_the_status_file(node):
    d = node()
    recorder = Recorder()
    d.start()
    try:
        d.round(list(d.runner.runs.values()))
        [unasked] = d.runner.runs["usage_loop"].state
        assert unasked.cgroups["be.slice"].cpu_weight is None        # nobody asked: not read
        d.rounds.readers += (recorder,)
        d.subscribers += (recorder,)
        d.round(list(d.runner.runs.values()))
    finally:
        d.stop()
    [result] = recorder.got
    assert result.snapshot.cgroups["be.slice"].cpu_weight == "100"
    assert result.rounds.rounds == 2 and list(result.loops) == ["usage_loop"]
    status = json.loads((d.state_dir / STATUS_FILE).read_text())
    assert status["loops"]["usage_loop"]["ticks"] == result.loops["usage_loop"]["ticks"] == 2


def test_a_round_whose_snapshot_fails_is_skipped_by_every_subscriber(node, monkeypatch):
    d = node()
    recorder = Recorder()
    d.subscribers += (recorder,)
    d.start()
    try:
        def broken(*args, **kwargs):
            raise RuntimeError("a sensor's bug")
        monkeypatch.setattr(d.sensors, "snapshot", broken)
        d.round(list(d.runner.runs.values()))
    finally:
        monkeypatch.undo()
        d.stop()
    assert recorder.got == ["skipped"]
    assert d.rounds.done == 0


def test_the_kubelet_rule_is_given_at_construction_and_swapped_by_a_reload(node):
    d = node('kubelet_override = ["cpu.weight"]')
    try:
        assert d.actuator.kubelet == KubeletRule(override=frozenset({"cpu.weight"}))
        d.config.path.write_text(d.config.path.read_text().replace('kubelet_override = ["cpu.weight"]',
                                                                   'kubelet_owned = "override"'))
        d.reload()
        assert d.actuator.kubelet == KubeletRule("override")
    finally:
        d.stop()
