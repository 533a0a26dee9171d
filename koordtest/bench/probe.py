"""The synthetic LS server of scripts/bench-qos: a fixed amount of work per request, so that any change
in its latency comes from waiting (for a CPU, for memory), not from the work.

One process serves one UNIX socket (bench-qos starts one per CPU, each on its own socket): a request is
one line, the work is hashing a buffer of --bytes with BLAKE2b (the buffer stays the same, so the work is
too, and it lives in the cache an antagonist can take away), the response is one empty line, sent as
soon as that request's work is done.

    python -m koordtest.bench.probe --socket PATH --bytes N
"""
from __future__ import annotations

import argparse
import hashlib
import os
import selectors
import socket
import sys
import time

CALIBRATION_BYTES = 1 << 20


def work(buffer: bytes) -> bytes:
    return hashlib.blake2b(buffer).digest()


def bytes_for(work_us: float, tries: int = 30) -> int:
    """How many bytes one request hashes so that its work takes `work_us` on a CPU of this host to
    itself: the fastest of `tries` timings (interference only ever slows a try down). Done once per
    benchmark, so every run and setup does the same work per request."""
    buffer = os.urandom(CALIBRATION_BYTES)
    best = min(_timed(buffer) for _ in range(tries))
    return max(4096, int(work_us * 1e-6 / best * CALIBRATION_BYTES))


def _timed(buffer: bytes) -> float:
    t = time.perf_counter()
    work(buffer)
    return time.perf_counter() - t


def serve(path: str, size: int) -> None:
    buffer = os.urandom(size)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                sel.register(conn, selectors.EVENT_READ)
                continue
            conn = key.fileobj
            try:
                data = conn.recv(65536)
                for _ in range(data.count(b"\n")):
                    work(buffer)
                    conn.sendall(b"\n")
            except (BrokenPipeError, ConnectionResetError):
                data = b""      # the client left with requests unanswered (its drain ended): as redis does, go on
            if not data:
                sel.unregister(conn)
                conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="fixed-work probe server (see the module docstring)")
    p.add_argument("--socket", required=True)
    p.add_argument("--bytes", type=int, required=True, help="bytes hashed per request")
    args = p.parse_args(argv)
    serve(args.socket, args.bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
