"""Support for koordd's tests and benchmarks, importable by name from the development venv (scripts/dev-env
installs it editable; never shipped): fake kernel trees (koordtest.fakes), the fuzzing profile, koordd as a
subprocess (koordtest.koordd_proc), the kernel tests' own cgroups (koordtest.kernel), the benchmarks and
their helpers (koordtest.bench) and scripts/vmtest's plan and verdict (koordtest.vmtest). koordd and
koordctl never import it."""
