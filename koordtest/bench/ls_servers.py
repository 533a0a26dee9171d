"""The LS servers of scripts/bench-qos: one server process per CPU, each on its own UNIX socket in the
benchmark's work directory (a single-threaded server then can still use the whole node, and no TCP
port of the host is taken), all in the LS cgroup.

- probe: koordtest.bench.probe, a fixed amount of hashing per request.
- redis: Debian's redis-server (no persistence, no TCP), holding two sets of --redis-set-size members
  that overlap by half; a request is SINTERCARD of the two (Redis 7), whose reply is one line.
- memcached: Debian's memcached (one worker thread, no TCP or UDP), holding --memcached-keys small items;
  a request is one get of many keys (one in ten stored), whose answer ends in "END\r\n". A single get
  costs memcached a few microseconds, more requests per second than the Python load generator sends on
  time: many keys in one get make a request cost about what a redis request does, with a small answer.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from koordtest.bench.packages import apt_install


def resp(*args: str) -> bytes:
    """A command in the Redis protocol (an array of bulk strings)."""
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def python_module(module: str, *args: str) -> list[str]:
    """argv running a koordtest.bench module with this Python (whose venv has koordtest installed)."""
    return [sys.executable, "-m", module, *args]


def worker_env() -> dict:
    """The environment of a worker process: a copy of this one's."""
    return dict(os.environ)


class Probe:
    name = "probe"
    request = b"\n"
    response_end = b"\n"

    def __init__(self, bytes_per_request: int, work_us: float):
        self.bytes, self.work_us = bytes_per_request, work_us

    def command(self, sock: Path, workdir: Path) -> list[str]:
        return python_module("koordtest.bench.probe", "--socket", str(sock), "--bytes", str(self.bytes))

    def prepare(self, sock: Path) -> None:
        pass

    def describe(self) -> str:
        return (f"probe: BLAKE2b of {self.bytes} bytes per request ({self.work_us:g} µs on an idle CPU of "
                f"this host when calibrated)")


class Redis:
    name = "redis"
    request = resp("SINTERCARD", "2", "bench:a", "bench:b")
    response_end = b"\n"

    def __init__(self, binary: str, set_size: int):
        self.binary, self.set_size = binary, set_size

    def command(self, sock: Path, workdir: Path) -> list[str]:
        return [self.binary, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                "--save", "", "--appendonly", "no", "--dir", str(workdir), "--daemonize", "no", "--logfile", ""]

    def prepare(self, sock: Path) -> None:
        """Fill the two sets; the intersection's size proves the data is there."""
        half = self.set_size // 2
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(sock))
            for key, first in (("bench:a", 0), ("bench:b", half)):
                for start in range(first, first + self.set_size, 1000):
                    members = [f"member:{i}" for i in range(start, min(start + 1000, first + self.set_size))]
                    _call(s, resp("SADD", key, *members))
            got = _call(s, self.request)
        if got != f":{self.set_size - half}".encode():
            raise RuntimeError(f"redis at {sock}: SINTERCARD answered {got!r}, expected :{self.set_size - half}")

    def describe(self) -> str:
        version = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout.strip()
        return f"redis: {version}; SINTERCARD of two sets of {self.set_size} members (half shared)"


class Memcached:
    name = "memcached"
    response_end = b"END\r\n"
    VALUE = b"v" * 64            # never holds the terminator
    HIT_EVERY = 10               # one key in ten is stored: a small answer to a large lookup

    def __init__(self, binary: str, keys: int):
        self.binary, self.keys = binary, keys
        self.request = b"get " + b" ".join(b"%x" % i for i in range(keys)) + b"\r\n"

    def command(self, sock: Path, workdir: Path) -> list[str]:
        # -u root: memcached refuses to run as root unless told to; -U 0: no UDP; -p 0: no TCP
        return [self.binary, "-s", str(sock), "-a", "0700", "-t", "1", "-U", "0", "-p", "0", "-m", "64",
                "-u", "root"]

    def prepare(self, sock: Path) -> None:
        """Store every HIT_EVERY-th key; the get's answer holding each of them proves they are there."""
        stored = range(0, self.keys, self.HIT_EVERY)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(sock))
            for i in stored:
                s.sendall(b"set %x 0 0 %d\r\n%s\r\n" % (i, len(self.VALUE), self.VALUE))
                if _read_until(s, b"\r\n") != b"STORED\r\n":
                    raise RuntimeError(f"memcached at {sock}: set {i:x} was not stored")
            s.sendall(self.request)
            got = _read_until(s, self.response_end)
        if got.count(b"VALUE ") != len(stored):
            raise RuntimeError(f"memcached at {sock}: the get found {got.count(b'VALUE ')} of {len(stored)} items")

    def describe(self) -> str:
        version = subprocess.run([self.binary, "-V"], capture_output=True, text=True).stdout.strip()
        return (f"memcached: {version}; a request is one get of {self.keys} keys, one in {self.HIT_EVERY} stored "
                f"({len(self.VALUE)}-byte items)")


def _read_until(s: socket.socket, end: bytes) -> bytes:
    reply = b""
    while not reply.endswith(end):
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        reply += chunk
    return reply


def find_memcached(install: bool) -> str:
    """memcached's path, installed with apt first when missing and `install`."""
    if not shutil.which("memcached"):
        apt_install("memcached", install, alternative="--ls redis")
    return shutil.which("memcached") or "/usr/bin/memcached"


def _call(s: socket.socket, command: bytes) -> bytes:
    """Send one command, read its one-line reply."""
    s.sendall(command)
    reply = b""
    while not reply.endswith(b"\r\n"):
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        reply += chunk
    if reply.startswith(b"-"):
        raise RuntimeError(f"redis: {reply.decode().strip()}")
    return reply.strip()


def find_redis(install: bool) -> str:
    """redis-server's path, installed with apt first when missing and `install`."""
    if not shutil.which("redis-server"):
        apt_install("redis-server", install, alternative="--ls probe")
    return shutil.which("redis-server") or "/usr/bin/redis-server"


def wait_accepting(sock: Path, proc: subprocess.Popen, timeout: float = 20) -> None:
    """Until the server at `sock` accepts a connection; an error if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"LS server {proc.args[0]} exited {proc.returncode} before listening on {sock}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(sock))
                return
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() >= deadline:
                raise RuntimeError(f"LS server did not listen on {sock} within {timeout:g} s") from None
            time.sleep(0.05)
