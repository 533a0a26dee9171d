"""bench-qos --koordd-b: an A/B of two koordd programs in one invocation (one LS-alone baseline and one target for
both, their runs interleaved), and the report's pairs. Two invocations on the 2-CPU host measured LS alone at
15.86 and 4.00 ms and told the two sides targets of 23.8 and 6.0 ms: no pair compared."""
from __future__ import annotations

import pytest

from koordtest.bench import qos_cli
from koordtest.bench.qos_report import ab_table
from koordtest.bench.qos_run import KOORDD_A, KOORDD_B, SETUPS, Bench, koordd_command_for, run_order

MS = 1e-3


@pytest.fixture
def other_koordd(tmp_path):
    path = tmp_path / "other" / "bin" / "koordd"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def args(argv):
    return qos_cli.parse_args(argv + ["--engine", "python", "--no-install", "--loads", "50"])


def test_the_other_program_runs_beside_koordd_in_the_default_setups_and_shares_the_run_order(other_koordd):
    oracle = args(["--oracle", "--koordd-b", str(other_koordd), "--candidates", "be-idle"])
    assert oracle.setups == ["ls-alone", "be-alone", "be-idle", KOORDD_A, KOORDD_B]
    plain = args(["--koordd-b", str(other_koordd), "--slo-ms", "8"])
    assert plain.setups[plain.setups.index(KOORDD_A) + 1] == KOORDD_B
    assert KOORDD_B not in args([]).setups                      # never without the option
    # every repetition runs both, shuffled among the rest (and the second in reverse: A B, then B A)
    order = run_order([KOORDD_A, KOORDD_B, "be-idle"], [50], 2, seed=1)
    firsts = [[s for r, s, _ in order if r == rep] for rep in (0, 1)]
    assert sorted(firsts[0]) == sorted([KOORDD_A, KOORDD_B, "be-idle"]) and firsts[1] == firsts[0][::-1]


@pytest.mark.parametrize("extra, says", [
    (["--frontier"], "not with --frontier"),
    (["--setups", "be-idle,koordd"], "go together"),           # the option without its setup
])
def test_refused_where_it_could_not_compare(other_koordd, capsys, extra, says):
    with pytest.raises(SystemExit):
        args(["--koordd-b", str(other_koordd)] + extra)
    assert says in capsys.readouterr().err


def test_refused_without_a_program_or_for_one_that_cannot_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        args(["--setups", "be-idle,koordd,koordd-b"])
    assert "go together" in capsys.readouterr().err
    not_executable = tmp_path / "koordd"
    not_executable.write_text("")
    for bad in (not_executable, tmp_path / "missing"):
        with pytest.raises(SystemExit):
            args(["--koordd-b", str(bad)])
        assert "not an executable file" in capsys.readouterr().err


def test_each_side_runs_its_own_program():
    setups = {s.name: s for s in SETUPS}
    bench = Bench(tree=None, fs=None, ncpu=2, ls_kind=None, antagonist="cpu", be_memory=0, seconds=1, warmup=1,
                  drain=1, realtime_client=False, koordd_config=None, koordd_command=["this/koordd"],
                  koordd_command_b=["other/koordd"])
    assert koordd_command_for(bench, setups[KOORDD_A]) == ["this/koordd"]
    assert koordd_command_for(bench, setups[KOORDD_B]) == ["other/koordd"]
    bench.koordd_command_b = None
    with pytest.raises(RuntimeError, match="--koordd-b"):
        koordd_command_for(bench, setups[KOORDD_B])


def run(setup, p99_ms, be_work, rep, windows=None, writes=0):
    windows = windows if windows is not None else [p99_ms]
    return {"setup": setup, "load": 50, "rep": rep, "be_work": be_work,
            "ls": {"p99": p99_ms * MS, "windows": [{"count": 100, "p99": w * MS} for w in windows]},
            "koordd_window": [{"outcome": "applied"}] * writes + [{"outcome": "skipped"}]}


def be_alone(rep, work=100.0):
    return {"setup": "be-alone", "load": None, "rep": rep, "ls": None, "be_work": work}


RUNS = [be_alone(0), be_alone(1, 200.0), be_alone(2),
        run(KOORDD_A, 6.0, 40.0, 0, writes=3), run(KOORDD_B, 5.0, 50.0, 0, writes=1),
        # repetition 2: b misses one window of two, a meets
        run(KOORDD_A, 7.0, 100.0, 1), run(KOORDD_B, 7.5, 120.0, 1, windows=[7.0, 9.0], writes=2),
        run(KOORDD_A, 9.0, 60.0, 2, writes=5), run(KOORDD_B, 4.0, 55.0, 2),
        run("be-idle", 3.0, 90.0, 0)]


def test_the_report_sets_each_pair_side_by_side_and_counts_which_way_they_lean():
    lines = ab_table(RUNS, {50: 8 * MS}, KOORDD_A, KOORDD_B).splitlines()
    assert lines[0] == "LS load 50%: SLO p99 <= 8.00 ms"
    rows = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    # BE work over each repetition's own BE alone (200 in repetition 2)
    assert rows == [f"| 1 | 6.00 | 5.00 | yes | yes | 40% | 50% | 3 / 1 | {KOORDD_A} |",
                    f"| 2 | 7.00 | 7.50 | yes | no | 50% | 60% | 0 / 2 | {KOORDD_A} |",
                    f"| 3 | 9.00 | 4.00 | no | yes | 60% | 55% | 5 / 0 | {KOORDD_A} |"]
    summary = next(line for line in lines if line.startswith(f"{KOORDD_B} over"))
    # p99 ratios 0.83, 1.07, 0.44; BE work 1.25, 1.2, 0.92
    assert summary == (f"{KOORDD_B} over {KOORDD_A}, median (min-max) of 3 pairs: LS p99 0.83x (0.44-1.07), "
                       f"BE work 1.20x (0.92-1.25); {KOORDD_B} had the lower p99 in 2 and the more BE work in 2 of "
                       f"3 pairs; met the SLO in 2 against {KOORDD_A}'s 2.")
    # b ran later in every pair (the runs are listed in the order they ran) and won two of them: that may be
    # the host's drift as much as b
    order = next(line for line in lines if line.startswith("Order:"))
    assert order.startswith(f"Order: {KOORDD_B} ran later in 3 of 3 pairs; the later run had the lower p99 in 2. "
                            "Not balanced"), order


def test_an_order_that_puts_each_side_later_equally_often_is_said_to_be_balanced():
    """bench-qos runs every second repetition in the reverse order: over two repetitions each side is later
    once. Here the later run had the lower p99 both times, b's win and a's."""
    runs = [be_alone(0), run(KOORDD_A, 6.0, 40.0, 0), run(KOORDD_B, 5.0, 50.0, 0),
            be_alone(1), run(KOORDD_B, 7.5, 40.0, 1), run(KOORDD_A, 7.0, 50.0, 1)]
    text = ab_table(runs, {50: 8 * MS}, KOORDD_A, KOORDD_B)
    assert f"| 2 | 7.00 | 7.50 | yes | yes | 50% | 40% | 0 / 0 | {KOORDD_B} |" in text
    assert (f"Order: {KOORDD_B} ran later in 1 of 2 pairs; the later run had the lower p99 in 2. Balanced: each "
            "side ran later equally often.") in text


def test_without_an_slo_the_pairs_still_compare_and_a_side_without_its_pair_is_left_out():
    runs = RUNS + [run(KOORDD_A, 5.0, 50.0, 3)]               # repetition 4: koordd-b's run is missing
    text = ab_table(runs, {}, KOORDD_A, KOORDD_B)
    assert text.startswith("LS load 50%: no SLO given")
    assert f"| 1 | 6.00 | 5.00 | - | - | 40% | 50% | 3 / 1 | {KOORDD_A} |" in text and "| 4 |" not in text
    assert "met the SLO" not in text
    assert ab_table([r for r in RUNS if r["setup"] != KOORDD_B], {}, KOORDD_A, KOORDD_B) == ""


def test_each_side_s_levers_verdicts_are_summed_so_control_trials_that_wrote_nothing_show():
    leave = {"leave": {"chosen": 4, "by_signal": {"app_p99_us": {"helped": 2, "bought_nothing": 1}}},
             "whole_be": {"chosen": 5, "by_signal": {"app_p99_us": {"helped": 3, "bought_nothing": 2}}}}
    runs = [dict(r, koordd_levers=leave) if r["setup"] == KOORDD_A else r for r in RUNS]
    text = ab_table(runs, {50: 8 * MS}, KOORDD_A, KOORDD_B)
    assert (f"{KOORDD_A}'s levers' verdicts over its 3 runs, counted from koordd's start: BE left alone as a "
            "control 9 times, LS recovered in 6; whole_be 9 helped, 6 bought nothing.") in text, text
    assert f"{KOORDD_B}'s levers'" not in text            # its runs carry no report (an older koordd)
