"""scripts/bench-qos's report: cell formats, the Markdown table and page, and the plot."""
from __future__ import annotations

import pytest

from koordtest.bench.qos_report import COLUMNS, markdown, percent, plain, plot, table, times
from koordtest.bench.qos_stats import Spread, summarise
from unit.koordtest.test_bench_qos_stats import RUNS

ORDER = ["ls-alone", "be-alone", "no-control"]


def test_cells():
    assert times(Spread(1.234, 1.1, 1.4, 3)) == "1.23x (1.10-1.40)"
    assert times(Spread(2.0, 2.0, 2.0, 1)) == "2.00x"
    assert times(Spread(2.0, 2.0, 2.0, 3)) == "2.00x"            # no range when there is none
    assert percent(Spread(0.856, 0.8, 0.9, 3)) == "86% (80-90)"
    assert plain(Spread(0.1234, 0.1, 0.2, 2), 3) == "0.123 (0.100-0.200)"
    assert times(None) == percent(None) == plain(None) == "-"


def test_table_has_a_row_per_setup_and_load():
    lines = table(summarise(RUNS, 2, ORDER)).splitlines()
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |"
    assert lines[1] == "|" + "---|" * len(COLUMNS)
    assert lines[2:] == [
        "| - | be-alone | - | - | - | 1.00x (0.50-1.50) | 100% | - | 0.10 | - |",
        "| 50% | ls-alone | 1.00x (0.50-1.50) | 1.00x (0.50-1.50) | 1.00x (0.50-1.50) | - | - "
        "| 2.00 (1.00-3.00) | 0.10 | 0.050 |",
        "| 50% | no-control | 2.50x (2.00-3.00) | 2.50x (2.00-3.00) | 2.50x (2.00-3.00) | 0.38x (0.25-0.50) "
        "| 75% (50-100) | 5.00 (4.00-6.00) | 0.10 | 0.050 |",
    ]


def test_markdown_page_starts_with_the_exact_command():
    page = markdown(summarise(RUNS, 2, ORDER), "sudo .venv/bin/python scripts/bench-qos --reps 2",
                    ["host: 2 CPUs"], ["client send lag p99: 40 µs"])
    assert page.startswith("# koordd QoS benchmark\n\n```console\n"
                           "sudo .venv/bin/python scripts/bench-qos --reps 2\n```\n")
    assert "- host: 2 CPUs\n" in page and "- client send lag p99: 40 µs\n" in page
    assert table(summarise(RUNS, 2, ORDER)) in page
    assert "up to 2" in page


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "qos.png"
    plot(RUNS, ORDER, path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
