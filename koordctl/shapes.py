"""The shapes of the documents koordd leaves in its state_dir, as koordctl checks them before it shows them.

A check returns nothing and raises Malformed("loops.be_suppress.interval: a string, not a number") on the
first value of another shape: koordctl then names the file and that, instead of a traceback further on.
Only the fields koordctl reads are checked; any other field may hold anything (a newer koordd's). Every
field may be absent or null: the views show "-" or "?" for it. Numbers are finite and bounded (a time lies
between 1970 and 9999, a count is an integer of 53 bits at most), so nothing koordctl computes or
allocates from them can overflow or grow without bound.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

Check = Callable[[Any, str], None]

LARGEST = 2.0 ** 64             # bytes, nanoseconds, counts: none koordd writes is larger
LAST_TIME = 253402300799.0      # 9999-12-31T23:59:59Z: time.localtime's range on every platform


class Malformed(ValueError):
    """A value of another shape than koordd writes: str() is "where: what"."""


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _bad(where: str, v: Any, want: str) -> Malformed:
    shown = f" ({v!r})" if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
    return Malformed(f"{where or 'the document'}: {_kind(v)}{shown}, not {want}")


def number(lo: float = -LARGEST, hi: float = LARGEST, integer: bool = False) -> Check:
    want = f"{'an integer' if integer else 'a number'} from {lo:g} to {hi:g}"

    def check(v: Any, where: str) -> None:
        if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
            raise _bad(where, v, want)
        if isinstance(v, float) and not math.isfinite(v) or not lo <= v <= hi:
            raise _bad(where, v, want)
    return check


NUM = number()
TIME = number(0, LAST_TIME)
COUNT = number(0, 2 ** 53, integer=True)
PID = number(1, 2 ** 31 - 1, integer=True)     # a pid_t: os.kill takes no more


def TEXT(v: Any, where: str) -> None:
    if not isinstance(v, str):
        raise _bad(where, v, "a string")


def BOOL(v: Any, where: str) -> None:
    if not isinstance(v, bool):
        raise _bad(where, v, "true or false")


def ANY(v: Any, where: str) -> None:
    pass


def SCALAR(v: Any, where: str) -> None:
    """A string, a bounded number or a boolean: printed as it is."""
    if isinstance(v, (str, bool)):
        return
    NUM(v, where) if isinstance(v, (int, float)) else TEXT(v, where)


def opt(check: Check) -> Check:
    """`check`, or null."""
    def run(v: Any, where: str) -> None:
        if v is not None:
            check(v, where)
    return run


def seq(check: Check) -> Check:
    """A list whose every item passes `check`."""
    def run(v: Any, where: str) -> None:
        if not isinstance(v, list):
            raise _bad(where, v, "a list")
        for i, item in enumerate(v):
            check(item, f"{where}[{i}]")
    return run


def table_of(check: Check) -> Check:
    """An object whose every value (under any name) passes `check`."""
    def run(v: Any, where: str) -> None:
        if not isinstance(v, dict):
            raise _bad(where, v, "an object")
        for name, item in v.items():
            check(item, f"{where}.{name}" if where else str(name))
    return run


def obj(fields: Mapping[str, Check]) -> Check:
    """An object; each of `fields` that it has is null or passes its check; other fields are not looked at."""
    def run(v: Any, where: str) -> None:
        if not isinstance(v, dict):
            raise _bad(where, v, "an object")
        for name, check in fields.items():
            if v.get(name) is not None:
                check(v[name], f"{where}.{name}" if where else name)
    return run


def check(doc: Any, shape: Check) -> None:
    """Malformed("where: what") unless `doc` has `shape`."""
    shape(doc, "")


# --- status.json (koordd/runtime/statusfile.py) --------------------------------------------------------

HELD = obj({"target": TEXT, "cgroup": TEXT, "kind": TEXT, "knob": TEXT, "original": TEXT, "owner": TEXT,
            "since": TIME})
PSI = obj({"cpu": NUM, "memory": NUM, "io": NUM})
WORKLOAD = obj({"cgroup": TEXT, "class": TEXT, "requests": COUNT, "latency_us": NUM, "latency_p999_us": NUM,
                "target_us": NUM, "target_p999_us": NUM, "violation_rate": NUM, "violation_target": NUM})
SLO = obj({"class": TEXT, "target_us": NUM, "target_p999_us": NUM, "violation_target": NUM})
# A history's point: koordd/core/report.py's HISTORY_FIELDS, each a number or null.
POINT = seq(opt(NUM))
MAX_HISTORY_POINTS = 10080      # a week of minutes: koordctl slo draws one character per step
HISTORY = obj({"seconds": number(0, 7 * 86400), "step_seconds": number(0.001, 86400), "left_out": COUNT,
               "fields": seq(TEXT), "workloads": table_of(seq(POINT)), "slos": table_of(SLO)})
REPORT = obj({"schema": SCALAR, "time": TIME, "fairness": obj({"jain_index": NUM}),
              "capacity": obj({"cpu_cores": NUM, "memory_bytes": NUM}),
              "usage": obj({"cpu_cores": NUM, "memory_bytes": NUM}),
              "tenants": seq(obj({"name": TEXT, "cpu_share": NUM, "memory_share": NUM, "dominant_share": NUM})),
              "workloads": seq(WORKLOAD)})
BPF = obj({"stats_enabled": BOOL, "objects": seq(obj({
    "object": TEXT,
    "programs": seq(obj({"name": TEXT, "id": SCALAR, "attached": seq(TEXT), "run_cnt": COUNT, "run_time_ns": COUNT})),
    "maps": seq(obj({"name": TEXT, "max_entries": COUNT, "key_size": COUNT, "value_size": COUNT,
                     "attached": seq(TEXT)}))}))})
_STATUS = obj({
    "pid": PID, "started": TIME, "updated": TIME, "config": TEXT, "dry_run": BOOL, "cgroups": SCALAR, "metrics": TEXT,
    "loops": table_of(obj({"interval": number(0, LARGEST), "ticks": COUNT, "failures": COUNT, "last_tick": TIME,
                           "last_ok": TIME, "last_error": TEXT})),
    "sensors": table_of(obj({"state": TEXT, "reason": TEXT, "loops": seq(TEXT)})),
    "held": seq(HELD),
    "reclaimable": obj({"cpu_cores": obj({"reclaimable": NUM}), "memory_bytes": obj({"reclaimable": NUM}),
                        "ls_cgroups": COUNT}),
    "report": REPORT, "slo_history": HISTORY, "bpf": BPF})


def STATUS(v: Any, where: str) -> None:
    _STATUS(v, where)
    history = v.get("slo_history") or {}
    # koordctl slo's defaults for what is absent: 600 s of 10 s steps
    seconds, step = history.get("seconds") or 600.0, history.get("step_seconds") or 10.0
    if seconds / step > MAX_HISTORY_POINTS:
        raise Malformed(f"slo_history: {seconds:g} s in steps of {step:g} s: more than {MAX_HISTORY_POINTS} "
                        "points, not a history koordd keeps")


# --- top.json (koordd/runtime/topfeed.py) --------------------------------------------------------------

ROW = obj({"path": TEXT, "kind": TEXT, "class": TEXT, "cpu": NUM, "memory": NUM, "psi": PSI,
           "runq": obj({"p99_us": NUM, "mean_us": NUM}), "cpi": obj({"cpi": NUM}),
           "knobs": table_of(obj({"current": TEXT, "original": TEXT}))})
TOP = obj({"time": TIME, "pid": PID, "node": obj({"memory_total": NUM, "memory_available": NUM, "cpu_used": NUM,
                                                  "cpus": NUM, "psi": PSI}),
           "sensors": table_of(obj({"state": TEXT, "reason": TEXT})), "cgroups": seq(ROW)})


# --- a record of decisions.jsonl (koordd/core/decisions.py) -------------------------------------------

# A loop's reason holds what that loop chose to say; koordctl slo reads be_suppress's.
REASON = obj({"rule": SCALAR, "step": SCALAR, "slack": SCALAR, "worst": obj({"cgroup": SCALAR, "signal": SCALAR})})
DECISION = obj({"time": TIME, "loop": TEXT, "outcome": TEXT, "kind": TEXT, "target": TEXT, "cgroup": TEXT,
                "knob": TEXT, "old": TEXT, "new": TEXT, "message": TEXT, "error": TEXT, "reason": REASON})
