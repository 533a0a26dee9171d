"""Wake the main loop from a signal handler or another thread: a self-pipe.

threading.Event is not safe in a signal handler: set() takes the lock that wait() and clear()
hold for a moment, and a handler runs in the main thread between two bytecodes, maybe inside
them. A signal arriving then deadlocks the daemon for good (SIGHUP during a wait did; SIGTERM
could not stop it after). Writing a byte to a non-blocking pipe takes no lock.
"""
from __future__ import annotations

import os
import select


class Wakeup:
    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def set(self) -> None:
        """Safe in a signal handler and from any thread."""
        try:
            os.write(self._write, b"!")
        except BlockingIOError:
            pass                # the pipe is full: a wake-up is pending already

    def wait(self, timeout: float | None) -> bool:
        """Sleep until set() or `timeout` seconds; True if woken. Consumes every pending wake-up."""
        ready, _, _ = select.select([self._read], [], [], timeout)
        if not ready:
            return False
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass
        return True
