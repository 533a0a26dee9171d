"""Hostile network peers on 127.0.0.1 for the tests and benchmarks of koordd/kernel/netpeer.py's users: a
real TCP server in a thread that answers every connection in one of SHAPES, until close().

- "trickle_head": a status line and headers one byte every `step` seconds, never ending.
- "endless_continue": `HTTP/1.1 100 Continue` answers, as fast as the socket takes them, for ever.
- "endless_body": a 200 head, then a body (no length: to the close) that never ends, `step` apart.
- "huge_body": a 200 head with a Content-Length of 1 GiB, then its body as fast as the socket takes it.
- "silent": reads the request and never answers.
- "ok": answers 200 with `body` (Content-Length), as a healthy endpoint does.
"""
from __future__ import annotations

import socket
import threading
import time

SHAPES = ("trickle_head", "endless_continue", "endless_body", "huge_body", "silent", "ok")


class HostileServer:
    def __init__(self, shape: str, step: float = 0.05, body: bytes = b"", life: float = 30.0):
        assert shape in SHAPES, shape
        self.shape, self.step, self.body, self.life = shape, step, body, life
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.done = threading.Event()
        self.connections = 0
        self.conns: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._serve, name=f"hostile-{shape}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.05)
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            self.conns.append(conn)
            t = threading.Thread(target=self._answer, args=(conn,), name=f"hostile-{self.shape}-conn", daemon=True)
            self.threads.append(t)
            t.start()

    def _alive(self, began: float) -> bool:
        return not self.done.is_set() and time.monotonic() - began < self.life

    def _answer(self, conn: socket.socket) -> None:
        began = time.monotonic()
        try:
            conn.settimeout(1.0)
            try:
                conn.recv(65536)                # the request (its head, at least)
            except socket.timeout:
                pass
            if self.shape == "ok":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
                             % len(self.body) + self.body)
                return
            if self.shape == "silent":
                self.done.wait(self.life)
                return
            if self.shape == "trickle_head":
                head = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 100_000
                for i in range(len(head)):
                    if not self._alive(began):
                        return
                    conn.sendall(head[i:i + 1])
                    time.sleep(self.step)
                return
            if self.shape == "endless_continue":
                answer = b"HTTP/1.1 100 Continue\r\n\r\n" * 64
                while self._alive(began):
                    conn.sendall(answer)
                return
            if self.shape == "endless_body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                while self._alive(began):
                    conn.sendall(b"# more\n")
                    time.sleep(self.step)
                return
            if self.shape == "huge_body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 30))
                chunk = b"#" * 65535 + b"\n"
                while self._alive(began):
                    conn.sendall(chunk)
                return
        except OSError:         # the client went: what a hostile peer wants least
            return
        finally:
            conn.close()

    def close(self) -> None:
        self.done.set()
        self.sock.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(2)
        self.thread.join(2)

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
