"""sched_ext: the status reader and sensor on fake /sys trees (literal kernel text, old kernels and
broken files included), and the loop's decisions on hand-built snapshots."""
from __future__ import annotations

from pathlib import Path

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import CgroupBackend
from koordd.backends.threads import ThreadPolicyBackend
from koordd.core.backend import Backends
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.decisions import REFUSED
from koordd.core.snapshot import CgroupSample, NodeSample, SCHED_EXT, SchedExtStatus, Snapshot
from koordd.kernel.sched_ext import read_sched_ext
from koordd_plugins.qos_baseline import QosBaseline
from koordd_plugins.sched_ext import SchedExt
from koordd.runtime.runner import Runner
from koordd.sensors.contract import SensorUnavailable
from koordd.sensors.sched_ext import SchedExtSensor
from unit.backends.test_threads import EXT, OTHER, FakeSched, put_threads

ENABLED = {"state": "enabled", "root/ops": "flatcg_1.0.5_g1234_x86_64_unknown_linux_gnu", "enable_seq": "2",
           "nr_rejected": "0", "switch_all": "0", "hotplug_seq": "0"}


def fake_sys(root: Path, files: dict[str, str]) -> Path:
    """A /sys whose kernel/sched_ext holds `files` (name -> text, a newline added as the kernel does)."""
    for name, text in files.items():
        path = root / "kernel/sched_ext" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


# --- reader ----------------------------------------------------------------------------------------

def test_reads_an_enabled_scheduler(tmp_path):
    status = read_sched_ext(fake_sys(tmp_path, ENABLED))
    assert status == SchedExtStatus("enabled", ENABLED["root/ops"], enable_seq=2, nr_rejected=0, switch_all=0,
                                    hotplug_seq=0)


def test_none_without_sched_ext_and_none_for_what_an_older_kernel_lacks(tmp_path):
    assert read_sched_ext(tmp_path) is None
    (tmp_path / "kernel/sched_ext").mkdir(parents=True)
    assert read_sched_ext(tmp_path) is None                 # the directory without its state file
    status = read_sched_ext(fake_sys(tmp_path, {"state": "disabled", "switch_all": "0"}))
    assert status == SchedExtStatus("disabled", "", None, None, 0, None)
    assert status.describe() == "state=disabled, switch_all=0"


@pytest.mark.parametrize("text", ["", "x", "1.5", "-"])
def test_a_malformed_counter_is_unknown(tmp_path, text):
    status = read_sched_ext(fake_sys(tmp_path, {**ENABLED, "enable_seq": text}))
    assert status.enable_seq is None and status.state == "enabled"


# --- sensor ----------------------------------------------------------------------------------------

def test_sensor_unavailable_without_sched_ext(tmp_path):
    with pytest.raises(SensorUnavailable, match="CONFIG_SCHED_CLASS_EXT"):
        SchedExtSensor(tmp_path).start()


def test_sensor_samples_the_status_each_round(tmp_path):
    sensor = SchedExtSensor(fake_sys(tmp_path, {**ENABLED, "state": "disabled", "root/ops": ""}))
    sensor.start()
    assert sensor.sample().state == "disabled" and sensor.sample().ops == ""
    fake_sys(tmp_path, ENABLED)                             # a scheduler was loaded meanwhile
    assert sensor.sample() == read_sched_ext(tmp_path) and sensor.sample().ops.startswith("flatcg")
    sensor.stop()


# --- the loop --------------------------------------------------------------------------------------

LOADED = SchedExtStatus("enabled", "flatcg", enable_seq=2, nr_rejected=0, switch_all=0, hotplug_seq=0)
CLASSES = {"ls.slice": "LS", "lsr.slice": "LSR", "be.slice": "BE"}


def settings(**kw):
    return make_settings(loop_options(SchedExt), {"enabled": True, **kw})


def snap(t=1.0, status=LOADED, classes=CLASSES, supported=frozenset({"sched_policy"})):
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.5),
                    cgroups={p: CgroupSample(path=p, cls=c) for p, c in classes.items()},
                    sections={SCHED_EXT: status} if status is not None else {}, supported=supported)


def test_each_root_of_the_chosen_classes_gets_ext_with_the_kernels_state_in_its_reason():
    [a, b] = SchedExt.decide(snap(), settings(ext_classes=["LS", "LSR"]), None)
    assert [(x.target, x.knob, x.value) for x in (a, b)] == [("ls.slice", "sched_policy", "ext"),
                                                             ("lsr.slice", "sched_policy", "ext")]
    assert a.reason == {"class": "LS", "sched_ext_state": "enabled", "ops": "flatcg", "enable_seq": 2}
    assert SchedExt.writes(settings(ext_classes=["LS", "LSR"])) == {("LS", "sched_policy"), ("LSR", "sched_policy")}
    assert SchedExt.needs(settings()) == {SCHED_EXT}


def test_asks_nothing_by_default_or_where_no_hierarchy_lists_threads():
    assert SchedExt.decide(snap(), settings(), None) == [] and SchedExt.writes(settings()) == frozenset()
    assert SchedExt.decide(snap(supported=frozenset()), settings(ext_classes=["LS"]), None) == []


def test_without_the_sensors_section_the_state_is_unknown_and_the_backend_decides():
    [a] = SchedExt.decide(snap(status=None), settings(ext_classes=["LS"]), None)
    assert (a.value, a.reason) == ("ext", {"class": "LS", "sched_ext_state": "unknown"})


def test_class_names_and_bes_owner_are_checked_when_the_config_loads():
    registry = {"sched_ext": SchedExt, "qos_baseline": QosBaseline}
    with pytest.raises(ConfigError) as e:
        parse_config('[loops.sched_ext]\nenabled = true\next_classes = ["LS", "SYSTEM"]\n', "koordd.toml", registry)
    assert e.value.errors == ["koordd.toml:3: loops.sched_ext.ext_classes: 'SYSTEM' is not one of the classes "
                              "this option takes (LSE, LSR, LS, BE)"]
    both = '[loops.qos_baseline]\nenabled = true\n\n[loops.sched_ext]\nenabled = true\next_classes = ["LS", "BE"]\n'
    with pytest.raises(ConfigError) as e:
        parse_config(both, "koordd.toml", registry)
    assert e.value.errors == ["koordd.toml:4: loops.sched_ext: loops 'qos_baseline' and 'sched_ext' both write "
                              "knob 'sched_policy' of class BE; enable only one of them"]
    ok = parse_config(both.replace("[loops.qos_baseline]\n", "[loops.qos_baseline]\nbe_cpu_idle = false\n"),
                      "koordd.toml", registry)
    assert ok.loops["sched_ext"].ext_classes == ("LS", "BE")


CONFIG = """
[[classes]]
name = "LS"
cgroups = ["ls.slice"]
[[classes]]
name = "BE"
cgroups = ["be.slice"]
[loops.sched_ext]
enabled = true
interval = "1s"
ext_classes = {classes}
"""


@pytest.fixture
def rig(tmp_path):
    """The loop run by the runner on a fake tree with a fake scheduler, on a kernel with sched_ext."""
    tree = FakeCgroups(tmp_path, "v2").add("ls.slice").add("ls.slice/app").add("be.slice")
    for cg, tids in (("ls.slice", []), ("ls.slice/app", [11, 12]), ("be.slice", [21])):
        put_threads(tree, cg, tids)
    sched = FakeSched({11: OTHER, 12: OTHER, 21: OTHER})
    fake_sys(tmp_path / "sys", {"state": "disabled"})
    threads = ThreadPolicyBackend(tree.fs, sched=sched, sys_root=tmp_path / "sys")
    state = tmp_path / "state"
    actuator = Actuator(Backends([CgroupBackend(tree.fs), threads]), RestoreJournal(state),
                        DecisionLog(state, send=lambda message, **fields: None))
    runner = Runner({"sched_ext": SchedExt}, actuator, sensors=(SCHED_EXT,))
    return tree, sched, actuator, runner


def configure(runner, classes: str, enabled: bool = True):
    text = CONFIG.format(classes=classes).replace("enabled = true", f"enabled = {str(enabled).lower()}")
    runner.configure(parse_config(text, "koordd.toml", {"sched_ext": SchedExt}), now=0.0)


def tick(runner, t: float, classes=(("ls.slice", "LS"), ("be.slice", "BE"))):
    runner.tick(list(runner.runs.values()), snap(t, status=LOADED, classes=dict(classes)))


def test_classes_in_and_out_new_threads_brought_in_line_and_restored_on_stop(rig):
    tree, sched, actuator, runner = rig
    configure(runner, '["LS", "BE"]')
    tick(runner, 1.0)
    assert sched.policies == {11: EXT, 12: EXT, 21: EXT}
    put_threads(tree, "ls.slice/app", [11, 12, 13])          # a thread that did not inherit the policy
    sched.policies[13] = OTHER
    tick(runner, 2.0)
    assert sched.policies[13] == EXT
    configure(runner, '["LS"]')                               # BE taken out of the option
    tick(runner, 3.0)
    assert sched.policies == {11: EXT, 12: EXT, 13: EXT, 21: OTHER}
    tick(runner, 4.0, classes=(("ls.slice", "BE"),))          # ls.slice relabelled: it left the class
    assert {sched.policies[t] for t in (11, 12, 13)} == {OTHER}
    tick(runner, 5.0)
    assert sched.policies[11] == EXT
    actuator.restore_all("koordd stopping")
    assert set(sched.policies.values()) == {OTHER}


def test_disabling_the_loop_restores(rig):
    tree, sched, actuator, runner = rig
    configure(runner, '["LS"]')
    tick(runner, 1.0)
    assert sched.policies == {11: EXT, 12: EXT, 21: OTHER}
    configure(runner, '["LS"]', enabled=False)
    assert "sched_ext" not in runner.runs and set(sched.policies.values()) == {OTHER}


def test_on_a_kernel_without_sched_ext_the_write_is_refused_once_saying_why(rig, tmp_path):
    tree, sched, actuator, runner = rig
    (tmp_path / "sys/kernel/sched_ext/state").unlink()
    actions = SchedExt.decide(snap(status=None), settings(ext_classes=["LS"]), None)
    [d] = actuator.apply("sched_ext", actions)
    assert d.outcome == REFUSED and "CONFIG_SCHED_CLASS_EXT" in d.error and sched.calls == []
    assert actuator.apply("sched_ext", actions) == []
