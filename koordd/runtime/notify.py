"""sd_notify(3) without libsystemd: a datagram to $NOTIFY_SOCKET. A no-op outside systemd."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time

log = logging.getLogger("koordd")

# systemd reads its socket at once; a full queue means the reader is stuck. Waiting for it would
# stall every control loop (and SIGTERM, which the main loop handles), so a message waits this
# long at most and is then dropped: a lost WATCHDOG=1 is what systemd's watchdog acts on anyway.
SEND_TIMEOUT = 0.2


def notify(*lines: str) -> bool:
    """Send "READY=1"-style lines; False when not run by systemd with Type=notify."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]          # abstract namespace socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.settimeout(SEND_TIMEOUT)
            s.connect(addr)
            s.sendall("\n".join(lines).encode())
        return True
    except OSError:
        return False


def reloading() -> bool:
    # MONOTONIC_USEC lets systemd (>= 253, Type=notify-reload) match this reload to its request.
    return notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def watchdog_period() -> float | None:
    """Seconds between WATCHDOG=1 pings: half of what systemd asked for, or None if it asked for none."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None


# A stop's restores (koordd/runtime/service.py): how often their progress is looked at, and how long without
# progress systemd is left to its own TimeoutStopSec=. A single restore may take seconds (sched_ext's
# safe unload waits up to 10 s); thousands of them take one journal fsync each.
EXTEND_EVERY = 5.0
STALL = 30.0


class StopExtender:
    """While a stop's restores make progress, ask systemd for more time (EXTEND_TIMEOUT_USEC): a stop
    that restores thousands of knobs on a slow disk must not be SIGKILLed halfway (the rest would wait
    for the next start), and one stuck on a single restore still ends, `stall` + `every` seconds after
    its last progress. `progress()` returns anything that changes as restores are made; it runs in
    another thread."""

    def __init__(self, progress, every: float = EXTEND_EVERY, stall: float = STALL):
        self.progress, self.every, self.stall = progress, every, stall
        self.done, self.stalled = threading.Event(), threading.Event()
        self.checks = 0
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "StopExtender":
        if os.environ.get("NOTIFY_SOCKET"):
            self._thread = threading.Thread(target=self._run, name="koordd-stop-extender", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        last, moved = self.progress(), time.monotonic()
        while True:
            left = self.stall + self.every - (time.monotonic() - moved)
            if left > self.every:
                # From now: systemd's deadline stays `stall` + `every` after the last progress.
                notify(f"EXTEND_TIMEOUT_USEC={int(left * 1e6)}")
            elif not self.stalled.is_set():
                self.stalled.set()
                log.warning("restoring made no progress for %.0fs: systemd's stop timeout runs on", self.stall)
            if self.done.wait(self.every):
                return
            self.checks += 1
            now = self.progress()
            if now != last:
                last, moved = now, time.monotonic()
