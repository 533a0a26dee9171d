"""koordd's benchmarks and their helpers. Each scripts/bench-* (and scripts/soak) is an entry point of one
module here, which holds its logic and its main(): bench-X's is koordtest.bench.X with dashes as
underscores, except bench-io's, io_qos (`io` is the standard library's). Shared: common (SIGTERM as
Ctrl-C, an option's value as TOML, the report's command line, host and cells), procstat (what a process
and the node use), cgroup_tree (a benchmark's own cgroups), koordtest.koordd_proc (koordd as a
subprocess, to_toml for its config); bench-qos's open-loop client, LS servers, BE antagonists, static
knobs, statistics and report. Not part of the daemon: koordd never imports this."""
