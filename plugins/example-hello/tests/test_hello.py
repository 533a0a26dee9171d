"""The loop alone: decide() is a pure function of a snapshot, so a test builds one and reads the actions."""
from koordd.core.config import loop_options, make_settings
from koordd.core.snapshot import CgroupSample, NodeSample, Snapshot

from koordd_hello import Hello


def snapshot(*cgroups: tuple[str, str]) -> Snapshot:
    return Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.0),
                    cgroups={path: CgroupSample(path, cls) for path, cls in cgroups})


def test_every_be_root_and_nothing_else_gets_the_weight():
    settings = make_settings(loop_options(Hello), {"enabled": True, "weight": 5})
    actions = Hello.decide(snapshot(("be.slice", "BE"), ("batch.slice", "BE"), ("ls.slice", "LS")), settings,
                           Hello.initial_state(settings))
    assert sorted((a.target, a.knob, a.value) for a in actions) == [
        ("batch.slice", "cpu.weight", "5"), ("be.slice", "cpu.weight", "5")]


def test_a_weight_out_of_range_is_refused_when_the_config_loads():
    try:
        make_settings(loop_options(Hello), {"weight": 0})
    except ValueError as e:
        assert str(e).startswith("weight:")
    else:
        raise AssertionError("weight 0 accepted")
