"""runtime/statusfile.py: the document's shape (indented two levels, compact below, the long lists a line
an entry) and the BPF report taken again only when it can have changed much. The document as koordctl
reads it back: koordctl/test_ctl_slo.py, core/test_report.py."""
from __future__ import annotations

import json

import koordd.runtime.statusfile as statusfile
from koordd.runtime.statusfile import StatusFile, dumps


def test_the_document_is_indented_two_levels_and_compact_below():
    status = {"pid": 7, "loops": {"be_suppress": {"ticks": 3, "report": {"levers": {"be_cap": {"chosen": 1}}}}},
              "odd": {1: "a"}, "held": [{"target": "be.slice"}, {"target": "x\n\"]"}]}
    text = dumps(status, {"seconds": 10, "workloads": {"web.slice": [[1, 2], [3, 4]]}})
    assert json.loads(text) == {**status, "odd": {"1": "a"},
                                "slo_history": {"seconds": 10, "workloads": {"web.slice": [[1, 2], [3, 4]]}}}
    lines = text.splitlines()
    assert ' "loops": {' in lines and \
        '  "be_suppress": {"ticks":3,"report":{"levers":{"be_cap":{"chosen":1}}}}' in lines
    assert '  {"target":"x\\n\\"]"}' in lines                                     # a held knob a line
    assert '    [3,4]' in lines                                                     # a history point a line
    assert ' "odd": {"1":"a"},' in lines                                           # keys json would change: compact


def test_the_bpf_report_is_taken_again_when_an_object_comes_or_goes_or_after_ten_seconds(monkeypatch, tmp_path):
    objects, taken = {"value": frozenset()}, []
    monkeypatch.setattr(statusfile.libbpf, "loaded", lambda: objects["value"])
    monkeypatch.setattr(statusfile.libbpf, "report", lambda: taken.append(1) or {"objects": sorted(objects["value"])})
    status = StatusFile(tmp_path, 0.0, "koordd.toml", False, "v2", lambda: None)
    assert status._bpf_report(100.0) == {"objects": []} and len(taken) == 1
    status._bpf_report(105.0)
    assert len(taken) == 1                                         # within 10 s, nothing loaded or closed
    objects["value"] = frozenset({"/usr/lib/koordd/runq_latency.bpf.o"})
    assert status._bpf_report(106.0) == {"objects": ["/usr/lib/koordd/runq_latency.bpf.o"]} and len(taken) == 2
    status._bpf_report(115.9)
    assert len(taken) == 2
    status._bpf_report(116.0)                                      # 10 s on: run counts move
    assert len(taken) == 3


def test_a_round_rewrites_the_file_when_what_an_operator_acts_on_changed_else_every_five_seconds(monkeypatch, tmp_path):
    from koordd.act.journal import Held
    from koordd.runtime.result import RoundResult
    clock = {"now": 1000.0}
    monkeypatch.setattr(statusfile.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(statusfile.libbpf, "loaded", frozenset)
    monkeypatch.setattr(statusfile.libbpf, "report", dict)
    status = StatusFile(tmp_path, 0.0, "koordd.toml", False, "v2", lambda: None)
    path = tmp_path / "status.json"

    def rnd(ticks, changes=0, held=(), failures=0, sensor="running", seconds=1.0):
        clock["now"] += seconds
        status.published(RoundResult(None, loops={"be_suppress": {"ticks": ticks, "last_changes": changes,
                                                                  "failures": failures, "errors": failures,
                                                                  "last_error": "OSError" if failures else None}},
                                     sensors={"runq_latency": {"state": sensor, "reason": None, "loops": ["be_suppress"]}},
                                     held=held))
        return json.loads(path.read_text())["loops"]["be_suppress"]["ticks"]

    assert rnd(1) == 1                                             # the first round writes
    assert [rnd(t) for t in (2, 3, 4, 5)] == [1, 1, 1, 1]         # counters alone: not within 5 s
    assert rnd(6) == 6                                             # 5 s since the last write
    knob = Held("be", "cpu.max", "max", "be_suppress", 1.0, written=("50000 100000",))
    assert rnd(7, changes=1, held=(knob,)) == 7                    # a knob taken
    assert rnd(8, held=(knob,)) == 7
    assert rnd(9, held=(Held("be", "cpu.max", "max", "be_suppress", 1.0, written=("20000 100000",)),)) == 9  # rewritten
    assert rnd(10) == 10                                           # given back
    assert rnd(11, failures=1) == 11 and rnd(12, failures=2) == 12 and rnd(13) == 13   # a loop failing, recovering
    assert rnd(14) == 13
    assert rnd(15, sensor="unavailable") == 15                     # a sensor stopping
    assert rnd(16, sensor="unavailable", seconds=0.1) == 15
    status.write(RoundResult(None, loops={"be_suppress": {"ticks": 17}}))   # at stop: whatever changed
    assert json.loads(path.read_text())["loops"]["be_suppress"]["ticks"] == 17
