"""sched_ext: run the threads of chosen classes under sched_ext, the kernel's BPF scheduling class.

Every class root of the classes in `ext_classes` gets `sched_policy = "ext"`: each thread of it and
of the cgroups below it gets the SCHED_EXT policy, asked for every round, so threads started since
the last round (the cgroup then reads "mixed") are brought in line. Where a BPF scheduler runs in
partial mode (`switch_all` 0, loaded with SCX_OPS_SWITCH_PARTIAL) only SCHED_EXT threads are
scheduled by it, everything else stays with the kernel's fair scheduler: this loop chooses which
classes it gets (with `switch_all` 1 it takes every fair thread anyway). While none is loaded
(state "disabled") the kernel runs SCHED_EXT threads in the fair class as normal ones, so setting
the policy ahead changes nothing; when a scheduler unloads, or the kernel ejects it after an error,
they fall back to the fair class at once.

The scheduler: with `scheduler = "koordd"` koordd loads its own (koordd/bpf/koordd_sched.bpf.o, see
docs/sched-ext.md): LS, LSR and LSE threads first, BE threads only on CPUs LS leaves idle, BE
preempted when LS wakes. Each class root of `ext_classes` gets its class in the scheduler's map
(knob `scheduler_class`) before the scheduler starts and every round after; the node-wide knob
`scheduler` then loads it with the safe switch (wait for "disabled", load, confirm "enabled",
`root/ops` "koordd" and a higher `enable_seq`, else the kernel's scheduler stays and the refusal
says why). A scheduler another program loaded is never stopped: koordd's is refused, naming it.
`scheduler_when` says when: "always", or "ls_slack": while LS's worst slack (the LS classes'
`[classes.health]` targets, as be_suppress and net_shaping read them) is under `scheduler_slack`,
and `scheduler_hold` after it last was, so it does not come and go with every round. Partial mode
runs fair-class threads before any SCHED_EXT one, so LS on the scheduler next to BE in the fair
class would wait for BE: `scheduler = "koordd"` needs an LS class and BE in `ext_classes`. On stop,
or when it is no longer wanted, koordd unloads it; if koordd dies the kernel unloads it, as the
scheduler lives only as long as koordd holds its link. The kernel's sched_ext state is recorded
with every decision (`sched_ext_state`, `ops`, `enable_seq`). On a kernel without sched_ext
(CONFIG_SCHED_CLASS_EXT, Linux 6.12+) each write is refused, recorded once per target, and
`koordctl doctor` says why.

Restore (on stop, when the loop is disabled, when a class leaves `ext_classes` or a cgroup leaves
its class): the threads go back to the policy they had (normal where they had several).

A thread has one policy: with `be_cpu_idle` (on by default) qos_baseline owns BE's `sched_policy`
(SCHED_IDLE threads where the kubelet owns the group), so a config with BE in `ext_classes` is
refused at load, naming the line; set qos_baseline's `be_cpu_idle = false` to put BE on sched_ext.
Off by default (no classes).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from koordd.core.classes import WORKLOAD_CLASSES
from koordd.core.health import LATENCY_SENSITIVE, RunqWindow, ls_signals, worst_slack
from koordd.core.slo import SloWindow
from koordd.core.loop import Action, Loop, NODE, restore
from koordd.core.options import ClassList, Duration, Option
from koordd.core.snapshot import RUNQ_LATENCY, SCHED_EXT, SchedExtStatus, Snapshot
from koordd.core.targets import SCHED_EXT_TARGET as TARGET

CLASSES = WORKLOAD_CLASSES


@dataclass
class State:
    unhealthy_at: float | None = None           # ls_slack: when LS's slack was last under scheduler_slack
    runq: RunqWindow = field(default_factory=RunqWindow)
    slo: SloWindow = field(default_factory=SloWindow)      # LS slack: recent rounds' responses per SLO


class SchedExt(Loop):
    __doc__ = __doc__
    name = "sched_ext"
    options = (
        ClassList("ext_classes", tuple, (), "classes whose threads get the SCHED_EXT policy (run by a loaded "
                  "BPF scheduler, as normal ones while none is)", choices=CLASSES),
        Option("scheduler", str, "none", "koordd: load koordd's own BPF scheduler for the threads of ext_classes "
               "(LS first, BE only on CPUs LS leaves idle); none: leave scheduling to whatever runs",
               choices=("none", "koordd")),
        Option("scheduler_when", str, "always", "when koordd's scheduler runs: always, or ls_slack (while LS's "
               "worst slack is under scheduler_slack, and scheduler_hold after)", choices=("always", "ls_slack")),
        Option("scheduler_slack", float, 0.10, "ls_slack: load the scheduler while LS's worst slack (1 - measured "
               "/ target) is under this", min=-1, max=1),
        Option("scheduler_hold", Duration, Duration(60.0), "ls_slack: how long it stays after LS's slack was last "
               "under scheduler_slack", min=0, max=86400),
    )

    @staticmethod
    def problems(settings) -> dict[str, str]:
        if settings.scheduler == "koordd" and not (
                "BE" in settings.ext_classes and set(LATENCY_SENSITIVE) & set(settings.ext_classes)):
            return {"scheduler": "koordd's scheduler needs an LS class and BE in ext_classes: in partial mode "
                                 "the fair class runs first, so LS on it would wait for BE left in the fair class"}
        return {}

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        policy = {(cls, "sched_policy") for cls in settings.ext_classes}
        if settings.scheduler == "none":
            return frozenset(policy)
        return frozenset(policy | {(cls, "scheduler_class") for cls in settings.ext_classes} | {(NODE, "scheduler")})

    @staticmethod
    def needs(settings) -> frozenset[str]:
        if settings.scheduler == "koordd" and settings.scheduler_when == "ls_slack":
            return frozenset({SCHED_EXT, RUNQ_LATENCY, "cpu_pressure"})
        return frozenset({SCHED_EXT})

    @staticmethod
    def initial_state(settings) -> State:
        return State()

    @staticmethod
    def decide(snapshot: Snapshot, settings, state: State) -> list[Action]:
        kernel = _kernel_reason(snapshot.section(SCHED_EXT))
        roots = [(cls, cg) for cls in settings.ext_classes for cg in snapshot.of_class(cls)]
        actions = []
        if "sched_policy" in snapshot.supported:        # else no hierarchy lists threads here (doctor says why)
            actions += [Action(cg.path, "sched_policy", "ext", {"class": cls, **kernel},
                               f"{cls} threads run under sched_ext (state {kernel['sched_ext_state']})")
                        for cls, cg in roots]
        held = (TARGET, "scheduler") in snapshot.held
        if settings.scheduler == "none":
            return actions + ([restore(TARGET, "scheduler", "scheduler = none: the kernel's scheduler runs")]
                              if held else [])
        # The classes first: the scheduler starts with them in its map.
        actions += [Action(cg.path, "scheduler_class", cls, {"class": cls}, f"{cls} in koordd's scheduler")
                    for cls, cg in roots]
        wanted, reason = _scheduler_wanted(snapshot, settings, state)
        if wanted:
            return actions + [Action(TARGET, "scheduler", "koordd", {**reason, **kernel},
                                     f"koordd's scheduler runs {'/'.join(settings.ext_classes)} ({reason['why']})")]
        return actions + ([restore(TARGET, "scheduler", f"koordd's scheduler not needed ({reason['why']})", **reason)]
                          if held else [])


def _scheduler_wanted(snapshot: Snapshot, settings, state: State) -> tuple[bool, dict]:
    """Whether koordd's scheduler should run this round, and why."""
    if settings.scheduler_when == "always":
        return True, {"why": "scheduler_when = always"}
    health = worst_slack(ls_signals(snapshot, snapshot.section(RUNQ_LATENCY), state.runq, state.slo))
    if health is None:
        return _held(snapshot.time, settings, state, {"why": "no LS health signal"})
    slack, worst = health
    reason = {"slack": round(slack, 3), "worst": worst, "scheduler_slack": settings.scheduler_slack}
    if slack < settings.scheduler_slack:
        state.unhealthy_at = snapshot.time
        return True, {**reason, "why": f"LS slack {slack:.2f} under {settings.scheduler_slack:g}"}
    return _held(snapshot.time, settings, state, {**reason, "why": f"LS slack {slack:.2f}"})


def _held(now: float, settings, state: State, reason: dict) -> tuple[bool, dict]:
    """Slack is back (or unknown): the scheduler stays until scheduler_hold has passed since it was not."""
    if state.unhealthy_at is not None and now - state.unhealthy_at < settings.scheduler_hold:
        return True, {**reason, "why": f"{reason['why']}, held {settings.scheduler_hold - (now - state.unhealthy_at):.0f}s more"}
    state.unhealthy_at = None
    return False, reason


def _kernel_reason(status: SchedExtStatus | None) -> dict:
    """What the kernel's sched_ext is doing, for the decision record; "unknown" without the sensor's section
    (no sched_ext in this kernel: the write is refused saying so)."""
    if status is None:
        return {"sched_ext_state": "unknown"}
    return {"sched_ext_state": status.state, "ops": status.ops, "enable_seq": status.enable_seq}
