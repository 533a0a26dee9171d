"""BPF programs koordd loads (C sources and the sched_ext object, shipped as package data)."""
