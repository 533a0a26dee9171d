"""The invariant every fault test checks: no knob is left changed without a journal entry, as a fresh
start would read the journal (tests/unit/test_faults.py, tests/kernel/test_faults_kernel.py)."""
from __future__ import annotations

from koordd.act.actuator import Actuator
from koordd.act.journal import read_held


def knob_values(actuator: Actuator, targets: list[tuple[str, str]]) -> dict[tuple[str, str, str], str]:
    """Every restorable knob of each (kind, target) that reads now, through its backend."""
    out = {}
    for kind, target in targets:
        backend = actuator.backends.of_kind(kind)
        for name, spec in backend.knobs.items():
            if spec.oneshot:
                continue
            try:
                out[(kind, target, name)] = backend.read(target, name)
            except Exception:  # noqa: BLE001 - not on this layout, or the target is gone: nothing to compare
                continue
    return out


def assert_every_change_journaled(before: dict[tuple[str, str, str], str], actuator: Actuator,
                                  state_dir) -> None:
    """Each knob that reads differently from `before` has its original in the restore journal on disk,
    as a fresh start would read it (an unreadable journal fails here)."""
    got = read_held(state_dir)
    held = {(h["kind"], h["target"], h["knob"]): h["original"] for h in (got[0] if got else [])}
    now = knob_values(actuator, sorted({(kind, target) for kind, target, _ in before}))
    changed = {key: (before[key], value) for key, value in now.items() if value != before.get(key, value)}
    unjournaled = {key: was for key, was in changed.items() if held.get(key) != was[0]}
    assert not unjournaled, f"changed with no journal entry holding the original: {unjournaled}"
