"""be_suppress (rule slack) in a closed loop: LS's run-queue p99 follows BE's CPU use, and BE should settle just
under the use LS tolerates instead of cycling between its floor and a step past it (16 CPUs, membw,
2026-11-29: floor, 4 CPUs, a miss, a shrink, the floor again). The growth near a remembered miss, the cut back
to where LS was healthy, the wait before probing past a miss, and what forgets a miss."""
from __future__ import annotations

import copy
import random

from koordd.core.miss_rate import Blame, MissLedger
from koordd_plugins.be_suppress import DWELL_FIRST, BeSuppress

from unit.plugins.test_be_suppress import PERIOD, at, health, settings

TARGET_US = 2000


def closed_loop(harm, rounds, ls_usage=lambda t: 1.0, forget=False, wants=2.5, spikes=None, **options):
    """Rounds of be_suppress on 4 CPUs where BE wants `wants` CPUs and LS's p99 is harm(BE's use) µs against a
    2 ms target, and 3 ms in the rounds in `spikes` whatever BE does. `forget`: drop every remembered level
    each round (the growth before this change).
    Returns [(t, allowance the round found, p99, steps, the state after the round)]."""
    s = settings(rule="slack", **options)
    state = BeSuppress.initial_state(s)
    out = []
    for t in range(rounds):
        allowance = 4.0 if state.allowance is None else state.allowance
        used = min(allowance, wants)
        p99 = harm(used) if spikes is None or t not in spikes else 3000
        actions = BeSuppress.decide(health(at(t), ls_usage(t), round(allowance * PERIOD), p99_us=p99,
                                           be_usage=used), s, state)
        if forget:
            state.missed_at = state.healthy_at = None
        out.append((t, allowance, p99, {a.reason.get("step") for a in actions if a.value}, copy.copy(state)))
    return out


def step_harm(used):          # LS is fine up to 1.5 CPUs of BE, and misses by 50% past them
    return 1000 if used <= 1.5 else 3000


def gradual_harm(used):       # 1 ms alone, 1 ms more per CPU of BE: tolerates 1 CPU
    return 1000 + 1000 * used


def misses_and_mean(run, after=40):
    tail = [(allowance, p99) for t, allowance, p99, _, _ in run if t >= after]
    return sum(p99 > TARGET_US for _, p99 in tail), sum(min(a, 2.5) for a, _ in tail) / len(tail)


def test_be_settles_under_the_use_ls_tolerates_where_it_cycled_around_it():
    for harm, tolerated in ((step_harm, 1.5), (gradual_harm, 1.0)):
        before = misses_and_mean(closed_loop(harm, 300, forget=True))
        now = misses_and_mean(closed_loop(harm, 300))
        # without the remembered levels: LS missed in over a third of the rounds
        assert before[0] > 100, (harm.__name__, before)
        # now: a handful of misses (the probes; with step_harm 6 more from two control trials, a window each
        # with LS left missing to learn whether it recovers without a cut: at most 3 per load band and
        # signal), BE at 80% or more of what LS tolerates, never past it
        assert now[0] <= 12 and 0.8 * tolerated <= now[1] <= tolerated, (harm.__name__, now)


def test_growth_halves_the_way_to_the_miss_and_a_miss_goes_back_to_where_ls_was_healthy_not_the_floor():
    run = closed_loop(step_harm, 30)
    steps = [(t, round(a, 2), sorted(s)) for t, a, _, s, _ in run if s]
    # the first miss (BE at 2.5 CPUs, 50% over), confirmed: the floor; then a whole step (1 CPU: half the way
    # to 2.5 is more), then half the way to 2.5 (0.74 CPUs)
    assert steps[1] == (1, 4.0, ["floor"])
    assert steps[2:4] == [(4, 0.02, ["grow towards 2.50 CPUs (where LS last missed)"]),
                          (5, 1.02, ["grow towards 2.50 CPUs (where LS last missed)"])]
    # a miss at 1.76 CPUs goes back to 1.02, where LS was last healthy, not to the floor
    back = next((t, a) for t, a, s in steps if any(x.startswith("shrink (back to 1.02 CPUs") for x in s))
    assert back[1] == 1.76
    assert all(a >= 1.0 for t, a, _, _, _ in run if t > back[0])        # never the floor again


def test_near_a_miss_be_waits_before_probing_past_it_longer_each_time_the_probe_misses():
    run = closed_loop(step_harm, 120)
    waits = [s for _, _, _, steps, _ in run for s in steps if s.startswith("hold near")]
    assert waits and "where LS last missed" in waits[0]
    dwells = []
    for _, _, _, _, state in run:
        if not dwells or dwells[-1] != state.dwell:
            dwells.append(state.dwell)
    assert dwells[:2] == [0.0, DWELL_FIRST] and all(b == 2 * a for a, b in zip(dwells[1:], dwells[2:])), dwells
    assert len(dwells) >= 4


def test_a_new_ls_load_band_forgets_the_miss_and_be_grows_whole_steps_again():
    # LS uses 1 CPU (band 1 of 5 on 4 CPUs) until t=60, then 0.1 (band 0): the miss at band 1 says nothing
    run = closed_loop(step_harm, 70, ls_usage=lambda t: 1.0 if t < 60 else 0.1)
    assert run[59][4].missed_at is not None and run[59][4].missed_band == 1
    t, allowance, _, steps, state = run[60]
    assert steps == {"grow"} and state.missed_at is None and state.allowance == allowance + 1.0


def test_a_cut_that_bought_nothing_leaves_no_miss_behind():
    # LS misses whatever BE does: the floor bought nothing, is undone, and BE's use is not remembered
    run = closed_loop(lambda used: 3000, 20)
    undone = [t for t, _, _, steps, _ in run if any(s.startswith("undo: cut bought nothing") for s in steps)]
    assert undone and run[undone[0]][4].missed_at is None


def test_status_shows_what_growth_remembers():
    s = settings(rule="slack")
    run = closed_loop(step_harm, 30)
    state = run[-1][4]
    levels = BeSuppress.report(s, state)["levels"]
    assert levels["missed_at_cores"] == round(state.missed_at, 3) and levels["healthy_at_cores"] == 1.39
    assert levels["probe_in_s"] == round(state.probe_at - state.lab.now, 1) > 0
    fresh = closed_loop(lambda used: 1000, 3)[-1][4]      # LS never missed: no miss, healthy at the whole node
    assert BeSuppress.report(s, fresh)["levels"] == {"missed_at_cores": None, "healthy_at_cores": 4.0,
                                                     "probe_in_s": None}


def random_spikes(rounds: int, seed: int, every: float = 40.0, length: int = 4) -> set[int]:
    """Rounds in which LS misses whatever BE does (its own stalls, a noisy host): episodes of `length` rounds
    starting at random, one per `every` rounds on average."""
    rng = random.Random(seed)
    out: set[int] = set()
    for t in range(rounds):
        if rng.random() < 1 / every:
            out.update(range(t, t + length))
    return out


def _spiky_runs(monkeypatch, harm, blame_all=False, control=True, seeds=range(10), rounds=900):
    """Per seed: (BE's mean allowance after the first 5 minutes, LS's misses then, decisions that set no new
    ceiling) where LS also misses in random episodes (3 rounds, one every 10 on average) whatever BE uses.
    `blame_all`: every miss blamed on BE (the growth before the miss ledger); `control`: the control arm on
    (control_trials 3, the default; else 0, which turns it off)."""
    def one(seed: int):
        with monkeypatch.context() as m:
            if blame_all:
                m.setattr(MissLedger, "blame", lambda self, level: Blame(True, level, (0, 0), (0, 0), None))
            run = closed_loop(harm, rounds, spikes=random_spikes(rounds, seed, every=10, length=3),
                              control_trials=3 if control else 0)
        tail = [(min(a, 2.5), p99) for t, a, p99, _, _ in run if t >= 300]
        kept = sum(any("no new growth ceiling" in x for x in steps) for _, _, _, steps, _ in run)
        assert control or not any(x.startswith("leave BE alone to") for _, _, _, steps, _ in run for x in steps)
        return sum(a for a, _ in tail) / len(tail), sum(p99 > TARGET_US for _, p99 in tail), kept
    return [one(seed) for seed in seeds]


def mean(runs, i: int) -> float:
    return sum(r[i] for r in runs) / len(runs)


def test_misses_that_come_at_any_level_of_be_do_not_lower_its_growth_ceiling(monkeypatch):
    # On 2 CPUs over minutes LS missed with BE at 0.02-0.95 CPUs within a minute; each miss set the growth
    # ceiling at BE's use then, and it fell to 0.40 CPUs (docs/benchmarks.md). Here LS misses in random
    # episodes whatever BE uses, and BE wants 2.5 of 4 CPUs. Before the ledger every miss was blamed on BE
    # (forced here); now a miss at a level where LS began to miss as often with less BE sets no ceiling.
    # Over ten seeds, without the control arm (whose leaving BE alone does most of the work here, next test)
    # BE's mean went 1.97 -> 2.02 CPUs when written, per seed within 0.1 (one ceiling not set changes every
    # later step: seed 7 went 1.72 -> 1.66, seed 2 1.54 -> 1.92).
    before = _spiky_runs(monkeypatch, lambda used: 1000, blame_all=True, control=False)
    now = _spiky_runs(monkeypatch, lambda used: 1000, control=False)
    assert mean(now, 0) >= mean(before, 0) + 0.03, (before, now)
    assert all(n[0] >= b[0] - 0.1 for b, n in zip(before, now)), (before, now)
    assert all(n[2] > 0 for n in now) and all(b[2] == 0 for b in before), (before, now)


def test_misses_that_come_more_often_past_a_level_of_be_still_set_the_ceiling(monkeypatch):
    # The same episodes, and LS also misses whenever BE uses over 1.5 CPUs: the ledger finds misses more
    # frequent there and keeps the ceilings; LS misses no more often than with every miss blamed
    # (377.9 -> 361.9 rounds of 600 over ten seeds, the control arm off, when written).
    before = _spiky_runs(monkeypatch, step_harm, blame_all=True, control=False)
    now = _spiky_runs(monkeypatch, step_harm, control=False)
    assert mean(now, 1) <= 1.02 * mean(before, 1), (before, now)


def test_where_ls_recovers_as_often_left_alone_be_is_left_alone_and_where_it_does_not_the_cut_goes_on(monkeypatch):
    # Each cut on an episode that passes on its own reads "helped". The control arm leaves one risk in three
    # alone (once the cut has helped three times, three trials): where LS recovers as often without the cut,
    # BE is left alone from then on. Over ten seeds of random episodes whatever BE does, BE's mean went
    # 2.02 -> 2.25 of the 2.5 CPUs it wants (LS's misses the same: 166.1 rounds of 600, they are not BE's);
    # where LS also misses past 1.5 CPUs of BE, the trials fail there and the cut goes on: LS's misses
    # 361.9 -> 367.1, BE 1.53 -> 1.55 CPUs (when written; 357.1 and 1.49 before trials went on while a few
    # verdicts leave the cut's edge unclear: those trials cost LS 10 rounds of 600 here).
    flat = lambda used: 1000
    off, on = _spiky_runs(monkeypatch, flat, control=False), _spiky_runs(monkeypatch, flat)
    assert mean(on, 0) >= mean(off, 0) + 0.15 and mean(on, 1) == mean(off, 1), (off, on)
    off, on = _spiky_runs(monkeypatch, step_harm, control=False), _spiky_runs(monkeypatch, step_harm)
    assert mean(on, 1) <= 1.02 * mean(off, 1) and mean(on, 0) >= mean(off, 0) - 0.1, (off, on)


from koordd.core.experiment import LEAVE, Record  # noqa: E402
from koordd_plugins.be_suppress import BE_CAP, CONTROL_EVERY, CONTROL_MORE, _control, _slack_lab  # noqa: E402


def test_a_cut_chosen_on_a_few_unlucky_trials_meets_the_control_arm_again_while_the_verdicts_leave_it_unclear():
    # After its 3 trials the control arm compared shares alone: LS recovered left alone 1 of 3, the cut helped
    # 4 of 6, and the cut was taken for every risk from then on; its own record grew, LS left alone's stayed
    # at those three trials. Now trials go on, one risk in 2 x CONTROL_EVERY, while the chance that the cut
    # is the better is under 90%. Here the cut helps 2 risks in 3 and LS recovers left alone as often (every
    # trial, after the three unlucky ones), and BE is soon left alone for good.
    s = settings(rule="slack")
    state = BeSuppress.initial_state(s)
    _slack_lab(s, state)
    cond = (2, ("be",), "app_p99_us")
    cut, alone = Record(helped=4, nothing=2), Record(helped=1, nothing=2)
    state.lab.memory[cond] = {BE_CAP: cut, LEAVE: alone}
    steps = []
    for i in range(60):
        step = _control(s, state, BE_CAP, cond)
        steps.append(step)
        if step is None and i % 3 < 2:
            cut.helped += 1                        # the cut helps (the risk passes on its own) ...
        elif step is None:
            cut.nothing += 1                       # ... two times in three
        else:
            alone.helped += 1                      # as LS does left alone
    again = [x for x in steps if x is not None and x.startswith("leave BE alone to test again")]
    assert again and "(trial 4, at most 12)" in again[0] and "under 90%" in again[0], steps
    assert steps[:2 * CONTROL_EVERY - 1] == [None] * (2 * CONTROL_EVERY - 1), steps   # one risk in 6
    assert all(x is not None and x.startswith("leave BE alone: LS recovered") for x in steps[-10:]), steps


def test_a_cut_that_clearly_helps_more_often_is_taken_without_more_trials_and_trials_end_at_their_cap():
    s = settings(rule="slack")
    cond = (2, ("be",), "app_p99_us")
    for cut, alone in ((Record(helped=9, nothing=0), Record(helped=0, nothing=3)),      # clear: 99.8%
                       (Record(helped=40, nothing=20), Record(helped=1, nothing=3 * CONTROL_MORE - 1))):
        state = BeSuppress.initial_state(s)
        _slack_lab(s, state)
        state.lab.memory[cond] = {BE_CAP: cut, LEAVE: alone}
        assert [_control(s, state, BE_CAP, cond) for _ in range(30)] == [None] * 30, (cut, alone)
    # unclear (2 of 3 against 1 of 3), yet the trials have reached CONTROL_MORE x control_trials: the cut
    state = BeSuppress.initial_state(s)
    _slack_lab(s, state)
    state.lab.memory[cond] = {BE_CAP: Record(helped=8, nothing=4), LEAVE: Record(helped=5, nothing=7)}
    assert [_control(s, state, BE_CAP, cond) for _ in range(30)] == [None] * 30
