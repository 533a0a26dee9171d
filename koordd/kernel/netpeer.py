"""koordd's one client of network peers (a service's Prometheus endpoint, an SLO probe's target, the node
report's receiver): every exchange is bounded by ONE total deadline, from the name lookup through the
connect to the last byte, and ends at once when its owner cancels it.

- `Deadline(seconds, cancel)`: the time left to one exchange; every wait on a socket is a poll() on the
  socket and the `Cancel`'s pipe, for at most that time: a trickled head, an endless run of `100 Continue`
  answers or a body that never ends cost the deadline, never more, and a stop wakes the wait at once.
- `Resolver`: a name lookup in a helper thread (getaddrinfo cannot be cancelled). The caller waits for it
  at most its deadline; one lookup per resolver is in flight at a time, MAX_LOOKUPS over all of koordd (a
  new one past that fails at once), and a result is kept CACHE_TTL seconds. An IP literal is no lookup.
- `connect_tcp`, `connect_unix`: a connected non-blocking `Conn`. A UNIX socket path is walked from "/"
  by file descriptors, following no symlink another user could have put there, and connected through
  /proc/self/fd to the very inode checked (`open_unix_path`): root never connects to a socket a service
  swapped in for its own.
- `http_exchange`: one HTTP/1.1 request on a fresh connection (http or https; no proxy, no redirect,
  `Connection: close`), its answer's status and (where asked) body, at most `max_body` bytes, plain,
  by Content-Length or chunked. At most MAX_HEAD bytes of head and MAX_INTERIM 1xx answers.

Mechanism only: what a failure means (unknown, a violation, a failed push) is the caller's.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import select
import socket
import stat
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import ssl      # imported where TLS is used: libssl and libcrypto cost the daemon 4 MB of RSS

MAX_LOOKUPS = 4             # name lookups in flight over all of koordd (helper threads blocked in getaddrinfo)
CACHE_TTL = 30.0            # seconds a resolved name is kept
MAX_HEAD = 64 << 10         # bytes of an answer's head (status line and headers) at most
MAX_INTERIM = 8             # 1xx answers before the final one, at most
MAX_SYMLINKS = 40           # symlinks followed in a UNIX socket path, as the kernel's limit
CHUNK = 65536


class PeerError(Exception):
    """An exchange that failed; `kind` names the kind of failure (a caller logs one line per kind):
    "timeout", "cancelled", "dns", "refused", "unreachable", "reset", "protocol", "too large", "tls",
    "unsafe path"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Cancel:
    """A stop its owner signals from another thread: set() wakes every wait of an exchange that uses it
    (its pipe's read end is in every poll) and every wait(). The pipe is made on first use and closed by
    close() (the thread that used it, when it ends) or when the object goes."""

    def __init__(self):
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._pipe: tuple[int, int] | None = None
        self._closed = False

    def set(self) -> None:
        self._event.set()
        with self._lock:
            if self._pipe is not None:
                try:
                    os.write(self._pipe[1], b"x")
                except OSError:         # full (already woken)
                    pass

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def fileno(self) -> int:
        """The read end of the pipe that set() writes to (-1 once closed: poll() ignores it)."""
        with self._lock:
            if self._closed:
                return -1
            if self._pipe is None:
                self._pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                if self._event.is_set():
                    os.write(self._pipe[1], b"x")
            return self._pipe[0]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pipe, self._pipe = self._pipe, None
        for fd in pipe or ():
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit
            pass


class Deadline:
    """The time left to one exchange, `seconds` from now; `cancel` ends it early."""

    def __init__(self, seconds: float, cancel: Cancel | None = None):
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.cancel = cancel

    def left(self) -> float:
        """Seconds left; PeerError("cancelled") once cancelled, PeerError("timeout") once none is left."""
        if self.cancel is not None and self.cancel.is_set():
            raise PeerError("cancelled", "stopped")
        left = self.end - time.monotonic()
        if left <= 0:
            raise PeerError("timeout", f"took over {self.seconds:g}s")
        return left

    def wait_fd(self, fd: int, events: int) -> None:
        """Until `fd` is ready for `events` (select.POLLIN / POLLOUT), the deadline passes or it is
        cancelled (those two raise PeerError)."""
        while True:
            left = self.left()
            p = select.poll()
            p.register(fd, events | select.POLLERR | select.POLLHUP)
            cfd = self.cancel.fileno() if self.cancel is not None else -1
            if cfd >= 0:
                p.register(cfd, select.POLLIN)
            ready = p.poll(max(int(left * 1000) + 1, 1))
            if any(f == fd for f, _ in ready):
                return
            # woken by the cancel, or the time is up: left() says which (or loops on a spurious wakeup)


# --- names -----------------------------------------------------------------------------------------------

_lookups = threading.BoundedSemaphore(MAX_LOOKUPS)


class _Lookup:
    def __init__(self, host: str, port: int, family: int, kind: int):
        self.done = threading.Event()
        self.result: list | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(host, port, family, kind),
                                       name=f"koordd-resolve {host}", daemon=True)

    def _run(self, host, port, family, kind) -> None:
        try:
            self.result = socket.getaddrinfo(host, port, family, kind)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            self.error = e
        finally:
            _lookups.release()
            self.done.set()


class Resolver:
    """Host names to addresses for one peer's exchanges: a lookup runs in a helper thread the caller waits
    for at most its deadline. At most one lookup of this resolver is in flight (a later exchange waits for
    that one rather than starting another), at most MAX_LOOKUPS over all resolvers; a result is kept
    CACHE_TTL seconds. A lookup stuck in the system's resolver ends when that gives up, not before."""

    def __init__(self, ttl: float = CACHE_TTL):
        self.ttl = ttl
        self.lock = threading.Lock()
        self.cache: dict[tuple[str, int], tuple[float, list]] = {}
        self.pending: dict[tuple[str, int], _Lookup] = {}

    def resolve(self, host: str, port: int, deadline: Deadline, kind: int = socket.SOCK_STREAM) -> list:
        """getaddrinfo()'s answer for (host, port) within `deadline`; PeerError("dns") where it fails."""
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            addr = (host, port, 0, 0) if ip.version == 6 else (host, port)
            return [(family, kind, 0, "", addr)]
        key = (host, port)
        with self.lock:
            hit = self.cache.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.ttl:
                return hit[1]
            lookup = self.pending.get(key)
            if lookup is None:
                if not _lookups.acquire(blocking=False):
                    raise PeerError("dns", f"cannot resolve {host}: {MAX_LOOKUPS} lookups already in flight")
                lookup = self.pending[key] = _Lookup(host, port, socket.AF_UNSPEC, kind)
                lookup.thread.start()
        while not lookup.done.is_set():
            try:
                lookup.done.wait(min(deadline.left(), 0.05))
            except PeerError as e:
                if e.kind == "timeout":
                    raise PeerError("dns", f"cannot resolve {host} within {deadline.seconds:g}s") from None
                raise
        with self.lock:
            if self.pending.get(key) is lookup:
                del self.pending[key]
            if lookup.error is None and lookup.result:
                self.cache[key] = (time.monotonic(), lookup.result)
        if lookup.error is not None or not lookup.result:
            e = lookup.error
            raise PeerError("dns", f"cannot resolve {host}: {getattr(e, 'strerror', None) or e or 'no address'}")
        return lookup.result


# --- connections -----------------------------------------------------------------------------------------

class Conn:
    """A connected non-blocking socket (TLS or not) whose every wait is bounded by `deadline`."""

    def __init__(self, sock: socket.socket, deadline: Deadline):
        self.sock: Any = sock
        self.deadline = deadline
        self.tls: Any = None        # the ssl module, once start_tls made this a TLS connection

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _io(self, op, *args):
        # ssl's errors only where this connection went TLS (start_tls imports ssl): a plain socket raises none.
        tls = self.tls
        want_read, want_write, tls_error = \
            (tls.SSLWantReadError, tls.SSLWantWriteError, tls.SSLError) if tls is not None else ((), (), ())
        while True:
            self.deadline.left()
            try:
                return op(*args)
            except want_read:
                self.deadline.wait_fd(self.sock.fileno(), select.POLLIN)
            except want_write:
                self.deadline.wait_fd(self.sock.fileno(), select.POLLOUT)
            except (BlockingIOError, InterruptedError):
                self.deadline.wait_fd(self.sock.fileno(), select.POLLOUT if op == self.sock.send else select.POLLIN)
            except tls_error as e:
                raise PeerError("tls", f"TLS: {e.reason or e}") from None
            except ConnectionError as e:
                raise PeerError("reset", e.strerror or type(e).__name__) from None
            except OSError as e:
                raise PeerError("unreachable", e.strerror or type(e).__name__) from None

    def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._io(self.sock.send, view[:CHUNK])
            view = view[n:]

    def recv(self, n: int = CHUNK) -> bytes:
        """Up to `n` bytes, b"" at the end; waits at most the deadline."""
        return self._io(self.sock.recv, n)

    def start_tls(self, context: ssl.SSLContext, server_hostname: str) -> None:
        import ssl
        self.tls = ssl
        self.sock = context.wrap_socket(self.sock, server_hostname=server_hostname, do_handshake_on_connect=False)
        self._io(self.sock.do_handshake)


def _connect(sock: socket.socket, address: Any, deadline: Deadline) -> None:
    sock.setblocking(False)
    err = sock.connect_ex(address)
    if err in (errno.EINPROGRESS, errno.EAGAIN, errno.EALREADY):
        deadline.wait_fd(sock.fileno(), select.POLLOUT)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err == errno.ECONNREFUSED:
        raise PeerError("refused", "connection refused")
    if err:
        raise PeerError("unreachable", os.strerror(err))


def connect_tcp(host: str, port: int, deadline: Deadline, resolver: Resolver | None = None) -> Conn:
    """A TCP connection to (host, port), the name resolved and each address tried within `deadline`."""
    infos = (resolver or Resolver(0)).resolve(host, port, deadline)
    last: PeerError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            _connect(sock, address, deadline)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return Conn(sock, deadline)
        except PeerError as e:
            sock.close()
            if e.kind in ("timeout", "cancelled"):
                raise
            last = e
        except BaseException:
            sock.close()
            raise
    raise last or PeerError("dns", f"{host} has no address")


def _owner_only(st: os.stat_result) -> bool:
    """A directory only root (or koordd's own user) can change: theirs, not writable by group or others."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def open_unix_path(path: str) -> int:
    """An O_PATH descriptor of the UNIX socket at `path`, walked from "/" by descriptors, or
    PeerError("unsafe path") where another user could have replaced what it names:

    - a symlink is followed only in a directory no user but root (koordd's) can write;
    - the socket itself is named with O_NOFOLLOW and must be a socket;
    - its directory must be writable by its owner alone, and the socket is that owner's (or the
      directory root's): a socket of root's (or a third user's) in a service's directory may be a hard
      link the service made to a socket it could not open itself.

    Connecting to /proc/self/fd/<the descriptor> connects to that very inode: nothing renamed after the
    check can take its place."""
    if not path.startswith("/"):
        raise PeerError("unsafe path", f"{path}: not an absolute path")
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    todo = [c for c in path.split("/") if c not in ("", ".")][::-1]
    fd = os.open("/", flags | os.O_DIRECTORY)
    links = 0
    try:
        while todo:
            name = todo.pop()
            if name == "..":
                raise PeerError("unsafe path", f"{path}: names '..'")
            dir_st = os.fstat(fd)
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                raise PeerError("unreachable", f"{path}: no such file") from None
            except PermissionError:
                raise PeerError("unreachable", f"{path}: permission denied") from None
            st = os.fstat(nfd)
            if stat.S_ISLNK(st.st_mode):
                try:
                    if not _owner_only(dir_st):
                        raise PeerError("unsafe path", f"{path}: {name} is a symlink in a directory another "
                                                       "user can write (it could point anywhere)")
                    links += 1
                    if links > MAX_SYMLINKS:
                        raise PeerError("unsafe path", f"{path}: too many symlinks")
                    target = os.readlink(name, dir_fd=fd)
                finally:
                    os.close(nfd)
                todo.extend([c for c in target.split("/") if c not in ("", ".")][::-1])
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", flags | os.O_DIRECTORY)
                continue
            if todo:
                if not stat.S_ISDIR(st.st_mode):
                    os.close(nfd)
                    raise PeerError("unreachable", f"{path}: {name} is not a directory")
                os.close(fd)
                fd = nfd
                continue
            # the last component: the socket
            if not stat.S_ISSOCK(st.st_mode):
                os.close(nfd)
                raise PeerError("unsafe path", f"{path} is not a socket")
            if dir_st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                os.close(nfd)
                raise PeerError("unsafe path", f"{path}: its directory is writable by other users than "
                                               "its owner (who could replace the socket)")
            if st.st_uid != dir_st.st_uid and dir_st.st_uid not in (0, os.geteuid()):
                os.close(nfd)
                raise PeerError("unsafe path", f"{path}: the socket (uid {st.st_uid}) is not of its "
                                               f"directory's owner (uid {dir_st.st_uid})")
            return nfd
        raise PeerError("unsafe path", f"{path}: names a directory")
    finally:
        os.close(fd)


def connect_unix(path: str, deadline: Deadline) -> Conn:
    """A connection to the UNIX stream socket at `path`, checked by open_unix_path(), within `deadline`."""
    deadline.left()
    fd = open_unix_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            _connect(sock, f"/proc/self/fd/{fd}", deadline)
        finally:
            os.close(fd)
        return Conn(sock, deadline)
    except BaseException:
        sock.close()
        raise


# --- HTTP ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]         # lower-case names; a repeated one: its last value
    body: bytes


def _head(conn: Conn, buf: bytearray) -> tuple[int, dict[str, str], bytearray]:
    """The final answer's status and headers; skips 1xx answers (at most MAX_INTERIM). Returns what was
    read past the head."""
    interim = 0
    while True:
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if len(buf) > MAX_HEAD:
                raise PeerError("protocol", f"an answer's head over {MAX_HEAD >> 10} KiB")
            chunk = conn.recv()
            if not chunk:
                raise PeerError("protocol", "closed before the answer's head" if not buf else
                                "closed within the answer's head")
            buf += chunk
        if end > MAX_HEAD:
            raise PeerError("protocol", f"an answer's head over {MAX_HEAD >> 10} KiB")
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        rest = buf[end + 4:]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not (len(parts[1]) == 3 and parts[1].isdigit()):
            raise PeerError("protocol", f"not an HTTP/1 status line: {lines[0][:60]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise PeerError("protocol", f"a garbled header line: {line[:60]!r}")
            headers[name.lower()] = value.strip()
        if 100 <= status < 200:
            if status == 101:
                raise PeerError("protocol", "answered 101 Switching Protocols")
            interim += 1
            if interim > MAX_INTERIM:
                raise PeerError("protocol", f"over {MAX_INTERIM} 1xx answers")
            buf = rest
            continue
        return status, headers, rest


def _body(conn: Conn, headers: dict[str, str], buf: bytearray, max_body: int) -> bytes:
    def more() -> bytes:
        chunk = conn.recv()
        if not chunk:
            raise PeerError("protocol", "closed within the body")
        return chunk

    cap = f"{max_body >> 20} MiB" if max_body >> 20 else f"{max_body} bytes"
    too_large = PeerError("too large", f"answered over {cap}")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            while (eol := buf.find(b"\r\n")) < 0:
                if len(buf) > 1024:
                    raise PeerError("protocol", "a garbled chunk size")
                buf += more()
            try:
                size = int(bytes(buf[:eol]).split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise PeerError("protocol", "a garbled chunk size") from None
            if size < 0:
                raise PeerError("protocol", "a garbled chunk size")
            del buf[:eol + 2]
            if size == 0:
                return bytes(out)           # trailers ignored: the connection closes
            if len(out) + size > max_body:
                raise too_large
            while len(buf) < size + 2:
                buf += more()
            out += buf[:size]
            del buf[:size + 2]
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise PeerError("protocol", "a garbled Content-Length") from None
        if length < 0:
            raise PeerError("protocol", "a garbled Content-Length")
        if length > max_body:
            raise too_large
        while len(buf) < length:
            buf += more()
        return bytes(buf[:length])
    while True:                             # to the end of the connection
        if len(buf) > max_body:
            raise too_large
        chunk = conn.recv()
        if not chunk:
            return bytes(buf)
        buf += chunk


def http_exchange(url: str, deadline: Deadline, *, method: str = "GET", body: bytes = b"",
                  headers: dict[str, str] | None = None, max_body: int = 0, resolver: Resolver | None = None,
                  tls: ssl.SSLContext | None = None) -> Answer:
    """One request to `url` (http:// or https://) on a fresh connection and its answer, all within
    `deadline`. max_body 0: the body is not read (only the head's status and headers)."""
    parts = urlsplit(url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise PeerError("protocol", f"not an http:// or https:// URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    with connect_tcp(host, port, deadline, resolver) as conn:
        if parts.scheme == "https":
            if tls is None:
                import ssl
                tls = ssl.create_default_context()
            conn.start_tls(tls, host)
        hostport = f"[{host}]" if ":" in host else host
        if parts.port:
            hostport += f":{parts.port}"
        head = [f"{method} {path} HTTP/1.1", f"Host: {hostport}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body or method in ("POST", "PUT"):
            head.append(f"Content-Length: {len(body)}")
        conn.send_all(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        status, got, rest = _head(conn, bytearray())
        if not max_body or method == "HEAD" or status in (204, 304):
            return Answer(status, got, b"")
        return Answer(status, got, _body(conn, got, rest, max_body))
