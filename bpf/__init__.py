"""BPF programs koordd loads with bcc (C sources, shipped as package data)."""
