"""What the benchmarks share (koordtest/bench/common.py): the median (range) cell of their reports, an
option's value read as TOML, the command line a report shows, and SIGTERM as Ctrl-C."""
from __future__ import annotations

import os
import signal

import pytest

from koordtest.bench import common
from koordtest.bench.common import cell, command_line, toml_value
from koordtest.bench.qos_stats import Spread


def test_cell_formats():
    assert cell(None) == "-"
    assert cell(Spread(1.234, 1.234, 1.234, 1)) == "1.23"
    assert cell(Spread(1.5, 1.0, 2.0, 3), 1, "x") == "1.5x (1.0-2.0)"
    assert cell(Spread(2.0, 2.0, 2.0, 2), 0) == "2"
    assert cell(Spread(1.234, 1.0, 2.0, 3), 2) == "1.23 (1.00-2.00)"
    assert cell(Spread(5.0, 5.0, 5.0, 3), 1) == "5.0"
    assert cell(Spread(0.856, 0.8, 0.9, 3), 0, "%", scale=100) == "86% (80-90)"
    assert cell(Spread(0.5, 0.5, 0.5, 3), 0, "%", scale=100) == "50%"


def test_an_option_value_is_read_as_toml_and_anything_else_is_a_string():
    assert toml_value("10") == 10 and toml_value("2.5") == 2.5 and toml_value("true") is True
    assert toml_value('"1s"') == "1s" and toml_value("4M") == "4M" and toml_value("[1, 2]") == [1, 2]


def test_the_command_line_names_the_script_as_run_and_a_python_below_here_relatively(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common.sys, "argv", [str(tmp_path / "scripts" / "bench-x"), "--reps", "2", "a b"])
    monkeypatch.setattr(common.sys, "executable", str(tmp_path / ".venv" / "bin" / "python"))
    assert command_line() == ".venv/bin/python scripts/bench-x --reps 2 'a b'"
    monkeypatch.setattr(common.sys, "executable", "/opt/elsewhere/bin/python")
    assert command_line().startswith("/opt/elsewhere/bin/python scripts/bench-x ")
    # main(argv) called from another benchmark (proof's cases): the script and arguments it is given
    assert command_line("scripts/bench-qos", ["--reps", "1"]) == "/opt/elsewhere/bin/python scripts/bench-qos --reps 1"
    assert command_line("scripts/bench-qos", []) == "/opt/elsewhere/bin/python scripts/bench-qos"


def test_sigterm_is_handled_as_ctrl_c():
    old = signal.signal(signal.SIGTERM, common.interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)       # let the handler run here, not later
    finally:
        signal.signal(signal.SIGTERM, old)


def test_wait_for_gives_the_first_truthy_value_or_none():
    calls = iter([0, "", "ready", "later"])
    assert common.wait_for(lambda: next(calls), timeout=60, step=0) == "ready"
    assert common.wait_for(lambda: None, timeout=0, step=0) is None


def test_the_parser_shows_the_docstring_as_written():
    doc = "What it does.\n\n    sudo scripts/bench-x [--reps N]\n\nMore, as written."
    text = common.doc_parser(doc).format_help()
    assert "What it does." in text and "    sudo scripts/bench-x [--reps N]\n\nMore, as written." in text
