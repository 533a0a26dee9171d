"""koordd's QoS classes, named once: every tuple of class names elsewhere is built from these.

SYSTEM: the host's own services. LSE, LSR, LS: latency-sensitive (exclusive CPUs, reserved CPUs,
shared); BE: best effort. A config's `[[classes]]` rule gives each cgroup pattern one of them."""
from __future__ import annotations

SYSTEM, LSE, LSR, LS, BE = "SYSTEM", "LSE", "LSR", "LS", "BE"
CLASS_NAMES = (SYSTEM, LSE, LSR, LS, BE)            # every class, in the config's order
WORKLOAD_CLASSES = (LSE, LSR, LS, BE)               # the classes of workloads (all but SYSTEM)
LATENCY_SENSITIVE = (LSE, LSR, LS)
RESERVED_CPUS = (LSE, LSR)                          # the classes whose CPUs are theirs (cpuset)
PROTECTED_CLASSES = frozenset({SYSTEM, *LATENCY_SENSITIVE})     # never evicted or throttled
NON_BE = (SYSTEM, *LATENCY_SENSITIVE)
