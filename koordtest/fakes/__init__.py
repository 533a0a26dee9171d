"""Fake kernel interfaces of plain files and objects: cgroup trees of every layout (cgroup), resctrl
(resctrl), perf (perf), netlink messages (netlink), a /proc for the sysctl backend (procfs) and backends
over fake kernels (backends)."""
