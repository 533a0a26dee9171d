"""The registry (koordd/core/registry.py): koordd's own loops, sensors and backends listed once, and the
third parties' entry points added the same way for all three."""
from __future__ import annotations

import logging
from importlib.metadata import EntryPoint
from pathlib import Path
from types import SimpleNamespace

import pytest

from koordtest.fakes.cgroup import FakeCgroups
import koordd.core.registry as registry
import koordd.loops
from koordd.backends.registry import all_backends
from koordd.core.backend import Backend
from koordd.core.loop import Loop
from koordd.core.registry import BACKENDS, BUILTIN, LOOPS, SENSORS, builtin, load_registry, third_party


class Widget(Loop):
    name = "widget"


class Impostor(Loop):
    name = "be_suppress"


def points(monkeypatch, *eps):
    monkeypatch.setattr(registry, "entry_points", lambda group: [p for p in eps if p.group == group])


@pytest.mark.parametrize("group", [LOOPS, SENSORS, BACKENDS])
def test_koordds_own_lie_in_the_package_their_group_names(group):
    # The registry loads them by name, unseen by lint-imports: this keeps a loop from naming a sensor.
    for name, value in BUILTIN[group].items():
        assert value.split(":")[0].startswith(group + "."), (name, value)
    assert builtin(group)


def test_each_built_in_class_says_its_own_name():
    for group in (LOOPS, SENSORS):
        for name, cls in builtin(group).items():
            assert cls.name == name, (group, name, cls)


def test_every_loop_module_is_built_in():
    modules = {p.stem for p in Path(koordd.loops.__file__).parent.glob("*.py")} - {"__init__"}
    assert {v.split(":")[0].rsplit(".", 1)[1] for v in BUILTIN[LOOPS].values()} == modules


def test_a_third_party_loop_is_added_and_a_broken_or_clashing_one_left_out_with_one_line(monkeypatch, caplog):
    points(monkeypatch,
           EntryPoint("widget", f"{__name__}:Widget", LOOPS),
           EntryPoint("gone", "koordd_no_such_module:Loop", LOOPS),
           EntryPoint("be_suppress", f"{__name__}:Impostor", LOOPS),
           EntryPoint("misnamed", f"{__name__}:Widget", LOOPS))
    with caplog.at_level(logging.ERROR, "koordd.registry"):
        got = load_registry()
    assert got["widget"] is Widget and got["be_suppress"] is not Impostor
    assert set(got) == set(BUILTIN[LOOPS]) | {"widget"}
    errors = sorted(r.getMessage() for r in caplog.records)
    assert len(errors) == 3, errors
    assert any(m.startswith("loop be_suppress (") and m.endswith("left out: be_suppress is already koordd's own loop")
               for m in errors)
    assert any(m.startswith("loop gone (koordd_no_such_module:Loop) failed to load") for m in errors)
    assert any(m.startswith("loop misnamed: entry point names class") for m in errors)


class Cgroup(Backend):
    kind = "cgroup"


def test_koordds_own_metadata_is_no_third_party(monkeypatch, caplog):
    # An older koordd listed its loops as entry points; its metadata may linger (a stale koordd.egg-info).
    stale = SimpleNamespace(name="be_suppress", value="koordd.plugins.be_suppress:BeSuppress", group=LOOPS,
                            dist=SimpleNamespace(metadata={"Name": "koordd"}))
    points(monkeypatch, stale)
    assert third_party(LOOPS) == {} and caplog.records == []


def test_a_third_party_backend_whose_kind_is_taken_is_left_out_named(monkeypatch, caplog, tmp_path):
    points(monkeypatch, EntryPoint("cgroup", f"{__name__}:Cgroup", BACKENDS))
    got = all_backends(FakeCgroups(tmp_path, "v2").fs)
    assert got.of_kind("cgroup") is not None and not isinstance(got.of_kind("cgroup"), Cgroup)
    assert "backend cgroup" in caplog.text and "already registered" in caplog.text
    got.close()
