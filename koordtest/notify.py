"""systemd's end of sd_notify for tests: a datagram socket read in a thread (as systemd reads it, so the
queue never fills), each message kept with the monotonic time it arrived; and koordd started as systemd
starts its service (start_koordd), its notifications going there."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


class NotifySocket:
    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.path = path
        self.messages: list[tuple[float, str]] = []        # (monotonic time, text)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                text = self.sock.recv(4096).decode()
            except OSError:
                return
            self.messages.append((time.monotonic(), text))

    def times(self, line: str, since: float = float("-inf")) -> list[float]:
        """When each message holding `line` (one of its lines) came, from `since` on."""
        return [t for t, m in list(self.messages) if t >= since and line in m.split("\n")]

    def wait(self, line: str, count: int = 1, since: float = float("-inf"), timeout: float = 15.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if len(self.times(line, since)) >= count:
                return True
            time.sleep(0.02)
        return False

    def expect(self, line: str, timeout: float = 15.0) -> None:
        """Wait for a message holding `line`; AssertionError naming it when none came within `timeout`."""
        if not self.wait(line, timeout=timeout):
            raise AssertionError(f"timed out waiting for {line}")

    def texts(self) -> list[str]:
        """Every message so far, oldest first."""
        return [m for _, m in list(self.messages)]

    def close(self) -> None:
        self.sock.close()


def service_env(notify: NotifySocket, watchdog_usec: int | None = None) -> dict[str, str]:
    """This process's environment as systemd gives it to a Type=notify service: NOTIFY_SOCKET at `notify`,
    WATCHDOG_USEC if given (WatchdogSec=), and no WATCHDOG_PID (koordd's pid is not known before it starts)."""
    env = {**os.environ, "NOTIFY_SOCKET": str(notify.path)}
    if watchdog_usec is not None:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    env.pop("WATCHDOG_PID", None)
    return env


def start_koordd(config: Path, log: Path, notify: NotifySocket, watchdog_usec: int | None = None) -> subprocess.Popen:
    """koordd on `config` (`python -m koordd.runtime.daemon`, this interpreter's) as systemd starts its
    service (service_env), its output in `log`."""
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "koordd.runtime.daemon", "--config", str(config)],
                                stdout=f, stderr=subprocess.STDOUT, env=service_env(notify, watchdog_usec))
