"""koordctl: main([...]) against hand-written configs and state dirs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

from koordctl import doctor
from koordctl.cli import main
from koordctl.common import ago, table
from koordd.act.owner import Holder, OwnerLock
from koordd.runtime.capabilities import PROBES

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "config" / "koordd.toml"
CAPABILITIES = tuple(name for name, _ in PROBES)        # doctor reports every probe, in order


def write_config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "koordd.toml"
    path.write_text(textwrap.dedent(body))
    return path


def decision(t: float, loop: str = "be_suppress", **kw) -> dict:
    return {"time": t, "loop": loop, "cgroup": "be.slice", "knob": "cpu.max", "old": "max 100000",
            "new": "400000 100000", "outcome": "applied", "message": "LS+system at 41%", "reason": {},
            "error": None, **kw}


@pytest.fixture
def now() -> float:
    return time.time()


@pytest.fixture
def state(tmp_path: Path, now: float) -> Path:
    """A state dir as a live koordd leaves it: status.json, originals.json, a rotated decision log."""
    d = tmp_path / "state"
    d.mkdir()
    (d / "status.json").write_text(json.dumps({
        "pid": os.getpid(), "started": now - 3600, "updated": now - 0.4, "config": "/etc/koordd/koordd.toml",
        "dry_run": False, "cgroups": "mode=unified unified=/sys/fs/cgroup (cpu memory)",
        "loops": {"be_suppress": {"interval": 1.0, "ticks": 3600, "failures": 2, "last_tick": now - 0.4,
                                  "last_ok": now - 10, "last_error": "OSError: cpu.max: EBUSY",
                                  "last_changes": 0}},
        "sensors": {"gpus": {"state": "unavailable", "reason": "nvmlInit: Driver Not Loaded",
                             "loops": ["gpu_share"]},
                    "runq": {"state": "stopped", "reason": None, "loops": []}},
        "held": [{"cgroup": "stale.slice", "knob": "cpu.max", "original": "max 100000",
                  "owner": "be_suppress", "since": now - 7200}]}))
    (d / "originals.json").write_text(json.dumps({"version": 1, "held": [
        {"cgroup": "be.slice", "knob": "cpu.max", "original": "max 100000", "owner": "be_suppress",
         "since": now - 3500}]}))
    (d / "decisions.jsonl.1").write_text(json.dumps(decision(now - 7200, message="old one")) + "\n")
    (d / "decisions.jsonl").write_text("\n".join([
        json.dumps(decision(now - 1800, loop="mem_qos", knob="memory.high", old=None, new="8G",
                            outcome="refused", message="", error="no such file")),
        "{damaged",
        json.dumps(decision(now - 60, old="400000 100000", new="300000 100000", message="newest")),
    ]) + "\n")
    return d


# --- helpers ------------------------------------------------------------------------------------

def test_table_widths_come_from_content():
    assert table([("a", None), ("longer", 3)], ("X", "VALUE")).splitlines() == [
        "X       VALUE", "a       -", "longer  3"]


@pytest.mark.parametrize("seconds, text", [(0.4, "0.4s ago"), (185, "3m05s ago"), (7800, "2h10m ago"),
                                           (3 * 86400 + 4 * 3600, "3d4h ago")])
def test_ago(seconds, text, now):
    assert ago(now - seconds, now) == text


# --- validate -----------------------------------------------------------------------------------

def test_validate_misspelt_key(tmp_path, capsys):
    path = write_config(tmp_path, """\
        [loops.be_suppress]
        enabled = true
        treshold_percent = 65
        """)
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:3: loops.be_suppress.treshold_percent: unknown key (did you mean 'threshold_percent'?)" in out


def test_validate_ok(tmp_path, capsys):
    path = write_config(tmp_path, """\
        [daemon]
        state_dir = "/tmp/koordd"
        [loops.be_suppress]
        enabled = true
        threshold_percent = 50
        """)
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok\n"


def test_validate_shipped_config(capsys):
    assert main(["validate", str(SHIPPED)]) == 0
    assert capsys.readouterr().out.strip().endswith(": ok")


def test_console_script_validates_shipped_config():
    koordctl = Path(sys.executable).parent / "koordctl"
    r = subprocess.run([str(koordctl), "validate", "config/koordd.toml"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, "config/koordd.toml: ok\n"), r.stderr


# --- doctor -------------------------------------------------------------------------------------

def test_doctor_text(capsys, tmp_path):
    assert main(["doctor", "--cgroup-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in CAPABILITIES:
        assert name in out


def test_doctor_json(capsys):
    assert main(["doctor", "--json"]) == 0
    caps = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in caps] == list(CAPABILITIES)
    assert all(set(c) == {"name", "available", "detail"} for c in caps)


# --- status -------------------------------------------------------------------------------------

def test_status_running(state, capsys):
    assert main(["status", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^koordd +running \(pid {os.getpid()}, status updated 0\.\ds ago\)$", out, re.M)
    assert "dry-run    no" in out
    assert "mode=unified" in out
    loop = next(line for line in out.splitlines() if line.startswith("be_suppress"))
    assert re.match(r"be_suppress +1s +3600 +0\.\ds ago +2 +OSError: cpu.max: EBUSY$", loop)
    # the sensors an enabled loop needs, with why one is not running; those none needs are not listed
    assert re.search(r"^gpus +unavailable +gpu_share +nvmlInit: Driver Not Loaded$", out, re.M)
    assert "runq" not in out
    # originals.json wins over status.json's copy of the held knobs
    assert "held knobs (from originals.json):" in out
    assert "be.slice  cpu.max  max 100000  be_suppress" in out and "stale.slice" not in out


def test_status_not_running_falls_back_to_status_held(state, capsys):
    status = json.loads((state / "status.json").read_text())
    (state / "status.json").write_text(json.dumps({**status, "pid": 2 ** 22 + 1}))  # above pid_max
    (state / "originals.json").unlink()
    assert main(["status", "--state-dir", str(state)]) == 1
    out = capsys.readouterr().out
    assert "not running" in out and "held knobs (from status.json):" in out and "stale.slice" in out


def test_status_json(state, capsys):
    assert main(["status", "--json", "--state-dir", str(state)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["running"] is True and got["state_dir"] == str(state)
    assert got["held_source"] == "originals.json" and [h["target"] for h in got["held"]] == ["be.slice"]
    assert got["loops"]["be_suppress"]["ticks"] == 3600


def test_status_never_ran(tmp_path, capsys):
    assert main(["status", "--state-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out == f"koordd has not run with state_dir {tmp_path}\n"


def test_status_state_dir_from_config(tmp_path, state, capsys):
    path = write_config(tmp_path, f'[daemon]\nstate_dir = "{state}"\n')
    assert main(["status", "--config", str(path)]) == 0
    assert f"state_dir  {state}" in capsys.readouterr().out


def test_status_invalid_config_falls_back_to_default(tmp_path, capsys):
    path = write_config(tmp_path, '[daemon]\nstate_dirr = "/x"\n')
    main(["status", "--config", str(path)])
    err = capsys.readouterr().err
    assert f"invalid config: {path}:2:" in err and "using the default state_dir /var/lib/koordd" in err


def test_without_config_or_state_dir_status_reads_the_running_koordds_state_dir(tmp_path, state, capsys,
                                                                                monkeypatch):
    # `sudo scripts/run` runs koordd on /run/koordd/koordd.toml: koordctl finds it through the host lock,
    # not through /etc/koordd (which need not exist), and says nothing about a config it did not need.
    monkeypatch.setattr("koordctl.running.DEFAULT_PATH", tmp_path / "absent.toml")
    lock = OwnerLock.take(tmp_path / "run.toml", state)
    try:
        assert main(["status"]) == 0
    finally:
        lock.release()
    out, err = capsys.readouterr()
    assert f"state_dir  {state}" in out and err == ""


def test_without_a_running_koordd_status_takes_the_config_its_last_status_names(tmp_path, state, capsys,
                                                                               monkeypatch):
    config = write_config(tmp_path, f'[daemon]\nstate_dir = "{state}"\n')
    default = tmp_path / "default-state"
    default.mkdir()
    (default / "status.json").write_text(json.dumps({"config": str(config)}))
    monkeypatch.setattr("koordctl.running.DEFAULT_STATE_DIR", str(default))
    monkeypatch.setattr("koordctl.running.DEFAULT_PATH", tmp_path / "absent.toml")
    main(["status"])
    out, err = capsys.readouterr()
    assert f"state_dir  {state}" in out and err == ""


def test_with_no_koordd_and_no_status_status_falls_back_to_etc_koordd(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("koordctl.running.DEFAULT_STATE_DIR", str(tmp_path / "nothing"))
    monkeypatch.setattr("koordctl.running.DEFAULT_PATH", tmp_path / "absent.toml")
    assert main(["status"]) == 1
    out, err = capsys.readouterr()
    assert f"invalid config: {tmp_path / 'absent.toml'}" in err and f"has not run with state_dir {tmp_path / 'nothing'}" in out


def test_status_unreadable_file(state, capsys):
    (state / "originals.json").write_text("{not json")
    assert main(["status", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"koordctl: {state / 'originals.json'}: unreadable:") and err.count("\n") == 1
    assert (state / "originals.json").exists()   # koordctl only reads: the file is left for the daemon


# --- decisions ----------------------------------------------------------------------------------

def rows(out: str) -> list[str]:
    return out.splitlines()[1:]


def test_decisions_table_across_rotation(state, capsys, now):
    assert main(["decisions", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["TIME", "LOOP", "OUTCOME", "TARGET", "KNOB", "CHANGE", "MESSAGE"]
    lines = rows(out)
    assert [line.split()[2] for line in lines] == ["be_suppress", "mem_qos", "be_suppress"]   # oldest first
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now - 60))
    assert lines[2].startswith(stamp + "  be_suppress")
    assert "400000 100000 -> 300000 100000" in lines[2] and lines[2].endswith("newest")
    assert "- -> 8G" in lines[1] and lines[1].endswith("(no such file)")


@pytest.mark.parametrize("args, messages", [
    (["--loop", "be_suppress"], ["old one", "newest"]),
    (["--since", "45m"], ["", "newest"]),
    (["--since", "90s"], ["newest"]),
    (["-n", "1"], ["newest"]),
    (["--loop", "be_suppress", "-n", "5"], ["old one", "newest"]),
])
def test_decisions_filters(state, capsys, args, messages):
    assert main(["decisions", "--json", "--state-dir", str(state), *args]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["message"] for r in records] == messages


def test_decisions_since_iso(state, capsys, now):
    since = datetime.fromtimestamp(now - 3600).isoformat(timespec="seconds")
    assert main(["decisions", "--json", "--since", since, "--state-dir", str(state)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_decisions_bad_since(state, capsys):
    assert main(["decisions", "--since", "yesterday", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("koordctl: --since 'yesterday':") and err.count("\n") == 1


def test_decisions_none(tmp_path, capsys):
    assert main(["decisions", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no decisions recorded in {tmp_path}\n"


def test_doctor_lists_the_running_koordds_bpf_programs(capsys, tmp_path, monkeypatch):
    """From the running koordd's status file: each program, where it runs, its run time; each map's size."""
    report = {"stats_enabled": True, "objects": [{"object": "runq_latency.bpf.o", "programs": [
        {"name": "runq_switch", "section": "tp_btf/sched_switch", "id": 41, "attached": ["tp_btf/sched_switch"],
         "run_time_ns": 3_000_000, "run_cnt": 10_000}], "maps": [
        {"name": "waits", "max_entries": 16384, "key_size": 8, "value_size": 264, "attached": []},
        {"name": "queued", "max_entries": 0, "key_size": 4, "value_size": 8, "attached": []}]}]}
    (tmp_path / "status.json").write_text(json.dumps({"bpf": report}))
    monkeypatch.setattr(doctor, "running_koordd", lambda: Holder(pid=4242, state_dir=str(tmp_path)))
    assert main(["doctor", "--cgroup-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "BPF programs loaded by koordd (pid 4242):\n  runq_latency.bpf.o\n" in out
    assert "program runq_switch (id 41): tp_btf/sched_switch; 10000 runs, 300 ns each, 3.0 ms in all" in out
    assert "map waits: 16384 entries of 8 + 264 bytes" in out
    assert "map queued: one per task or socket of 4 + 8 bytes" in out      # task storage: no size of its own
    report["stats_enabled"] = False
    (tmp_path / "status.json").write_text(json.dumps({"bpf": report}))
    main(["doctor", "--cgroup-root", str(tmp_path)])
    out = capsys.readouterr().out
    assert "run time not counted" in out and "kernel.bpf_stats_enabled is 0" in out
    (tmp_path / "status.json").write_text(json.dumps({"bpf": {}}))    # an older koordd's: no objects
    main(["doctor", "--cgroup-root", str(tmp_path)])
    assert "  none: no loop or sensor enabled needs one" in capsys.readouterr().out
    (tmp_path / "status.json").unlink()
    main(["doctor", "--cgroup-root", str(tmp_path)])
    assert "koordd (pid 4242) has written no report of them" in capsys.readouterr().out
    (tmp_path / "status.json").write_text("{not json")          # a status file koordctl cannot read: named
    assert main(["doctor", "--cgroup-root", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"koordctl: BPF programs not shown: {tmp_path}/status.json: not JSON")
    monkeypatch.setattr(doctor, "running_koordd", lambda: None)
    main(["doctor", "--cgroup-root", str(tmp_path)])
    assert "BPF programs: no koordd runs on this host" in capsys.readouterr().out
