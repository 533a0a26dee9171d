"""The knob table on v2 and v1 files (hybrid and co-mounted v1 behave as v1), and validate()'s kernel rules."""
from __future__ import annotations

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.backends.cgroup_knobs import KNOBS, PAGE_SIZE, Unsupported, shares_to_weight, validate, weight_to_shares
from koordd.core.backend import InvalidValue
from koordd.core.cgroup_text import parse_cpu_max

JOB = "be.slice/job"
V1_UNLIMITED = "9223372036854771712"


def put(tree, files, cgroup=JOB):
    for (ctl, name), text in files.items():
        tree.set(cgroup, ctl, name, text + "\n")


# knob, v2 file text, v1 file text, canonical value read
READS = [
    ("cpu.max", {("cpu", "cpu.max"): "max 100000"},
     {("cpu", "cpu.cfs_quota_us"): "-1", ("cpu", "cpu.cfs_period_us"): "100000"}, "max 100000"),
    ("cpu.max", {("cpu", "cpu.max"): "50000 100000"},
     {("cpu", "cpu.cfs_quota_us"): "50000", ("cpu", "cpu.cfs_period_us"): "100000"}, "50000 100000"),
    ("cpu.max.burst", {("cpu", "cpu.max.burst"): "20000"}, {("cpu", "cpu.cfs_burst_us"): "20000"}, "20000"),
    ("cpu.weight", {("cpu", "cpu.weight"): "100"}, {("cpu", "cpu.shares"): "1024"}, "100"),
    ("cpu.weight", {("cpu", "cpu.weight"): "1"}, {("cpu", "cpu.shares"): "2"}, "1"),
    ("cpu.weight", {("cpu", "cpu.weight"): "10000"}, {("cpu", "cpu.shares"): "262144"}, "10000"),
    ("cpu.idle", {("cpu", "cpu.idle"): "1"}, {("cpu", "cpu.idle"): "1"}, "1"),
    ("cpuset.cpus", {("cpuset", "cpuset.cpus"): "0-3,5"}, {("cpuset", "cpuset.cpus"): "0-3,5"}, "0-3,5"),
    ("cpuset.cpus", {("cpuset", "cpuset.cpus"): ""}, {("cpuset", "cpuset.cpus"): ""}, ""),
    ("memory.max", {("memory", "memory.max"): "max"}, {("memory", "memory.limit_in_bytes"): V1_UNLIMITED}, "max"),
    ("memory.max", {("memory", "memory.max"): "1073741824"},
     {("memory", "memory.limit_in_bytes"): "1073741824"}, "1073741824"),
]


@pytest.mark.parametrize("knob, v2, v1, want", READS)
def test_read(tree, knob, v2, v1, want):
    put(tree, v1 if tree.v1 else v2)
    assert KNOBS[knob].read(tree.fs, JOB) == want


def test_defaults_read_the_same_on_every_layout(tree):
    got = {k: KNOBS[k].read(tree.fs, JOB) for k in ("cpu.max", "cpu.max.burst", "cpu.weight", "cpu.idle", "memory.max")}
    assert got == {"cpu.max": "max 100000", "cpu.max.burst": "0", "cpu.weight": "100", "cpu.idle": "0",
                   "memory.max": "max"}


# knob, value, v2 files after the write, v1 files after the write
WRITES = [
    ("cpu.max", "50000 100000", {("cpu", "cpu.max"): "50000 100000"},
     {("cpu", "cpu.cfs_quota_us"): "50000", ("cpu", "cpu.cfs_period_us"): "100000"}),
    ("cpu.max", "max 50000", {("cpu", "cpu.max"): "max 50000"},
     {("cpu", "cpu.cfs_quota_us"): "-1", ("cpu", "cpu.cfs_period_us"): "50000"}),
    ("cpu.max.burst", "20000", {("cpu", "cpu.max.burst"): "20000"}, {("cpu", "cpu.cfs_burst_us"): "20000"}),
    ("cpu.weight", "1", {("cpu", "cpu.weight"): "1"}, {("cpu", "cpu.shares"): "10"}),
    ("cpu.weight", "100", {("cpu", "cpu.weight"): "100"}, {("cpu", "cpu.shares"): "1024"}),
    ("cpu.weight", "10000", {("cpu", "cpu.weight"): "10000"}, {("cpu", "cpu.shares"): "102400"}),
    ("cpu.idle", "1", {("cpu", "cpu.idle"): "1"}, {("cpu", "cpu.idle"): "1"}),
    ("cpuset.cpus", "0-3", {("cpuset", "cpuset.cpus"): "0-3"}, {("cpuset", "cpuset.cpus"): "0-3"}),
    ("memory.max", "max", {("memory", "memory.max"): "max"}, {("memory", "memory.limit_in_bytes"): "-1"}),
    ("memory.max", "1073741824", {("memory", "memory.max"): "1073741824"},
     {("memory", "memory.limit_in_bytes"): "1073741824"}),
]


@pytest.mark.parametrize("knob, value, v2, v1", WRITES)
def test_write(tree, knob, value, v2, v1):
    KNOBS[knob].write(tree.fs, JOB, value)
    want = v1 if tree.v1 else v2
    assert {f: tree.read(JOB, *f).strip() for f in want} == want


@pytest.mark.parametrize("knob, value", [(k, v) for k, v, _, _ in WRITES if not (k == "memory.max" and v == "max")])
def test_write_then_read_round_trips(tree, knob, value):
    KNOBS[knob].write(tree.fs, JOB, value)
    assert KNOBS[knob].read(tree.fs, JOB) == value


@pytest.mark.parametrize("period_changes, calls", [
    (False, [("cpu.cfs_quota_us", "50000")]),
    (True, [("cpu.cfs_period_us", "50000"), ("cpu.cfs_quota_us", "25000")]),
])
def test_v1_cpu_max_writes_period_then_quota(tmp_path, monkeypatch, period_changes, calls):
    fs = FakeCgroups(tmp_path, "v1").add(JOB).fs
    seen = []
    real = fs.write
    monkeypatch.setattr(fs, "write", lambda c, cg, name, text: seen.append((name, text)) or real(c, cg, name, text))
    KNOBS["cpu.max"].write(fs, JOB, "25000 50000" if period_changes else "50000 100000")
    assert seen == calls


@pytest.mark.parametrize("weight, shares", [(1, 10), (100, 1024), (10000, 102400), (39, 399)])
def test_weight_shares_mapping(weight, shares):
    assert weight_to_shares(weight) == shares
    assert shares_to_weight(shares) == weight


def test_weight_shares_round_trip_everywhere():
    assert all(shares_to_weight(weight_to_shares(w)) == w for w in range(1, 10001))
    assert (shares_to_weight(2), shares_to_weight(262144)) == (1, 10000)


# --- validate ----------------------------------------------------------------

@pytest.mark.parametrize("knob, value, want", [
    ("cpu.max", " 50000   100000 ", "50000 100000"),
    ("cpu.max", "max 100000", "max 100000"),
    ("cpu.max", "1000 1000", "1000 1000"),
    ("cpu.max", "max 1000000", "max 1000000"),
    ("cpu.max.burst", "0", "0"),
    ("cpu.weight", "007", "7"),
    ("cpu.idle", "0", "0"),
    ("cpuset.cpus", " 3,0-2,2 ", "0-3"),
    ("memory.max", "max", "max"),
    ("memory.max", str(256 * PAGE_SIZE + 1), str(256 * PAGE_SIZE)),   # the kernel keeps whole pages
])
def test_validate_canonical(tree, knob, value, want):
    assert validate(tree.fs, JOB, knob, value) == want


@pytest.mark.parametrize("knob, value, match", [
    ("cpu.max", "999 100000", "quota must be >= 1000"),
    ("cpu.max", "50000 999", "period must be"),
    ("cpu.max", "50000 1000001", "period must be"),
    ("cpu.max", "50000", "wants"),
    ("cpu.max", "lots 100000", "integer"),
    ("cpu.max.burst", "-1", "cpu.max.burst must be"),
    ("cpu.weight", "0", "cpu.weight must be 1..10000"),
    ("cpu.weight", "10001", "cpu.weight must be 1..10000"),
    ("cpu.idle", "2", "cpu.idle must be 0..1"),
    ("cpuset.cpus", "3-1", "bad cpu range"),
    ("cpuset.cpus", "0-9", "CPUs 8-9 are not in the parent's cpuset"),
    ("memory.max", "1G", "integer"),
    ("memory.max", "-5", "memory limit must be"),
])
def test_validate_rejects(tree, knob, value, match):
    with pytest.raises(InvalidValue, match=match):
        validate(tree.fs, JOB, knob, value)


def test_burst_above_quota_is_refused(tree):
    put(tree, {("cpu", "cpu.cfs_quota_us"): "50000"} if tree.v1 else {("cpu", "cpu.max"): "50000 100000"})
    assert validate(tree.fs, JOB, "cpu.max.burst", "50000") == "50000"        # burst == quota is fine
    with pytest.raises(InvalidValue, match="exceeds cpu.max quota 50000"):
        validate(tree.fs, JOB, "cpu.max.burst", "50001")


def test_any_burst_under_unlimited_quota(tree):
    assert validate(tree.fs, JOB, "cpu.max.burst", "900000") == "900000"


def test_quota_below_burst_is_refused(tree):
    put(tree, {("cpu", "cpu.cfs_burst_us"): "30000"} if tree.v1 else {("cpu", "cpu.max.burst"): "30000"})
    assert validate(tree.fs, JOB, "cpu.max", "30000 100000") == "30000 100000"
    assert validate(tree.fs, JOB, "cpu.max", "max 100000") == "max 100000"
    with pytest.raises(InvalidValue, match="below cpu.max.burst 30000"):
        validate(tree.fs, JOB, "cpu.max", "20000 100000")


def test_cpuset_must_lie_in_the_parents_cpus(tree):
    if tree.v1:
        tree.set("be.slice", "cpuset", "cpuset.cpus", "0-3\n")
    else:
        tree.set("be.slice", "cpuset", "cpuset.cpus.effective", "0-3\n")
    assert validate(tree.fs, JOB, "cpuset.cpus", "2-3") == "2-3"
    with pytest.raises(InvalidValue, match=r"CPUs 4-5 are not in the parent's cpuset \(0-3\)"):
        validate(tree.fs, JOB, "cpuset.cpus", "2-5")
    assert validate(tree.fs, "be.slice", "cpuset.cpus", "0-7") == "0-7"     # its own parent is the root


def test_empty_cpuset_means_inherit_on_v2_and_is_refused_on_v1(tree):
    if tree.v1:
        with pytest.raises(InvalidValue, match="may not be empty on cgroup v1"):
            validate(tree.fs, JOB, "cpuset.cpus", "")
    else:
        assert validate(tree.fs, JOB, "cpuset.cpus", "") == ""


def test_unknown_knob(tree):
    with pytest.raises(Unsupported, match="unknown knob"):
        validate(tree.fs, JOB, "cpu.turbo", "1")


@pytest.mark.parametrize("mode", ["v2", "v1", "hybrid", "v1-comount"])
def test_unsupported_knob_without_its_controller(tmp_path, mode):
    fs = FakeCgroups(tmp_path, mode, memory=False).add(JOB).fs
    assert not KNOBS["memory.max"].supported(fs)
    with pytest.raises(Unsupported, match="memory.max is not available"):
        validate(fs, JOB, "memory.max", "max")
    with pytest.raises(Unsupported):
        KNOBS["memory.max"].read(fs, JOB)
    assert validate(fs, JOB, "cpu.weight", "100") == "100"


def test_parse_cpu_max():
    assert parse_cpu_max("max 100000\n") == (None, 100000)
    assert parse_cpu_max("50000 100000") == (50000, 100000)


@pytest.mark.parametrize("mode, refused", [("v1", True), ("v2", False)])
def test_v1_child_quota_may_not_exceed_the_parent(tmp_path, mode, refused):
    from koordtest.fakes.cgroup import FakeCgroups
    from koordd.core.backend import InvalidValue
    from koordd.backends.cgroup_knobs import validate
    tree = FakeCgroups(tmp_path, mode).add("be.slice/job")
    if mode == "v1":
        tree.set("be.slice", "cpu", "cpu.cfs_quota_us", "50000\n")
    else:
        tree.set("be.slice", "cpu", "cpu.max", "50000 100000\n")
    assert validate(tree.fs, "be.slice/job", "cpu.max", "50000 100000") == "50000 100000"
    if refused:
        with pytest.raises(InvalidValue, match="parent"):
            validate(tree.fs, "be.slice/job", "cpu.max", "60000 100000")
    else:
        assert validate(tree.fs, "be.slice/job", "cpu.max", "60000 100000") == "60000 100000"
