"""Helpers of koordd's benchmark scripts (scripts/bench-*): cgroups of their own on the real hierarchy,
koordd as a subprocess, and the parts of scripts/bench-qos (open-loop client, LS servers, BE
antagonists, statistics, report). Not part of the daemon: koordd never imports this."""
