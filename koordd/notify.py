"""sd_notify(3) without libsystemd: a datagram to $NOTIFY_SOCKET. A no-op outside systemd."""
from __future__ import annotations

import os
import socket
import time

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
