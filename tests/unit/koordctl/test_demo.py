"""koordctl demo without a kernel: koordd's config, what the live view says of koordd, signals, and
the command line. tests/kernel/test_demo_kernel.py runs the real thing."""
from __future__ import annotations

import io
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest
from koordtest.fakes.cgroup import FakeCgroups

from koordctl.cli import main
from koordctl.demo import session as demo
from koordctl.demo.cgroups import DemoCgroups
from koordctl.demo.session import Stopped, koordd_config, signals_stop
from koordd.core.config import load_config
from koordd.core.catalogue import load_registry


# --- koordd's config ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("loops", [("be_suppress",), ("qos_baseline",), ("be_suppress", "qos_baseline")])
def test_koordd_config_classifies_only_the_demo_cgroups(tmp_path, loops):
    tree = FakeCgroups(tmp_path, "hybrid")
    path = tmp_path / "koordd.toml"
    path.write_text(koordd_config(DemoCgroups(tree.layout, "koordd-demo-7"), tmp_path / "state", loops))
    config = load_config(path, load_registry())
    assert config.daemon.state_dir == str(tmp_path / "state")
    assert config.daemon.cgroup_root == str(tree.root)
    assert config.classify("koordd-demo-7/ls") == "LS" and config.classify("koordd-demo-7/be") == "BE"
    assert config.classify("be.slice") is None and config.classify("kubepods/besteffort") is None
    assert sorted(name for name, loop in config.loops.items() if loop.enabled) == sorted(loops)
    # LS works in 100 ms slots: its run-queue target is a tenth of one, not a µs server's 2 ms.
    assert config.rule_for("koordd-demo-7/ls").health.runq_p99_us == 10_000.0
    assert config.rule_for("koordd-demo-7/be").health is None


# --- signals and the command line ---------------------------------------------------------------------------

def test_sigterm_stops_the_demo_like_ctrl_c():
    with pytest.raises(KeyboardInterrupt) as stopped:
        with signals_stop():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)           # the handler runs first
    assert isinstance(stopped.value, Stopped) and stopped.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_demo_needs_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["demo", "--phase", "2s"]) == 2
    assert "demo: needs root" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [(["--loops", "cpu_burst"], "one or more of be_suppress, qos_baseline"),
                                           (["--loops", ","], "one or more of"),
                                           (["--phase", "500ms"], "at least 1s"),
                                           (["--period", "soon"], "not a duration")])
def test_demo_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo", *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_demo_loops_and_phase_parse(monkeypatch):
    got = {}
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(demo, "run", lambda settings, plot_path, layout: got.update(s=settings, p=plot_path) or 0)
    monkeypatch.setattr("koordctl.demo.session.detect_layout", lambda root: None)
    monkeypatch.setattr("koordctl.demo.session.hierarchy_roots", lambda layout: [])
    assert main(["demo", "--phase", "1m", "--period", "15s", "--loops", "qos_baseline,be_suppress,qos_baseline",
                 "--no-plot"]) == 0
    assert got["s"] == demo.Settings(phase=60.0, period=15.0, loops=("qos_baseline", "be_suppress"))
    assert got["p"] is None


# --- what is said of koordd ------------------------------------------------------------------------------

class FakeKoordd:
    pid = 4242


def a_demo(tmp_path, koordd=None) -> demo.Demo:
    d = demo.Demo(FakeCgroups(tmp_path, "hybrid").layout, demo.Settings(), cpus=[0, 1], name="koordd-demo-1")
    d.tmp, d.koordd = tmp_path / "run", koordd
    (d.tmp / "state").mkdir(parents=True)
    return d


def test_koordd_text_follows_koordd_from_phase_3(tmp_path):
    d = a_demo(tmp_path)
    assert demo.koordd_text(d) == "not running (phase 3 starts it)"
    d.koordd = FakeKoordd()
    assert demo.koordd_text(d) == "starting (pid 4242, loops qos_baseline, be_suppress)"
    (d.state_dir / "status.json").write_text('{"pid": 4242, "loops": {"qos_baseline": {"ticks": 1}}}')
    assert demo.koordd_text(d) == "running (pid 4242): qos_baseline 1 tick"
    (d.state_dir / "status.json").write_text('{"loops": {"qos_baseline": {"ticks": 7}, "be_suppress": {"ticks": 6}}}')
    assert demo.koordd_text(d) == "running (pid 4242): be_suppress 6 ticks, qos_baseline 7 ticks"


def test_koordd_changes_from_its_decision_log(tmp_path):
    d = a_demo(tmp_path, FakeKoordd())
    (d.state_dir / "decisions.jsonl").write_text("\n".join([
        '{"loop": "be_suppress", "knob": "cpu.max", "outcome": "applied"}',
        '{"loop": "be_suppress", "knob": "cpu.max", "outcome": "applied"}',
        '{"loop": "qos_baseline", "knob": "cpu.idle", "outcome": "refused"}',
        '{"loop": "be_suppress", "knob": "cpu.max", "outcome": "restored"}',
        '{"loop": "be_suppress", "knob": "cpu.m',                              # torn by a crash
    ]) + "\n")
    assert demo.changes_lines(d.koordd_changes()) == [
        "koordd's writes on BE (its decision log): be_suppress cpu.max 2x, qos_baseline cpu.idle 1x refused"]


def test_no_koordd_no_changes(tmp_path):
    assert demo.changes_lines(a_demo(tmp_path).koordd_changes()) == ["koordd changed nothing."]


def test_a_demo_that_cannot_start_says_why_and_leaves_what_was_there(tmp_path, capsys):
    tree = FakeCgroups(tmp_path, "hybrid")
    tree.add(f"koordd-demo-{os.getpid()}/ls")                   # left by a killed demo whose pid was ours
    out = io.StringIO()
    assert demo.run(demo.Settings(phase=1.0), tmp_path / "demo.png", tree.layout, out=out) == 1
    assert f"koordd-demo-{os.getpid()} exists already" in capsys.readouterr().err
    assert out.getvalue().splitlines()[-1] == "cleaned up: nothing had been made yet"
    assert (tree.root / "cpu" / f"koordd-demo-{os.getpid()}" / "ls").is_dir()
    assert not (tmp_path / "demo.png").exists()
    assert not list(Path(tempfile.gettempdir()).glob(f"koordd-demo-{os.getpid()}-*"))
