"""Names the workloads choose: cgroup names with newlines, tabs, spaces, glob characters, quotes,
backslashes, escape sequences, bidi overrides, bytes that are not UTF-8, 255-byte components and deep
paths. The classifier matches them as the literal names they are, the restore journal and the decision
log give them back exactly, one record a line, and what koordctl prints stays one line per row with no
control character reaching the terminal (koordd/core/printable.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.fuzzing import PROFILE, counted
from koordctl.cli import main as koordctl
from koordctl.top import render
from koordd.act.decision_log import DecisionLog, read_decisions
from koordd.act.journal import Held, RestoreJournal, read_held
from koordd.core.cgroup_text import match_pattern
from koordd.core.config import parse_config
from koordd.core.decisions import APPLIED, Decision
from koordd.core.printable import printable
from koordd.kernel.avx import TaskStat, parse_stat
from koordd.sensors.collect import find_classified

# Each a single path component, as a workload could name its cgroup (anything but "/" and NUL).
NAMES = (
    "web\nKOORDD_OUTCOME=refused",          # a newline that would forge a line, a record or a field
    "tab\tand space", " lead and trail ", "w*", "we?", "[w]eb", "*", "quo\"te", "it's", "back\\slash",
    "system-systemd\\x2dfsck.slice",        # systemd's own escapes: shown as they are
    "esc\x1b[2J\x1b[31mred", "cr\roverwrite", "\u202eevil.slice", "zero\u200bwidth", "line\u2028sep",
    "bell\x07", "c1\x9bcsi", "日本語", "caf\udce9", "\udcff\udcfe",   # the last two: bytes not UTF-8
    "x" * 255, "日" * 85,                    # 255 bytes, the most a component takes
)
DEEP = "/".join(f"level{i:02d}-" + "d" * 40 for i in range(24))   # 24 levels, over 1 KB
# What a terminal or a line-based log must never receive from a name.
UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def without_unsafe(text: str) -> bool:
    return UNSAFE.search(text.replace("\n", "")) is None


@pytest.fixture
def tree(tmp_path) -> FakeCgroups:
    t = FakeCgroups(tmp_path, "v2").add("pods.slice/web")
    for name in NAMES:
        t.add(f"pods.slice/{name}")
    return t


# --- the classifier ---------------------------------------------------------------------------------------

CLASSES = """
[[classes]]
name = "BE"
cgroups = ["pods.slice/web"]

[[classes]]
name = "LS"
cgroups = ["pods.slice/*"]
"""


def test_odd_names_are_classified_as_the_literal_names_they_are(tree):
    config = parse_config(CLASSES, "koordd.toml", {})
    found = find_classified(tree.fs, config.classify, max_depth=2)
    # "w*", "we?" and "[w]eb" are names, not patterns: only "web" itself is BE.
    assert found == {"pods.slice/web": "BE", **{f"pods.slice/{n}": "LS" for n in NAMES}}


NAME_CHARS = st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",))
COMPONENT = st.one_of(st.text(NAME_CHARS, min_size=1, max_size=20), st.sampled_from(NAMES),
                      st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\x00" not in b)
                      .map(os.fsdecode))
LITERAL = st.text(st.characters(blacklist_characters="/\x00*?[", blacklist_categories=("Cs",)), min_size=1,
                  max_size=10)


@PROFILE
@given(st.lists(COMPONENT, min_size=1, max_size=4), st.lists(LITERAL, min_size=1, max_size=4))
@counted
def test_a_name_matches_a_literal_pattern_only_when_it_is_that_name(parts, literal):
    cgroup, pattern = "/".join(parts), "/".join(literal)
    assert match_pattern(pattern, cgroup) == (pattern == cgroup)
    assert match_pattern("/".join("*" * len(parts)), cgroup)     # a star takes any component whole


# --- the restore journal -----------------------------------------------------------------------------------

def test_the_journal_gives_odd_names_back_exactly_one_entry_a_line(tmp_path):
    journal = RestoreJournal(tmp_path)
    added = [Held(f"pods.slice/{n}", "cpu.max", f"max 100000 {n}", "be_suppress", 1.5) for n in NAMES + (DEEP,)]
    for h in added:
        journal.add(h)
    journal.close()
    assert RestoreJournal(tmp_path).entries() == added
    lines = (tmp_path / RestoreJournal.FILE).read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == 1 + len(added)        # the header, then one a hold
    assert [h["target"] for h in read_held(tmp_path)[0]] == [h.target for h in added]


# --- the decision log: the file and journald -----------------------------------------------------------------

def strict_send(sent: list):
    """systemd.journal.send as python-systemd does it: str fields encoded as strict UTF-8, bytes as they are."""
    def send(message, **fields):
        lines = [f"MESSAGE={message}".encode()]
        lines += [k.encode() + b"=" + (v if isinstance(v, bytes) else str(v).encode()) for k, v in fields.items()]
        sent.append(lines)
    return send


def decision(target: str) -> Decision:
    return Decision(1.0, "be_suppress", target, "cpu.max", "max 100000", "50000 100000", APPLIED,
                    message=f"BE {target} over its allowance", reason={"cgroup": target})


def test_a_name_forges_no_record_and_no_field(tmp_path):
    sent: list = []
    log = DecisionLog(tmp_path, send=strict_send(sent))
    targets = [f"pods.slice/{n}" for n in NAMES] + [DEEP]
    for t in targets:
        log.record(decision(t))
    lines = (tmp_path / DecisionLog.FILE).read_bytes().split(b"\n")
    assert len(lines) - 1 == len(targets)
    assert [r["target"] for r in read_decisions(tmp_path)] == targets
    assert len(sent) == len(targets)
    for t, fields in zip(targets, sent):
        message, *rest = fields
        # journald takes a field with a newline in its binary form: one field, whatever its value.
        by_name = dict(f.split(b"=", 1) for f in rest)
        assert by_name[b"KOORDD_TARGET"] == t.encode("utf-8", "surrogateescape")
        assert json.loads(by_name[b"KOORDD_REASON"]) == {"cgroup": t}
        assert without_unsafe(message.decode()) and b"\n" not in message


def test_without_journald_the_log_line_of_a_decision_is_one_line(tmp_path, caplog):
    log = DecisionLog(None)
    with caplog.at_level("INFO", logger="koordd.decision"):
        for n in NAMES:
            log.record(decision(f"pods.slice/{n}"))
    assert len(caplog.records) == len(NAMES)
    assert all("\n" not in r.getMessage() and without_unsafe(r.getMessage()) for r in caplog.records)


def test_plain_log_lines_naming_a_cgroup_cannot_forge_a_line(monkeypatch, capsys):
    # Not decisions: warnings such as "cannot read <cgroup>" print the name too. Through the daemon's own
    # handler (stderr without journald), every name stays on its line, and a traceback's lines are
    # indented, so an exception's message cannot start a line either.
    import logging
    from koordd.runtime import daemon
    monkeypatch.setattr(daemon, "journal_sender", lambda: None)
    daemon.setup_logging("info")
    try:
        log = logging.getLogger("koordd.test")
        for n in NAMES:
            log.warning("cannot read %s", f"pods.slice/{n}")
        try:
            raise OSError(f"pods.slice/{NAMES[0]} is gone")
        except OSError:
            log.exception("loop failed")
    finally:
        logging.getLogger().handlers.clear()
    lines = capsys.readouterr().err.splitlines()
    own = [line for line in lines if not line.startswith("  ")]
    assert len(own) == len(NAMES) + 1 and all(" WARNING koordd.test: cannot read " in line for line in own[:-1])
    assert own[-1].endswith("ERROR koordd.test: loop failed")
    assert all(without_unsafe(line) for line in lines)
    assert any("KOORDD_OUTCOME=refused is gone" in line for line in lines if line.startswith("  "))


# --- koordctl -----------------------------------------------------------------------------------------------

def state_with_odd_names(d: Path) -> list[str]:
    targets = [f"pods.slice/{n}" for n in NAMES] + [DEEP]
    d.mkdir(exist_ok=True)
    journal = RestoreJournal(d)
    for t in targets:
        journal.add(Held(t, "cpu.max", "max 100000", "be_suppress", 1.5))
    journal.close()
    log = DecisionLog(d)
    for t in targets:
        log.record(decision(t))
    status = {"pid": os.getpid(), "updated": 2.0, "started": 1.0, "config": "/etc/koordd/koordd.toml",
              "cgroups": len(targets), "loops": {"be_suppress": {"interval": 1.0, "ticks": 3, "last_tick": 2.0,
                                                                  "failures": 1, "last_error": f"{NAMES[0]} gone"}}}
    (d / "status.json").write_text(json.dumps(status))
    return targets


def test_koordctl_status_and_decisions_print_one_line_a_row_and_nothing_for_the_terminal(tmp_path, capsys):
    targets = state_with_odd_names(tmp_path)
    # capsys's stdout is strict UTF-8, as a real one: a name that is not UTF-8 would be a traceback.
    assert koordctl(["status", "--state-dir", str(tmp_path)]) == 0
    status = capsys.readouterr().out
    assert koordctl(["decisions", "--state-dir", str(tmp_path)]) == 0
    decisions = capsys.readouterr().out
    for out in (status, decisions):
        assert without_unsafe(out)
        rows = [line for line in out.splitlines() if re.search(r"(^| )(pods\.slice/|level00-)", line)]
        assert len(rows) == len(targets)
        for t in targets:
            assert sum(printable(t) in row for row in rows) >= 1
    assert "web\\nKOORDD_OUTCOME=refused" in status and "caf\\xe9" in status and "\\x1b[2J" in decisions


def test_koordctl_json_keeps_the_exact_names(tmp_path, capsys):
    targets = state_with_odd_names(tmp_path)
    assert koordctl(["decisions", "--json", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["target"] for line in out] == targets


def test_koordctl_top_shows_odd_names_on_their_own_rows():
    doc = {"pid": 1, "time": 10.0, "node": {}, "sensors": {"runq_latency": {"state": "unavailable",
                                                                             "reason": "no\nbpf\x1b[2J"}},
           "cgroups": [{"path": f"pods.slice/{n}", "class": "LS", "cpu": 0.5} for n in NAMES]}
    lines = render(doc, "cpu", None, 10.0)
    rows = [line for line in lines if line.startswith("pods.slice/")]
    assert len(rows) == len(NAMES) and all(without_unsafe(line) for line in lines)


# --- the daemon on a tree of such names -----------------------------------------------------------------------

DAEMON_CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"

[[classes]]
name = "BE"
cgroups = ["be.slice/*"]

[[classes]]
name = "LS"
cgroups = ["ls.slice"]

[loops.be_suppress]
enabled = true
rule = "threshold"
threshold_percent = 65
"""


def test_koordd_caps_odd_be_cgroups_and_koordctl_shows_them(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("ls.slice")
    names = [n for n in NAMES if n.strip() == n]     # be_suppress's targets: every BE root
    for n in names:
        tree.add(f"be.slice/{n}")
    state = tmp_path / "state"
    config = tmp_path / "koordd.toml"
    config.write_text(DAEMON_CONFIG.format(root=tree.root, state=state))
    run = subprocess.run([sys.executable, "-m", "koordd.runtime.daemon", "--config", str(config), "--once"],
                         capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    capped = {r["target"] for r in read_decisions(state) if r["outcome"] == APPLIED}
    assert capped == {f"be.slice/{n}" for n in names}
    for n in names:
        assert tree.read(f"be.slice/{n}", "cpu", "cpu.max").strip() != "max 100000"
    # koordctl as the user runs it: its own process, its stdout a pipe (strict UTF-8).
    ctl = subprocess.run([sys.executable, "-m", "koordctl.cli", "decisions", "--state-dir", str(state)],
                         capture_output=True, timeout=60)
    assert ctl.returncode == 0, ctl.stderr.decode(errors="replace")
    out = ctl.stdout.decode()
    assert without_unsafe(out) and len(out.splitlines()) == 1 + len(names)


# --- process names ----------------------------------------------------------------------------------------

COMM = st.binary(min_size=0, max_size=15).filter(lambda b: b"\x00" not in b).map(
    lambda b: b.decode("ascii", "replace"))       # as avx._read_small decodes it


@PROFILE
@given(COMM, st.sampled_from("RSDZ"), st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 8191))
@counted
def test_a_process_name_cannot_shift_the_fields_of_its_stat_line(comm, state, utime, stime, cpu):
    # comm is the process's to choose, up to 15 bytes: ")", " R ", newlines and digits included.
    fields = ["1"] * 49
    fields[3 - 3], fields[14 - 3], fields[15 - 3], fields[39 - 3] = state, str(utime), str(stime), str(cpu)
    stat = parse_stat(f"4242 ({comm}) {' '.join(fields)}\n")
    assert stat == TaskStat(state, utime + stime, cpu)
