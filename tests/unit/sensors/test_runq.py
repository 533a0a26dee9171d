"""The run-queue latency sensor without a kernel: histogram arithmetic, the eBPF source over fake maps,
the schedstat source over a fake /proc and v2 tree, and how the source is chosen."""
from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from koordtest.fakes.bpf import FakeMap
from koordd.core.histogram import quantile_us
from koordd.core.snapshot import RunqLatency
from koordd.kernel.libbpf import BpfError, BpfObject
from koordd.sensors import runq
from koordd.sensors.contract import SensorContext, SensorUnavailable
from koordd.sensors.runq import (EBPF, EbpfSource, RunqLatencySensor, SCHEDSTAT, SLOTS, SchedstatSource, enclosing,
    summarize)


def slots(**counts) -> list[int]:
    """slots(s3=5) -> 5 waits in slot 3 ([4, 8) µs)."""
    out = [0] * SLOTS
    for k, n in counts.items():
        out[int(k[1:])] = n
    return out


def test_quantiles_are_interpolated_within_their_bucket():
    s = slots(s0=10, s3=80, s10=9, s14=1)                 # 100 waits
    assert quantile_us(s, 0.5) == 6.0                     # the 40th of 80 waits in [4, 8) µs
    assert quantile_us(s, 0.99) == 1024.0                 # the last of 9 waits in [512, 1024)
    assert quantile_us(s, 0.95) == 512 + 512 * 5 / 9      # the 5th of them
    assert quantile_us(s, 0.10) == 1.0                    # slot 0: under 1 µs
    assert quantile_us(slots(s11=100), 0.99) == 1024 + 1024 * 0.99   # in [1024, 2048): not 2048
    assert quantile_us([0] * SLOTS, 0.5) is None
    r = summarize(s, wait_ns=100 * 50_000)
    assert r == RunqLatency(EBPF, 100, 50.0, 6.0, 1024.0, 16384.0,   # the maximum: its bucket's upper bound
                            (10, 0, 0, 80, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 1))   # the histogram, to its last wait
    assert summarize([0] * SLOTS, 0) is None


def test_enclosing_groups_a_root_with_its_pods_only():
    got = enclosing(["be", "be/pod1", "be/pod2", "bee", "ls"])
    assert got["be"] == ["be", "be/pod1", "be/pod2"] and got["bee"] == ["bee"] and got["be/pod1"] == ["be/pod1"]


# --- eBPF source over fake maps -----------------------------------------------------------------------

class FakeBpf:
    """The runq program's three maps; `count` is the program counting waits."""

    def __init__(self):
        self.tables = {"watched": FakeMap(), "waits": FakeMap(), "resolved": FakeMap()}

    def __getitem__(self, name):
        return self.tables[name]

    def install(self, src: EbpfSource) -> "FakeBpf":
        src.watched, src.resolved, src.waits = self["watched"], self["resolved"], self["waits"]
        return self

    def count(self, cid: int, slot: int, n: int, wait_ns: int) -> None:
        """The program counting n waits for a watched cgroup."""
        h = dict.get(self.tables["waits"], cid) or SimpleNamespace(slots=[0] * SLOTS, wait_ns=0)
        h.slots[slot] += n
        h.wait_ns += wait_ns
        dict.__setitem__(self.tables["waits"], cid, h)


@pytest.fixture
def v2tree(tmp_path):
    for d in ("be/pod1", "be/pod2", "ls"):
        (tmp_path / d).mkdir(parents=True)
    return tmp_path


def ino(tree: Path, path: str) -> int:
    return os.stat(tree / path).st_ino


def test_ebpf_source_watches_the_sampled_cgroups_and_reports_deltas_per_subtree(v2tree):
    src = EbpfSource(v2tree)
    bpf = FakeBpf().install(src)
    paths = ["be", "be/pod1", "be/pod2", "ls"]
    assert src.read(paths) == {}
    assert set(bpf["watched"]) == {ino(v2tree, p) for p in paths}
    bpf["resolved"][5] = 1                 # the program's cache, from before

    bpf.count(ino(v2tree, "be/pod1"), 13, 90, 90 * 5_000_000)   # pod1 waited ~5 ms, 90 times
    bpf.count(ino(v2tree, "be/pod2"), 2, 10, 10 * 2_000)
    bpf.count(ino(v2tree, "ls"), 4, 50, 50 * 10_000)
    got = src.read(paths)
    # 90 waits in slot 13, [4096, 8192) µs: p99 the 89.1th of them, interpolated.
    assert got["be/pod1"].count == 90 and got["be/pod1"].p99_us == pytest.approx(4096 + 4096 * 0.99)
    assert got["be"].count == 100 and got["be"].mean_us == pytest.approx((90 * 5000 + 10 * 2) / 100)
    assert got["be"].p50_us == pytest.approx(4096 + 4096 * 40 / 90) and got["ls"].p99_us == pytest.approx(8 + 8 * 0.99)
    assert dict(bpf["resolved"]) == {5: 1}                  # the watched set did not change: cache kept

    # Next round: only what is new since the last read.
    bpf.count(ino(v2tree, "ls"), 4, 5, 5 * 10_000)
    assert src.read(paths) == {"ls": RunqLatency(EBPF, 5, 10.0, 12.0, 8 + 8 * 0.99, 16.0, (0, 0, 0, 0, 5))}


def test_a_cgroup_that_goes_is_unwatched_and_its_histogram_dropped(v2tree):
    src = EbpfSource(v2tree)
    bpf = FakeBpf().install(src)
    src.read(["be", "be/pod1", "be/pod2"])
    gone = ino(v2tree, "be/pod2")
    bpf.count(gone, 3, 1, 5000)
    bpf["resolved"][gone] = gone
    (v2tree / "be/pod2").rmdir()
    assert "be/pod2" not in src.read(["be", "be/pod1"])
    assert gone not in bpf["watched"] and gone not in bpf["waits"] and dict(bpf["resolved"]) == {}


def test_a_histogram_made_anew_for_a_cgroup_no_longer_watched_is_deleted_not_kept(v2tree):
    """A wait stamped while its cgroup was watched can count after koordd unwatched it: the program makes
    the histogram anew. Left, such entries would fill the map (16384) and blind every cgroup after."""
    src = EbpfSource(v2tree)
    bpf = FakeBpf().install(src)
    src.read(["be", "be/pod1", "be/pod2"])
    gone = ino(v2tree, "be/pod2")
    (v2tree / "be/pod2").rmdir()
    src.read(["be", "be/pod1"])
    bpf.count(gone, 3, 1, 5000)                         # the late wait
    bpf.count(ino(v2tree, "be/pod1"), 3, 2, 10_000)
    got = src.read(["be", "be/pod1"])
    assert got["be"].count == 2 and set(bpf["waits"]) == {ino(v2tree, "be/pod1")}


# --- schedstat source over a fake /proc ------------------------------------------------------------------

class FakeProc:
    def __init__(self, root: Path):
        self.root = root

    def thread(self, tid: int, run_delay_ns: int, slices: int) -> None:
        d = self.root / str(tid)
        d.mkdir(exist_ok=True)
        (d / "schedstat").write_text(f"123456 {run_delay_ns} {slices}\n")

    def exit(self, tid: int) -> None:
        (self.root / str(tid) / "schedstat").unlink()


def threads(tree: Path, path: str, *tids: int) -> None:
    (tree / path / "cgroup.threads").write_text("".join(f"{t}\n" for t in tids))


def test_schedstat_mean_wait_per_timeslice_over_each_subtree(tmp_path, v2tree):
    proc = FakeProc(tmp_path / "proc")
    proc.root.mkdir()
    src = SchedstatSource(v2tree, "cgroup.threads", proc.root)
    threads(v2tree, "be/pod1", 11, 12)
    threads(v2tree, "ls", 21)
    for tid in (11, 12, 21):
        proc.thread(tid, 0, 0)
    paths = ["be", "be/pod1", "be/pod2", "ls"]
    assert src.read(paths) == {}                           # the first read sets the baseline
    proc.thread(11, 3_000_000, 10)                         # 3 ms over 10 slices
    proc.thread(12, 1_000_000, 10)
    proc.thread(21, 20_000, 20)
    threads(v2tree, "be/pod2", 31)
    proc.thread(31, 9_000_000_000, 5)                      # a new thread: counted from the next round
    got = src.read(paths)
    assert got["be/pod1"] == RunqLatency(SCHEDSTAT, 20, 200.0)
    assert got["be"] == got["be/pod1"] and got["ls"] == RunqLatency(SCHEDSTAT, 20, 1.0)
    proc.exit(12)                                          # a thread that exits just stops counting
    proc.thread(31, 9_000_500_000, 10)
    proc.thread(11, 3_000_000, 10)
    got = src.read(paths)
    assert got == {"be/pod2": RunqLatency(SCHEDSTAT, 5, 100.0), "be": RunqLatency(SCHEDSTAT, 5, 100.0)}


def test_on_schedstat_the_sensor_reads_only_the_latency_sensitive_classes(tmp_path, v2tree, monkeypatch):
    """The slack and the antagonist's victims read LS roots' waits: BE's pods cost no listing and no
    schedstat read (issue 27: 63 ms/s over 502 cgroups, most of them BE's pods)."""
    proc = FakeProc(tmp_path / "proc")
    proc.root.mkdir()
    threads(v2tree, "be/pod1", 11)
    threads(v2tree, "ls", 21)
    for tid in (11, 21):
        proc.thread(tid, 0, 0)
    sensor = RunqLatencySensor(v2tree, tmp_path / "proc", sources=(SCHEDSTAT,))
    sensor.source = SchedstatSource(v2tree, "cgroup.threads", proc.root)
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a: opened.append(str(path)) or real_open(path, *a))
    context = SensorContext(1.0, {"be": "BE", "be/pod1": "BE", "ls": "LS", "system": "SYSTEM"})
    assert sensor.sample(context) == {}
    proc.thread(11, 3_000_000, 10)
    proc.thread(21, 20_000, 20)
    assert sensor.sample(context) == {"ls": RunqLatency(SCHEDSTAT, 20, 1.0)}
    assert opened and not any("/be" in p or "/11/" in p for p in opened), opened


def test_a_root_whose_children_are_all_leaves_is_listed_alone(tmp_path, monkeypatch):
    """nr_descendants equal to the children listed: the pods are not listed one by one; one more below a
    pod (the kernel's count says so) and every child is listed, its threads counted."""
    tree = tmp_path / "cg"
    for d in ("ls/pod1", "ls/pod2"):
        (tree / d).mkdir(parents=True)
    (tree / "ls" / "cgroup.stat").write_text("nr_descendants 2\nnr_dying_descendants 0\n")
    threads(tree, "ls/pod1", 21)
    src = SchedstatSource(tree, "cgroup.threads", tmp_path / "proc")
    listed = []
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: listed.append(os.path.relpath(path, tree)) or real_scandir(path))
    assert src._threads_by_dir(["ls"]) == {"ls/pod1": [21]} and listed == ["ls"]
    (tree / "ls/pod2/job").mkdir()
    threads(tree, "ls/pod2/job", 31)
    (tree / "ls" / "cgroup.stat").write_text("nr_descendants 3\nnr_dying_descendants 0\n")
    listed.clear()
    assert src._threads_by_dir(["ls"]) == {"ls/pod1": [21], "ls/pod2/job": [31]}
    assert sorted(listed) == ["ls", "ls/pod1", "ls/pod2", "ls/pod2/job"]


# --- choosing the source ----------------------------------------------------------------------------------

def test_without_ebpf_the_sensor_falls_back_to_schedstat_and_says_why_once(tmp_path, monkeypatch, caplog):
    (tmp_path / "cg").mkdir()
    (tmp_path / "cg" / "cgroup.controllers").write_text("cpu memory\n")
    monkeypatch.setattr(EbpfSource, "open", lambda self: (_ for _ in ()).throw(
        SensorUnavailable("libbpf.so.1 is not installed (apt-get install libbpf1)")))
    caplog.set_level(logging.INFO)
    sensor = RunqLatencySensor(tmp_path / "cg", sources=(EBPF, SCHEDSTAT))
    sensor.start()
    assert sensor.kind == SCHEDSTAT and sensor.detail.startswith("schedstat, a mean only: eBPF unavailable: libbpf")
    [line] = [r.getMessage() for r in caplog.records if "run-queue" in r.getMessage()]
    assert "libbpf.so.1 is not installed" in line and "mean wait per timeslice" in line
    assert sensor.sample(SensorContext(1.0, {})) == {}
    sensor.stop()
    assert sensor.kind is None


def test_without_either_source_the_sensor_is_unavailable_with_both_reasons(tmp_path, monkeypatch):
    (tmp_path / "cg").mkdir()
    (tmp_path / "cg" / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "proc").mkdir()
    monkeypatch.setattr(EbpfSource, "open", lambda self: (_ for _ in ()).throw(SensorUnavailable("no BTF")))
    sensor = RunqLatencySensor(tmp_path / "cg", proc_root=tmp_path / "proc", sources=(EBPF, SCHEDSTAT))
    with pytest.raises(SensorUnavailable, match=r"schedstat .*CONFIG_SCHED_INFO.*eBPF: no BTF"):
        sensor.start()


def test_the_ebpf_source_says_what_is_missing_and_closes_what_it_loaded(tmp_path):
    btf = tmp_path / "vmlinux"
    with pytest.raises(SensorUnavailable, match=r"no BTF .*CONFIG_DEBUG_INFO_BTF"):
        EbpfSource(tmp_path, kernel_btf=btf).open()
    btf.write_bytes(b"")

    def verifier_says_no(path):
        raise BpfError(f"loading {path.name}: Permission denied (libbpf: processed 12 insns)")
    with pytest.raises(SensorUnavailable, match=r"did not load: loading runq_latency.bpf.o: Permission denied"):
        EbpfSource(tmp_path, load=verifier_says_no, kernel_btf=btf).open()

    closed = []

    class AttachFails:
        def __init__(self, path):
            pass

        def attach_all(self):
            raise BpfError("attaching runq_switch: No such file or directory")

        def close(self):
            closed.append(True)
    src = EbpfSource(tmp_path, load=AttachFails, kernel_btf=btf)
    with pytest.raises(SensorUnavailable, match="runq_switch"):
        src.open()
    assert closed == [True] and src.obj is None


def test_unit_tests_never_load_bpf(tmp_path):
    assert runq.DEFAULT_SOURCES == (SCHEDSTAT,)
    with pytest.raises(BpfError, match="unit tests load no BPF program"):
        BpfObject(runq.PROGRAM)


def test_below_and_outermost_keep_siblings_with_a_shared_prefix_apart():
    ordered = sorted(["be", "be-x", "be/pod1", "be/pod1/c", "bee", "ls"])
    assert runq.below(ordered, "be") == ["be", "be/pod1", "be/pod1/c"]
    assert runq.below(ordered, "be/pod") == [] and runq.below(ordered, "") == ordered
    assert runq.outermost(["be", "be/pod1", "be-x", "ls/a", "ls/a/b"]) == ["be", "be-x", "ls/a"]
    assert runq.outermost(["", "be"]) == [""]


def _subtrees_by_enclosing(ids: dict[str, int], delta: dict, nslots: int) -> dict:
    """Each sampled path's subtree sum as it was computed before the entries were added to their ancestors
    (the reference): enclosing() of every sampled path, its subtree summed path by path."""
    out = {}
    for path, inside in enclosing(ids).items():
        s, ns = [0] * nslots, 0
        for q in inside:
            d = delta.get(ids[q])
            if d is not None:
                s, ns = [a + b for a, b in zip(s, d[0])], ns + d[1]
        out[path] = (s, ns)
    return out


_TREE_PATHS = st.lists(st.sampled_from(["be", "be-x", "ls", "pod1", "pod2"]), max_size=3).map("/".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(_TREE_PATHS, unique=True, min_size=1, max_size=8), st.data())
def test_each_wait_is_added_to_the_sampled_paths_above_it_as_enclosing_sums_them(paths, data):
    """_subtrees (each map entry added to its sampled ancestors) against the pass over every sampled path's
    subtree it replaced: the same sums wherever an entry lies in the subtree, the same order and zero-sum paths
    left out by all_deltas."""
    nslots = 3
    src = runq.CgroupHistograms(Path("/nonexistent"), Path("/nonexistent.o"), "waits", nslots)
    src.ids = {p: 100 + i for i, p in enumerate(paths)}
    counts = st.tuples(st.lists(st.integers(0, 5), min_size=nslots, max_size=nslots), st.integers(0, 10**6))
    delta = data.draw(st.dictionaries(st.sampled_from(sorted(src.ids.values()) + [7]), counts))
    want = _subtrees_by_enclosing(src.ids, delta, nslots)
    got = src._subtrees(delta, {cid: p for p, cid in src.ids.items()})
    assert {p: c for p, c in want.items() if p in got} == got
    assert all(c == ([0] * nslots, 0) for p, c in want.items() if p not in got)
