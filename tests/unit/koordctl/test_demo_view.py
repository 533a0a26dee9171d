"""What koordctl demo shows: the summary, the live view, the lines for a pipe, the plot."""
from __future__ import annotations

import io
import math

import pytest

from koordctl.demo.view import LinePrinter, LiveView, Sample, bar, frame, line, plot, summarize, summary_lines


def sample(t, phase, asked=1.0, used=1.0, be=0.0, other=0.1, dt=0.5, quota=None, idle=False):
    return Sample(t=t, dt=dt, phase=phase, ls_asked=asked, ls_used=used, be_used=be, other=other,
                  be_quota=quota, be_idle=idle)


def test_summary_means_are_weighted_by_time():
    samples = [sample(0.5, 0, asked=0.4, used=0.4), sample(1.0, 0, asked=0.8, used=0.8),
               sample(1.5, 1, asked=1.0, used=0.5, be=1.5, dt=0.25), sample(2.0, 1, asked=1.0, used=0.8, be=1.2, dt=0.75),
               sample(2.5, 2, asked=1.2, used=1.2, be=0.6), sample(3.0, 2, asked=0.8, used=0.6, be=1.0)]
    alone, uncontrolled, managed = summarize(samples, ncpu=2)
    assert (alone.phase, alone.seconds, alone.ls_asked, alone.ls_used, alone.ls_got) == \
        (0, 1.0, pytest.approx(0.6), pytest.approx(0.6), pytest.approx(1.0))
    assert uncontrolled.ls_used == pytest.approx(0.25 * 0.5 + 0.75 * 0.8)
    assert uncontrolled.be_used == pytest.approx(0.25 * 1.5 + 0.75 * 1.2)
    assert uncontrolled.ls_got == pytest.approx(0.725)
    assert managed.ls_got == pytest.approx(1.8 / 2.0) and managed.be_used == pytest.approx(0.8)
    assert managed.other == pytest.approx(0.1)
    assert managed.left == pytest.approx(2 - 0.9 - 0.1) and managed.be_took == pytest.approx(0.8)


def test_be_took_at_most_all_that_was_left():
    busy, = summarize([sample(1, 1, used=1.5, be=0.6, other=0.2)], ncpu=2)     # samples that overlap a little
    assert busy.left == pytest.approx(0.3) and busy.be_took == 1.0
    full, = summarize([sample(1, 1, used=1.9, be=0.1, other=0.3)], ncpu=2)
    assert full.left == 0.0 and full.be_took == 0.0


def test_summary_of_a_stopped_demo_has_the_phases_it_reached():
    assert [p.phase for p in summarize([sample(0.5, 0), sample(1.0, 1)], ncpu=2)] == [0, 1]
    assert summarize([], ncpu=2) == []


def test_summary_lines():
    lines = summary_lines(summarize([sample(1, 0, asked=0.8, used=0.8, dt=1), sample(2, 1, asked=0.8, used=0.6, be=1.3, dt=1),
                                     sample(3, 2, asked=0.8, used=0.76, be=1.1, dt=1)], ncpu=2))
    assert lines == [
        "Means per phase, in CPUs of 2 (left over: what LS and other work left to BE):",
        "  phase       seconds  LS asked  LS used  LS got  BE used  left over  BE took  other",
        "  LS alone          1      0.80     0.80    100%     0.00       1.10        -   0.10",
        "  no control        1      0.80     0.60     75%     1.30       1.30     100%   0.10",
        "  koordd on         1      0.80     0.76     95%     1.10       1.14      96%   0.10",
        "",
        "LS alone: LS got 100% of what it asked",
        "no control: LS got 75% of what it asked; BE used 1.30 CPUs, 100% of the 1.30 left over",
        "koordd on: LS got 95% of what it asked; BE used 1.10 CPUs, 96% of the 1.14 left over",
    ]


def test_a_phase_that_asked_nothing_got_nothing():
    assert summarize([sample(1, 0, asked=0.0, used=0.0)], ncpu=2)[0].ls_got == 0.0


@pytest.mark.parametrize("cpus, width, filled", [(0, 10, 0), (1, 10, 5), (2, 10, 10), (3, 10, 10), (-1, 10, 0),
                                                 (0.14, 20, 1)])
def test_bar(cpus, width, filled):
    assert bar(cpus, 2, width) == "█" * filled + "·" * (width - filled)


def test_frame():
    lines = frame(sample(47.0, 1, asked=1.2, used=0.92, be=1.05), ncpu=2, phase_seconds=30,
                  koordd="not running (phase 3 starts it)", width=100)
    assert lines == [
        "koordctl demo: phase 2/3 no control (BE busy on every CPU, nothing controls it), 17.0s of 30s",
        "",
        "LS asks  " + "█" * 30 + "·" * 20 + "  1.20 CPUs",
        "LS uses  " + "█" * 23 + "·" * 27 + "  0.92 CPUs   77% of what it asks",
        "BE uses  " + "█" * 26 + "·" * 24 + "  1.05 CPUs",
        "other    " + "█" * 2 + "·" * 48 + "  0.10 CPUs  rest of the node",
        "",
        "BE limit: no limit",
        "koordd: not running (phase 3 starts it)",
        "Ctrl-C stops the demo and removes everything it made.",
    ]


def test_frame_shows_what_holds_be_back_and_fits_a_narrow_terminal():
    lines = frame(sample(61, 2, be=0.3, quota=0.3125, idle=True), ncpu=2, phase_seconds=30, koordd="running", width=40)
    assert all(len(x) <= 40 for x in lines) and lines[2].startswith("LS asks  " + "█" * 5 + "·" * 5)
    wide = frame(sample(61, 2, be=0.3, quota=0.3125, idle=True), ncpu=2, phase_seconds=30, koordd="running", width=80)
    assert "BE limit: cpu.max 0.31 CPUs, cpu.idle 1 (SCHED_IDLE)" in wide
    assert all(len(x) <= 80 for x in wide) and wide[3].endswith("  1.00 CPUs  100% of what it asks")


def test_line():
    assert line(sample(12.5, 2, asked=1.0, used=0.97, be=0.8, quota=0.4)) == \
        "  12.5s  koordd on   LS asks 1.00 uses 0.97  BE uses 0.80 (cpu.max 0.40 CPUs)  other 0.10 CPUs"


def test_line_printer_prints_one_line_per_second():
    out = io.StringIO()
    printer = LinePrinter(out)
    for n in range(1, 8):
        printer.sample(sample(n * 0.5, 0))
    assert [x.split()[0] for x in out.getvalue().splitlines()] == ["1.0s", "2.0s", "3.0s"]


def test_line_printer_after_a_late_sample_waits_for_the_next_whole_second():
    out = io.StringIO()
    printer = LinePrinter(out)
    for t in (1.0, 2.7, 3.0, 3.5, 4.0):
        printer.sample(sample(t, 0))
    assert [x.split()[0] for x in out.getvalue().splitlines()] == ["1.0s", "2.7s", "3.0s", "4.0s"]


def test_live_view_draws_over_the_last_frame_and_shows_the_cursor_again():
    out = io.StringIO()
    with LiveView(out) as view:
        view.show(["a", "b", "c"])
        view.show(["d", "e", "f"])
    assert out.getvalue() == ("\x1b[?25l" + "a\x1b[K\nb\x1b[K\nc\x1b[K\x1b[J"
                              + "\r\x1b[2A" + "d\x1b[K\ne\x1b[K\nf\x1b[K\x1b[J" + "\x1b[?25h\n")


def test_live_view_shows_the_cursor_again_after_an_error():
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with LiveView(out) as view:
            view.show(["a"])
            raise KeyboardInterrupt
    assert out.getvalue().endswith("\x1b[?25h\n")


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    samples = [sample(n * 0.5, min(n // 4, 2), asked=1 + math.sin(n / 3), used=1, be=0.5,
                      quota=0.4 if n > 8 else None) for n in range(1, 13)]
    path = tmp_path / "demo.png"
    plot(samples, ncpu=2, phase_seconds=2.0, title="test", path=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
