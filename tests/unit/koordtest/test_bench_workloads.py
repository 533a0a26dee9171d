"""scripts/bench-qos's workloads: the probe server answers one line per request, BE workers count their
work into a shared file, redis commands are encoded as the protocol wants them."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

from koordtest.bench.antagonist import Counter, make_counters, read_counters
from koordtest.bench.ls_servers import Probe, resp, wait_accepting, worker_env


def test_resp_encodes_bulk_strings():
    assert resp("SADD", "k", "été") == b"*3\r\n$4\r\nSADD\r\n$1\r\nk\r\n$5\r\n\xc3\xa9t\xc3\xa9\r\n"


def test_counters_sum_every_workers_slot(tmp_path):
    path = str(tmp_path / "counters")
    make_counters(path, 3)
    first, last = Counter(path, 0), Counter(path, 2)
    first.add(5)
    last.add(7)
    first.add(1 << 40)
    assert read_counters(path) == 12 + (1 << 40)


def start(argv, tmp_path):
    return subprocess.Popen(argv, env=worker_env(), stdout=subprocess.DEVNULL, stderr=open(tmp_path / "log", "w"))


def test_probe_answers_one_line_per_request(tmp_path):
    sock = tmp_path / "probe.sock"
    p = start(Probe(4096, 1).command(sock, tmp_path), tmp_path)
    try:
        wait_accepting(sock, p)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(sock))
            s.sendall(b"\n\n\n")
            got = b""
            while len(got) < 3:
                got += s.recv(16)
        assert got == b"\n\n\n"
    finally:
        p.kill()
        p.wait()


def test_cpu_antagonist_counts_its_work(tmp_path):
    path = str(tmp_path / "counters")
    make_counters(path, 2)
    p = start([sys.executable, "-m", "koordtest.bench.antagonist", "--kind", "cpu", "--counters", path, "--slot", "1"],
              tmp_path)
    try:
        deadline = time.monotonic() + 10
        while read_counters(path) == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        first = read_counters(path)
        time.sleep(0.1)
        assert 0 < first < read_counters(path)
    finally:
        p.kill()
        p.wait()
