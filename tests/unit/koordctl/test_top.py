"""koordctl top: rows, sorting and the screen from a fixed top.json; --json and the live view against
a state dir where a thread plays koordd."""
from __future__ import annotations

import io
import json
import os
import pty
import termios
import threading
import time
from pathlib import Path

import pytest

from koordctl import top
from koordctl.cli import main
from koordctl.top import Terminal, human_bytes, human_us, render, select_rows, target_name, watch
from koordd.core.feeds import REQUEST_FILE, TOP_FILE, TopRequest, parse_request

NOW = 1_800_000_000.0


def row(path, cls, cpu=None, memory=None, psi=(None, None, None), runq=None, cpi=None, knobs=None, **kw):
    return {"path": path, "kind": "cgroup", "class": cls, "member_of": None, "cpu": cpu, "memory": memory,
            "psi": dict(zip(("cpu", "memory", "io"), psi)), "runq": runq, "cpi": cpi, "knobs": knobs or {}, **kw}


def runq(p99, mean=40.0):
    return {"source": "ebpf" if p99 else "schedstat", "count": 10, "mean_us": mean, "p50_us": None,
            "p99_us": p99, "max_us": None}


DOC = {
    "version": 1, "time": NOW - 0.4, "pid": 4242, "interval": 2.0, "members": False,
    "sensors": {"runq_latency": {"state": "running", "reason": None, "loops": ["koordctl top"]},
                "cpi": {"state": "unavailable", "reason": "no hardware counters", "loops": ["koordctl top"]}},
    "node": {"cpus": 8, "cpu_used": 3.25, "memory_total": 16 << 30, "memory_available": 4 << 30,
             "psi": {"cpu": 1.5, "memory": 0.0, "io": 0.25}},
    "cgroups": [
        row("be.slice", "BE", cpu=2.5, memory=6 << 30, psi=(0.0, 8.0, 0.0), runq=runq(4096.0),
            knobs={"cpu.max": {"current": "200000 100000", "original": "max 100000", "owner": "be_suppress",
                               "since": NOW - 60}}),
        row("ls.slice", "LS", cpu=0.5, memory=2 << 30, psi=(12.5, 0.0, 1.0), runq=runq(None, mean=35.0)),
        row("system.slice", "SYSTEM", cpu=0.25, memory=512 << 20, psi=(0.0, 0.0, 0.0), runq=runq(128.0)),
        row("kubepods.slice/pod-x", "BE", knobs={"cgroup.freeze": {"current": "1", "original": "0",
                                                                   "owner": "memory_evict", "since": NOW}}),
    ],
}


def paths(rows):
    return [r["path"] for r in rows]


# --- rows and text ----------------------------------------------------------------------------------

@pytest.mark.parametrize("by, order", [
    ("cpu", ["be.slice", "ls.slice", "system.slice", "kubepods.slice/pod-x"]),      # unknown last
    ("memory", ["be.slice", "ls.slice", "system.slice", "kubepods.slice/pod-x"]),
    ("psi", ["ls.slice", "be.slice", "system.slice", "kubepods.slice/pod-x"]),       # the highest of the three
    ("runq", ["be.slice", "system.slice", "ls.slice", "kubepods.slice/pod-x"]),      # p99, else the mean
    ("cpi", ["be.slice", "kubepods.slice/pod-x", "ls.slice", "system.slice"]),       # none known: by name
    ("name", ["be.slice", "kubepods.slice/pod-x", "ls.slice", "system.slice"]),
])
def test_rows_sort_highest_first_and_unknown_last(by, order):
    assert paths(select_rows(DOC, by)) == order


def test_rows_of_one_class():
    assert paths(select_rows(DOC, "cpu", "BE")) == ["be.slice", "kubepods.slice/pod-x"]


@pytest.mark.parametrize("n, text", [(None, None), (0, "0B"), (1023, "1023B"), (1536, "1.5K"), (6 << 30, "6.0G"),
                                     (12 << 30, "12G"), (3 << 40, "3.0T")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


@pytest.mark.parametrize("us, text", [(None, None), (35.0, "35us"), (4096.0, "4.1ms"), (2.5e6, "2.50s")])
def test_human_us(us, text):
    assert human_us(us) == text


@pytest.mark.parametrize("r, name", [({"kind": "cgroup", "path": "be.slice"}, "be.slice"),
                                     ({"kind": "cgroup", "path": ""}, "/"),
                                     ({"kind": "resctrl", "path": "be"}, "resctrl:be")])   # a held target of another kind
def test_target_names(r, name):
    assert target_name(r) == name


def test_the_screen():
    lines = render(DOC, "cpu", None, NOW)
    assert lines[0] == ("koordd 4242 | sample 0.4s old | CPU 3.25 of 8 busy | memory 12G of 16G used"
                        " | PSI some avg10 cpu 1.50% mem 0.00% io 0.25%")
    assert lines[1] == "cpi: unavailable (no hardware counters)"        # why its column is all "-"
    assert lines[2:4] == ["4 cgroups, by cpu", ""]
    assert lines[4:] == [
        "CGROUP                CLASS    CPU  MEMORY  PSI CPU  PSI MEM  PSI IO  RUNQ P99  CPI  KNOBS HELD",
        "be.slice              BE      2.50    6.0G     0.00     8.00    0.00     4.1ms    -  "
        "cpu.max 200000 100000 (was max 100000)",
        "ls.slice              LS      0.50    2.0G    12.50     0.00    1.00  avg 35us    -  -",
        "system.slice          SYSTEM  0.25    512M     0.00     0.00    0.00     128us    -  -",
        "kubepods.slice/pod-x  BE         -       -        -        -       -         -    -  cgroup.freeze 1 (was 0)",
    ]


def test_columns_of_sensors_koordd_does_not_have_are_left_out():
    doc = {**DOC, "sensors": {}, "cgroups": [{**r, "runq": None} for r in DOC["cgroups"]]}
    header = render(doc, "cpu", "LS", NOW)[3]
    assert header.split("  ")[-1] == "KNOBS HELD" and "RUNQ" not in header and "CPI" not in header


def test_the_screen_fits_the_terminal():
    lines = render(DOC, "cpu", None, NOW, keys=True, notice="koordd is not running", width=40, height=9)
    assert len(lines) == 9 and all(len(line) <= 40 for line in lines)
    assert lines[2] == "koordd is not running"
    assert lines[3].startswith("4 cgroups, by cpu | sort: c cpu")
    assert lines[-1] == "... and 2 more"


# --- koordctl top against a state dir ---------------------------------------------------------------

@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state dir of a running koordd (this process's pid) that has not answered yet."""
    (tmp_path / "status.json").write_text(json.dumps({"pid": os.getpid(), "started": NOW, "updated": NOW}))
    return tmp_path


@pytest.fixture
def koordd(state):
    """Plays koordd: answers the first request with DOC, sampled after it."""
    def answer():
        end = time.monotonic() + 30
        while not (state / REQUEST_FILE).exists() and time.monotonic() < end:
            time.sleep(0.01)
        (state / TOP_FILE).write_text(json.dumps({**DOC, "time": time.time() + 0.01}))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield state
    thread.join(timeout=30)


def test_json_asks_and_prints_one_sample(koordd, capsys):
    assert main(["top", "--json", "--class", "be", "--sort", "name", "--interval", "3s", "--state-dir",
                 str(koordd)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert paths(got["cgroups"]) == ["be.slice", "kubepods.slice/pod-x"]
    assert got["node"] == DOC["node"] and got["sensors"] == DOC["sensors"]
    assert parse_request((koordd / REQUEST_FILE).read_text()) == TopRequest(interval=3.0, members=False)


def test_without_a_terminal_one_screen_is_printed(koordd, capsys):
    assert main(["top", "--members", "--state-dir", str(koordd)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("koordd 4242 | sample ") and "\x1b" not in out
    assert out.splitlines()[5].startswith("be.slice ")
    assert parse_request((koordd / REQUEST_FILE).read_text()).members is True


def test_koordd_not_running(state, capsys):
    (state / "status.json").write_text(json.dumps({"pid": 2 ** 22 + 1}))     # above pid_max
    assert main(["top", "--json", "--state-dir", str(state)]) == 1
    assert capsys.readouterr().err == f"koordctl top: koordd is not running (state_dir {state})\n"
    assert not (state / REQUEST_FILE).exists()


def test_koordd_that_does_not_answer(state, capsys, monkeypatch):
    monkeypatch.setattr(top, "ANSWER_TIMEOUT", 0.2)
    (state / TOP_FILE).write_text(json.dumps({**DOC, "time": time.time() - 3600}))  # an old one: no answer
    assert main(["top", "--json", "--state-dir", str(state)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"koordctl top: koordd (pid {os.getpid()}) published no sample within 0.2s")


@pytest.mark.parametrize("interval", ["100ms", "2m", "soon"])
def test_an_interval_out_of_range_is_refused(state, interval, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["top", "--interval", interval, "--state-dir", str(state)])
    assert exit_.value.code == 2 and "--interval" in capsys.readouterr().err


# --- the live view ------------------------------------------------------------------------------------

class Screen:
    """A terminal that records frames and hands out scripted key presses (no waiting)."""

    def __init__(self, keys):
        self.keys, self.frames = list(keys), []

    def size(self):
        return 200, 50

    def show(self, lines):
        self.frames.append(lines)

    def key(self, timeout):
        return self.keys.pop(0) if self.keys else "q"


def test_the_view_keeps_asking_sorts_on_a_key_and_quits_on_q(state):
    (state / TOP_FILE).write_text(json.dumps({**DOC, "time": time.time() + 1}))
    old = time.time() - 30
    (state / REQUEST_FILE).write_text("{}")
    os.utime(state / REQUEST_FILE, (old, old))
    screen = Screen(["", "p", "x"])
    watch(screen, state, TopRequest(interval=2.0), time.time(), "cpu", None, alive=lambda: True)
    assert len(screen.frames) == 4                                   # "q" came with the fourth
    assert [f[2].split(" | ")[0] for f in screen.frames] == ["4 cgroups, by cpu"] * 2 + ["4 cgroups, by psi"] * 2
    assert screen.frames[-1][5].startswith("ls.slice ")              # highest PSI first
    assert os.stat(state / REQUEST_FILE).st_mtime > old + 20         # touched: still asking


def test_the_view_says_when_koordd_is_gone_and_keeps_its_last_sample(state):
    (state / TOP_FILE).write_text(json.dumps({**DOC, "time": time.time() + 1}))
    screen = Screen([""])
    watch(screen, state, TopRequest(), time.time(), "cpu", None, alive=lambda: False)
    assert screen.frames[0][2] == "koordd is not running: this is its last sample"


def test_the_view_gives_up_when_koordd_does_not_answer(state):
    screen = Screen([])
    with pytest.raises(top.NoAnswer):
        watch(screen, state, TopRequest(), time.time(), "cpu", None, alive=lambda: True, answer_timeout=0.0)


def test_the_terminal_is_restored_after_the_view():
    master, slave = pty.openpty()
    try:
        before = termios.tcgetattr(slave)
        out = io.StringIO()
        with open(slave, "rb", buffering=0, closefd=False) as inp:
            with pytest.raises(KeyboardInterrupt):
                with Terminal(inp, out) as terminal:
                    assert not termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO)   # keys one by one
                    os.write(master, b"p")
                    assert terminal.key(30.0) == "p"
                    raise KeyboardInterrupt                          # Ctrl-C
            assert termios.tcgetattr(slave) == before
        assert out.getvalue() == Terminal.ENTER + Terminal.LEAVE
    finally:
        os.close(master)
        os.close(slave)
