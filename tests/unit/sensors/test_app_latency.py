"""The application latency sensor without a kernel: its summary of a round's histograms (the quantiles
weighted by connection, the slots in whole responses), the cgroups it watches (the latency-sensitive
classes' only) over a fake loader, and why it is unavailable where it is."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordd.core.catalogue import SENSORS, builtin
from koordd.core.snapshot import APP_LATENCY, AppLatency
from koordd.kernel.libbpf import BpfError
from koordd.sensors import app_latency
from koordd.sensors.app_latency import SLOTS, AppLatencySensor, ResponseTimes, apportion, summarize
from koordd.sensors.contract import SensorContext, SensorUnavailable
from koordtest.fakes.bpf import FakeHistObject
from koordtest.fakes.cgroup import FakeCgroups


def fake() -> FakeHistObject:
    """The program's maps: `responses` (each response once), `weighted` (the same, weighted) and `crowded`
    (those sent on a socket near its limit)."""
    return FakeHistObject("responses", SLOTS, more=("weighted", "crowded"))


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
                             16384 + 16384 * 9 / 9, 131072.0, tuple(s[:18]), 0)
    assert got.p99_us == 8192.0 and got.p999_us == 32768.0    # the 990th, the 999th: their slots' ends
    assert summarize([0] * SLOTS, 0) is None


def test_the_sensor_watches_the_latency_sensitive_classes_only_and_reports_deltas_per_subtree(v2tree, btf):
    bpf = fake()
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
    assert all(ino(v2tree, "lsr") not in bpf.maps[m] for m in ("watched", "responses", "weighted", "crowded"))
    sensor.stop()
    assert bpf.closed and sensor.source is None
    sensor.stop()                                                   # again: harmless


def test_without_btf_or_a_loading_program_the_sensor_is_unavailable_saying_why(v2tree, tmp_path, btf):
    with pytest.raises(SensorUnavailable, match=r"no BTF .*CONFIG_DEBUG_INFO_BTF"):
        AppLatencySensor(v2tree, load=fake(), kernel_btf=tmp_path / "none").start()

    def verifier_says_no(path):
        raise BpfError(f"loading {path.name}: Invalid argument (libbpf: tp_btf/sk_data_ready not found)")
    with pytest.raises(SensorUnavailable, match=r"did not load: loading app_latency.bpf.o: Invalid argument"):
        AppLatencySensor(v2tree, load=verifier_says_no, kernel_btf=btf).start()

    bpf = FakeHistObject("responses", SLOTS, attach_error="attaching app_sent: No such file or directory",
                         more=("weighted", "crowded"))
    with pytest.raises(SensorUnavailable, match="app_sent"):
        AppLatencySensor(v2tree, load=bpf, kernel_btf=btf).start()
    assert bpf.closed                                               # what it loaded is closed again


def test_a_host_without_a_v2_tree_has_no_application_latency(tmp_path, btf):
    v1 = FakeCgroups(tmp_path, "v1")
    with pytest.raises(SensorUnavailable, match="no v2 tree"):
        AppLatencySensor(v1.root, load=fake(), kernel_btf=btf).start()


def test_the_source_reads_the_programs_responses_weighted_and_crowded_maps(v2tree, btf):
    bpf = fake()
    src = ResponseTimes(v2tree, load=bpf, kernel_btf=btf)
    src.open()
    assert src.waits is bpf.maps["responses"] and src.more_maps == [bpf.maps["weighted"], bpf.maps["crowded"]]
    assert src.watched is bpf.maps["watched"]


def test_the_quantiles_weigh_each_connection_alike_and_the_count_mean_and_maximum_each_response(v2tree, btf):
    """60,000 pings of ~20 µs on one connection and 40 answers of ~24 ms on another, in one window: the
    program weighs each connection's responses WEIGHT in all. Per response the 40 are 0.07% and the p99
    a ping's; weighted they are half, and the p99 theirs. The count, the exact mean and the maximum stay
    per response; the slots are the weighted histogram in whole responses, summing to the count."""
    bpf = fake()
    sensor = AppLatencySensor(v2tree, load=bpf, kernel_btf=btf)
    sensor.start()
    context = SensorContext(1.0, CLASSES)
    sensor.sample(context)
    pod = ino(v2tree, "ls/pod1")
    bpf.count(pod, 5, 60_000, 60_000 * 20_000)
    bpf.count(pod, 15, 40, 40 * 24_000_000)
    bpf.count(pod, 5, 1 << 20, 0, table="weighted")
    bpf.count(pod, 15, 1 << 20, 0, table="weighted")
    got = sensor.sample(context)["ls/pod1"]
    per_response = summarize(slots(s5=60_000, s15=40), 60_000 * 20_000 + 40 * 24_000_000)
    assert per_response.p99_us < 32                                      # hidden, counted per response
    assert got.count == 60_040 and got.mean_us == per_response.mean_us and got.max_us == 32768.0
    assert got.p50_us == 32.0 and got.p99_us == pytest.approx(16384 + 16384 * 0.98)
    assert got.slots == tuple(slots(s5=30_020, s15=30_020)[:16]) and sum(got.slots) == got.count
    assert sensor.sample(context) == {}                                 # next round: nothing new
    # The round after: pings only. The weights are deltas too: the last round's slow ones are gone.
    bpf.count(pod, 5, 100, 100 * 20_000)
    bpf.count(pod, 5, 1 << 20, 0, table="weighted")
    got = sensor.sample(context)["ls/pod1"]
    assert got.count == 100 and got.p99_us < 32 and got.slots == tuple(slots(s5=100)[:6])
    # A cgroup no longer watched loses its histograms, and what rounding left it owed.
    sensor.sample(SensorContext(2.0, {p: c for p, c in CLASSES.items() if not p.startswith("ls")}))
    assert pod not in bpf.maps["weighted"] and "ls/pod1" not in sensor.source.carry


def test_without_weights_the_quantiles_are_per_response():
    s = slots(s5=99, s12=1)
    assert summarize(s, 0, [0] * SLOTS) == summarize(s, 0) == summarize(s, 0, None, s)


def test_apportion_splits_the_count_by_weight_in_whole_responses():
    whole, carry = apportion(10, slots(s3=1, s5=1), [0.0] * SLOTS)
    assert whole == slots(s3=5, s5=5) and carry == [0.0] * SLOTS
    # 7 by 1:2: 2.33 and 4.67, the larger remainder rounds up; the remainders are carried
    whole, carry = apportion(7, slots(s3=1, s5=2), [0.0] * SLOTS)
    assert whole == slots(s3=2, s5=5) and sum(whole) == 7
    assert carry[3] == pytest.approx(1 / 3) and carry[5] == pytest.approx(-1 / 3)
    # a tie goes to the slower slot
    assert apportion(1, slots(s3=1, s5=1), [0.0] * SLOTS)[0] == slots(s5=1)
    assert apportion(0, slots(s3=1), [0.0] * SLOTS) == ([0] * SLOTS, [0.0] * SLOTS)


def test_a_tail_too_small_to_round_up_in_a_round_is_carried_until_it_shows():
    """10 responses a round, a slow connection's weight 3% of them: 0.3 of a response, rounded away
    each round without the carry; with it, the slow slot gets about 3 in 100 rounds' 1000 responses."""
    carry, total = [0.0] * SLOTS, [0] * SLOTS
    for _ in range(100):
        whole, carry = apportion(10, slots(s4=97, s15=3), carry)
        assert sum(whole) == 10 and all(n >= 0 for n in whole)
        total = [a + b for a, b in zip(total, whole)]
    assert total[15] == 30 and total[4] == 970
    assert all(abs(c) < 1 for c in carry)
    # a slot without weight this round gets nothing, whatever it was owed; its debt is dropped
    whole, carry = apportion(10, slots(s4=1), slots(s15=1))
    assert whole == slots(s4=10) and carry == [0.0] * SLOTS


def test_the_sensor_is_registered_and_never_loads_bpf_in_unit_tests():
    assert builtin(SENSORS)[APP_LATENCY] is AppLatencySensor and AppLatencySensor.name == "app_latency"
    with pytest.raises(SensorUnavailable):                          # tests/conftest.py refuses the loader
        AppLatencySensor().start()


def test_responses_sent_on_a_socket_near_its_limit_are_counted_per_round_as_crowded(v2tree, btf):
    """The program counts, besides every response, those sent on a socket an arrival found near its limit
    (their clients held back): the round's AppLatency carries how many, per cgroup and as a delta, never more
    than the round's responses; a round with none says 0 (the kernel can tell), not None."""
    bpf = fake()
    sensor = AppLatencySensor(v2tree, load=bpf, kernel_btf=btf)
    sensor.start()
    context = SensorContext(1.0, CLASSES)
    sensor.sample(context)
    pod1, pod2 = ino(v2tree, "ls/pod1"), ino(v2tree, "ls/pod2")
    bpf.count(pod1, 12, 100, 100 * 3_000_000)
    bpf.count(pod1, 12, 30, 30 * 3_000_000, table="crowded")
    bpf.count(pod2, 12, 10, 10 * 3_000_000)
    got = sensor.sample(context)
    assert (got["ls/pod1"].count, got["ls/pod1"].crowded) == (100, 30)
    assert (got["ls/pod2"].count, got["ls/pod2"].crowded) == (10, 0)
    assert (got["ls"].count, got["ls"].crowded) == (110, 30)        # the class root holds both pods
    bpf.count(pod1, 12, 5, 5 * 3_000_000)
    bpf.count(pod1, 12, 2, 2 * 3_000_000, table="crowded")
    assert sensor.sample(context)["ls/pod1"].crowded == 2              # the round's, not the total
    # A count the maps got out of step on (a reset between the two reads) never exceeds the responses.
    assert summarize(slots(s12=4), 4_000_000, crowded=9).crowded == 4
    assert summarize(slots(s12=4), 4_000_000, crowded=-1).crowded == 0
