"""koordctl slo's lines on be_suppress's levers: what each cut bought, from the loop's report in status.json."""
from koordctl.slo import lever_lines, levers

STATUS = {"loops": {"be_suppress": {"ticks": 9, "report": {"running": None, "levers": {
    "be_cap": {"chosen": 3, "by_signal": {"app_p99_us": {"helped": 2, "bought_nothing": 1, "mean_gain": 1500.0,
                                                         "mean_be_cores_given_up": 0.75}},
               "resting_s": {}, "last": None},
    "hot_cap": {"chosen": 1, "by_signal": {"app_p99_us": {"helped": 1, "bought_nothing": 1, "retracted": 1,
                                                          "mean_gain": None,
                                                          "mean_be_cores_given_up": None}},
                "resting_s": {"app_p99_us": 12.0}, "last": None},
    "leave": {"chosen": 4, "by_signal": {}, "resting_s": {}, "last": None}}}}}}
TRIALS = {"chosen": 61, "by_signal": {"app_p99_us": {"helped": 2, "bought_nothing": 1, "mean_gain": 10.0},
                                      "runq_p99_us": {"helped": True, "bought_nothing": -3}},
          "resting_s": {"app_p99_us": 10.0}, "last": None}


def test_each_lever_says_what_it_bought_for_how_much_be_work():
    lines = lever_lines(STATUS)
    assert lines[0].startswith("be_suppress's levers")
    assert lines[1] == "  be_cap: chosen 3: app_p99_us 2 helped, 1 bought nothing, 1.50ms bought for 0.75 BE cores"
    # a helped whose release then cost nothing (A/B/A) is said so
    assert lines[2] == ("  hot_cap: chosen 1: app_p99_us 1 helped (1 of them not: their release did not confirm them), "
                        "1 bought nothing; rests 12s for app_p99_us")
    assert lines[3] == "  leave: chosen 4 (control trials, and rounds where every cut rested)"


def test_leaving_be_alone_says_in_how_many_control_trials_ls_recovered():
    # a control trial is judged as a cut is (helped: LS recovered with BE left alone), but no latency was bought
    status = {"loops": {"be_suppress": {"report": {"levers": {"leave": TRIALS}}}}}
    assert lever_lines(status)[1] == ("  leave: chosen 61 (control trials, and rounds where every cut rested): "
                                      "app_p99_us LS recovered in 2 of 3 control trials; rests 10s for app_p99_us")


def test_no_report_or_a_malformed_one_shows_nothing():
    for status in ({}, {"loops": []}, {"loops": {"be_suppress": {"report": "x"}}},
                   {"loops": {"be_suppress": {"report": {"levers": [1]}}}}):
        assert lever_lines(status) == [] and levers(status) == {}
    odd = {"loops": {"be_suppress": {"report": {"levers": {"x\x1b[2J": {"by_signal": {"s": "no"}}}}}}}
    assert lever_lines(odd)[1] == "  x\\x1b[2J: chosen 0"


def test_the_standing_headroom_says_its_phase_and_last_verdict_where_it_was_ever_tried():
    report = STATUS["loops"]["be_suppress"]["report"]
    kept = {"phase": "kept", "ceiling": 1.234, "last": "bought: stolen in 3 of 90 rounds -> 0 of 242"}
    lines = lever_lines({"loops": {"be_suppress": {"report": {**report, "headroom": kept}}}})
    assert lines[1] == ("  headroom (host steals busy vCPUs): kept, BE at most 1.23 CPUs; last: bought: stolen in "
                        "3 of 90 rounds -> 0 of 242")
    never = {"phase": "watching", "ceiling": None, "last": None}
    assert lever_lines({"loops": {"be_suppress": {"report": {**report, "headroom": never}}}}) == lever_lines(STATUS)
    odd = {"phase": "kept\x1b[2J", "ceiling": "x", "last": 5}
    assert lever_lines({"loops": {"be_suppress": {"report": {**report, "headroom": odd}}}})[1] == \
        "  headroom (host steals busy vCPUs): kept\\x1b[2J"
