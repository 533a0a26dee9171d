"""What no loop may evict or throttle, whatever the config says.

A config can be wrong: a BE pattern that also matches `system.slice`, a class root that holds LS
pods below it, a scope that is PID 1's. The actuator checks every evicting or throttling write
against this list before it reads the knob, so no loop and no config can kill, freeze, reclaim or
cap:
- a cgroup of class SYSTEM, LSE, LSR or LS, or one below such a class root (a BE root nested in
  an LS one too: whatever runs inside LS work is not koordd's to cut);
- a cgroup that holds one (killing or capping a parent reaches its children): a BE root with an LS
  job below it is found as such because the snapshot lists every class root at any depth
  (sensors/collect.py find_classified), not only the outermost.
- the cgroup of PID 1 or of koordd itself, or one that holds them.
Throttling means a lower cap than the knob's original value; weights are shares, not caps, and
raising a limit (cpu_burst on LS) is what protection is for. What a write does is the knob's to say,
beside it in its backend (KnobSpec.harm, koordd/core/backend.py): an act on the tasks (kill, freeze,
reclaim) or a cap that can be tighter; a knob that declares nothing does no harm.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping

from koordd.core.backend import KnobSpec
from koordd.core.cgroup_text import normalize_cgroup
from koordd.core.protected import Protected

# The limits a loop raises on protected work (cpu_burst on LS: its quota and burst), so that a restore
# there may lower them again: every other restore that would tighten a protected cgroup is refused.
# oom_score_adj alike: oom_shaping lowers LS's scores, and its restore raises them back.
GIVEN_BACK = frozenset({"cpu.max", "cpu.max.burst", "oom_score_adj"})


def harm(spec: KnobSpec | None, new: str, original: str | None) -> str | None:
    """What writing `new` over `original` (None: a command, nothing read) would do to the target's workload,
    as the knob declares it (KnobSpec.harm, koordd/core/backend.py); None when it only helps or restores,
    or the knob declares no harm (a weight, a knob of a backend that says nothing, no knob served)."""
    declared = getattr(spec, "harm", None)       # a third party's spec class may lack the attribute
    return declared.of(new, original) if declared is not None else None


class Guard:
    """The actuator's guard: what no write may do to this round's protected cgroups (Protected, built from
    the classes and the processes only when a write would do harm; most rounds write none)."""

    def __init__(self, processes: Mapping[str, str] | None = None):
        self.processes: dict[str, str] = dict(processes or {})     # cgroup -> whose (PID 1, koordd)
        self._classes: Mapping[str, str | None] = {}
        self._protected: Protected | None = None

    def protect(self, classes: Mapping[str, str | None]) -> None:
        """This round's classes (cgroup -> class, from the snapshot)."""
        self._classes, self._protected = classes, None

    @property
    def protected(self) -> Protected:
        if self._protected is None:
            self._protected = Protected.of(self._classes, self.processes)
        return self._protected

    def refusal(self, spec: KnobSpec, target: str, new: str, original: str | None) -> str | None:
        """Why writing `new` over `original` on `target` is refused, or None."""
        what = harm(spec, new, original)
        why = self.protected.why(target) if what else None
        return f"protected: would {what} {target or '/'}, which {why}" if why else None

    def restore_refusal(self, spec: KnobSpec, target: str, value: str, current: str) -> str | None:
        """Why putting `value` back over `current` on `target` is refused, or None. Not the kubelet rule: it
        keeps koordd from taking a knob from the kubelet; a restore gives back the kubelet's own value
        (test_kubelet.py::test_override_lets_the_write_through_and_restores_go_through_anyway).
        A protected class's own CPU limit may go back below its current value (cpu_burst gives back the quota
        it raised, the one limit a loop raises on protected work: GIVEN_BACK); nothing else is lowered there
        (a forged memory.max or cpuset), nothing is frozen, and nothing is capped where PID 1, koordd or a
        protected class root lies below (a forged hold on system.slice)."""
        refused = self.refusal(spec, target, value, current)
        if refused and (spec.name not in GIVEN_BACK or target.strip("/") in self.protected.holders):
            return refused
        return None


def standing_harm(guard: Protected, target: str, spec: KnobSpec | None, original: str,
                  current: Callable[[], str]) -> str | None:
    """Why a knob koordd holds changed on `target` (`original` its value before) must go back now, or
    None: it still throttles or freezes a cgroup the guard protects since it was written (an LS job
    started in be.slice, a nested class root the config now names). The guard refuses new writes
    only; this lifts the standing ones. `current` reads the knob; unreadable: nothing to say."""
    why = guard.why(target)
    if why is None:
        return None
    try:
        what = harm(spec, current(), original)
    except Exception:  # noqa: BLE001 - gone or unreadable this round: the next one sees it
        return None
    return f"protected: would go on to {what} {target or '/'}, which {why}" if what else None


def process_cgroups(proc: Path | str = "/proc", pids: Mapping[str, int] | None = None) -> dict[str, str]:
    """cgroup -> whose, for PID 1 and koordd: every path /proc/PID/cgroup names (v1 hierarchies
    and v2 alike; on a hybrid host they usually agree). An unreadable file protects nothing extra:
    the root is protected anyway as their ancestor."""
    pids = pids if pids is not None else {"PID 1": 1, "koordd": os.getpid()}
    out: dict[str, str] = {}
    for whose, pid in pids.items():
        try:
            text = Path(proc, str(pid), "cgroup").read_text()
        except OSError:
            out.setdefault("", whose)
            continue
        for line in text.splitlines():
            path = line.split(":", 2)[-1]
            try:
                out.setdefault(normalize_cgroup(path), whose)
            except ValueError:
                continue
    return out
