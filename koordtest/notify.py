"""systemd's end of sd_notify for tests: a datagram socket read in a thread (as systemd reads it, so the
queue never fills), each message kept with the monotonic time it arrived."""
from __future__ import annotations

import socket
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

    def close(self) -> None:
        self.sock.close()
