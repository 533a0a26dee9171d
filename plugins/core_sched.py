"""core_sched: work of different classes never shares an SMT core (core scheduling).

Every class root of the classes in `classes` gets `core_sched` = its class name: all threads of all
cgroups of a class share one core-scheduling cookie, so the kernel runs two threads on the two SMT
siblings of a core at the same time only when they have the same cookie. A thread without a cookie
(every class left out, the host's own services) counts as one more cookie: `classes = ["BE"]` is enough
to keep BE off the siblings of everything else, LS included; `["LS", "BE"]` keeps each of them to
itself, and the untagged rest to itself too. The kernel forces a sibling idle rather than mix them:
the price is throughput (a core half idle while only one side has work), what it buys is that BE can
neither slow LS through the shared core's caches and pipelines nor observe it (the hw-vuln reason).

A class root inside a chosen one (an LS job in be.slice) gets a cookie of its own class, whatever
`classes` says, so it never takes the outer class's; that is also why the loop claims `core_sched` of
every class (koordd/backends/core_sched.py leaves such a cgroup's threads out of the outer one's).

Asked every round, so threads started since the last round (the cgroup then reads "mixed") are brought
in line: a thread inherits its creator's cookie, so most new ones already have it.

Restore (on stop, when the loop is disabled, when a class leaves `classes` or a cgroup leaves its
class): the cookies are cleared, the kernel's only way back (koordd/backends/core_sched.py says what
that cannot restore: a cookie another program had set). Needs a kernel with CONFIG_SCHED_CORE (5.14+) on
a machine with SMT; elsewhere each write is refused, recorded once per cgroup, and `koordctl doctor`'s
core_sched row says which is missing. Off by default (no classes).
"""
from __future__ import annotations

from koordd.core.classes import CLASS_NAMES, WORKLOAD_CLASSES
from koordd.core.loop import Action, Loop, restore
from koordd.core.options import ClassList


class CoreSched(Loop):
    __doc__ = __doc__
    name = "core_sched"
    options = (
        ClassList("classes", tuple, (), "classes whose threads get a core-scheduling cookie of their own "
                  "(one per class): they share an SMT core only with their own class", choices=WORKLOAD_CLASSES),
    )

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        # Every class: a class root nested in a chosen one (an LS job in be.slice) gets a cookie of its own.
        return frozenset((cls, "core_sched") for cls in CLASS_NAMES) if settings.classes else frozenset()

    @staticmethod
    def needs(settings) -> frozenset[str]:
        return frozenset()          # the class roots' paths only; the backend reads the threads

    @staticmethod
    def decide(snapshot, settings, state) -> list[Action]:
        chosen = [cg for cls in settings.classes for cg in snapshot.of_class(cls)]
        actions = [Action(cg.path, "core_sched", cg.cls, {"class": cg.cls},
                          f"{cg.cls} threads share one core-scheduling cookie: no SMT sibling with another class")
                   for cg in chosen]
        # A class root inside a chosen one: its threads would take the outer class's cookie; they get their
        # own class's instead, whatever `classes` says (an LS job in be.slice never shares a core with BE).
        nested, seen, stack = snapshot.nested(), {cg.path for cg in chosen}, [cg.path for cg in chosen]
        while stack:
            for inner in nested.get(stack.pop(), ()):
                if inner not in seen:
                    seen.add(inner)
                    stack.append(inner)
                    cls = snapshot.cgroups[inner].cls
                    actions.append(Action(inner, "core_sched", cls, {"class": cls, "inside": "a chosen class root"},
                                          f"{cls} root inside a {'/'.join(settings.classes)} root: a cookie of "
                                          f"its own class"))
        # writes() names every class, so the runner keeps what a class that left `classes` holds: let it go.
        wanted = {a.target for a in actions}
        actions += [restore(path, knob, "its class is no longer in core_sched's classes")
                    for path, knob in sorted(snapshot.held) if knob == "core_sched" and path not in wanted]
        return actions
