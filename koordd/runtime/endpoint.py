"""The HTTP server behind the metrics endpoint: one thread and a selector, bounded in everything a
client controls, so that no client (a slow one, a hostile one, hundreds of them) can take koordd's
memory or threads, or keep /healthz (the liveness probe) from answering.

- Connections: at most `max_connections` open; a new one past that closes the oldest still sending its
  request (slowloris holds the oldest; a probe's is the newest), so a flood never locks a probe out.
- Request size: the request line and headers together at most `max_head` bytes (431 beyond); a body is
  never read (GET and HEAD only; every answer closes the connection).
- Time: one deadline from accept for the whole exchange, request read and answer sent (408 or closed
  past it), not a timeout per read that a client trickling a byte at a time renews forever.
- Threads: none per connection. A request is answered in this thread once its head is complete:
  answers are small and made from memory (the exporter holds no lock and reads no file).
"""
from __future__ import annotations

import ipaddress
import logging
import selectors
import socket
import time
from http import HTTPStatus
from typing import Callable

log = logging.getLogger("koordd.endpoint")     # its name before the move: log lines unchanged

MAX_CONNECTIONS = 64
MAX_HEAD = 8192             # bytes: request line and headers
DEADLINE = 10.0             # seconds from accept: a Prometheus scrape's default timeout
BACKLOG = 64
RECV = 4096

# (method, path) -> (status, content type, body)
Handler = Callable[[str, str], tuple[int, str, bytes]]


class _Conn:
    __slots__ = ("sock", "deadline", "head", "out", "sent")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline
        self.head = bytearray()
        self.out: bytes | None = None       # the answer, once the request is complete
        self.sent = 0


class HttpServer:
    """serve_forever() in a thread of its own; stop() from any other."""

    def __init__(self, host: str, port: int, handle: Handler, max_connections: int = MAX_CONNECTIONS,
                 max_head: int = MAX_HEAD, deadline: float = DEADLINE):
        self.handle, self.max_connections, self.max_head, self.deadline = handle, max_connections, max_head, deadline
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # A restart binds again while the old socket is in TIME_WAIT.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            self.sock.listen(BACKLOG)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.server_address = self.sock.getsockname()
        self.conns: dict[socket.socket, _Conn] = {}      # in accept order: the first is the oldest
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = False
        self._accept_failed = False         # log a failing accept once, not once a loop
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ)
        self.sel.register(self._wake_r, selectors.EVENT_READ)

    # --- the loop -------------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        try:
            while not self._stopping:
                now = time.monotonic()
                nearest = min((c.deadline for c in self.conns.values()), default=now + 1.0)
                for key, events in self.sel.select(max(0.0, min(nearest - now, 1.0))):
                    try:
                        self._event(key.fileobj, events)
                    except Exception:  # noqa: BLE001 - one connection's trouble must not end the endpoint
                        log.exception("metrics: a connection failed; the endpoint stays up")
                        if (conn := self.conns.get(key.fileobj)) is not None:    # type: ignore[arg-type]
                            self._close(conn)
                self._expire(time.monotonic())
        finally:
            for conn in list(self.conns.values()):
                self._close(conn)
            self.sel.close()
            self.sock.close()
            self._wake_r.close()
            self._wake_w.close()

    def _event(self, fileobj, events: int) -> None:
        if fileobj is self.sock:
            self._accept()
        elif fileobj is self._wake_r:
            self._wake_r.recv(64)
        elif (conn := self.conns.get(fileobj)) is not None:
            if events & selectors.EVENT_WRITE:
                self._write(conn)
            else:
                self._read(conn)

    def stop(self) -> None:
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _accept(self) -> None:
        for _ in range(BACKLOG):             # what is waiting, then back to the others
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                # EMFILE and the like: give up the oldest connection for it (the client waits in the
                # backlog), or, holding none, pause so that a listen socket that stays readable does
                # not spin this thread.
                if not self._accept_failed:
                    log.warning("metrics: cannot accept a connection (%s)", e.strerror or e)
                self._accept_failed = True
                if self.conns:
                    self._close(self._oldest())
                else:
                    time.sleep(0.1)
                return
            self._accept_failed = False
            if len(self.conns) >= self.max_connections:
                self._close(self._oldest())
            sock.setblocking(False)
            self.conns[sock] = _Conn(sock, time.monotonic() + self.deadline)
            self.sel.register(sock, selectors.EVENT_READ)

    def _oldest(self) -> _Conn:
        """The connection to give up for a new one: the oldest still sending its request, else the oldest."""
        return next((c for c in self.conns.values() if c.out is None), next(iter(self.conns.values())))

    def _expire(self, now: float) -> None:
        for conn in [c for c in self.conns.values() if c.deadline <= now]:
            if conn.out is None:
                self._try_send(conn, _response(HTTPStatus.REQUEST_TIMEOUT, "text/plain; charset=utf-8",
                                               b"request not complete in time\n", True))
            self._close(conn)

    # --- one connection ----------------------------------------------------------------------------------

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        start = max(0, len(conn.head) - 3)
        conn.head += data
        end = _end_of_head(conn.head, start)
        if end is None and len(conn.head) <= self.max_head:
            return                                                  # more to come
        if end is None or end > self.max_head:
            self._answer(conn, "GET", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                         f"request line and headers over {self.max_head} bytes\n".encode())
            return
        line = bytes(conn.head[:end]).split(b"\n", 1)[0].strip().split()
        if len(line) != 3 or not line[2].startswith(b"HTTP/1."):
            self._answer(conn, "GET", HTTPStatus.BAD_REQUEST, b"not an HTTP/1 request\n")
            return
        method, target = line[0].decode("latin-1"), line[1].decode("latin-1")
        if method not in ("GET", "HEAD"):
            self._answer(conn, "GET", HTTPStatus.METHOD_NOT_ALLOWED, b"GET or HEAD only\n")
            return
        try:
            status, ctype, body = self.handle(method, target.partition("?")[0])
        except Exception:  # noqa: BLE001 - a bug met in one request must not take the endpoint down
            log.exception("metrics: answering %s failed; the endpoint stays up", target[:100])
            status, ctype, body = 500, "text/plain; charset=utf-8", b"internal error\n"
        conn.out = _response(status, ctype, body, method != "HEAD")
        self._start_writing(conn)

    def _answer(self, conn: _Conn, method: str, status: int, text: bytes) -> None:
        conn.out = _response(status, "text/plain; charset=utf-8", text, method != "HEAD")
        self._start_writing(conn)

    def _start_writing(self, conn: _Conn) -> None:
        self.sel.modify(conn.sock, selectors.EVENT_WRITE)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            conn.sent += conn.sock.send(conn.out[conn.sent:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if conn.sent >= len(conn.out):
            self._close(conn)

    @staticmethod
    def _try_send(conn: _Conn, data: bytes) -> None:
        try:
            conn.sock.send(data)
        except OSError:
            pass

    def _close(self, conn: _Conn) -> None:
        if self.conns.pop(conn.sock, None) is None:
            return
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        try:
            conn.sock.shutdown(socket.SHUT_WR)     # the answer goes out before the close
        except OSError:
            pass
        conn.sock.close()


def _end_of_head(buf: bytearray, start: int) -> int | None:
    """Where the blank line ending the head starts (CRLF or bare LF), searched from `start`; None yet."""
    found = [i for i in (buf.find(b"\r\n\r\n", start), buf.find(b"\n\n", start)) if i >= 0]
    return min(found) if found else None


def _response(status: int, ctype: str, body: bytes, with_body: bool = True) -> bytes:
    reason = HTTPStatus(status).phrase
    head = (f"HTTP/1.1 {status} {reason}\r\nServer: koordd\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + (body if with_body else b"")
