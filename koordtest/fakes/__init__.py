"""Fake kernel interfaces of plain files and objects: cgroup trees of every layout (cgroup), resctrl
(resctrl), perf (perf), netlink messages (netlink) and backends over fake kernels (backends)."""
