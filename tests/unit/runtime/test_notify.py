"""sd_notify: messages reach the socket; a socket nobody reads never stalls the daemon."""
from __future__ import annotations

import socket
import threading

from koordd.runtime import notify


def test_lines_reach_the_socket(tmp_path, monkeypatch):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as reader:
        reader.bind(str(tmp_path / "notify.sock"))
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
        assert notify.notify("READY=1", "STATUS=running")
        assert reader.recv(4096) == b"READY=1\nSTATUS=running"


def test_no_socket_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.notify("READY=1") is False


def test_a_full_queue_drops_the_message_instead_of_blocking(tmp_path, monkeypatch):
    # The reader never reads: its queue (net.unix.max_dgram_qlen datagrams) fills up. A blocking
    # send would hang here, and the daemon's main loop with it (the CI hang of stop 21).
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as reader:
        reader.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        results: list[bool] = []

        def flood():
            for _ in range(2000):
                results.append(notify.notify("WATCHDOG=1"))
                if results[-1] is False:
                    return
        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        sender.join(timeout=60)
        assert not sender.is_alive(), "notify blocked on a full socket"
        assert results[0] is True and results[-1] is False
