"""Issue 25, defect 11: a config that validates never stops a loop. Every number option of every section
and of every registered loop declares a finite range; nan, inf, -inf, 1e308 and 10**30 are refused at
their file:line when the config loads; and a tick of each loop at the extremes its options accept raises
nothing (OverflowError, ZeroDivisionError: `antagonist_cap_cpus = inf` once failed every be_suppress tick).
"""
from __future__ import annotations

import itertools
import math
import re

import pytest

from koordd.backends.cgroup_knobs import KNOBS
from koordd.core.backend import InvalidValue
from koordd.core.config import ConfigError, DAEMON_OPTIONS, METRICS_OPTIONS, loop_options, make_settings, parse_config
from koordd.core.health import HEALTH_OPTIONS
from koordd.core.options import Duration, Option
from koordd.core.reclaimable import RECLAIMABLE_OPTIONS
from koordd.core.report import REPORT_OPTIONS
from koordd.core.catalogue import load_registry
from koordd.core.schemata import L3Info, MBInfo, ResctrlInfo
from koordd.core.snapshot import (AVX, CPI, CgroupSample, CpiSample, CpuTopology, NET, NodeSample, Pressure,
    PressureStat, RESCTRL, RUNQ_LATENCY, RunqLatency, SCHED_EXT, SchedExtStatus, Snapshot, Throttling)
from koordd.sensors.avx import AvxSection, AvxUse
from koordd.sensors.net import NetSample
from koordd.sensors.resctrl import ResctrlSection

NUMBER_TYPES = (int, float, Duration)
REGISTRY = load_registry()
PATH = "/etc/koordd/koordd.toml"
CLASS_HEAD = '[[classes]]\nname = "LS"\ncgroups = ["ls"]\n'

# (TOML header that opens the table, its dotted name in messages, its options)
SECTIONS = [("[daemon]", "daemon", DAEMON_OPTIONS), ("[metrics]", "metrics", METRICS_OPTIONS),
            ("[reclaimable]", "reclaimable", RECLAIMABLE_OPTIONS), ("[report]", "report", REPORT_OPTIONS),
            (CLASS_HEAD + "[classes.health]", "classes[0].health", HEALTH_OPTIONS)] + [
    (f"[loops.{name}]", f"loops.{name}", loop_options(cls)) for name, cls in sorted(REGISTRY.items())]
NUMBERS = [(head, dotted, o) for head, dotted, opts in SECTIONS for o in opts if o.type in NUMBER_TYPES]
BAD = ("nan", "+nan", "-nan", "inf", "+inf", "-inf", "1e308", "-1e308", str(10**30), str(-10**30),
       '"' + "9" * 400 + 's"')


def _id(case) -> str:
    return f"{case[1]}.{case[2].name}"


def test_the_walk_finds_every_loop_and_the_options_of_issue_25():
    # The walk below must not be empty or miss a loop: it is the test's reach.
    assert set(REGISTRY) >= {"be_suppress", "cpu_burst", "memory_evict", "qos_baseline", "llc_partition",
                             "net_shaping", "avx_weight", "sched_ext"}
    assert "loops.be_suppress.antagonist_cap_cpus" in {_id(c) for c in NUMBERS}


@pytest.mark.parametrize("case", NUMBERS, ids=_id)
def test_every_number_option_declares_a_finite_range(case):
    opt = case[2]
    assert opt.min is not None and opt.max is not None, f"{_id(case)} has no range ({opt.min}..{opt.max})"
    assert math.isfinite(opt.min) and math.isfinite(opt.max) and opt.min <= opt.default <= opt.max


def test_a_number_option_without_a_range_is_refused_where_it_is_declared():
    with pytest.raises(TypeError, match="finite max"):
        Option("ratio", float, 0.5, "no max", min=0)
    with pytest.raises(TypeError, match="finite min"):
        Option("count", int, 1, "no min", max=10)
    with pytest.raises(TypeError, match="finite max"):
        Option("wait", Duration, Duration(1.0), "an infinite max", min=0, max=math.inf)


@pytest.mark.parametrize("case", NUMBERS, ids=_id)
def test_non_finite_and_huge_values_are_refused_at_their_line(case):
    head, dotted, opt = case
    for bad in BAD:
        text = f"{head}\n{opt.name} = {bad}\n"
        line = text.count("\n")
        with pytest.raises(ConfigError) as err:
            parse_config(text, PATH, REGISTRY)
        assert err.value.errors == [err.value.errors[0]] and re.match(
            rf"{re.escape(PATH)}:{line}: {re.escape(dotted)}\.{opt.name}: \S", err.value.errors[0]), \
            f"{opt.name} = {bad}: {err.value.errors}"


def test_the_reported_config_is_refused_at_its_line():
    text = '[loops.be_suppress]\nenabled = true\nantagonist_signal = "runq"\nantagonist_cap_cpus = inf\n'
    with pytest.raises(ConfigError, match=rf"^{re.escape(PATH)}:4: loops.be_suppress.antagonist_cap_cpus: "):
        parse_config(text, PATH, REGISTRY)


def test_link_rates_are_bounded_too():
    text = f'[loops.net_shaping]\ndevices = ["eth0:{"9" * 300}"]\n'
    with pytest.raises(ConfigError, match=rf"^{re.escape(PATH)}:2: loops.net_shaping.devices: .*at most 10tbit"):
        parse_config(text, PATH, REGISTRY)


# --- a tick at every accepted extreme --------------------------------------------------------------

CANDIDATES = (math.nan, math.inf, -math.inf, 1e308, -1e308, 10**30, -10**30, 0, 0.0)


def accepted_extremes(opt: Option) -> list:
    """The declared bounds and every candidate the option takes as it is: what a config can hand a loop."""
    out = [v for v in (opt.min, opt.max) if v is not None]
    for v in CANDIDATES:
        if opt.type is int and isinstance(v, float):
            continue
        try:
            out.append(opt.convert(v))
        except ValueError:
            pass
    return [opt.convert(int(v) if opt.type is int else v) for v in dict.fromkeys(out)]


def variants(cls) -> list[dict]:
    """Settings values: every number option alone at each accepted extreme, and all of them at their
    lowest and at their highest together; each once per value of every choice and bool option."""
    opts = [o for o in loop_options(cls) if o.name not in ("enabled", "interval")]
    numbers = [o for o in opts if o.type in NUMBER_TYPES]
    base = {"enabled": True, **EXTRA.get(cls.name, {})}
    values = [{o.name: v} for o in numbers for v in accepted_extremes(o)]
    values += [{o.name: min(accepted_extremes(o)) for o in numbers},
               {o.name: max(accepted_extremes(o)) for o in numbers}]
    switches = [{o.name: c} for o in opts for c in (o.choices if o.choices and o.type is str else
                                                    (True, False) if o.type is bool else ())]
    return [{**base, **v, **s} for v, s in itertools.product(values, switches or [{}])]


EXTRA = {"net_shaping": {"devices": ["eth0:1gbit", "lo:10tbit"]},
         "avx_weight": {"avx_cgroups": ["be"]},
         "sched_ext": {"ext_classes": ["LS", "BE"]} if "ext_classes" in {
             o.name for o in loop_options(REGISTRY["sched_ext"])} else {}}

TOPOLOGY = tuple(CpuTopology(c, c - c % 2, c // 4) for c in range(8))
RESCTRL_INFO = ResctrlInfo(L3Info(0x7FF, 2, 8, 0, (0, 1)), MBInfo(10, 10, 8, (0, 1), "intel"), "intel")
GIB = 1 << 30


def psi(avg: float) -> PressureStat:
    return PressureStat(Pressure(avg, avg, avg, int(avg * 1e6), avg * 1e4), Pressure(avg, avg, avg, 0, avg * 1e4))


def sample(path: str, cls: str, t: int, usage: float, cpuset: str = "") -> CgroupSample:
    wave = 1 + (t % 3)
    return CgroupSample(path=path, cls=cls, cpu_usage=usage * wave, throttling=Throttling(
        100 * t, 50 * t, 10_000 * t, 100, 50 * wave), cpu_max="50000 100000", cpu_max_burst="0",
        cpuset_cpus=cpuset, cpu_weight="100", memory_current=3 * GIB * wave, memory_anon=2 * GIB * wave,
        memory_max="max", oom_kills=0, frozen=False, cpu_pressure=psi(30.0 * wave),
        memory_pressure=psi(30.0 * wave), io_pressure=psi(5.0))


def world(t: int) -> Snapshot:
    """A busy node whose readings swing each tick: LS slow and pressed, BE large, memory nearly full,
    every optional sensor's section present (so each loop reaches the arithmetic its options feed)."""
    wave = 1 + (t % 3)
    roots = [sample("ls", "LS", t, 1.0), sample("lsr", "LSR", t, 0.5), sample("lse", "LSE", t, 0.5, "0"),
             sample("be", "BE", t, 1.5)]
    pods = tuple(sample(f"be/pod{i}", "BE", t, 0.4 * i) for i in (1, 2))
    runq = {c.path: RunqLatency("ebpf", 1000, 800.0 * wave, 500.0, 5000.0 * wave, 20000.0, (0,) * 10 + (900, 100))
            for c in roots + list(pods)}
    cpi = {c.path: CpiSample(2e9 * wave, 1e9, 1.0) for c in roots + list(pods)}
    avx = AvxUse(threads=4, avx512_threads=2, min_elapsed_ms=3, cpus=frozenset({0}), ran_cpus=frozenset({0, 1}))
    net = {"eth0": NetSample("htb", 10**9, 10**8, 4e8 * wave, 1e8, 1e7),
           "lo": NetSample("htb", 10**13, 10**12, 4e12 * wave, 1e12, 1e11)}
    return Snapshot(
        time=100.0 + t, wall=1e9 + t,
        node=NodeSample(cpu_count=8, cpu_used=3.0 * wave, memory_total=16 * GIB, memory_available=GIB,
                        memory_anon=14 * GIB, cpu_pressure=psi(40.0), memory_pressure=psi(70.0),
                        io_pressure=psi(1.0), topology=TOPOLOGY),
        cgroups={c.path: c for c in roots}, members={"be": pods},
        sections={RUNQ_LATENCY: runq, CPI: cpi, AVX: AvxSection({"be": avx, "be/pod1": avx}),
                  RESCTRL: ResctrlSection(RESCTRL_INFO, {"default": {}}), NET: net,
                  SCHED_EXT: SchedExtStatus("enabled", "flatcg", enable_seq=2, nr_rejected=0, switch_all=0,
                                            hotplug_seq=0)},
        held={("be", "cpu.max"): "max 100000", ("be/pod1", "cpu.max"): "max 100000"},
        supported=frozenset(KNOBS) | {"sched_policy", "cpu.idle"})


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_tick_at_every_accepted_extreme_raises_nothing(name):
    cls = REGISTRY[name]
    ticked = 0
    for values in variants(cls):
        s = make_settings(loop_options(cls), values)
        if cls.problems(s):
            continue                    # refused when the config loads: never reaches a tick
        state = cls.initial_state(s)
        for t in range(12):
            snap = world(t)
            cls.member_fields(snap, s, state)
            actions = cls.decide(snap, s, state)
            cls.settle(actions, [], s, state)
            for a in actions:           # what the actuator will do with the value must not raise either
                if a.value is not None and a.knob in KNOBS:
                    try:
                        KNOBS[a.knob].normalize(a.value)
                    except InvalidValue:
                        pass            # refused as a decision, as the actuator does
        ticked += 1
    assert ticked, f"{name}: no variant passed problems(); the test reached no tick"
