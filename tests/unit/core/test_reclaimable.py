"""Reclaimable capacity from hand-built snapshots: what LS was given, its windowed peak, the margin, the
system's share, and the cases where nothing is reclaimable."""
from __future__ import annotations

import pytest

from koordd.core.config import make_settings
from koordd.core.reclaimable import RECLAIMABLE_OPTIONS, ReclaimableState, WindowPeak, cpu_given, memory_given, observe
from koordd.core.snapshot import CgroupSample, NodeSample, Snapshot

GiB = 1 << 30


def settings(**kw):
    return make_settings(RECLAIMABLE_OPTIONS, {"window": "60s", "margin_percent": 10, **kw})


def ls(path="ls", usage=1.0, mem=1 * GiB, cpu_max="max 100000", cpuset="", memory_max="max", cls="LS"):
    return CgroupSample(path, cls, cpu_usage=usage, cpu_max=cpu_max, cpuset_cpus=cpuset, memory_current=mem,
                        memory_max=memory_max)


def be(usage=0.0, mem=0):
    return CgroupSample("be", "BE", cpu_usage=usage, memory_current=mem)


def snap(*cgroups, t=100.0, cpus=8, used=None, mem_total=16 * GiB, mem_available=None):
    used = sum(c.cpu_usage or 0 for c in cgroups) if used is None else used
    if mem_available is None:
        mem_available = mem_total - sum(c.memory_current or 0 for c in cgroups)
    node = NodeSample(cpu_count=cpus, cpu_used=used, memory_total=mem_total, memory_available=mem_available)
    return Snapshot(time=t, wall=t, node=node, cgroups={c.path: c for c in cgroups})


@pytest.mark.parametrize("cpu_max, cpuset, want", [
    ("max 100000", "", 8.0),                  # unlimited: the node
    ("200000 100000", "", 2.0),               # quota / period
    ("200000 100000", "0-0", 1.0),            # the cpuset is tighter
    ("max 100000", "0-3", 4.0),
    ("2000000 100000", "", 8.0),              # a quota above the node still gets only the node
    (None, None, 8.0),                        # no cpu controller: nothing limits it
    ("garbage", "x-y", 8.0),
])
def test_cpu_given(cpu_max, cpuset, want):
    assert cpu_given(ls(cpu_max=cpu_max, cpuset=cpuset), 8.0) == want


@pytest.mark.parametrize("memory_max, want", [("max", 16 * GiB), (str(4 * GiB), 4 * GiB), (None, 16 * GiB),
                                              (str(64 * GiB), 16 * GiB)])
def test_memory_given(memory_max, want):
    assert memory_given(ls(memory_max=memory_max), float(16 * GiB)) == want


def test_given_minus_peak_with_margin():
    r = observe(snap(ls(usage=1.0, cpu_max="400000 100000", mem=2 * GiB, memory_max=str(8 * GiB)), be()),
                settings(), ReclaimableState())
    assert r.cpu.given == 4.0 and r.cpu.peak == 1.0 and r.cpu.needs == pytest.approx(1.1)
    assert r.cpu.reclaimable == pytest.approx(2.9)
    assert r.memory.reclaimable == pytest.approx(8 * GiB - 2.2 * GiB)
    assert r.ls_cgroups == 1


def test_the_peak_holds_for_the_window_then_falls():
    s, state = settings(window="10s"), ReclaimableState()
    limit = "400000 100000"
    assert observe(snap(ls(usage=3.0, cpu_max=limit), t=100), s, state).cpu.reclaimable == pytest.approx(0.7)
    # LS falls to 0.5 core: its peak of 3 still counts within the window
    assert observe(snap(ls(usage=0.5, cpu_max=limit), t=105), s, state).cpu.reclaimable == pytest.approx(0.7)
    assert observe(snap(ls(usage=0.5, cpu_max=limit), t=110), s, state).cpu.reclaimable == pytest.approx(0.7)
    # 11 s after the peak it has left the window
    assert observe(snap(ls(usage=0.5, cpu_max=limit), t=111), s, state).cpu.reclaimable == pytest.approx(3.45)
    # a rise counts at once
    assert observe(snap(ls(usage=2.0, cpu_max=limit), t=112), s, state).cpu.reclaimable == pytest.approx(1.8)


def test_the_margin_never_asks_for_more_than_was_given():
    r = observe(snap(ls(usage=2.0, cpu_max="200000 100000")), settings(margin_percent=50), ReclaimableState())
    assert r.cpu.needs == 2.0 and r.cpu.reclaimable == 0.0


def test_never_negative_when_ls_uses_more_than_it_was_given():
    # usage above the limit (a burst, a stale cpu.max) leaves nothing, not a negative figure
    r = observe(snap(ls(usage=3.0, cpu_max="200000 100000", mem=5 * GiB, memory_max=str(4 * GiB))),
                settings(), ReclaimableState())
    assert r.cpu.reclaimable == 0.0 and r.memory.reclaimable == 0.0


def test_the_system_share_comes_off_what_an_unlimited_ls_was_given():
    # 8 CPUs; LS unlimited uses 1, BE 2, and the node 5: the host itself uses 2
    r = observe(snap(ls(usage=1.0), be(usage=2.0), used=5.0), settings(margin_percent=0), ReclaimableState())
    assert r.cpu.system == pytest.approx(2.0)
    assert r.cpu.reclaimable == pytest.approx(8 - 2 - 1)      # BE's own use is what reclaimable is for


def test_unlimited_roots_do_not_add_up_past_the_node():
    r = observe(snap(ls("a", usage=1.0), ls("b", usage=1.0), cpus=4), settings(margin_percent=0),
                ReclaimableState())
    assert r.cpu.given == 4.0 and r.cpu.reclaimable == pytest.approx(2.0)


def test_every_latency_sensitive_class_counts_and_no_other():
    cgroups = (ls("a", usage=1.0, cpu_max="100000 100000", cls="LSE"),
               ls("b", usage=0.0, cpu_max="100000 100000", cls="LSR"),
               ls("c", usage=0.0, cpu_max="100000 100000", cls="LS"),
               ls("sys", usage=0.0, cpu_max="100000 100000", cls="SYSTEM"))
    r = observe(snap(*cgroups), settings(margin_percent=0), ReclaimableState())
    assert r.ls_cgroups == 3 and r.cpu.given == 3.0 and r.cpu.reclaimable == pytest.approx(2.0)


def test_no_ls_class_means_nothing_reclaimable():
    r = observe(snap(be(usage=1.0)), settings(), ReclaimableState())
    assert r.cpu.reclaimable == 0.0 and r.memory.reclaimable == 0.0 and r.ls_cgroups == 0


def test_unknown_usage_makes_that_resource_unknown_and_keeps_its_peaks():
    s, state = settings(), ReclaimableState()
    observe(snap(ls(usage=3.0, cpu_max="400000 100000"), t=100), s, state)
    unknown = CgroupSample("ls", "LS", cpu_usage=None, cpu_max="400000 100000", memory_current=GiB, memory_max="max")
    r = observe(snap(unknown, used=1.0, t=101), s, state)
    assert r.cpu is None and r.memory is not None
    # the peak of 3 cores was kept through the unknown round
    assert observe(snap(ls(usage=0.5, cpu_max="400000 100000"), t=102), s, state).cpu.peak == 3.0


def test_a_vanished_root_takes_its_window_with_it():
    s, state = settings(), ReclaimableState()
    observe(snap(ls("a"), ls("b")), s, state)
    observe(snap(ls("a"), t=101), s, state)
    assert {k[1] for k in state.peaks} == {"a", ""}


def test_as_dict_is_json_ready():
    r = observe(snap(ls(usage=1.0, cpu_max="400000 100000")), settings(), ReclaimableState())
    d = r.as_dict()
    assert d["cpu_cores"]["reclaimable"] == pytest.approx(2.9) and isinstance(d["memory_bytes"]["reclaimable"], int)
    assert d["ls_cgroups"] == 1 and d["observed_seconds"] == 0.0


def test_window_peak_keeps_few_entries():
    w = WindowPeak(5.0)
    for t in range(100):
        w.push(float(t), float(100 - t))        # falling: every value is a later peak candidate
    assert len(w.entries) <= 6
    w2 = WindowPeak(5.0)
    for t in range(100):
        w2.push(float(t), float(t))             # rising: each value hides all before it
    assert len(w2.entries) == 1
