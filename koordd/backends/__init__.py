"""Backends: one module per target kind (cgroup knobs, threads, tc, netclass, resctrl, sched_ext), each the Backend contract of koordd.core.backend over a kernel adapter. Imports core and kernel."""
