"""koordctl on a state_dir it should not believe (issue 35, item 7): every command that reads state, on
forged and malformed files, and on a state_dir that koordd itself would refuse.

- Trust: a state_dir others could change (group- or world-writable, a file another user owns) is refused by
  every command, naming the directory or file, as koordd refuses it (koordd/core/trust.py).
- The property: each command (status, slo, decisions, top, doctor; text and --json) on documents forged from
  valid ones (a value anywhere replaced by a string of control characters, a huge or negative or non-finite
  number, a list, an object, null; a whole document replaced; text that is not JSON; nesting 100,000 deep)
  returns an exit code: no exception escapes main(), nothing it prints holds a control character but the
  newline, and a refusal (exit 2) is one line naming the file.
- The issue's own cases: slo_history.seconds = 1e10 (a MemoryError before), an escape in a field koordctl
  printed as it was.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import time
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from koordctl import doctor, top
from koordctl.cli import main
from koordctl.statefiles import MAX_FILE
from koordd.act.journal import Held, RestoreJournal
from koordd.act.owner import Holder
from koordd.core.feeds import STATUS_FILE, TOP_FILE
from koordtest.fuzzing import EXAMPLES, PROFILE, counted

NOW = time.time()
ESC = "\x1b[2J\x1b]0;owned\x07\r\nforged line\u202e\x9b"


def status_doc() -> dict:
    return {
        "pid": os.getpid(), "started": NOW - 3600, "updated": NOW - 0.5, "config": "/etc/koordd/koordd.toml",
        "dry_run": False, "cgroups": "mode=unified unified=/sys/fs/cgroup (cpu memory)", "metrics": "127.0.0.1:9316",
        "loops": {"be_suppress": {"interval": 1.0, "ticks": 3600, "failures": 2, "last_tick": NOW - 0.4,
                                  "last_ok": NOW - 10, "last_error": "OSError: cpu.max: EBUSY", "last_changes": 0}},
        "sensors": {"app_latency": {"state": "running", "reason": None, "loops": ["the SLO of class LS"]},
                    "runq": {"state": "unavailable", "reason": "no BTF", "loops": ["be_suppress"]}},
        "held": [{"target": "be.slice", "kind": "cgroup", "knob": "cpu.max", "original": "max 100000",
                  "owner": "be_suppress", "since": NOW - 7200, "identity": None, "written": []}],
        "reclaimable": {"cpu_cores": {"reclaimable": 1.25, "node": 4.0}, "memory_bytes": {"reclaimable": 3 << 30},
                        "ls_cgroups": 2, "observed_seconds": 60.0},
        "report": {"schema": 1, "time": NOW - 1, "fairness": {"jain_index": 0.9, "tenants": 1},
                   "capacity": {"cpu_cores": 4.0, "memory_bytes": 8 << 30},
                   "usage": {"cpu_cores": 2.0, "memory_bytes": 3 << 30},
                   "tenants": [{"name": "team-a", "cpu_share": 0.5, "memory_share": 0.25, "dominant_share": 0.5}],
                   "workloads": [{"cgroup": "web.slice", "class": "LS", "requests": 500, "quantile": 0.99,
                                  "latency_us": 1500.0, "latency_p999_us": 3000.0, "target_us": 2000.0,
                                  "target_p999_us": None, "violation_rate": 0.004, "violation_target": 0.01}]},
        "slo_history": {"step_seconds": 10.0, "seconds": 600.0,
                        "fields": ["time", "latency_us", "latency_p999_us", "violation_rate", "slack", "requests"],
                        "workloads": {"web.slice": [[NOW - 20, 1400.0, 2800.0, 0.003, 0.3, 480],
                                                    [NOW - 10, 2500.0, 4000.0, 0.02, -0.25, 510]]},
                        "slos": {"web.slice": {"class": "LS", "target_us": 2000.0, "target_p999_us": None,
                                               "violation_target": 0.01}}, "left_out": 0},
        "bpf": {"stats_enabled": True, "objects": [{"object": "runq_latency.bpf.o", "programs": [
            {"name": "runq_switch", "id": 41, "attached": ["tp_btf/sched_switch"], "run_time_ns": 3_000_000,
             "run_cnt": 10_000}], "maps": [{"name": "waits", "max_entries": 16384, "key_size": 8,
                                             "value_size": 264, "attached": []}]}]},
    }


def top_doc() -> dict:
    return {"version": 1, "time": NOW + 3600, "pid": os.getpid(), "interval": 1.0,
            "node": {"cpus": 4, "cpu_used": 1.5, "memory_total": 8 << 30, "memory_available": 5 << 30,
                     "psi": {"cpu": 1.0, "memory": 0.0, "io": 0.5}},
            "sensors": {"runq": {"state": "unavailable", "reason": "no BTF"}},
            "cgroups": [{"path": "be.slice", "kind": "cgroup", "class": "BE", "cpu": 1.2, "memory": 1 << 30,
                         "psi": {"cpu": 3.0, "memory": None, "io": 0.0}, "runq": {"p99_us": 800.0, "mean_us": 90.0},
                         "cpi": {"cpi": 1.1}, "knobs": {"cpu.max": {"current": "400000 100000",
                                                                    "original": "max 100000"}}}]}


def decision_doc(**kw) -> dict:
    return {"time": NOW - 30, "loop": "be_suppress", "kind": "cgroup", "target": "be.slice", "cgroup": "be.slice",
            "knob": "cpu.max", "old": "max 100000", "new": "400000 100000", "outcome": "applied",
            "message": "LS at 41%", "error": None,
            "reason": {"rule": "slack", "step": "shrink (below zero)", "slack": -0.2,
                       "worst": {"cgroup": "web.slice", "signal": "app_p99_us"}}, **kw}


def write_state(d: Path, status: Any = None, topd: Any = None, decisions: list | None = None) -> Path:
    d.mkdir(mode=0o700, exist_ok=True)
    for name in (STATUS_FILE, TOP_FILE, "decisions.jsonl", RestoreJournal.FILE):
        (d / name).unlink(missing_ok=True)
    put(d / STATUS_FILE, status_doc() if status is None else status)
    put(d / TOP_FILE, top_doc() if topd is None else topd)
    lines = [decision_doc(), decision_doc(outcome="refused", error="EBUSY")] if decisions is None else decisions
    (d / "decisions.jsonl").write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    journal = RestoreJournal(d)
    journal.add(Held("be.slice", "cpu.max", "max 100000", "be_suppress", NOW - 100))
    journal.close()
    return d


def put(path: Path, doc: Any) -> None:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))


# The commands that read state, each with the files it reads.
COMMANDS = {
    "status": (["status"], (STATUS_FILE,)), "status --json": (["status", "--json"], (STATUS_FILE,)),
    "slo": (["slo"], (STATUS_FILE, "decisions.jsonl")), "slo --json": (["slo", "--json"], (STATUS_FILE, "decisions.jsonl")),
    "slo --ascii": (["slo", "--ascii"], (STATUS_FILE,)),
    "decisions": (["decisions"], ("decisions.jsonl",)), "decisions --json": (["decisions", "--json"], ("decisions.jsonl",)),
    "top": (["top"], (STATUS_FILE, TOP_FILE)), "top --json": (["top", "--json"], (STATUS_FILE, TOP_FILE)),
    "doctor": (["doctor"], (STATUS_FILE,)),
}


@pytest.fixture(autouse=True)
def quick(monkeypatch, tmp_path):
    """top answers from top.json at once (its time is an hour ahead); doctor's probes of the host are left out
    and its koordd is the state_dir's."""
    monkeypatch.setattr(top, "ANSWER_TIMEOUT", 0.0)
    monkeypatch.setattr(doctor, "probe_all", lambda root: [])
    monkeypatch.setattr(doctor, "format_report", lambda caps: "capabilities")


def run(args: list[str], sd: Path) -> tuple[int, str, str]:
    """main()'s exit code, stdout and stderr; an exception escaping main() fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if args[0] == "doctor":
            real, doctor.running_koordd = doctor.running_koordd, lambda: Holder(pid=os.getpid(), state_dir=str(sd))
            try:
                code = main([*args, "--cgroup-root", str(sd)])
            finally:
                doctor.running_koordd = real
        else:
            code = main([*args, "--state-dir", str(sd)])
    return code, out.getvalue(), err.getvalue()


def unsafe(text: str) -> list[str]:
    """The characters that must never reach a terminal from a file: controls (but the newline), format
    characters (bidi overrides), line and paragraph separators, lone surrogates."""
    return sorted({repr(c) for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")})


def check_output(code: int, out: str, err: str, sd: Path) -> None:
    assert isinstance(code, int)
    assert not unsafe(out) and not unsafe(err), (unsafe(out), unsafe(err))
    if code == 2:
        assert err.startswith("koordctl: ") and str(sd) in err and err.count("\n") == 1, err


# --- valid state: the base the forgeries start from ---------------------------------------------------------

@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_reads_a_valid_state_dir(tmp_path, name):
    sd = write_state(tmp_path / "state")
    code, out, err = run(COMMANDS[name][0], sd)
    check_output(code, out, err, sd)
    assert code == 0, (out, err)


# --- trust ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(COMMANDS))
@pytest.mark.parametrize("how", ["world-writable dir", "group-writable dir", "file of another user",
                                 "world-writable file", "symlinked file"])
def test_a_state_dir_koordd_would_refuse_is_refused_naming_the_file(tmp_path, name, how):
    sd = write_state(tmp_path / "state")
    forged = status_doc()
    forged["config"] = ESC
    put(sd / STATUS_FILE, forged)
    bad = sd / STATUS_FILE
    if how == "world-writable dir":
        os.chmod(sd, 0o777)
        bad = sd
    elif how == "group-writable dir":
        os.chmod(sd, 0o770)
        bad = sd
    elif how == "file of another user":
        os.chown(sd / "decisions.jsonl", 4242, 4242)
        bad = sd / "decisions.jsonl"
    elif how == "world-writable file":
        os.chmod(sd / TOP_FILE, 0o666)
        bad = sd / TOP_FILE
    else:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o777)
        os.chmod(elsewhere, 0o777)
        (sd / STATUS_FILE).rename(elsewhere / STATUS_FILE)
        (sd / STATUS_FILE).symlink_to(elsewhere / STATUS_FILE)
        bad = elsewhere
    code, out, err = run(COMMANDS[name][0], sd)
    check_output(code, out, err, sd)
    assert code == 2
    assert f"{bad} " in err and "koordd trusts its state_dir only if root alone can change it" in err
    assert "forged line" not in out


# --- the issue's cases -------------------------------------------------------------------------------------

def test_a_history_of_1e10_seconds_is_refused_not_drawn(tmp_path):
    status = status_doc()
    status["slo_history"]["seconds"] = 1e10
    sd = write_state(tmp_path / "state", status=status)
    code, out, err = run(["slo"], sd)
    assert code == 2 and err.startswith(f"koordctl: {sd / STATUS_FILE}: slo_history.seconds: a number (10000000000.0), not ")


@pytest.mark.parametrize("where", ["requests", "class", "target_us"])
def test_an_escape_in_any_field_slo_prints_is_escaped_or_refused(tmp_path, where):
    status = status_doc()
    status["report"]["workloads"][0][where] = ESC
    sd = write_state(tmp_path / "state", status=status)
    code, out, err = run(["slo"], sd)
    check_output(code, out, err, sd)


def test_escapes_in_names_are_shown_escaped(tmp_path):
    status = status_doc()
    status["loops"][ESC] = status["loops"]["be_suppress"]
    status["config"] = ESC
    sd = write_state(tmp_path / "state", status=status, decisions=[decision_doc(message=ESC, target=ESC)])
    for args in (["status"], ["decisions"]):
        code, out, err = run(args, sd)
        assert code in (0, 1) and not unsafe(out) and "\\x1b[2J\\x1b]0;owned\\x07\\r\\nforged line\\u202e\\x9b" in out


def test_a_file_larger_than_koordd_writes_is_refused_unread(tmp_path):
    sd = write_state(tmp_path / "state")
    with open(sd / STATUS_FILE, "r+") as f:
        f.seek(MAX_FILE + 10)
        f.write(" ")
    code, out, err = run(["status"], sd)
    assert code == 2 and f"{sd / STATUS_FILE}: larger than 16 MiB" in err


# --- the property ------------------------------------------------------------------------------------------

ODD_NUMBERS = (1e10, -1.0, 0, -0.0, 1e308, -1e308, 2 ** 63, 2 ** 64 + 1, -(2 ** 80), 10 ** 300, 0.5, 1e-300,
               float("nan"), float("inf"), float("-inf"), 2 ** 22 + 1, 2 ** 31, True, False)
ODD_TEXT = (ESC, "", "\x00", "a" * 5000, "\ud800", "\udcff", "../../etc", "%s%n", "\u2028", "web.slice")


def odd_values() -> st.SearchStrategy:
    scalar = st.one_of(st.none(), st.sampled_from(ODD_NUMBERS), st.sampled_from(ODD_TEXT),
                       st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
                       st.text(max_size=12))
    return st.recursive(scalar, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                        st.dictionaries(st.sampled_from(ODD_TEXT + ("time", "pid")),
                                                                        kids, max_size=3)), max_leaves=8)


def paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in `doc`: the document itself, each field of each object, each item of each list."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, prefix + (i,))
    return out


@st.composite
def forged(draw, base: Any) -> Any:
    """`base` with one to three of its values replaced by odd ones, or a field dropped; sometimes not JSON."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.sampled_from(["", "{", "[" * 100_000 + "]" * 100_000, "\xff\xfe", "null", "NaN",
                                     "{\"pid\": 1" + "0" * 5000 + "}", "[]", "\"status\""]))
    doc = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(doc)))
        value = draw(odd_values())
        if not where:
            return value
        parent = doc
        for step in where[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and draw(st.booleans()) and kind == 1:
            parent.pop(where[-1], None)
        else:
            parent[where[-1]] = value
    return doc


def as_text(doc: Any) -> str:
    """A forged document as a file holds it: a string as it is (a lone surrogate written as its bytes, which
    are no UTF-8: errors="surrogatepass" where it is written), anything else as JSON (NaN and Infinity as
    Python writes them)."""
    return doc if isinstance(doc, str) else json.dumps(doc)


CASES = [(name, f) for name, (_, files) in COMMANDS.items() for f in files]


@pytest.mark.parametrize("name, file", CASES, ids=[f"{n}:{f}" for n, f in CASES])
def test_forged_files_give_an_exit_code_and_nothing_for_the_terminal(tmp_path_factory, name, file):
    sd = write_state(tmp_path_factory.mktemp("forged") / "state")
    base = {STATUS_FILE: status_doc(), TOP_FILE: top_doc(), "decisions.jsonl": decision_doc()}[file]

    # half the fuzz profile's examples per command and file: 13 of them in the unit run
    @settings(PROFILE, max_examples=max(10, EXAMPLES // 2), suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(doc=forged(base))
    @counted
    def test_ctl_forged_file(doc):
        write_state(sd)
        if file == "decisions.jsonl":
            (sd / file).write_text(json.dumps(decision_doc()) + "\n" + as_text(doc) + "\n", errors="surrogatepass")
        else:
            (sd / file).write_text(as_text(doc), errors="surrogatepass")
        code, out, err = run(COMMANDS[name][0], sd)
        check_output(code, out, err, sd)

    test_ctl_forged_file()
