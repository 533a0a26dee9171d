"""System tests: koordd installed as a systemd service on a real cgroup-v2 host.

They run inside the VM that `scripts/vmtest` boots (systemd as PID 1, pure cgroup v2, koordd installed
by scripts/install) and are skipped everywhere else: they enable and kill the koordd service, edit
/etc/koordd/koordd.toml, and start CPU hogs in be.slice and ls.slice.
"""
