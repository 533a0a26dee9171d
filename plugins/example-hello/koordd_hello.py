"""hello: every BE class root gets cpu.weight = `weight`, so BE runs on the CPU the other classes leave.

An example of a loop from a package of its own (koordd's docs/plugins.md walks through it). The loop only
decides; koordd does the rest: it checks the [loops.hello] section against `options`, refuses a config in
which another enabled loop also writes BE's cpu.weight (qos_baseline's be_cpu_weight), samples what
needs() names, applies the actions through its backends, records each change as a decision of loop
"hello", and puts the weight it found back when the loop is disabled or koordd stops.
"""
from __future__ import annotations

from koordd.core.classes import BE
from koordd.core.loop import Action, Loop
from koordd.core.options import Option


class Hello(Loop):
    __doc__ = __doc__                   # the loop's user documentation
    name = "hello"                      # its config section and its entry point's name
    options = (
        Option("weight", int, 1, "cpu.weight of every BE class root (1 to 10000; v1: cpu.shares)", min=1, max=10000),
    )

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        return frozenset({(BE, "cpu.weight")})      # no other enabled loop may write it too

    @staticmethod
    def needs(settings) -> frozenset[str]:
        return frozenset()              # the class roots' paths are enough: no cgroup file read for it

    @staticmethod
    def decide(snapshot, settings, state) -> list[Action]:
        # Asked every round: the actuator writes only what differs, and journals the value it replaces.
        return [Action(cg.path, "cpu.weight", str(settings.weight), {"weight": settings.weight},
                       f"BE runs at cpu.weight {settings.weight}")
                for cg in snapshot.of_class(BE)]
