"""Layout detection, CgroupFS paths/reads/writes/walk, patterns and cpulists on fake trees."""
from __future__ import annotations

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.core.cgroup_text import depth, format_cpulist, match_pattern, normalize_cgroup, parent_of, parse_cpulist
from koordd.kernel.cgroupfs import CgroupFS, CgroupGone, LayoutError, detect_layout


@pytest.mark.parametrize("mode, want_mode, v2, v1", [
    ("v2", "v2", {"cpuset", "cpu", "io", "memory", "pids"}, set()),
    ("v1", "v1", set(), {"cpu", "cpuacct", "cpuset", "memory", "freezer"}),
    ("hybrid", "hybrid", {"hugetlb"}, {"cpu", "cpuacct", "cpuset", "memory", "freezer"}),
    ("v1-comount", "v1", set(), {"cpu", "cpuacct", "cpuset", "memory", "freezer"}),
])
def test_detect_layout(tmp_path, mode, want_mode, v2, v1):
    tree = FakeCgroups(tmp_path, mode)
    layout = detect_layout(tree.root)
    assert (layout.mode, set(layout.v2_controllers), set(layout.v1)) == (want_mode, v2, v1)
    assert layout.unified == {"v2": tree.root, "hybrid": tree.root / "unified"}.get(mode)
    assert "systemd" not in layout.v1          # name=systemd is not a controller
    assert f"mode={want_mode}" in layout.describe()


def test_comounted_cpu_and_cpuacct_share_one_directory(tmp_path):
    layout = detect_layout(FakeCgroups(tmp_path, "v1-comount").root)
    assert layout.v1["cpu"].resolve() == layout.v1["cpuacct"].resolve() == tmp_path / "cgroup" / "cpu,cpuacct"


def test_v2_with_only_a_unified_subdirectory(tmp_path):
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("cpu memory\n")
    layout = detect_layout(tmp_path)
    assert (layout.mode, layout.unified, layout.v2_controllers) == ("v2", tmp_path / "unified",
                                                                   frozenset({"cpu", "memory"}))


@pytest.mark.parametrize("make", [lambda p: p, lambda p: p / "missing", lambda p: (p / "junk").mkdir() or p])
def test_detect_layout_without_a_hierarchy(tmp_path, make):
    with pytest.raises(LayoutError):
        detect_layout(make(tmp_path))


def test_dir_per_controller(tree):
    fs, cg = tree.fs, "be.slice/job"
    for controller in ("cpu", "cpuacct", "cpuset", "memory"):
        if tree.mode == "v2" and controller == "cpuacct":
            assert fs.dir(controller, cg) is None     # no cpuacct on v2
            continue
        assert fs.dir(controller, cg).resolve() == tree.dir(cg, controller).resolve()
    assert fs.dir("cpu", "").resolve() == tree.dir("", "cpu").resolve()
    assert fs.dir(None, cg) == (None if tree.mode in ("v1", "v1-comount") else tree.dir(cg, None))


def test_read_and_write(tree):
    fs = tree.fs
    name = "cpu.weight" if tree.mode == "v2" else "cpu.shares"
    assert fs.read("cpu", "be.slice/job", name) == ("100\n" if tree.mode == "v2" else "1024\n")
    fs.write("cpu", "be.slice/job", name, "5")
    assert tree.read("be.slice/job", "cpu", name) == "5"      # truncated, like `echo 5 >`
    assert fs.exists("cpu", "be.slice/job") and not fs.exists("cpu", "nope")


def test_gone_cgroup_versus_missing_file(tree):
    fs = tree.fs
    tree.remove("be.slice/job")
    with pytest.raises(CgroupGone):
        fs.read("cpu", "be.slice/job", "cpu.stat")
    with pytest.raises(CgroupGone):
        fs.write("cpu", "be.slice/job", "cpu.stat", "1")
    for op in (lambda: fs.read("cpu", "be.slice", "no.such.file"),
               lambda: fs.write("cpu", "be.slice", "no.such.file", "1")):
        with pytest.raises(FileNotFoundError):
            op()
    assert not (tree.dir("be.slice", "cpu") / "no.such.file").exists()   # write never creates a file


def test_no_hierarchy_for_controller_is_file_not_found(tmp_path):
    fs = FakeCgroups(tmp_path, "v2").add("a").fs
    with pytest.raises(FileNotFoundError):
        fs.read("cpuacct", "a", "cpuacct.usage")
    with pytest.raises(FileNotFoundError):
        fs.write("freezer", "a", "freezer.state", "FROZEN")


def test_walk_parents_first_to_max_depth(tree):
    tree.add("be.slice/job/c1").add("be.slice/a").add("ls.slice")
    fs = tree.fs
    ctl = fs.walk_controller()
    assert ctl == (None if tree.mode == "v2" else "cpu")
    assert list(fs.walk(ctl, 1)) == ["be.slice", "ls.slice"]
    assert list(fs.walk(ctl, 3)) == ["be.slice", "be.slice/a", "be.slice/job", "be.slice/job/c1", "ls.slice"]
    assert list(fs.walk(ctl, 0)) == []
    if tree.mode == "v2":
        assert list(fs.walk("cpuacct", 3)) == []              # no such hierarchy
    elif tree.mode == "hybrid":
        assert list(fs.walk(None, 1)) == ["be.slice", "ls.slice"]
    else:
        assert list(fs.walk(None, 3)) == []


@pytest.mark.parametrize("pattern, cgroup, match", [
    ("kubepods.slice/*", "kubepods.slice/kubepods-besteffort.slice", True),
    ("kubepods.slice/*", "kubepods.slice", False),
    ("kubepods.slice/*", "kubepods.slice/a/b", False),
    ("*/kubepods-besteffort*", "kubepods.slice/kubepods-besteffort.slice", True),
    ("kubepods/besteffort", "kubepods/besteffort", True),
    ("kubepods/besteffort", "kubepods/Besteffort", False),
    ("be.slice", "be.slice", True),
])
def test_match_pattern(pattern, cgroup, match):
    assert match_pattern(pattern, cgroup) is match


@pytest.mark.parametrize("text, cpus", [
    ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}),
    ("", set()),
    ("\n", set()),
    ("5", {5}),
    (" 0-1 , 3 ", {0, 1, 3}),
    ("0-0", {0}),
])
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize("text", ["3-1", "a", "0-", "-1", "1-2-3", "0,,x", "0 1"])
def test_parse_cpulist_rejects_malformed(text):
    with pytest.raises(ValueError):
        parse_cpulist(text)


@pytest.mark.parametrize("cpus, text", [
    ({0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"), (set(), ""), ({7}, "7"), ({1, 2}, "1-2"), ({5, 3, 1}, "1,3,5"),
])
def test_format_cpulist_round_trip(cpus, text):
    assert format_cpulist(cpus) == text
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize("name, want", [
    ("/be.slice/", "be.slice"), ("", ""), ("/", ""), ("a//b/./c", "a/b/c"), (" a/b ", "a/b"),
])
def test_normalize_cgroup(name, want):
    assert normalize_cgroup(name) == want


@pytest.mark.parametrize("name", ["..", "a/../b", "/../etc", "a/.."])
def test_normalize_cgroup_rejects_parent_references(name):
    with pytest.raises(ValueError):
        normalize_cgroup(name)


def test_parent_and_depth():
    assert [parent_of(c) for c in ("", "a", "a/b")] == [None, "", "a"]
    assert [depth(c) for c in ("", "a", "a/b/c")] == [0, 1, 3]


def test_fs_is_plain_over_a_layout(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("a")
    assert CgroupFS(detect_layout(tree.root)).read(None, "a", "cpu.max") == "max 100000\n"


def test_kept_open_files_are_re_read_with_pread_and_reopened_after_enodev(tmp_path, monkeypatch):
    import errno
    import os

    from koordd.kernel import cgroupfs as mod
    tree = FakeCgroups(tmp_path, "v2").add("a").add("b")
    fs = CgroupFS(tree.layout, keep_open=True)
    assert fs.read("cpu", "a", "cpu.max").strip() == "max 100000"
    assert len(fs._open) == 1
    tree.set("a", "cpu", "cpu.max", "5000 100000\n")          # rewritten in place, as the kernel does
    opened = []
    real_open = os.open
    monkeypatch.setattr(mod.os, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    assert fs.read("cpu", "a", "cpu.max").strip() == "5000 100000"
    assert opened == []                                         # one pread on the kept descriptor

    # A removed cgroup's file answers ENODEV: closed, opened afresh (here: the cgroup is back).
    real_pread = os.pread
    kept = fs._open[f"{tree.root}/a/cpu.max"][1]

    failed = []

    def pread(fd, n, offset):
        if fd == kept and not failed:          # once: the reopened file may get the same number
            failed.append(fd)
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, n, offset)
    monkeypatch.setattr(mod.os, "pread", pread)
    assert fs.read("cpu", "a", "cpu.max").strip() == "5000 100000" and len(opened) == 1

    fs.read("cpu", "b", "cpu.max")
    fs.close_except({"b"})                                     # a is no longer sampled
    assert [cg for cg, _ in fs._open.values()] == ["b"]
    fs.close()
    assert fs._open == {}


def test_files_are_kept_open_only_up_to_the_limit_and_only_on_cgroupfs(tmp_path):
    from koordd.kernel.cgroupfs import on_cgroupfs
    tree = FakeCgroups(tmp_path, "v2").add("a")
    fs = CgroupFS(tree.layout, keep_open=True, max_open=1)
    fs.read("cpu", "a", "cpu.max")
    fs.read("cpu", "a", "cpu.weight")                          # over the limit: read and closed
    assert len(fs._open) == 1 and fs.read("cpu", "a", "cpu.weight").strip() == "100"
    assert not on_cgroupfs(tree.layout)                        # plain files: the daemon keeps nothing open
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {tree.root} cgroup2 rw 0 0\n")
    assert on_cgroupfs(tree.layout, str(mounts))


@pytest.mark.parametrize("keep_open", [False, True])
def test_a_thread_list_longer_than_a_page_is_read_whole(tmp_path, monkeypatch, keep_open):
    import os

    from koordd.kernel import cgroupfs as mod
    tree = FakeCgroups(tmp_path, "v2").add("a")
    tids = [str(100000 + i) for i in range(2000)]               # 14 KB, as a JVM's cgroup.threads
    tree.set("a", None, "cgroup.threads", "".join(f"{t}\n" for t in tids))
    real_pread = os.pread
    calls = []

    def seq_pread(fd, n, offset):
        """As a seq_file: whole lines, at most a page per read."""
        calls.append(offset)
        data = real_pread(fd, mod.SEQ_PAGE, offset)
        return data[:data.rfind(b"\n") + 1] if len(data) == mod.SEQ_PAGE else data
    monkeypatch.setattr(mod.os, "pread", seq_pread)
    fs = CgroupFS(tree.layout, keep_open=keep_open)
    assert fs.read(None, "a", "cgroup.threads").split() == tids
    calls.clear()
    assert fs.read(None, "a", "cpu.max") == "max 100000\n" and calls == [0]     # a short file: one pread


@pytest.mark.parametrize("mode", ["v1", "hybrid"])
def test_v1_thread_lists_are_never_kept_open(tmp_path, mode):
    """The kernel hands a kept v1 `tasks`/`cgroup.procs` its old list for a second: always opened afresh."""
    tree = FakeCgroups(tmp_path, mode).add("a")
    fs = CgroupFS(tree.layout, keep_open=True)
    for filename in ("tasks", "cgroup.procs"):
        fs.read("cpu", "a", filename)
    fs.read("cpu", "a", "cpu.shares")
    assert [path.rsplit("/", 1)[1] for path in fs._open] == ["cpu.shares"]
