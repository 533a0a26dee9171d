"""The registry (koordd/core/catalogue.py): koordd's own loops are entry points of its own metadata, found as a
third party's are (plugins/, the package koordd_plugins); its own sensors and backends are listed once; the
third parties' entry points are added the same way for all three."""
from __future__ import annotations

import logging
import subprocess
import sys
import tomllib
from koordd.core.installed import EntryPoint
from pathlib import Path
from types import SimpleNamespace

import pytest

from koordtest.fakes.cgroup import FakeCgroups
import koordd.core.catalogue as registry
from koordd.backends.host_backends import all_backends
from koordd.core.backend import Backend
from koordd.core.loop import Loop
from koordd.core.catalogue import (BACKENDS, BUILTIN, LOOPS, OWN_LOOPS, PLUGINS, SENSORS, BrokenInstall, builtin,
                                  load_registry, own_loop_points, third_party)

ROOT = Path(__file__).resolve().parents[3]


class Widget(Loop):
    name = "widget"


class Impostor(Loop):
    name = "be_suppress"


def points(monkeypatch, *eps, own=True):
    """The installed entry points (koordd's own loops among them) and `eps`; only `eps` if not `own`."""
    real = registry.entry_points
    monkeypatch.setattr(registry, "entry_points", lambda group: [*(real(group=group) if own else ()),
                                                                 *(p for p in eps if p.group == group)])


@pytest.mark.parametrize("group", [SENSORS, BACKENDS])
def test_koordds_own_lie_in_the_package_their_group_names(group):
    # The registry loads them by name, unseen by lint-imports: this keeps a loop from naming a sensor.
    for name, value in BUILTIN[group].items():
        assert value.split(":")[0].startswith(group + "."), (name, value)
    assert builtin(group)


def test_koordds_own_loops_come_from_its_metadata_and_lie_in_koordd_plugins():
    got = own_loop_points()
    assert list(got) == list(OWN_LOOPS)
    for name, ep in got.items():
        assert ep.dist.name == "koordd" and ep.value.startswith(PLUGINS + "."), (name, ep)


def test_each_built_in_class_says_its_own_name():
    for group in (LOOPS, SENSORS):
        for name, cls in builtin(group).items():
            assert cls.name == name, (group, name, cls)


def test_every_loop_module_is_an_entry_point_of_pyproject_and_in_own_loops():
    # A loop added to plugins/ needs its line in pyproject.toml's [project.entry-points."koordd.loops"] and
    # its name in OWN_LOOPS (the order loops run in); each module holds one loop, named after it.
    modules = {p.stem for p in (ROOT / "plugins").glob("*.py")} - {"__init__"}
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][LOOPS]
    assert {name: value.split(":")[0] for name, value in declared.items()} == {m: f"{PLUGINS}.{m}" for m in modules}
    assert sorted(OWN_LOOPS) == sorted(modules) and len(set(OWN_LOOPS)) == len(OWN_LOOPS)


def test_the_registry_keeps_the_order_koordd_has_always_run_its_loops_in():
    # The metadata sorts entry points by name; the config (and so the rounds, and the reference) keep this.
    assert list(load_registry())[:len(OWN_LOOPS)] == ["be_suppress", "cpu_burst", "memory_evict", "net_shaping",
        "llc_partition", "qos_baseline", "sched_ext", "avx_weight", "io_qos", "proactive_reclaim", "core_sched",
        "oom_shaping"]


def test_an_install_without_its_entry_points_stops_koordd_with_one_line_saying_so(monkeypatch, tmp_path):
    # No list to fall back on: a package that lost its metadata would lose every third party's loop too.
    points(monkeypatch, own=False)
    with pytest.raises(BrokenInstall, match="koordd's own loops be_suppress, cpu_burst, .* reinstall koordd"):
        load_registry()
    # koordd itself (a process of its own: main() sets the umask and the log handlers): exit 1, one line.
    code = ("import sys, koordd.core.catalogue as r; r.entry_points = lambda group: []\n"
            "from koordd.runtime.daemon import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "--config", str(tmp_path / "none.toml"), "--once"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "ERROR koordd: cannot start: koordd's own loops be_suppress" in done.stderr, done.stderr
    assert "reinstall koordd (in a checkout: scripts/dev-env; on a node: its .deb)" in done.stderr


def test_a_third_party_loop_is_added_and_a_broken_or_clashing_one_left_out_with_one_line(monkeypatch, caplog):
    points(monkeypatch,
           EntryPoint("widget", f"{__name__}:Widget", LOOPS),
           EntryPoint("gone", "koordd_no_such_module:Loop", LOOPS),
           EntryPoint("be_suppress", f"{__name__}:Impostor", LOOPS),
           EntryPoint("misnamed", f"{__name__}:Widget", LOOPS))
    with caplog.at_level(logging.ERROR, "koordd.registry"):
        got = load_registry()
    assert got["widget"] is Widget and got["be_suppress"] is not Impostor
    assert list(got) == [*OWN_LOOPS, "widget"]
    errors = sorted(r.getMessage() for r in caplog.records)
    assert len(errors) == 3, errors
    assert any(m.startswith("loop be_suppress (") and m.endswith("left out: be_suppress is already koordd's own loop")
               for m in errors)
    assert any(m.startswith("loop gone (koordd_no_such_module:Loop) failed to load") for m in errors)
    assert any(m.startswith("loop misnamed: entry point names class") for m in errors)


class Cgroup(Backend):
    kind = "cgroup"


def test_koordds_own_metadata_is_no_third_party_and_stale_metadata_is_named(monkeypatch, caplog):
    # An older koordd's metadata may linger (a stale koordd.egg-info in a checkout, read before the venv's):
    # it names modules of before (koordd.loops.*). Never a third party's; koordd says to reinstall.
    stale = SimpleNamespace(name="be_suppress", value="koordd.loops.be_suppress:BeSuppress", group=LOOPS,
                            dist=SimpleNamespace(name="koordd"))
    points(monkeypatch, stale, own=False)
    assert third_party(LOOPS) == {} and caplog.records == []
    with pytest.raises(BrokenInstall, match="koordd's own loops be_suppress, cpu_burst, .* koordd_plugins"):
        builtin(LOOPS)


def test_a_third_party_backend_whose_kind_is_taken_is_left_out_named(monkeypatch, caplog, tmp_path):
    points(monkeypatch, EntryPoint("cgroup", f"{__name__}:Cgroup", BACKENDS))
    got = all_backends(FakeCgroups(tmp_path, "v2").fs)
    assert got.of_kind("cgroup") is not None and not isinstance(got.of_kind("cgroup"), Cgroup)
    assert "backend cgroup" in caplog.text and "already registered" in caplog.text
    got.close()
