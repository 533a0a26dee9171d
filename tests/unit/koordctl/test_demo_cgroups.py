"""The demo's cgroups on fake trees of every layout: where they are made, what is read from them,
what is removed. tests/kernel/test_demo_kernel.py makes and removes real ones."""
from __future__ import annotations

import os

import pytest
from koordtest.fakes.cgroup import FakeCgroups

from koordctl.demo.cgroups import DemoCgroups, DemoError, hierarchy_roots


@pytest.mark.parametrize("mode, hierarchies", [("hybrid", ["cpu", "cpuacct", "unified"]), ("v1", ["cpu", "cpuacct"]),
                                               ("v1-comount", ["cpu"]), ("v2", [""])])
def test_hierarchy_roots(tmp_path, mode, hierarchies):
    tree = FakeCgroups(tmp_path, mode)
    roots = hierarchy_roots(tree.layout)
    assert [os.path.realpath(r) for r in roots] == [os.path.realpath(tree.root / h) for h in hierarchies]


def test_hierarchy_roots_needs_cpu_and_cpuacct(tmp_path):
    tree = FakeCgroups(tmp_path, "hybrid")
    (tree.root / "cpuacct" / "cgroup.procs").unlink()         # no longer recognised as a hierarchy
    with pytest.raises(DemoError, match="cpuacct"):
        hierarchy_roots(tree.layout)


@pytest.mark.parametrize("mode", ["hybrid", "v1-comount", "v2"])
def test_cgroups_made_in_every_hierarchy(tmp_path, mode):
    tree = FakeCgroups(tmp_path, mode)
    if mode == "v2":
        tree.set("", None, "cgroup.subtree_control", "cpu memory\n")
    cgroups = DemoCgroups(tree.layout, "koordd-demo-1")
    cgroups.create()
    for root in hierarchy_roots(tree.layout):
        for child in ("ls", "be"):
            assert (root / "koordd-demo-1" / child).is_dir()
    assert len(cgroups.made) == 3 * len(hierarchy_roots(tree.layout))
    if mode == "v2":
        assert tree.read("koordd-demo-1", None, "cgroup.subtree_control") == "+cpu"
    assert cgroups.procs_files("ls") == [str(r / "koordd-demo-1" / "ls" / "cgroup.procs")
                                         for r in hierarchy_roots(tree.layout)]


def test_v2_root_without_cpu_for_its_children_is_left_alone(tmp_path):
    tree = FakeCgroups(tmp_path, "v2")                      # subtree_control is empty
    before = tree.read("", None, "cgroup.subtree_control")
    cgroups = DemoCgroups(tree.layout, "koordd-demo-1")
    with pytest.raises(DemoError, match=r"echo \+cpu"):
        cgroups.create()
    assert tree.read("", None, "cgroup.subtree_control") == before
    assert not (tree.root / "koordd-demo-1").exists()


def test_a_leftover_of_the_same_name_is_left_alone(tmp_path):
    tree = FakeCgroups(tmp_path, "hybrid")
    tree.add("koordd-demo-1/ls")
    cgroups = DemoCgroups(tree.layout, "koordd-demo-1")
    with pytest.raises(DemoError, match="koordd-demo-1 exists already"):
        cgroups.create()
    assert cgroups.made == [] and (tree.root / "cpu" / "koordd-demo-1" / "ls").is_dir()


@pytest.mark.parametrize("mode", ["hybrid", "v1-comount", "v2"])
def test_usage_and_be_limits(tmp_path, mode):
    tree = FakeCgroups(tmp_path, mode)
    tree.add("koordd-demo-1/ls", usage_us=1500).add("koordd-demo-1/be", usage_us=250)
    cgroups = DemoCgroups(tree.layout, "koordd-demo-1")
    assert cgroups.usage_ns("ls") == 1_500_000 and cgroups.usage_ns("be") == 250_000
    assert cgroups.be_limits() == (None, False)
    if mode == "v2":
        tree.set("koordd-demo-1/be", "cpu", "cpu.max", "30000 100000\n")
    else:
        tree.set("koordd-demo-1/be", "cpu", "cpu.cfs_quota_us", "30000\n")
    tree.set("koordd-demo-1/be", "cpu", "cpu.idle", "1\n")
    assert cgroups.be_limits() == (pytest.approx(0.3), True)


def test_be_limits_without_cpu_idle(tmp_path):
    tree = FakeCgroups(tmp_path, "hybrid")
    tree.add("koordd-demo-1/be")
    (tree.dir("koordd-demo-1/be", "cpu") / "cpu.idle").unlink()         # a kernel before 5.15
    assert DemoCgroups(tree.layout, "koordd-demo-1").be_limits() == (None, None)


def test_cgroups_removed_in_reverse_order(tmp_path):
    """On a fake tree rmdir meets ordinary files; the kernel test removes real cgroups. Here: only the
    directories create() made go, children first, and what cannot go is said."""
    tree = FakeCgroups(tmp_path, "hybrid")
    cgroups = DemoCgroups(tree.layout, "koordd-demo-1")
    cgroups.create()
    (tree.root / "cpu" / "koordd-demo-1" / "be" / "stray").write_text("")
    problems = cgroups.remove(timeout=0.2)
    assert problems == [f"cannot remove {tree.root / 'cpu' / 'koordd-demo-1' / 'be'}: Directory not empty",
                        f"cannot remove {tree.root / 'cpu' / 'koordd-demo-1'}: Directory not empty"]
    assert cgroups.removed == 7 and cgroups.made == [tree.root / "cpu" / "koordd-demo-1",
                                                     tree.root / "cpu" / "koordd-demo-1" / "be"]
    assert not (tree.root / "cpuacct" / "koordd-demo-1").exists()
    assert not (tree.root / "unified" / "koordd-demo-1").exists()
    assert (tree.root / "cpu" / "cpu.shares").exists()                   # nothing of the host's touched
