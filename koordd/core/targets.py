"""The names of node-wide targets: what a loop writes and the backend of that kind serves, named once."""
from __future__ import annotations

RESCTRL_TARGET = "resctrl"          # the target of resctrl.mount: the filesystem at the resctrl backend's mount point
SCHED_EXT_TARGET = "sched_ext"      # the node-wide target of `scheduler` (koordd/backends/sched_ext.py)
SYSCTL_TARGET = "node"              # the node-wide target of the sysctl knobs (koordd/backends/sysctl.py): /proc/sys
PM_QOS_TARGET = "node"              # the node-wide target of cpu_dma_latency (koordd/backends/pm_qos.py): one per host
