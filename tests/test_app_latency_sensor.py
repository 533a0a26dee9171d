"""The application latency sensor without a kernel: its summary of a round's histogram, the cgroups it
watches (the latency-sensitive classes' only) over a fake loader, and why it is unavailable where it is."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordd.core.registry import SENSORS, builtin
from koordd.core.snapshot import APP_LATENCY, AppLatency
from koordd.kernel.libbpf import BpfError
from koordd.sensors import app_latency
from koordd.sensors.app_latency import SLOTS, AppLatencySensor, ResponseTimes, summarize
from koordd.sensors.contract import SensorContext, SensorUnavailable
from koordtest.fakes.bpf import FakeHistObject
from koordtest.fakes.cgroup import FakeCgroups


def slots(**counts) -> list[int]:
    """slots(s12=5) -> 5 responses in slot 12 ([2048, 4096) µs)."""
    out = [0] * SLOTS
    for k, n in counts.items():
        out[int(k[1:])] = n
    return out


@pytest.fixture
def v2tree(tmp_path) -> Path:
    tree = tmp_path / "cg"
    for d in ("ls/pod1", "ls/pod2", "lsr", "be/pod3", "system"):
        (tree / d).mkdir(parents=True)
    (tree / "cgroup.controllers").write_text("cpu memory\n")
    return tree


@pytest.fixture
def btf(tmp_path) -> Path:
    (tmp_path / "vmlinux").write_bytes(b"")
    return tmp_path / "vmlinux"


def ino(tree: Path, path: str) -> int:
    return os.stat(tree / path).st_ino


CLASSES = {"ls": "LS", "ls/pod1": "LS", "ls/pod2": "LS", "lsr": "LSR", "be": "BE", "be/pod3": "BE",
           "system": "SYSTEM", "": ""}


def test_a_rounds_histogram_gives_count_mean_quantiles_and_its_upper_bound():
    s = slots(s12=900, s13=90, s15=9, s17=1)            # 1000 responses, ~3 ms with a tail
    got = summarize(s, 1000 * 3_500_000)
    assert got == AppLatency(1000, 3500.0, 2048 + 2048 * 500 / 900, 4096 + 4096 * 90 / 90,
                             16384 + 16384 * 9 / 9, 131072.0, tuple(s[:18]))
    assert got.p99_us == 8192.0 and got.p999_us == 32768.0    # the 990th, the 999th: their slots' ends
    assert summarize([0] * SLOTS, 0) is None


def test_the_sensor_watches_the_latency_sensitive_classes_only_and_reports_deltas_per_subtree(v2tree, btf):
    bpf = FakeHistObject("responses", SLOTS)
    sensor = AppLatencySensor(v2tree, load=bpf, kernel_btf=btf)
    sensor.start()
    assert bpf.attached and bpf.path == app_latency.PROGRAM
    context = SensorContext(1.0, CLASSES)
    assert sensor.sample(context) == {}
    assert set(bpf.maps["watched"]) == {ino(v2tree, p) for p in ("ls", "ls/pod1", "ls/pod2", "lsr")}

    bpf.count(ino(v2tree, "ls/pod1"), 12, 99, 99 * 3_000_000)      # pod1 answered 99 requests in ~3 ms
    bpf.count(ino(v2tree, "ls"), 15, 1, 20_000_000)                 # the root itself one in 20 ms
    bpf.count(ino(v2tree, "lsr"), 8, 10, 10 * 200_000)
    got = sensor.sample(context)
    assert set(got) == {"ls", "ls/pod1", "lsr"}
    assert got["ls"].count == 100 and got["ls"].mean_us == pytest.approx((99 * 3000 + 20_000) / 100)
    assert got["ls"].p50_us == pytest.approx(2048 + 2048 * 50 / 99) and got["ls"].max_us == 32768.0
    assert got["ls/pod1"].count == 99 and got["lsr"].mean_us == 200.0

    # Next round: what is new only; a cgroup that left the classes is no longer watched.
    bpf.count(ino(v2tree, "lsr"), 8, 5, 5 * 200_000)
    bpf.count(ino(v2tree, "ls/pod2"), 12, 3, 3 * 3_000_000)
    fewer = {p: cls for p, cls in CLASSES.items() if p != "lsr"}
    assert sensor.sample(SensorContext(2.0, fewer)) == {"ls": summarize(slots(s12=3), 9_000_000),
                                                       "ls/pod2": summarize(slots(s12=3), 9_000_000)}
    assert ino(v2tree, "lsr") not in bpf.maps["watched"] and ino(v2tree, "lsr") not in bpf.maps["responses"]
    sensor.stop()
    assert bpf.closed and sensor.source is None
    sensor.stop()                                                   # again: harmless


def test_without_btf_or_a_loading_program_the_sensor_is_unavailable_saying_why(v2tree, tmp_path, btf):
    with pytest.raises(SensorUnavailable, match=r"no BTF .*CONFIG_DEBUG_INFO_BTF"):
        AppLatencySensor(v2tree, load=FakeHistObject("responses", SLOTS), kernel_btf=tmp_path / "none").start()

    def verifier_says_no(path):
        raise BpfError(f"loading {path.name}: Invalid argument (libbpf: tp_btf/sk_data_ready not found)")
    with pytest.raises(SensorUnavailable, match=r"did not load: loading app_latency.bpf.o: Invalid argument"):
        AppLatencySensor(v2tree, load=verifier_says_no, kernel_btf=btf).start()

    bpf = FakeHistObject("responses", SLOTS, attach_error="attaching app_sent: No such file or directory")
    with pytest.raises(SensorUnavailable, match="app_sent"):
        AppLatencySensor(v2tree, load=bpf, kernel_btf=btf).start()
    assert bpf.closed                                               # what it loaded is closed again


def test_a_host_without_a_v2_tree_has_no_application_latency(tmp_path, btf):
    v1 = FakeCgroups(tmp_path, "v1")
    with pytest.raises(SensorUnavailable, match="no v2 tree"):
        AppLatencySensor(v1.root, load=FakeHistObject("responses", SLOTS), kernel_btf=btf).start()


def test_the_source_reads_the_programs_responses_map(v2tree, btf):
    bpf = FakeHistObject("responses", SLOTS)
    src = ResponseTimes(v2tree, load=bpf, kernel_btf=btf)
    src.open()
    assert src.waits is bpf.maps["responses"] and src.watched is bpf.maps["watched"]


def test_the_sensor_is_registered_and_never_loads_bpf_in_unit_tests():
    assert builtin(SENSORS)[APP_LATENCY] is AppLatencySensor and AppLatencySensor.name == "app_latency"
    with pytest.raises(SensorUnavailable):                          # tests/conftest.py refuses the loader
        AppLatencySensor().start()
