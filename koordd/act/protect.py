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
raising a limit (cpu_burst on LS) is what protection is for.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping

from koordd.backends.cgroup import KNOBS
from koordd.backends.oom import parse as parse_oom_score
from koordd.core.blkio import tighter as blkio_tighter
from koordd.core.cgroup import normalize_cgroup, parse_cpulist
from koordd.core.protected import Protected

# Acts on the tasks themselves: refused on a protected cgroup whatever the value (thawing excepted).
EVICTING = {"cgroup.kill": "kill", "memory.reclaim": "reclaim memory of", "cgroup.freeze": "freeze",
            "cgroup.prekill": "run the prekill hook of"}      # the prelude to a kill (memory_evict)


def _lower(magnitude: Callable[[str], float]) -> Callable[[str, str], bool]:
    def lower(new: str, original: str) -> bool:
        try:
            return magnitude(new) < magnitude(original)
        except (ValueError, ZeroDivisionError):
            return True             # a value we cannot compare is not one we may write here
    return lower


def _cpus(text: str) -> float:
    # An empty v2 cpuset.cpus is no restriction: the parent's CPUs apply.
    return float("inf") if not text.strip() else len(parse_cpulist(text))


def _oom_raised(new: str, original: str) -> bool:
    """oom_score_adj: whether `new` puts any process above the lowest value it had (the kernel's OOM
    killer would take it sooner). Readings may be "mixed ..." (koordd/backends/oom.py)."""
    try:
        new_common, new_own = parse_oom_score(new)
        old_common, old_own = parse_oom_score(original)
    except ValueError:
        return True                 # a value we cannot compare is not one we may write here
    if new_common is None or old_common is None:
        return False                # no processes: nothing is made likelier to die
    return max([new_common, *new_own.values()]) > min([old_common, *old_own.values()])


def _by_magnitude(knob: str) -> Callable[[str, str], bool]:
    """Tighter by the knob table's own magnitude (koordd/backends/cgroup.py), the one the write order uses."""
    return _lower(KNOBS[knob].magnitude)


# knob -> (what the write does, whether `new` is a tighter cap than `original`)
THROTTLING: dict[str, tuple[str, Callable[[str, str], bool]]] = {
    "cpu.max": ("cap the CPU of", _by_magnitude("cpu.max")),
    "cpu.max.burst": ("cut the CPU burst of", _by_magnitude("cpu.max.burst")),
    "cpuset.cpus": ("shrink the CPUs of", _lower(_cpus)),
    "memory.max": ("cap the memory of", _by_magnitude("memory.max")),
    "memory.high": ("throttle the memory of", _by_magnitude("memory.high")),
    # Less swap pushes anon memory into RAM or the OOM killer instead: a cap like memory.max.
    "memory.swap.max": ("cap the swap of", _by_magnitude("memory.swap.max")),
    "cpu.idle": ("make idle", lambda new, old: new.strip() == "1" and old.strip() != "1"),
    # io_qos: a lower rbps/wbps/riops/wiops on any device (koordd/core/blkio.py); io.weight is a share.
    "io.max": ("cap the IO of", blkio_tighter),
    # oom_shaping: BE's processes first in the OOM killer's line, and BE pods killed whole.
    "oom_score_adj": ("raise the OOM score of", _oom_raised),
    "memory.oom.group": ("make the OOM killer take all of", lambda new, old: new.strip() == "1" and old.strip() != "1"),
    "sched_policy": ("demote the threads of", lambda new, old: new in ("idle", "batch") and new != old),
    "scheduler_class": ("put in the BE class", lambda new, old: new == "BE" and new != old),
    "net_class": ("shape the egress of", lambda new, old: new == "be" and new != old),
    # llc_partition's BE group (plugins/llc_partition.py group_of): a few cache ways, a share of the
    # memory bandwidth, for every thread of the cgroup and below it.
    "resctrl_group": ("confine the cache of", lambda new, old: new == "koordd-BE" and new != old),
}


# The limits a loop raises on protected work (cpu_burst on LS: its quota and burst), so that a restore
# there may lower them again: every other restore that would tighten a protected cgroup is refused.
# oom_score_adj alike: oom_shaping lowers LS's scores, and its restore raises them back.
GIVEN_BACK = frozenset({"cpu.max", "cpu.max.burst", "oom_score_adj"})


def harm(knob: str, new: str, original: str | None) -> str | None:
    """What the write would do to its target's workload, or None when it only helps or restores."""
    if knob in EVICTING:
        return None if knob == "cgroup.freeze" and new.strip() == "0" else EVICTING[knob]
    if knob in THROTTLING:
        what, tighter = THROTTLING[knob]
        return what if original is not None and tighter(new, original) else None
    return None


def standing_harm(guard: Protected, target: str, knob: str, original: str, current: Callable[[], str]) -> str | None:
    """Why a knob koordd holds changed on `target` (`original` its value before) must go back now, or
    None: it still throttles or freezes a cgroup the guard protects since it was written (an LS job
    started in be.slice, a nested class root the config now names). The guard refuses new writes
    only; this lifts the standing ones. `current` reads the knob; unreadable: nothing to say."""
    why = guard.why(target)
    if why is None:
        return None
    try:
        what = harm(knob, current(), original)
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
