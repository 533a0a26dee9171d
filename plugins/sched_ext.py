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

What it does now: the policy only. The scheduler is loaded by its own program (scx_flatcg,
scx_layered, the scx_loader service); the loop reads its state from the `sched_ext` sensor and
records it with every decision (`sched_ext_state`, `ops`, `enable_seq`). Loading a scheduler of
koordd's own and switching safely (stop the old one, wait for "disabled", start, confirm "enabled",
the expected `root/ops` and a higher `enable_seq`, else fall back to the kernel's default) is to be
a node-wide knob of this loop. On a kernel without sched_ext (CONFIG_SCHED_CLASS_EXT, Linux 6.12+)
each write is refused, recorded once per cgroup, and `koordctl doctor` says why.

Restore (on stop, when the loop is disabled, when a class leaves `ext_classes` or a cgroup leaves
its class): the threads go back to the policy they had (normal where they had several).

A thread has one policy: with `be_cpu_idle` (on by default) qos_baseline owns BE's `sched_policy`
(SCHED_IDLE threads where the kubelet owns the group), so a config with BE in `ext_classes` is
refused at load, naming the line; set qos_baseline's `be_cpu_idle = false` to put BE on sched_ext.
Off by default (no classes).
"""
from __future__ import annotations

from koordd.loop import Action, Loop
from koordd.options import ClassList
from koordd.sched_ext import SchedExtStatus
from koordd.snapshot import SCHED_EXT, Snapshot

CLASSES = ("LSE", "LSR", "LS", "BE")


class SchedExt(Loop):
    __doc__ = __doc__
    name = "sched_ext"
    options = (
        ClassList("ext_classes", tuple, (), "classes whose threads get the SCHED_EXT policy (run by a loaded "
                  "BPF scheduler, as normal ones while none is)", choices=CLASSES),
    )

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        return frozenset((cls, "sched_policy") for cls in settings.ext_classes)

    @staticmethod
    def needs(settings) -> frozenset[str]:
        return frozenset({SCHED_EXT})

    @staticmethod
    def decide(snapshot: Snapshot, settings, state) -> list[Action]:
        if "sched_policy" not in snapshot.supported:
            return []               # no hierarchy lists threads here (doctor says why)
        kernel = _kernel_reason(snapshot.section(SCHED_EXT))
        return [Action(cg.path, "sched_policy", "ext", {"class": cls, **kernel},
                       f"{cls} threads run under sched_ext (state {kernel['sched_ext_state']})")
                for cls in settings.ext_classes for cg in snapshot.of_class(cls)]


def _kernel_reason(status: SchedExtStatus | None) -> dict:
    """What the kernel's sched_ext is doing, for the decision record; "unknown" without the sensor's section
    (no sched_ext in this kernel: the write is refused saying so)."""
    if status is None:
        return {"sched_ext_state": "unknown"}
    return {"sched_ext_state": status.state, "ops": status.ops, "enable_seq": status.enable_seq}
