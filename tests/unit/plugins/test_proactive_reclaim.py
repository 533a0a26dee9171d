"""Decision tests for proactive_reclaim: hand-built snapshots in, actions out, settle() fed the
actuator's decisions; then the config rules, the knob and the guard. No kernel."""
from __future__ import annotations

import logging

import pytest

from koordd.act.protect import harm
from koordd.backends.cgroup_knobs import KNOBS
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.decisions import APPLIED, DEFERRED, DRY_RUN, REFUSED, Decision
from koordd.core.loop import COMMANDS, Action
from koordd.core.catalogue import builtin, LOOPS
from koordd.core.snapshot import CgroupSample, NodeSample, Pressure, PressureStat, Refaults, Snapshot
from koordd_plugins.proactive_reclaim import ProactiveReclaim, parse_size, pressure_percent

MiB = 1 << 20
V2 = frozenset({"memory.reclaim", "memory.swap.max"})
HYBRID = frozenset({"cgroup.kill"})


def settings(**kw):
    return make_settings(loop_options(ProactiveReclaim), {"enabled": True, **kw})


def psi(percent: float | None, growth: bool = True) -> PressureStat | None:
    """Memory PSI some at `percent` of time: as this round's growth (µs/s), or avg10 only."""
    if percent is None:
        return None
    return PressureStat(Pressure(percent, 0, 0, 0, growth=percent * 1e4 if growth else None), None)


def cg(path, current_mib=1000, pressure=0.0, cls="BE", growth=True, refault_mib=None):
    """`refault_mib`: memory.stat's cumulative refaults (file), None where the snapshot has none."""
    return CgroupSample(path=path, cls=cls, memory_current=None if current_mib is None else int(current_mib * MiB),
                        memory_pressure=psi(pressure, growth),
                        memory_refaults=None if refault_mib is None else Refaults(int(refault_mib * MiB), 0))


def snap(*cgroups, t=100.0, supported=V2, held=(), members=None):
    return Snapshot(time=t, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.5),
                    cgroups={c.path: c for c in cgroups}, members=members or {},
                    held={h: "max" for h in held}, supported=supported)


class Run:
    """The loop over several rounds, with the actuator's answer fed back through settle()."""

    def __init__(self, **kw):
        self.settings = settings(**kw)
        self.state = ProactiveReclaim.initial_state(self.settings)

    def __call__(self, snapshot, refuse=(), outcome=APPLIED, defer=()):
        actions = ProactiveReclaim.decide(snapshot, self.settings, self.state)
        decisions = [Decision(0.0, "proactive_reclaim", a.target, a.knob, None, a.value,
                              REFUSED if a.target in refuse else DEFERRED if a.target in defer else outcome,
                              a.message, dict(a.reason))
                     for a in actions]
        ProactiveReclaim.settle(actions, decisions, self.settings, self.state)
        return actions

    def reclaims(self, snapshot, refuse=(), defer=()):
        return {a.target: int(a.value) for a in self(snapshot, refuse, defer=defer) if a.knob == "memory.reclaim"}


def test_step_grows_while_quiet_and_is_capped_by_memory_current():
    run = Run(min_step="1M", grow_percent=100, max_step_percent=1.0)
    asks = [run.reclaims(snap(cg("be"), t=100 + i))["be"] for i in range(8)]
    assert asks[:4] == [1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB]
    cap = 1000 * MiB // 100 // 4096 * 4096                   # 1% of 1000 MiB, in pages
    assert asks[-1] == cap and max(asks) == cap
    assert all(b >= a for a, b in zip(asks, asks[1:]))


def test_never_reclaims_from_a_cgroup_above_target_and_backs_off():
    run = Run(psi_target=0.1, backoff="30s", min_step="1M", grow_percent=100)
    for i in range(3):
        run(snap(cg("be"), t=100 + i))
    assert run.state.cgroups["be"].step == 8 * MiB
    # At and above the target: nothing, and the step falls back to the minimum.
    assert run.reclaims(snap(cg("be", pressure=0.1), t=103)) == {}
    assert run.reclaims(snap(cg("be", pressure=5.0), t=104)) == {}
    assert run.state.cgroups["be"].step == 1 * MiB
    # Quiet again, but within the backoff: still nothing.
    assert run.reclaims(snap(cg("be", pressure=0.0), t=120)) == {}
    # After it: the minimum step first.
    assert run.reclaims(snap(cg("be", pressure=0.0), t=135)) == {"be": 1 * MiB}


def test_one_cgroup_above_target_does_not_stop_the_others():
    run = Run(psi_target=0.1)
    asks = run.reclaims(snap(cg("be/a", pressure=0.5), cg("be/b", pressure=0.01)))
    assert asks == {"be/b": 1 * MiB}


def test_rising_pressure_under_target_shrinks_the_step():
    run = Run(psi_target=1.0, min_step="1M", grow_percent=100)
    for i in range(4):
        run(snap(cg("be", pressure=0.1), t=100 + i))
    assert run.state.cgroups["be"].step == 16 * MiB
    # Rising and past half the target: half the step is reclaimed, and it does not grow after.
    [a] = run(snap(cg("be", pressure=0.7), t=104))
    assert int(a.value) == 8 * MiB and a.reason["step"] == "shrink"
    assert run.state.cgroups["be"].step == 8 * MiB
    # Rising but far under the target counts as quiet.
    run2 = Run(psi_target=1.0, min_step="1M", grow_percent=100)
    run2(snap(cg("be", pressure=0.01), t=100))
    [a] = run2(snap(cg("be", pressure=0.02), t=101))
    assert a.reason["step"] == "grow" and int(a.value) == 2 * MiB


def test_a_refused_reclaim_halves_the_step_and_saves_nothing():
    run = Run(min_step="1M", grow_percent=100)
    for i in range(3):
        run(snap(cg("be"), t=100 + i))
    assert run.state.cgroups["be"].saved_total == 7 * MiB
    run(snap(cg("be"), t=103), refuse={"be"})               # EAGAIN: the kernel found less to reclaim
    st = run.state.cgroups["be"]
    assert st.step == 4 * MiB and st.saved_total == 7 * MiB


def test_a_deferred_reclaim_keeps_its_step_and_goes_first_next_round():
    # The actuator defers a write once the round's budget for slow writes is spent (issue 35 item 2): not
    # tried, so not a failure (no halving), nothing saved, and its place in line kept.
    run = Run(min_step="1M", grow_percent=100)
    for i in range(3):
        run(snap(cg("be"), t=100 + i))
    st = run.state.cgroups["be"]
    assert (st.step, st.saved_total, st.turn) == (8 * MiB, 7 * MiB, 102)
    assert run.reclaims(snap(cg("be"), t=103), defer={"be"}) == {"be": 8 * MiB}
    assert (st.step, st.saved_total, st.turn, st.stepped) == (8 * MiB, 7 * MiB, 102, 0)
    assert run.reclaims(snap(cg("be"), t=104)) == {"be": 8 * MiB}       # asked again, as it was
    assert (st.step, st.saved_total) == (16 * MiB, 15 * MiB)
    # Ten pods of 32 MiB asks: eight fit a round's 256 MiB; the last two of them deferred by the actuator
    # go first next round, before the two that were not asked.
    many = Run(min_step="100M", max_step_percent=50)
    pods = [cg(f"be/p{i}", current_mib=10_000) for i in range(10)]
    members = {"be": tuple(pods)}
    first = [a.target for a in many(snap(cg("be", current_mib=50_000), t=100, members=members),
                                    defer={"be/p6", "be/p7"}) if a.knob == "memory.reclaim"]
    assert first == [f"be/p{i}" for i in range(8)]
    asked = list(many.reclaims(snap(cg("be", current_mib=50_000), t=101, members=members)))
    assert asked == ["be/p6", "be/p7", "be/p8", "be/p9", "be/p0", "be/p1", "be/p2", "be/p3"]


def test_bytes_saved_are_reported_in_each_decision():
    run = Run(min_step="2M", grow_percent=50)
    run(snap(cg("be"), t=100))
    [a] = run(snap(cg("be"), t=101))
    assert a.reason["saved_total_bytes"] == 2 * MiB and a.reason["reclaim_bytes"] == 3 * MiB
    assert "2.0 MiB reclaimed so far" in a.message


def test_blind_rounds_reclaim_nothing():
    run = Run()
    assert run(snap(cg("be", pressure=None))) == []
    assert run(snap(cg("be", current_mib=None))) == []
    # Too little memory in use for even a page.
    assert run(snap(cg("be", current_mib=0.1))) == []


def test_avg10_is_used_before_two_samples_give_a_growth():
    assert pressure_percent(cg("be", pressure=0.3, growth=False)) == (0.3, "avg10")
    assert pressure_percent(cg("be", pressure=0.3)) == (pytest.approx(0.3), "round")
    run = Run(psi_target=0.1)
    assert run(snap(cg("be", pressure=0.3, growth=False))) == []


def test_pods_are_reclaimed_one_by_one_and_an_ls_job_in_be_is_left_alone():
    run = Run()
    be = cg("be", pressure=0.0)
    pods = (cg("be/pod1"), cg("be/ls-job"))
    ls = CgroupSample(path="be/ls-job", cls="LS")
    s = snap(be, ls, members={"be": pods})
    assert ProactiveReclaim.members_of(run.settings) == {"BE"}
    assert set(run.reclaims(s)) == {"be/pod1"}


def test_gone_cgroups_are_forgotten():
    run = Run()
    run(snap(cg("be/a"), cg("be/b")))
    run(snap(cg("be/a"), t=101))
    assert set(run.state.cgroups) == {"be/a"}


def test_without_memory_reclaim_one_log_line_and_nothing_else(caplog):
    run = Run()
    with caplog.at_level(logging.WARNING, logger="koordd.loop.proactive_reclaim"):
        for i in range(3):
            assert run(snap(cg("be"), t=100 + i, supported=HYBRID)) == []
    lines = [r.getMessage() for r in caplog.records if r.name == "koordd.loop.proactive_reclaim"]
    assert len(lines) == 1 and "no memory.reclaim" in lines[0] and "doctor" in lines[0]


def test_swap_max_per_class_root_and_restored_when_turned_off():
    run = Run(be_swap_max="0")
    acts = [a for a in run(snap(cg("be"))) if a.knob == "memory.swap.max"]
    assert [(a.target, a.value) for a in acts] == [("be", "0")]
    assert ("BE", "memory.swap.max") in ProactiveReclaim.writes(run.settings)
    off = Run()
    [a] = [a for a in off(snap(cg("be"), held=[("be", "memory.swap.max")])) if a.knob == "memory.swap.max"]
    assert a.value is None
    assert ("BE", "memory.swap.max") not in ProactiveReclaim.writes(off.settings)
    # A host without memory.swap.max (v1, hybrid): nothing asked.
    assert [a for a in Run(be_swap_max="1G")(snap(cg("be"), supported=HYBRID))] == []


def test_option_values():
    assert settings(be_swap_max="max").be_swap_max == "max"
    assert settings(be_swap_max="512M").be_swap_max == str(512 * MiB)
    assert settings(be_swap_max=0).be_swap_max == "0"
    assert settings(be_swap_max="").be_swap_max == ""
    assert parse_size("16M") == 16 * MiB and parse_size("") is None
    for bad in ("50%", "max", "0", "lots"):
        with pytest.raises(ValueError):
            parse_size(bad)


def _load(tmp_path, text):
    return parse_config(text, tmp_path / "koordd.toml", builtin(LOOPS))


def test_config_errors_name_the_option(tmp_path):
    for line, word in (('classes = ["LS"]', "classes"), ('min_step = "50%"', "min_step"),
                       ('be_swap_max = "10%"', "be_swap_max"), ("psi_target = 0", "psi_target")):
        with pytest.raises(ConfigError) as e:
            _load(tmp_path, f"[loops.proactive_reclaim]\nenabled = true\n{line}\n")
        assert word in str(e.value)


def test_runs_next_to_memory_evict_reclaim_is_a_command(tmp_path):
    cfg = _load(tmp_path, "[loops.proactive_reclaim]\nenabled = true\n[loops.memory_evict]\nenabled = true\n")
    assert cfg.loops["proactive_reclaim"].enabled and cfg.loops["memory_evict"].enabled
    assert COMMANDS <= {name for name, k in KNOBS.items() if k.oneshot}


def test_off_by_default_and_the_guard_refuses_reclaim_and_less_swap_on_ls():
    assert not settings(enabled=False).enabled and not make_settings(loop_options(ProactiveReclaim), {}).enabled
    assert harm(KNOBS["memory.reclaim"], "1048576", None)
    assert harm(KNOBS["memory.swap.max"], "0", "max") and not harm(KNOBS["memory.swap.max"], "max", "0")
    assert KNOBS["memory.swap.max"].normalize("max") == "max"


def test_dry_run_moves_the_step_but_saves_nothing():
    run = Run(min_step="1M", grow_percent=100)
    for i in range(3):
        run(snap(cg("be"), t=100 + i), outcome=DRY_RUN)
    st = run.state.cgroups["be"]
    assert st.step == 8 * MiB and st.saved_total == 0


def test_through_the_actuator_on_a_fake_v2_tree_and_swap_restored(tmp_path):
    from koordtest.fakes.cgroup import FakeCgroups
    from koordd.act.actuator import Actuator
    from koordd.act.decision_log import DecisionLog
    from koordd.act.journal import RestoreJournal
    from koordd.core.decisions import RESTORED
    tree = FakeCgroups(tmp_path, "v2").add("be").add("be/pod1").add("ls")
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    act = Actuator(tree.fs, journal, DecisionLog(state, send=lambda message, **fields: None))
    assert not {"memory.reclaim", "memory.swap.max"} & set(act.backends.probe())
    run = Run(be_swap_max="0")
    s = snap(cg("be"), CgroupSample("ls", "LS"), members={"be": (cg("be/pod1"),)})
    actions = ProactiveReclaim.decide(s, run.settings, run.state)
    ds = act.apply("proactive_reclaim", actions)
    ProactiveReclaim.settle(actions, ds, run.settings, run.state)
    got = {(d.target, d.knob, d.new, d.outcome) for d in ds}
    assert got == {("be", "memory.swap.max", "0", APPLIED), ("be/pod1", "memory.reclaim", str(MiB), APPLIED)}
    assert tree.read("be/pod1", None, "memory.reclaim") == str(MiB)
    assert run.state.cgroups["be/pod1"].saved_total == MiB
    # The guard refuses reclaim on LS whatever asks for it.
    act.protect({"be": "BE", "be/pod1": "BE", "ls": "LS"})
    [d] = act.apply("proactive_reclaim", [Action("ls", "memory.reclaim", str(MiB), {}, "")])
    assert d.outcome == REFUSED and "protected" in d.error
    [d] = act.restore_all("stopping")
    assert (d.target, d.knob, d.new, d.outcome) == ("be", "memory.swap.max", "max", RESTORED)
    assert tree.read("be", None, "memory.swap.max") == "max"


# --- refaults: the step that reached the working set --------------------------------------------------


def test_refaults_above_the_share_of_the_last_step_back_off_under_the_psi_target():
    run = Run(psi_target=0.5, min_step="4M", grow_percent=100, backoff="30s", refault_percent=25)
    assert run.reclaims(snap(cg("be", refault_mib=10), t=100)) == {"be": 4 * MiB}
    assert run.reclaims(snap(cg("be", refault_mib=10), t=101)) == {"be": 8 * MiB}
    # 2.5 MiB read back after the 8 MiB step: more than 25% of it, with PSI far under the target.
    assert run.reclaims(snap(cg("be", pressure=0.05, refault_mib=12.5), t=102)) == {}
    st = run.state.cgroups["be"]
    assert st.step == 4 * MiB and st.backoff_until == 132.0
    # Left alone for the backoff although quiet, then from min_step again.
    assert run.reclaims(snap(cg("be", refault_mib=12.5), t=110)) == {}
    assert run.reclaims(snap(cg("be", refault_mib=12.5), t=133)) == {"be": 4 * MiB}


def test_refaults_under_the_share_do_not_stop_the_step_and_show_in_the_reason():
    run = Run(min_step="4M", grow_percent=100, max_step_percent=5.0, refault_percent=25)
    run(snap(cg("be", refault_mib=0), t=100))                       # 4 MiB asked
    [a] = run(snap(cg("be", refault_mib=1), t=101))                  # 1 MiB back: exactly 25%, not over
    assert int(a.value) == 8 * MiB and a.reason["step"] == "grow"
    assert a.reason["refault_bytes"] == 1 * MiB and a.reason["refault_limit_bytes"] == 1 * MiB
    assert "refaults 1.0 MiB" in a.message
    [a] = run(snap(cg("be", refault_mib=2), t=102))                  # 1 MiB after 8 MiB
    assert int(a.value) == 16 * MiB and a.reason["refault_bytes"] == MiB
    # The first round: nothing to compare with, no step to judge.
    [a] = Run()(snap(cg("be", refault_mib=500)))
    assert a.reason["refault_bytes"] is None and a.reason["refault_limit_bytes"] is None


def test_refaults_without_a_step_before_are_not_judged():
    """A workload's own refaults while the loop took nothing (backoff, blind) say nothing of a step."""
    run = Run(psi_target=0.1, min_step="1M", backoff="10s")
    run(snap(cg("be", refault_mib=0), t=100))
    assert run.reclaims(snap(cg("be", pressure=0.2, refault_mib=0), t=101)) == {}     # PSI: back off
    assert run.reclaims(snap(cg("be", refault_mib=50), t=105)) == {}                  # still backing off
    # Past the backoff, 50 MiB more refaulted, but the round before asked nothing: reclaimed from.
    assert run.reclaims(snap(cg("be", refault_mib=100), t=112)) == {"be": 1 * MiB}
    st = run.state.cgroups["be"]
    assert st.refaults == 100 * MiB


def test_refault_counters_that_go_backwards_or_are_missing_leave_it_to_psi():
    run = Run(min_step="4M", grow_percent=100, max_step_percent=5.0)
    run(snap(cg("be", refault_mib=100), t=100))
    # Recreated under the same name: its counters start again near 0. Not a growth, and not judged.
    [a] = run(snap(cg("be", refault_mib=3), t=101))
    assert a.reason["refault_bytes"] is None and int(a.value) == 8 * MiB
    # From the new reading on, growth is judged again: 3 -> 6 MiB after an 8 MiB step is 37%.
    assert run.reclaims(snap(cg("be", refault_mib=6), t=102)) == {}
    # Missing (a v1 memory.stat, an old kernel, a file that did not parse): PSI alone.
    run = Run(min_step="4M", grow_percent=100, max_step_percent=5.0)
    for i in range(3):
        [a] = run(snap(cg("be"), t=100 + i))
        assert a.reason["refault_bytes"] is None
    assert int(a.value) == 16 * MiB
    # Missing for a round between two readings: that round is not judged, nor the one after it.
    run(snap(cg("be", refault_mib=0), t=103))
    run(snap(cg("be"), t=104))
    [a] = run(snap(cg("be", refault_mib=40), t=105))
    assert a.reason["refault_bytes"] is None


def test_a_refused_step_is_not_what_refaults_are_judged_by():
    run = Run(min_step="4M", grow_percent=100, max_step_percent=5.0)
    run(snap(cg("be", refault_mib=0), t=100), refuse={"be"})
    [a] = run(snap(cg("be", refault_mib=10), t=101))
    assert a.reason["refault_limit_bytes"] is None


def test_refault_percent_0_turns_it_off_and_reads_no_memory_stat():
    run = Run(min_step="4M", grow_percent=100, refault_percent=0)
    run(snap(cg("be", refault_mib=0), t=100))
    [a] = run(snap(cg("be", refault_mib=100), t=101))
    assert int(a.value) == 8 * MiB and a.reason["refault_bytes"] is None
    assert ProactiveReclaim.class_needs(run.settings) == frozenset()
    assert "memory_refaults" not in ProactiveReclaim.member_needs(run.settings)
    on = settings()
    assert on.refault_percent == 25.0
    # Read of BE's roots and pods alone: never of every class root (needs()).
    assert ProactiveReclaim.class_needs(on) == {"memory_refaults"} <= ProactiveReclaim.member_needs(on)
    assert "memory_refaults" not in ProactiveReclaim.needs(on)


def test_huge_refault_counts_do_not_break_the_arithmetic():
    run = Run(min_step="4M")
    run(snap(cg("be", refault_mib=0), t=100))
    huge = CgroupSample("be", "BE", memory_current=1000 * MiB, memory_pressure=psi(0.0),
                        memory_refaults=Refaults((1 << 64) * 4096, (1 << 64) * 4096))
    assert run.reclaims(snap(huge, t=101)) == {}                     # far above the share: back off
    assert run.state.cgroups["be"].refaults == (1 << 65) * 4096


def test_a_round_reclaims_its_budget_at_most_and_the_cgroups_take_turns():
    # A write to memory.reclaim returns only once that much is reclaimed, and every loop's round waits
    # for it: one round asks for RECLAIM_ROUND_BYTES at most over all cgroups, and those that waited
    # longest for a step go first, so none is left out for good.
    from koordd_plugins import proactive_reclaim
    budget = proactive_reclaim.RECLAIM_ROUND_BYTES
    assert budget == 256 * MiB
    run = Run(min_step="100M", max_step_percent=50)
    pods = [cg(f"be/p{i}", current_mib=10_000) for i in range(10)]
    members = {"be": tuple(pods)}
    rounds = [run.reclaims(snap(cg("be", current_mib=50_000), t=100 + i, members=members)) for i in range(4)]
    for asks in rounds:
        assert sum(asks.values()) <= budget
    assert {p for asks in rounds for p in asks} == {f"be/p{i}" for i in range(10)}
    # One cgroup alone with a step larger than one write: capped at it (koordd/core/reclaim.py).
    big = Run(min_step="1G", max_step_percent=50)
    assert big.reclaims(snap(cg("be", current_mib=100_000))) == {"be": 32 * MiB}
