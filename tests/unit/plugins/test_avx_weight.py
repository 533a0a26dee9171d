"""avx_weight: the weights it asks for on hand-built snapshots (victims, the PMU's licence levels against
arch_status, AVX2, lower_avx, clamping, hold, declared cgroups without the sensor, the journaled base), the
one-owner rule at config load, the cpu_weight the cgroup sensor reads (v1 shares converted), and a run
through the actuator on fake trees."""
from __future__ import annotations

from dataclasses import replace

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import CgroupBackend
from koordd.core.avx import AVX256, AVX512, Licence, SCALAR
from koordd.core.backend import Backends
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.snapshot import AVX, CgroupSample, CpuTopology, NodeSample, Snapshot
from koordd_plugins.avx_weight import AvxWeight
from koordd_plugins.qos_baseline import QosBaseline
from koordd.runtime.runner import Runner
from koordd.sensors.avx import AvxSection, AvxUse
from koordd.sensors.cgroup_stats import CgroupSensor

# 4 CPUs, SMT pairs {0,1} and {2,3}
TOPOLOGY = tuple(CpuTopology(c, c - c % 2, 0) for c in range(4))
SUPPORTED = frozenset({"cpu.weight"})


def settings(**kw):
    return make_settings(loop_options(AvxWeight), {"enabled": True, **kw})


def avx(threads=1, ms=3, cpus=(0,), ran=None, licence=None, counted=None) -> AvxUse:
    """A cgroup's AvxUse: `threads` AVX-512 threads on `cpus`, its threads that ran on `ran` (default
    `cpus`), and the PMU's Licence; counted by the PMU when it has one, unless `counted` says."""
    return AvxUse(threads=4, avx512_threads=threads, min_elapsed_ms=ms, cpus=frozenset(cpus),
                  ran_cpus=frozenset(cpus if ran is None else ran),
                  counted=licence is not None if counted is None else counted, licence=licence)


def pmu(level, lvl1=0.0, lvl2=0.0) -> Licence:
    return Licence(1e9, lvl1, lvl2, level)


def cg(path, cls, weight="100", usage=None):
    return CgroupSample(path=path, cls=cls, cpu_weight=weight, cpu_usage=usage)


def snap(t=1.0, cgroups=(), avx_section=None, held=None, members=None):
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=4, cpu_used=1.0, topology=TOPOLOGY),
                    cgroups={c.path: c for c in cgroups}, sections={AVX: avx_section} if avx_section else {},
                    members=members or {}, held=held or {}, supported=SUPPORTED)


LS_NEXT_TO_BE = AvxSection({"ls.slice": avx(0, ran=(1,)), "be.slice": avx(ms=3, cpus=(0,))})
ROOTS = (cg("ls.slice", "LS"), cg("be.slice", "BE"))


def asked(actions):
    return [(a.target, a.knob, a.value) for a in actions]


# --- raise_victims ---------------------------------------------------------------------------------

def test_a_victim_next_to_avx512_gets_its_weight_times_nominal_over_effective():
    [a] = AvxWeight.decide(snap(cgroups=ROOTS, avx_section=LS_NEXT_TO_BE), settings(), AvxWeight.initial_state(None))
    assert asked([a]) == [("ls.slice", "cpu.weight", "108")]          # 100 × 3200 / 2958
    assert a.reason == {"class": "LS", "mode": "raise_victims",
                        "avx_cgroups": {"be.slice": {"evidence": "arch_status", "avx512_threads": 1,
                                                     "avx512_ms_ago": 3}},
                        "shared_cpus": "1", "level": "avx512", "f_nominal_mhz": 3200.0, "f_effective_mhz": 2958.0,
                        "factor": 1.0818, "base_weight": 100, "base_from": "cgroup", "weight": 108}
    assert a.message == ("LS ls.slice shares CPUs 1 with be.slice (1 AVX-512 thread, latest 3 ms ago): "
                         "cpu.weight 100 × 3200/2958 MHz = 108")


def test_cpus_not_slowed_by_another_cgroup_and_ones_own_avx_give_nothing():
    state = AvxWeight.initial_state(None)
    far = AvxSection({"be.slice": avx(cpus=(0,)), "ls.slice": avx(0, ran=(3,))})    # CPU 3: not 0's sibling
    assert AvxWeight.decide(snap(cgroups=ROOTS, avx_section=far), settings(), state) == []
    own = AvxSection({"ls.slice": avx(cpus=(2,), ran=(2, 3)), "ls.slice/app": avx(cpus=(2,))})
    assert AvxWeight.decide(snap(cgroups=ROOTS, avx_section=own), settings(), state) == []
    assert state.by_cgroup == {}


def test_declared_avx2_job_raises_by_the_avx2_factor_without_the_sensor():
    members = {"be.slice": (cg("be.slice/avx-job", "BE", usage=1.5), cg("be.slice/other", "BE", usage=3.0))}
    s = settings(avx_cgroups=["be.slice/avx-*"], declared_level="avx2")
    assert AvxWeight.members_of(s) == {"LSE", "LSR", "LS", "BE"} and AvxWeight.members_of(settings()) == set()
    [a] = AvxWeight.decide(snap(cgroups=ROOTS, members=members), s, AvxWeight.initial_state(s))
    assert asked([a]) == [("ls.slice", "cpu.weight", "102")]          # 100 × 3200 / 3147
    assert a.reason["avx_cgroups"] == {"be.slice/avx-job": {"declared": "AVX2", "cpu_usage": 1.5}}
    assert (a.reason["shared_cpus"], a.reason["f_effective_mhz"]) == ("any (declared)", 3147.0)


def test_a_declared_cgroup_counts_only_while_it_uses_cpu():
    s = settings(avx_cgroups=["be.slice"])
    for usage in (None, 0.05):
        assert AvxWeight.decide(snap(cgroups=(ROOTS[0], cg("be.slice", "BE", usage=usage))), s,
                                AvxWeight.initial_state(s)) == []
    [a] = AvxWeight.decide(snap(cgroups=(ROOTS[0], cg("be.slice", "BE", usage=0.1))), s, AvxWeight.initial_state(s))
    assert a.value == "108"


def test_the_base_is_the_journaled_original_so_rounds_do_not_compound():
    state = AvxWeight.initial_state(None)
    AvxWeight.decide(snap(cgroups=ROOTS, avx_section=LS_NEXT_TO_BE), settings(), state)
    later = snap(t=2.0, cgroups=(cg("ls.slice", "LS", weight="108"), ROOTS[1]), avx_section=LS_NEXT_TO_BE,
                 held={("ls.slice", "cpu.weight"): "100"})
    [a] = AvxWeight.decide(later, settings(), state)
    assert (a.value, a.reason["base_weight"], a.reason["base_from"]) == ("108", 100, "journal")


def test_a_cgroup_whose_weight_is_unknown_is_skipped():
    unknown = (cg("ls.slice", "LS", weight=None), ROOTS[1])
    assert AvxWeight.decide(snap(cgroups=unknown, avx_section=LS_NEXT_TO_BE), settings(),
                            AvxWeight.initial_state(None)) == []


# --- the PMU's licence levels ---------------------------------------------------------------------

def test_the_pmus_licence_2_raises_by_the_avx512_factor_with_the_shares_as_evidence():
    be = avx(threads=0, ms=None, cpus=(), ran=(0,), licence=pmu(AVX512, 0.05, 0.6))
    [a] = AvxWeight.decide(snap(cgroups=ROOTS, avx_section=AvxSection({"ls.slice": avx(0, ran=(1,)), "be.slice": be})),
                           settings(), AvxWeight.initial_state(None))
    assert (a.value, a.reason["level"], a.reason["shared_cpus"]) == ("108", "avx512", "1")
    assert a.reason["avx_cgroups"] == {"be.slice": {"evidence": "pmu", "lvl1_share": 0.05, "lvl2_share": 0.6}}
    assert a.message == ("LS ls.slice shares CPUs 1 with be.slice (PMU: licence 1 for 5% and licence 2 for 60% of "
                         "its cycles): cpu.weight 100 × 3200/2958 MHz = 108")


def test_the_pmus_licence_1_makes_avx2_visible():
    be = avx(threads=0, ms=None, cpus=(), ran=(0,), licence=pmu(AVX256, lvl1=0.7))
    [a] = AvxWeight.decide(snap(cgroups=ROOTS, avx_section=AvxSection({"ls.slice": avx(0, ran=(1,)), "be.slice": be})),
                           settings(), AvxWeight.initial_state(None))
    assert (a.value, a.reason["level"], a.reason["f_effective_mhz"]) == ("102", "avx256", 3147.0)   # 100 × 3200/3147


@pytest.mark.parametrize("be, raised", [
    (dict(licence=pmu(SCALAR)), False),        # the PMU's verdict wins: AVX-512 state from glibc's string functions
    (dict(counted=True), False),               # counted from this round on: no verdict yet, and no evidence
    (dict(), True),                            # not counted (no PMU, past the fd budget): arch_status decides
])
def test_where_the_pmu_counts_a_cgroup_its_verdict_alone_decides(be, raised):
    uses = {"ls.slice": avx(0, ran=(1,)), "be.slice": avx(threads=3, ms=1, cpus=(0,), **be)}   # AVX-512 state
    got = AvxWeight.decide(snap(cgroups=ROOTS, avx_section=AvxSection(uses)), settings(), AvxWeight.initial_state(None))
    assert [a.reason["avx_cgroups"]["be.slice"]["evidence"] for a in got] == (["arch_status"] if raised else [])


def test_the_level_is_the_widest_of_the_sources_whose_cpus_the_root_shared():
    roots = (*ROOTS, cg("batch.slice", "BE"))
    uses = {"be.slice": avx(0, cpus=(), ran=(0,), licence=pmu(AVX256, lvl1=0.5)),
            "batch.slice": avx(0, cpus=(), ran=(2,), licence=pmu(AVX512, lvl2=0.5))}
    for ran, value, shared in (((1,), "102", "1"), ((1, 3), "108", "1,3")):
        seen = AvxSection({**uses, "ls.slice": avx(0, ran=ran, licence=pmu(AVX256, lvl1=0.4))})
        [a] = AvxWeight.decide(snap(cgroups=roots, avx_section=seen), settings(), AvxWeight.initial_state(None))
        # ls.slice's own licence 1 (it shares cores with AVX code) does not keep it from being a victim
        assert (a.target, a.value, a.reason["shared_cpus"]) == ("ls.slice", value, shared)


def test_lower_avx_lowers_a_cgroup_the_pmu_puts_at_licence_1_by_the_avx2_factor():
    s = settings(mode="lower_avx", classes=["BE"])
    be = avx(threads=0, ms=None, cpus=(), ran=(0,), licence=pmu(AVX256, lvl1=0.9))
    [a] = AvxWeight.decide(snap(cgroups=ROOTS, avx_section=AvxSection({"ls.slice": avx(0, ran=(1,)), "be.slice": be})),
                           s, AvxWeight.initial_state(s))
    assert (a.target, a.value, a.reason["victims"]) == ("be.slice", "98", {"ls.slice": "1"})   # 100 × 3147/3200


# --- lower_avx -------------------------------------------------------------------------------------

def test_lower_avx_divides_the_avx_cgroups_weight_and_leaves_the_victim():
    s = settings(mode="lower_avx", classes=["LS", "BE"])
    [a] = AvxWeight.decide(snap(cgroups=ROOTS, avx_section=LS_NEXT_TO_BE), s, AvxWeight.initial_state(s))
    assert asked([a]) == [("be.slice", "cpu.weight", "92")]           # 100 × 2958 / 3200
    assert a.reason["victims"] == {"ls.slice": "1"} and a.reason["factor"] == 1.0818
    assert a.message == ("BE be.slice uses AVX-512 (be.slice (1 AVX-512 thread, latest 3 ms ago)), slowing ls.slice "
                         "on CPUs 1: cpu.weight 100 ÷ 3200/2958 MHz = 92")
    # BE not among the classes: nothing to lower
    assert AvxWeight.decide(snap(cgroups=ROOTS, avx_section=LS_NEXT_TO_BE), settings(mode="lower_avx"),
                            AvxWeight.initial_state(s)) == []


def test_lower_avx_with_a_declared_job_below_the_class_root():
    s = settings(mode="lower_avx", classes=["BE"], avx_cgroups=["be.slice/avx-job"])
    members = {"be.slice": (cg("be.slice/avx-job", "BE", usage=1.0),)}
    [a] = AvxWeight.decide(snap(cgroups=ROOTS, members=members), s, AvxWeight.initial_state(s))
    assert (a.target, a.value, a.reason["victims"]) == ("be.slice", "92", "its neighbours (declared)")


@pytest.mark.parametrize("mode, base, expected", [("raise_victims", "5000", "10000"), ("lower_avx", "1", "1"),
                                                  ("lower_avx", "4", "1")])
def test_weights_are_clamped_to_1_and_10000(mode, base, expected):
    s = settings(mode=mode, classes=["LS", "BE"], mhz_avx512=1000.0)      # factor 3.2
    roots = (cg("ls.slice", "LS", weight=base), cg("be.slice", "BE", weight=base))
    [a] = AvxWeight.decide(snap(cgroups=roots, avx_section=LS_NEXT_TO_BE), s, AvxWeight.initial_state(s))
    assert a.value == expected and a.reason["factor"] == 3.2


# --- hold ------------------------------------------------------------------------------------------

def test_hold_keeps_the_weight_after_the_last_evidence_then_restores():
    s, state = settings(hold="10s"), AvxWeight.initial_state(None)
    held = {("ls.slice", "cpu.weight"): "100"}
    AvxWeight.decide(snap(t=1.0, cgroups=ROOTS, avx_section=LS_NEXT_TO_BE), s, state)
    quiet = AvxSection({"be.slice": avx(0)})
    [kept] = AvxWeight.decide(snap(t=6.0, cgroups=ROOTS, avx_section=quiet, held=held), s, state)
    assert kept.value == "108" and kept.reason["evidence_age_s"] == 5.0
    assert kept.message.endswith("(held, last evidence 5.0 s ago)")
    [back] = AvxWeight.decide(snap(t=11.0, cgroups=ROOTS, avx_section=quiet, held=held), s, state)
    assert (back.target, back.knob, back.value) == ("ls.slice", "cpu.weight", None)
    assert back.reason == {"class": "LS", "hold_s": 10.0} and state.by_cgroup == {}
    # released: nothing more to ask until AVX comes back
    assert AvxWeight.decide(snap(t=12.0, cgroups=ROOTS, avx_section=quiet), s, state) == []


def test_new_evidence_during_hold_restarts_it_and_a_vanished_cgroup_is_forgotten():
    s, state = settings(hold="10s"), AvxWeight.initial_state(None)
    AvxWeight.decide(snap(t=1.0, cgroups=ROOTS, avx_section=LS_NEXT_TO_BE), s, state)
    AvxWeight.decide(snap(t=9.0, cgroups=ROOTS, avx_section=LS_NEXT_TO_BE), s, state)
    [a] = AvxWeight.decide(snap(t=15.0, cgroups=ROOTS), s, state)
    assert a.value == "108" and a.reason["evidence_age_s"] == 6.0
    AvxWeight.decide(snap(t=16.0, cgroups=ROOTS[1:]), s, state)
    assert state.by_cgroup == {}


# --- ownership and needs ---------------------------------------------------------------------------

def test_writes_and_needs():
    assert AvxWeight.writes(settings()) == {("LSE", "cpu.weight"), ("LSR", "cpu.weight"), ("LS", "cpu.weight")}
    assert AvxWeight.needs(settings()) == {AVX, "cpu_weight", "cpu_usage"}
    no_weight = replace(snap(cgroups=ROOTS, avx_section=LS_NEXT_TO_BE), supported=frozenset())
    assert AvxWeight.decide(no_weight, settings(), AvxWeight.initial_state(None)) == []     # no cpu.weight here


def test_a_class_weight_set_by_qos_baseline_and_compensated_here_is_refused_at_load():
    registry = {"qos_baseline": QosBaseline, "avx_weight": AvxWeight}
    both = "[loops.qos_baseline]\nenabled = true\nls_cpu_weight = 200\n\n[loops.avx_weight]\nenabled = true\n"
    with pytest.raises(ConfigError) as e:
        parse_config(both, "koordd.toml", registry)
    assert e.value.errors == ["koordd.toml:5: loops.avx_weight: loops 'qos_baseline' and 'avx_weight' both write "
                              "knob 'cpu.weight' of class LS; enable only one of them"]
    ok = parse_config(both.replace("ls_cpu_weight = 200", "ls_cpu_weight = 0"), "koordd.toml", registry)
    assert ok.loops["avx_weight"].classes == ("LSE", "LSR", "LS")


def test_options_are_checked_at_load():
    with pytest.raises(ConfigError) as e:
        parse_config('[loops.avx_weight]\nenabled = true\ndeclared_level = "avx128"\nhold = "soon"\n',
                     "koordd.toml", {"avx_weight": AvxWeight})
    assert e.value.errors == [
        "koordd.toml:3: loops.avx_weight.declared_level: must be one of 'avx512', 'avx2', got 'avx128'",
        "koordd.toml:4: loops.avx_weight.hold: not a duration: 'soon' (use e.g. \"500ms\", \"2s\", \"1m\")"]


# --- the cgroup's weight, and a run through the actuator --------------------------------------------

@pytest.mark.parametrize("mode, raw, weight", [("v2", "250", "250"), ("hybrid", "2048", "200"), ("v1", "512", "50")])
def test_the_cgroup_sensor_reads_cpu_weight_as_the_actuator_does(tmp_path, mode, raw, weight):
    tree = FakeCgroups(tmp_path, mode).add("ls.slice")
    tree.set("ls.slice", "cpu", "cpu.weight" if mode == "v2" else "cpu.shares", raw + "\n")
    sensor = CgroupSensor(tree.fs)
    assert sensor.sample("ls.slice", "LS", 1.0, frozenset({"cpu_weight"})).cpu_weight == weight
    assert sensor.sample("ls.slice", "LS", 2.0, frozenset({"cpu_usage"})).cpu_weight is None   # not asked


CONFIG = """
[[classes]]
name = "LS"
cgroups = ["ls.slice"]
[[classes]]
name = "BE"
cgroups = ["be.slice"]
[loops.avx_weight]
enabled = true
hold = "{hold}"
"""


@pytest.mark.parametrize("mode", ["v2", "hybrid"])
def test_through_the_actuator_the_weight_lands_and_is_restored(tmp_path, mode):
    tree = FakeCgroups(tmp_path, mode).add("ls.slice").add("be.slice")
    knob_file = "cpu.weight" if mode == "v2" else "cpu.shares"
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    actuator = Actuator(Backends([CgroupBackend(tree.fs)]), journal, DecisionLog(state, send=lambda message, **f: None))
    runner = Runner({"avx_weight": AvxWeight}, actuator, sensors=(AVX,))
    runner.configure(parse_config(CONFIG.format(hold="2s"), "koordd.toml", {"avx_weight": AvxWeight}), now=0.0)
    sensor = CgroupSensor(tree.fs)

    def tick(t, avx_section):
        roots = tuple(sensor.sample(p, c, t, frozenset({"cpu_weight"})) for p, c in (("ls.slice", "LS"),
                                                                                      ("be.slice", "BE")))
        held = {(h.target, h.knob): h.original for h in journal.entries()}
        runner.tick(list(runner.runs.values()), Snapshot(
            time=t, wall=0.0, node=NodeSample(cpu_count=4, cpu_used=1.0, topology=TOPOLOGY),
            cgroups={r.path: r for r in roots}, sections={AVX: avx_section}, held=held,
            supported=SUPPORTED))

    def raw():
        return tree.read("ls.slice", "cpu", knob_file).strip()

    tick(1.0, LS_NEXT_TO_BE)
    assert raw() == ("108" if mode == "v2" else "1106")               # weight_to_shares(108)
    tick(2.0, LS_NEXT_TO_BE)                                          # no compounding
    assert raw() == ("108" if mode == "v2" else "1106")
    tick(5.0, AvxSection())                                           # hold (2 s) over: back
    assert raw() == ("100" if mode == "v2" else "1024") and journal.entries() == []
    tick(6.0, LS_NEXT_TO_BE)
    actuator.restore_all("koordd stopping")
    assert raw() == ("100" if mode == "v2" else "1024")
