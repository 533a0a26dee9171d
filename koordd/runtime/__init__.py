"""The daemon: wiring, the round runner, status, metrics endpoint, config watch, top feed, the host probes (doctor) and the docs generator. Imports every koordd package below it."""
