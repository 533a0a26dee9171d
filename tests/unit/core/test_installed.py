"""koordd's reader of installed metadata (koordd/core/installed.py) against importlib.metadata, which it
replaces at start: the same entry points and versions on this test's own environment, on folders written to
be awkward, and no crash on folders written to be hostile."""
from __future__ import annotations

import importlib.metadata as stdlib
import logging
import sys
import types

import pytest

from koordd.core import installed
from koordd.core.catalogue import BACKENDS, LOOPS, SENSORS, own_loop_points

GROUPS = (LOOPS, SENSORS, BACKENDS, "console_scripts", "pytest11")


def seen(eps) -> list[tuple[str, str, str, str]]:
    return sorted((ep.group, ep.name, ep.value, installed.normalized(ep.dist.name)) for ep in eps)


def stdlib_points(group: str, path: list[str] | None = None) -> list:
    if path is None:
        return list(stdlib.entry_points(group=group))
    return [ep for dist in _unique(stdlib.distributions(path=path)) for ep in dist.entry_points if ep.group == group]


def _unique(dists):
    names = set()
    for d in dists:
        key = installed.normalized(d._normalized_name)
        if key not in names:
            names.add(key)
            yield d


@pytest.mark.parametrize("group", GROUPS)
def test_this_environment_s_entry_points_are_importlib_metadata_s(group):
    ours = installed.entry_points(group)
    assert seen(ours) == seen(stdlib_points(group))
    if group in (LOOPS, "console_scripts"):
        assert ours, group      # koordd's own are there: the comparison is of something


def test_versions_are_importlib_metadata_s():
    for name in ("koordd", "pytest", "pluggy"):
        assert installed.version(name) == stdlib.version(name), name
    assert installed.version("no-such-package-here") is None
    assert installed.distribution("KOORDD").name.lower() == "koordd"      # names compare as packaging does


def write(folder, files: dict[str, str]):
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)


@pytest.fixture
def awkward(tmp_path):
    """Two folders on a path: comments, blank lines, spaces and extras; a .egg-info without a version in its
    name; a package shadowed by the same name (spelled otherwise) in the later folder; an old-style .egg-info
    file; a zip file on the path."""
    first, second = tmp_path / "first", tmp_path / "second"
    write(first / "Widget_Co-1.0.dist-info", {
        "METADATA": "Metadata-Version: 2.1\nName: Widget-Co\nVersion: 1.0\n\nVersion: 9 (the description)\n",
        "entry_points.txt": "# a comment\n\n[koordd.loops]\nwidget = widget_co.loop:Widget\n"
                            "  spaced   =   widget_co.loop : Spaced . Inner  \n\n"
                            "[console_scripts]\nwidgetd = widget_co.cli:main [cli]\n"})
    write(first / "gadget.egg-info", {"PKG-INFO": "Metadata-Version: 1.1\nName: gadget\nVersion: 0.3\n",
                                      "entry_points.txt": "[koordd.sensors]\ngadget = gadget:Gadget\n"})
    (first / "old-0.1.egg-info").write_text("Metadata-Version: 1.0\nName: old\nVersion: 0.1\n")
    write(second / "widget.co-2.0.dist-info", {"METADATA": "Name: widget.co\nVersion: 2.0\n",
                                               "entry_points.txt": "[koordd.loops]\nshadowed = x:Y\n"})
    (tmp_path / "eggs.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    return [str(first), str(tmp_path / "eggs.zip"), str(second), str(tmp_path / "gone")]


@pytest.mark.parametrize("group", [LOOPS, SENSORS, "console_scripts"])
def test_awkward_folders_read_as_importlib_metadata_reads_them(awkward, group):
    assert seen(installed.entry_points(group, awkward)) == seen(stdlib_points(group, awkward))


def test_awkward_folders_give_the_first_of_each_name_and_its_version(awkward):
    # the old-style file is no folder: it has no entry points, and is not read (importlib.metadata lists it)
    assert [installed.normalized(d.name) for d in installed.distributions(awkward)] == ["widget_co", "gadget"]
    widget = installed.distribution("widget-co", awkward)
    assert widget.version == "1.0"      # the header, not the description's line of the same name
    assert installed.distribution("gadget", awkward).version == "0.3"
    assert [ep.name for ep in installed.entry_points(LOOPS, awkward)] == ["widget", "spaced"]


def test_an_entry_point_loads_what_it_names_as_importlib_metadata_s_does(monkeypatch):
    mod = types.ModuleType("koordd_test_ep_target")
    mod.Outer = types.SimpleNamespace(Inner="found")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    for value in (f"{mod.__name__}:Outer.Inner", f"{mod.__name__} : Outer.Inner [extra]", mod.__name__):
        ours = installed.EntryPoint("x", value, "g").load()
        assert ours is stdlib.EntryPoint("x", value, "g").load(), value


def test_a_hostile_entry_points_file_costs_its_bad_lines_only(tmp_path, caplog):
    folder = tmp_path / "bad-1.dist-info"
    write(folder, {"entry_points.txt": "orphan = before:AnyGroup\n[koordd.loops]\nno equals sign here\n= x:Y\n"
                                       "name =\n\x00\xff = still:Parsed\nok = fine:Loop\n[unclosed\n"
                                       + "# padding\n" * 200_000 + "[koordd.loops]\nlate = too:Far\n",
                   "METADATA": "\n" * 10 + "Version: 1\n"})
    with caplog.at_level(logging.ERROR, logger="koordd.registry"):
        got = installed.entry_points(LOOPS, [str(tmp_path)])
    assert [(ep.name, ep.value) for ep in got] == [("\x00\xff", "still:Parsed"), ("ok", "fine:Loop")]
    bad = [r.getMessage() for r in caplog.records]
    assert len(bad) == 5 and all(str(folder / "entry_points.txt") in m for m in bad), bad
    assert " line 1:" in bad[0] and " line 3:" in bad[1] and " line 8:" in bad[4]
    assert installed.distribution("bad", [str(tmp_path)]).version is None   # no headers before the empty line


def test_a_file_of_nothing_but_bad_lines_names_ten_and_counts_the_rest(tmp_path, caplog):
    write(tmp_path / "junk-1.dist-info", {"entry_points.txt": "[koordd.loops]\n" + "junk\n" * 100_000})
    with caplog.at_level(logging.ERROR, logger="koordd.registry"):
        assert installed.entry_points(LOOPS, [str(tmp_path)]) == []
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == installed.BAD_LINES_LOGGED + 1 and said[-1].endswith(": 99990 more lines like those left out")


def test_what_is_not_a_folder_name_on_sys_path_is_skipped(tmp_path):
    assert list(installed.distributions([b"/bytes", None, 3, str(tmp_path / "missing")])) == []


def test_koordds_own_loops_come_from_its_distribution_named_by_its_folder():
    for ep in own_loop_points().values():
        assert isinstance(ep, installed.EntryPoint) and installed.normalized(ep.dist.name) == "koordd"
