"""Helpers of koordd's benchmark scripts (scripts/bench-*, scripts/soak): the parts of scripts/bench-qos
(open-loop client, LS servers, BE antagonists, static knobs, statistics, report) and what the scripts
read of a process. Their own cgroups are koordtest.bench.cgroup_tree, koordd as a subprocess
koordtest.koordd_proc. Not part of the daemon: koordd never imports this."""
