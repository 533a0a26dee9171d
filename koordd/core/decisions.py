"""Decision records: what one change, refusal or restore was, and its forms: the journal's message and
fields, the stored JSON. Where they go (journald, <state_dir>/decisions.jsonl) is
koordd/act/decision_log.py.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from koordd.core.printable import printable

APPLIED, DRY_RUN, REFUSED, RESTORED = "applied", "dry-run", "refused", "restored"
LEFT = "left"           # a held knob not restored: someone else's value now, or another object of that name
# Not tried this round: a write that may block (KnobSpec.slow, memory.reclaim) after the round's budget for
# such writes was spent (koordd/act/actuator.py). Not a failure: the loop asks it again next round.
DEFERRED = "deferred"
# Nothing written, the knob already holding the value: said because the loop asked it on record (Action.say),
# a verdict such as "this cut helped: it stays".
KEPT = "kept"


@dataclass(frozen=True)
class Decision:
    time: float
    loop: str
    target: str                     # a cgroup path, or what the knob's backend (kind) names
    knob: str
    old: str | None
    new: str | None
    outcome: str
    message: str = ""
    reason: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    kind: str = "cgroup"

    def text(self) -> str:
        """The journal's MESSAGE: what changed, and why in words; one line whatever the target's name
        (printable()), the exact name being in the fields."""
        what = {APPLIED: "set", DRY_RUN: "would set", RESTORED: "restored", REFUSED: "refused",
                LEFT: "left", DEFERRED: "deferred", KEPT: "kept"}[self.outcome]
        where = (self.target or "/") if self.kind == "cgroup" else f"{self.kind} {self.target}"
        s = f"{self.loop}: {what} {where} {self.knob} {self.old!r} -> {self.new!r}"
        if self.message:
            s += f": {self.message}"
        if self.error:
            s += f" ({self.error})"
        return printable(s)

    def record(self) -> dict:
        """The stored form (decisions.jsonl); a cgroup target is under "cgroup" too, where readers have always looked."""
        out = asdict(self)
        if self.kind == "cgroup":
            out["cgroup"] = self.target
        return out

    def fields(self) -> dict[str, str]:
        # KOORDD_CGROUP stays for cgroup targets: queries written before other kinds existed still work.
        return {"KOORDD_LOOP": self.loop, "KOORDD_KIND": self.kind, "KOORDD_TARGET": self.target,
                **({"KOORDD_CGROUP": self.target} if self.kind == "cgroup" else {}), "KOORDD_KNOB": self.knob,
                "KOORDD_OLD": "" if self.old is None else self.old,
                "KOORDD_NEW": "" if self.new is None else self.new,
                "KOORDD_OUTCOME": self.outcome,
                "KOORDD_REASON": json.dumps(dict(self.reason), sort_keys=True, default=str),
                **({"KOORDD_ERROR": self.error} if self.error else {})}

