"""qos_baseline: the static per-class knobs, put back every tick when someone else rewrites them.

Reads: which cgroups belong to BE, LS and LSR; which knobs this host has; for percentages, each
cgroup's `memory.max` and the node's memory; the knobs koordd already holds changed.

Writes, on every class root of the class (the same value on each):
- BE `cpu.idle` = 1 (`be_cpu_idle`): the group runs as SCHED_IDLE, the upstream form of Group
  Identity: BE gets a CPU only when nothing else wants it (on a shared CPU an LS task keeps about
  99.7% of it, weight 1024 against 3). Writing `cpu.idle` makes the kernel set the group's weight
  (1 while idle; 100 when idle goes back to 0, whatever it was before), so the loop first sets BE's
  `cpu.weight` to 1 — what idle shows anyway — to save the original weight, and restoring puts
  `cpu.idle` back first, then the weight.
- BE `sched_policy` = idle instead, on BE cgroups at or below `be_thread_idle_cgroups` (the
  kubelet's by default): every thread gets the SCHED_IDLE policy, and the group's `cpu.weight` is
  left to the kubelet. The kubelet writes the weights of its QoS and pod cgroups itself (BestEffort:
  the lowest, `cpu.shares` 2) and would get EINVAL on an idle group (the kernel pins an idle group's
  weight), failing its QoS setup on restart; it never touches thread policies. Idle threads are
  preempted by any waking non-idle task, whatever its cgroup, as in an idle group; what they lack is
  the idle group's weight of 3, which the kubelet's lowest weight nearly matches.
- Without `cpu.idle` on this host (Linux < 5.15), or with `be_cpu_idle = false`, BE gets
  `cpu.weight` = `be_cpu_weight` instead (default 1, the minimum: about 1% of a CPU LS wants at the
  default weight 100); without `cpu.idle` but with `be_cpu_idle`, its threads get SCHED_IDLE too.
- LS and LSR `cpu.weight` (`ls_cpu_weight`, `lsr_cpu_weight`).
- LS `memory.low` and `memory.min` (`ls_memory_low`, `ls_memory_min`): memory that reclaim takes
  from LS last (low) or never (min).
- BE `memory.high` (`be_memory_high`): above it BE's allocations are throttled and reclaimed
  instead of growing into the memory LS needs.
A memory value is bytes with an optional binary suffix K, M, G, T ("512M", "1.5G"), "max", or a
percentage ("50%") of the cgroup's own `memory.max`, or of the node's memory where that is
unlimited. 0 or "" leaves a knob alone (and puts it back if koordd had changed it).

Where the host lacks a knob it is skipped without a word: cgroup v1 (and hybrid hosts, whose memory
controller is v1) has no `memory.high`, `memory.low` or `memory.min`, so there the memory options do
nothing; `koordctl doctor` shows the host's layout.

Reconciled: the loop asks for every value on every tick, and the actuator writes only those that
differ, so a value rewritten by someone else (kubelet, systemd, an operator) is corrected within one
interval, each correction a decision in the journal. Do not let two managers own one knob: set it
to 0 / "" here when the kubelet (e.g. its MemoryQoS feature) or a unit file is meant to decide it.

Restore (on stop, when the loop is disabled, or when a knob is turned off or a cgroup leaves its
class): the value the knob had before koordd's FIRST write, not whatever another agent wrote in
between — koordd overwrote those rewrites within a tick, and cannot tell a rewrite that restates
the other agent's intent from one that changes it. An agent that keeps its own value (the kubelet
re-applies its cgroup values periodically) sets it again after koordd stops.
"""
from __future__ import annotations

from typing import Any

from koordd.core.cgroup_text import pattern_rank
from koordd.core.loop import Action, Loop, restore
from koordd.core.options import Option, PatternList
from koordd.core.snapshot import CgroupSample, Snapshot
from koordd.core.units import parse_memory_value

MIN_WEIGHT = 1              # cpu.weight's floor; also what the kernel shows for an idle group
MAX_WEIGHT = 10000


# --- memory values ----------------------------------------------------------------------------

class MemoryOption(Option):
    """A memory value option: checked (and written back as its tidy text) when the config loads."""

    def convert(self, value: Any) -> str:
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise ValueError(f"expected a size such as \"512M\", a percentage or \"max\", got {type(value).__name__}")
        parsed = parse_memory_value(value)
        if parsed is None:
            return ""
        return "max" if parsed[0] == "max" else (str(value).strip() if isinstance(value, str) else str(value))


def memory_target(setting: str, sample: CgroupSample, node_memory: int | None) -> tuple[str | None, dict]:
    """The knob value (canonical: bytes or "max") a setting asks for on this cgroup, and the numbers
    behind it; None when a percentage has nothing to be a percentage of."""
    kind, n = parse_memory_value(setting)            # settings were checked when the config loaded
    if kind == "max":
        return "max", {"setting": setting}
    if kind == "bytes":
        return str(int(n)), {"setting": setting}
    limited = sample.memory_max not in (None, "max")
    base = int(sample.memory_max) if limited else node_memory
    if base is None:
        return None, {}
    return str(int(base * n / 100)), {"setting": setting, "base_bytes": base,
                                      "base": "memory.max" if limited else "node memory"}


# --- the loop -----------------------------------------------------------------------------------

class QosBaseline(Loop):
    __doc__ = __doc__
    name = "qos_baseline"
    options = (
        Option("be_cpu_idle", bool, True, "BE runs as SCHED_IDLE (cpu.idle = 1) where the kernel has cpu.idle (Linux 5.15+)"),
        PatternList("be_thread_idle_cgroups", tuple, ("kubepods.slice", "kubepods"),
                    "BE cgroups at or below these get SCHED_IDLE threads instead of cpu.idle, and their "
                    "cpu.weight is left to the kubelet"),
        Option("be_cpu_weight", int, MIN_WEIGHT,
               "BE cpu.weight where cpu.idle is not used (no cpu.idle, or be_cpu_idle = false); 0 = leave alone",
               min=0, max=MAX_WEIGHT),
        Option("ls_cpu_weight", int, 0, "LS cpu.weight; 0 = leave alone", min=0, max=MAX_WEIGHT),
        Option("lsr_cpu_weight", int, 0, "LSR cpu.weight; 0 = leave alone", min=0, max=MAX_WEIGHT),
        MemoryOption("ls_memory_low", str, "", "LS memory.low (cgroup v2); size, % or max; \"\" = leave alone"),
        MemoryOption("ls_memory_min", str, "", "LS memory.min (cgroup v2); size, % or max; \"\" = leave alone"),
        MemoryOption("be_memory_high", str, "", "BE memory.high (cgroup v2); size, % or max; \"\" = leave alone"),
    )

    @staticmethod
    def needs(settings) -> frozenset[str]:
        # memory.max is the base of "N%" memory settings; every knob value is read by the actuator.
        return frozenset({"memory_max"})

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        out = set()
        if settings.be_cpu_idle:
            # The weight: saved before idle changes it. The policy: where the kubelet owns the group.
            out |= {("BE", "cpu.idle"), ("BE", "cpu.weight"), ("BE", "sched_policy")}
        if settings.be_cpu_weight:
            out.add(("BE", "cpu.weight"))
        if settings.ls_cpu_weight:
            out.add(("LS", "cpu.weight"))
        if settings.lsr_cpu_weight:
            out.add(("LSR", "cpu.weight"))
        for cls, knob, value in _memory_settings(settings):
            if value:
                out.add((cls, knob))
        return frozenset(out)

    @staticmethod
    def decide(snapshot: Snapshot, settings, state) -> list[Action]:
        actions: list[Action] = []
        for cg in snapshot.of_class("BE"):
            actions += _be_cpu(snapshot, cg, settings)
        for cls, weight in (("LS", settings.ls_cpu_weight), ("LSR", settings.lsr_cpu_weight)):
            if weight and "cpu.weight" in snapshot.supported:
                for cg in snapshot.of_class(cls):
                    actions.append(Action(cg.path, "cpu.weight", str(weight),
                                          {"class": cls, "cpu_weight": weight}, f"{cls} cpu.weight {weight}"))
        for cls, knob, setting in _memory_settings(settings):
            if not setting or knob not in snapshot.supported:
                continue
            for cg in snapshot.of_class(cls):
                value, why = memory_target(setting, cg, snapshot.node.memory_total)
                if value is None:
                    continue          # a percentage of an unknown amount: hold whatever is there
                actions.append(Action(cg.path, knob, value, {"class": cls, **why},
                                      f"{cls} {knob} {setting}" + (f" of {why['base']}" if "base" in why else "")))
        return actions


def _memory_settings(settings) -> tuple[tuple[str, str, str], ...]:
    return (("LS", "memory.low", settings.ls_memory_low), ("LS", "memory.min", settings.ls_memory_min),
            ("BE", "memory.high", settings.be_memory_high))


def _be_cpu(snapshot: Snapshot, cg: CgroupSample, settings) -> list[Action]:
    supported = snapshot.supported
    idle_held = (cg.path, "cpu.idle") in snapshot.held
    # The kubelet's groups (by default): their weight is the kubelet's, idle goes on their threads.
    kubelets = pattern_rank(cg.path, settings.be_thread_idle_cgroups) < len(settings.be_thread_idle_cgroups)
    by_thread = settings.be_cpu_idle and kubelets
    out = []
    if settings.be_cpu_idle and "cpu.idle" in supported and not by_thread:
        if not idle_held:
            # Before the first idle write only: save the weight the kernel is about to overwrite. Once
            # idle is ours the kernel pins the weight at 1 (a write would be refused), and an idle
            # reset by someone else is undone by writing idle again.
            out.append(Action(cg.path, "cpu.weight", str(MIN_WEIGHT),
                              {"class": "BE", "cpu_weight": MIN_WEIGHT, "for": "cpu.idle"},
                              "BE cpu.weight 1 before cpu.idle (the kernel resets the weight when idle changes)"))
        out.append(Action(cg.path, "cpu.idle", "1", {"class": "BE", "cpu_idle": 1},
                          "BE runs as SCHED_IDLE (cpu.idle 1)"))
        return out + _release(snapshot, cg, "sched_policy", "BE runs as an idle group")
    if idle_held:
        # Idle no longer wanted here: put it back first, as that resets the weight set below.
        out.append(restore(cg.path, "cpu.idle", "BE threads run as SCHED_IDLE instead" if by_thread
                           else "be_cpu_idle is off" if not settings.be_cpu_idle else "this kernel has no cpu.idle"))
    thread_idle = settings.be_cpu_idle and (by_thread or "cpu.idle" not in supported)
    if thread_idle and "sched_policy" in supported:
        why = ("the kubelet owns this group's cpu.weight" if by_thread else "this kernel has no cpu.idle")
        out.append(Action(cg.path, "sched_policy", "idle", {"class": "BE", "sched_policy": "idle",
                                                            "placement": "threads", "why": why},
                          f"BE threads run as SCHED_IDLE ({why})"))
    elif not thread_idle:
        out += _release(snapshot, cg, "sched_policy", "be_cpu_idle is off")
    weight = settings.be_cpu_weight
    if weight and not kubelets and "cpu.weight" in supported:
        fallback = settings.be_cpu_idle          # wanted idle, but this kernel has no cpu.idle
        out.append(Action(cg.path, "cpu.weight", str(weight),
                          {"class": "BE", "cpu_weight": weight, "cpu_idle_available": "cpu.idle" in supported},
                          f"BE cpu.weight {weight}" + (" (this kernel has no cpu.idle)" if fallback else "")))
    elif kubelets:
        out += _release(snapshot, cg, "cpu.weight", "the kubelet owns this group's cpu.weight")
    return out


def _release(snapshot: Snapshot, cg: CgroupSample, knob: str, why: str) -> list[Action]:
    """Give back a knob koordd holds on this cgroup and no longer wants; nothing if it holds none."""
    return [restore(cg.path, knob, why)] if (cg.path, knob) in snapshot.held else []
