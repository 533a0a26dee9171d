"""sched_ext: the status reader and sensor on fake /sys trees (literal kernel text, old kernels and
broken files included), and the loop's decisions on hand-built snapshots."""
from __future__ import annotations

from pathlib import Path

import pytest

from koordd.sched_ext import SchedExtStatus, read_sched_ext
from koordd.sensors.contract import SensorUnavailable
from koordd.sensors.sched_ext import SchedExtSensor

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
