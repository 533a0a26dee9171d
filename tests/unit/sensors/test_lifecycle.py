"""Optional sensors: the registry, and a lifecycle that follows what the enabled loops need."""
from __future__ import annotations

import json
import logging
from koordd.core.installed import EntryPoint

import pytest

from koordtest.fakes.cgroup import FakeCgroups
import koordd.core.catalogue as entry_point_loader
from koordd.core.catalogue import SENSORS
from koordd.core.config import parse_config
from koordd.core.feeds import STATUS_FILE
from koordd.core.loop import Loop
from koordd.core.slo import SloTarget
from koordd.runtime.daemon import Daemon
from koordd.sensors import lifecycle, optional_sensors
from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable
from koordd.sensors.cpi import CpiSensor
from koordd.sensors.gpu import GpuSensor
from koordd.sensors.lifecycle import RETRY_AFTER, SensorManager


class Widget(OptionalSensor):
    """A fake sensor that notes every call into `calls` (class-wide: the manager makes the instances)."""
    name = "widget"
    calls: list[str] = []
    start_error: Exception | None = None
    sample_error: Exception | None = None

    def start(self):
        Widget.calls.append("start")
        if Widget.start_error is not None:
            raise Widget.start_error

    def sample(self, context):
        Widget.calls.append("sample")
        if Widget.sample_error is not None:
            raise Widget.sample_error
        return {cg: 1 for cg in context.cgroups}

    def stop(self):
        Widget.calls.append("stop")


@pytest.fixture(autouse=True)
def fresh_widget(monkeypatch):
    monkeypatch.setattr(Widget, "calls", [])
    monkeypatch.setattr(Widget, "start_error", None)
    monkeypatch.setattr(Widget, "sample_error", None)


def context(now=1.0):
    return SensorContext(now, {"be.slice": "BE"})


def warnings_about(caplog, name):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"sensor {name} unavailable")]


# --- the manager ------------------------------------------------------------------------------

def test_a_sensor_no_loop_needs_is_never_made_nor_started():
    made = []
    manager = SensorManager({"widget": lambda: made.append(1) or Widget()})
    manager.require({})
    assert manager.sample(context()) == {}
    assert made == [] and Widget.calls == []
    assert manager.status() == {"widget": {"state": "stopped", "reason": None, "loops": []}}


def test_a_needed_sensor_starts_once_and_is_sampled_every_round():
    manager = SensorManager({"widget": Widget})
    manager.require({"widget": ["b_loop", "a_loop"]})
    manager.require({"widget": ["a_loop", "b_loop"]})             # a reload that changed nothing for it
    sections = [manager.sample(context(t)) for t in (1.0, 2.0, 3.0)]
    assert sections == [{"widget": {"be.slice": 1}}] * 3
    assert Widget.calls == ["start", "sample", "sample", "sample"]
    assert manager.status()["widget"] == {"state": "running", "reason": None, "loops": ["a_loop", "b_loop"]}


def test_a_sensor_no_longer_needed_stops_and_a_fresh_one_starts_when_needed_again():
    made = []
    manager = SensorManager({"widget": lambda: made.append(Widget()) or made[-1]})
    manager.require({"widget": ["a_loop"]})
    manager.require({})                                            # the only loop needing it was disabled
    assert Widget.calls == ["start", "stop"] and manager.sample(context()) == {}
    assert manager.status()["widget"]["state"] == "stopped"
    manager.require({"widget": ["a_loop"]})
    assert Widget.calls == ["start", "stop", "start"] and len(made) == 2


def test_stop_all_stops_running_sensors_once():
    manager = SensorManager({"widget": Widget})
    manager.require({"widget": ["a_loop"]})
    manager.stop_all("koordd stopping")
    manager.stop_all("koordd stopping")
    assert Widget.calls == ["start", "stop"] and manager.status()["widget"]["state"] == "stopped"


def test_a_failed_start_is_said_once_with_the_loops_and_retried_quietly(caplog):
    Widget.start_error = SensorUnavailable("no widget on this host")
    manager = SensorManager({"widget": Widget})
    manager.require({"widget": ["a_loop"]}, now=0.0)
    assert Widget.calls == ["start", "stop"]                       # stopped: a partial start releases
    for t in (1.0, 2.0, RETRY_AFTER - 1):                          # rounds before the retry: nothing tried
        assert manager.sample(context(t)) == {}
    assert Widget.calls == ["start", "stop"]
    manager.sample(context(RETRY_AFTER))                           # tried again, same reason: no new line
    assert Widget.calls == ["start", "stop"] * 2
    assert warnings_about(caplog, "widget") == [
        "sensor widget unavailable (no widget on this host): loop a_loop runs without it"]
    assert manager.status()["widget"] == {"state": "unavailable", "reason": "no widget on this host",
                                          "loops": ["a_loop"]}

    Widget.start_error = SensorUnavailable("widget driver too old")  # a new reason is worth a line
    manager.sample(context(2 * RETRY_AFTER))
    assert warnings_about(caplog, "widget")[1:] == [
        "sensor widget unavailable (widget driver too old): loop a_loop runs without it"]

    Widget.start_error = None                                     # the driver came: it starts by itself
    assert manager.sample(context(3 * RETRY_AFTER)) == {"widget": {"be.slice": 1}}
    assert manager.status()["widget"]["state"] == "running"


def test_a_reload_tries_again_and_says_again(caplog):
    Widget.start_error = SensorUnavailable("no widget")
    manager = SensorManager({"widget": Widget})
    manager.require({"widget": ["a_loop"]}, now=0.0)
    manager.reprobe()
    manager.require({"widget": ["a_loop", "b_loop"]}, now=1.0)
    assert Widget.calls.count("start") == 2
    assert warnings_about(caplog, "widget") == [
        "sensor widget unavailable (no widget): loop a_loop runs without it",
        "sensor widget unavailable (no widget): loops a_loop, b_loop run without it"]


def test_koordctl_top_is_named_as_a_user_that_is_not_a_loop(caplog):
    Widget.start_error = SensorUnavailable("no widget")
    manager = SensorManager({"widget": Widget})
    manager.require({"widget": [lifecycle.VIEW_USER]}, now=0.0)
    manager.require({}, now=1.0)                                   # the view went away
    manager.require({"widget": [lifecycle.VIEW_USER]}, now=2.0)  # the view again: tried, not said again
    manager.require({}, now=3.0)
    manager.require({"widget": ["a_loop", lifecycle.VIEW_USER]}, now=4.0)
    assert Widget.calls.count("start") == 3
    assert warnings_about(caplog, "widget") == [
        "sensor widget unavailable (no widget): koordctl top runs without it",
        "sensor widget unavailable (no widget): loop a_loop and koordctl top run without it"]
    assert manager.status()["widget"]["loops"] == ["a_loop", "koordctl top"]


def test_a_start_that_raises_anything_else_is_unavailable_too(caplog):
    Widget.start_error = OSError(13, "Permission denied")
    manager = SensorManager({"widget": Widget})
    manager.require({"widget": ["a_loop"]})
    assert manager.status()["widget"]["reason"] == "start failed: PermissionError: [Errno 13] Permission denied"
    broken = SensorManager({"widget": lambda: 1 / 0})               # even a constructor that raises
    broken.require({"widget": ["a_loop"]})
    assert broken.status()["widget"]["reason"] == "start failed: ZeroDivisionError: division by zero"


def test_a_failing_sample_loses_its_section_for_the_round_and_is_logged_once(caplog):
    manager = SensorManager({"widget": Widget})
    manager.require({"widget": ["a_loop"]})
    Widget.sample_error = RuntimeError("ring buffer lost")
    assert manager.sample(context(1.0)) == {} and manager.sample(context(2.0)) == {}
    errors = [r for r in caplog.records if "failed to sample" in r.getMessage()]
    assert len(errors) == 1 and "RuntimeError: ring buffer lost" in errors[0].getMessage()
    Widget.sample_error = None
    assert manager.sample(context(3.0)) == {"widget": {"be.slice": 1}}
    assert manager.status()["widget"]["state"] == "running"


# --- the registry ------------------------------------------------------------------------------

class Mismatch(OptionalSensor):
    name = "other"


def test_third_party_sensors_come_from_the_entry_point_group(monkeypatch, caplog):
    points = [EntryPoint("widget", f"{__name__}:Widget", SENSORS),
              EntryPoint("broken", "koordd_no_such_module:Sensor", SENSORS),
              EntryPoint("mismatch", f"{__name__}:Mismatch", SENSORS),
              EntryPoint("gpus", f"{__name__}:Widget", SENSORS),
              EntryPoint("cpi", f"{__name__}:Widget", SENSORS),
              EntryPoint("cpu_usage", f"{__name__}:Widget", SENSORS)]
    monkeypatch.setattr(entry_point_loader, "entry_points", lambda group: [p for p in points if p.group == group])
    assert optional_sensors.load_sensor_registry() == {**optional_sensors.builtin_sensors(), "widget": Widget}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(m.startswith("sensor broken (koordd_no_such_module:Sensor) failed to load") for m in errors)
    assert any(m.startswith("sensor mismatch: entry point names class") for m in errors)
    assert any("gpus is already koordd's own sensor" in m for m in errors)
    assert any("cpi is already koordd's own sensor" in m for m in errors)
    assert any("cpu_usage is already a cgroup field" in m for m in errors)


def test_the_gpu_sensor_is_built_in_and_starts_nothing_until_needed():
    assert optional_sensors.builtin_sensors()["gpus"] is GpuSensor and optional_sensors.builtin_sensors()["cpi"] is CpiSensor
    assert GpuSensor.name == "gpus"
    sensor, why = lifecycle.start_sensor(lambda: GpuSensor(nvml=FailingNvml()))
    assert sensor is None and why == "nvmlInit: Driver Not Loaded"


class FailingNvml:
    class NVMLError(Exception):
        pass

    def nvmlInit(self):
        raise self.NVMLError("Driver Not Loaded")


# --- the daemon: loops' needs drive the sensors ---------------------------------------------------

class WidgetLoop(Loop):
    """Notes the widget section of every snapshot it sees into its state."""
    name = "widget_loop"

    @staticmethod
    def needs(settings):
        return frozenset({"cpu_usage", "widget"})

    @staticmethod
    def initial_state(settings):
        return []

    @staticmethod
    def decide(snapshot, settings, state):
        state.append(snapshot.section("widget"))
        return []


CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"
[[classes]]
name = "BE"
cgroups = ["be.slice"]
[loops.widget_loop]
enabled = {enabled}
interval = "1s"
"""


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    # The doctor's probe sees the widget too: the daemon must not start it that way.
    for where in ("koordd.runtime.wiring", "koordd.runtime.capabilities"):
        monkeypatch.setattr(f"{where}.load_sensor_registry", lambda: {"widget": Widget})
    loops = {"widget_loop": WidgetLoop}
    path = tmp_path / "koordd.toml"

    def configure(enabled: bool):
        path.write_text(CONFIG.format(root=tree.root, state=tmp_path / "state", enabled=str(enabled).lower()))
        return parse_config(path.read_text(), path, loops)

    return Daemon(configure(True), loops), configure


def status(d: Daemon) -> dict:
    return json.loads((d.state_dir / STATUS_FILE).read_text())


def rounds(d: Daemon, n: int) -> None:
    for _ in range(n):
        d.round(list(d.runner.runs.values()))


def test_the_daemon_runs_a_sensor_while_a_loop_needs_it(daemon):
    daemon, configure = daemon
    daemon.start()
    rounds(daemon, 2)
    assert Widget.calls == ["start", "sample", "sample", "sample"]     # the baseline snapshot, then 2 rounds
    assert daemon.runner.runs["widget_loop"].state == [{"be.slice": 1}] * 2
    assert status(daemon)["sensors"] == {"widget": {"state": "running", "reason": None, "loops": ["widget_loop"]}}
    configure(False)
    daemon.reload()
    assert Widget.calls[-1] == "stop"
    configure(True)
    daemon.reload()
    assert Widget.calls[-1] == "start"
    daemon.stop()
    assert Widget.calls[-1] == "stop" and Widget.calls.count("stop") == 2
    assert status(daemon)["sensors"]["widget"]["state"] == "stopped"


def test_a_loop_needing_an_unavailable_sensor_runs_without_its_section(daemon, caplog):
    daemon, _ = daemon
    Widget.start_error = SensorUnavailable("no widget here")
    daemon.start()
    rounds(daemon, 3)
    run = daemon.runner.runs["widget_loop"]
    assert run.state == [None] * 3 and run.failures == 0 and run.ticks == 3
    assert warnings_about(caplog, "widget") == ["sensor widget unavailable (no widget here): loop widget_loop runs "
                                                "without it"]
    assert status(daemon)["sensors"]["widget"] == {"state": "unavailable", "reason": "no widget here",
                                                   "loops": ["widget_loop"]}
    daemon.stop()


# --- the SLOs: a class that declares one runs the sensor its latency comes from ---------------------------

class FakeAppLatency(Widget):
    """The application latency sensor's stand-in (no BPF): notes its calls into Widget.calls."""
    name = "app_latency"


SLO_CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"
[[classes]]
name = "LS"
cgroups = ["ls.slice"]
{slo}
[[classes]]
name = "BE"
cgroups = ["be.slice"]
[loops.widget_loop]
enabled = false
"""


def test_the_application_latency_sensor_runs_only_while_a_class_declares_an_slo(tmp_path, monkeypatch, caplog):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice").add("ls.slice")
    for where in ("koordd.runtime.wiring", "koordd.runtime.capabilities"):
        monkeypatch.setattr(f"{where}.load_sensor_registry", lambda: {"app_latency": FakeAppLatency})
    loops = {"widget_loop": WidgetLoop}
    path = tmp_path / "koordd.toml"

    def configure(slo: str):
        path.write_text(SLO_CONFIG.format(root=tree.root, state=tmp_path / "state", slo=slo))
        return parse_config(path.read_text(), path, loops)

    d = Daemon(configure(""), loops)                 # no SLO: nothing loads the sensor
    d.start()
    rounds(d, 1)
    assert Widget.calls == []
    assert d.sensors.optional.status()["app_latency"]["state"] == "stopped"
    configure('[classes.slo]\nlatency_p99 = "5ms"')
    d.reload()
    assert Widget.calls == ["start"]
    snapshot = d.rounds.run([]).snapshot             # the snapshot carries the SLO and the sensor's section
    assert snapshot.slo_of("ls.slice") == SloTarget(5000.0) and snapshot.slo_of("be.slice") is None
    assert snapshot.section("app_latency") == {"ls.slice": 1, "be.slice": 1}     # the fake answers for every cgroup
    rounds(d, 1)
    assert status(d)["sensors"]["app_latency"] == {"state": "running", "reason": None,
                                                     "loops": ["the SLO of class LS"]}
    configure("")                                    # a reload that removes every SLO stops it again
    d.reload()
    assert Widget.calls[-1] == "stop" and d.sensors.optional.status()["app_latency"]["state"] == "stopped"
    # Where it cannot start, the log names the SLO that goes without it.
    Widget.start_error = SensorUnavailable("no BTF")
    configure('[classes.slo]\nlatency_p99 = "5ms"')
    d.reload()
    assert warnings_about(caplog, "app_latency") == ["sensor app_latency unavailable (no BTF): the SLO of class LS "
                                                     "runs without it"]
    d.stop()
