"""koordd with its metrics endpoint on a fake cgroup tree, and the HTTP helpers its tests share
(tests/unit/runtime/test_metrics.py, tests/unit/runtime/test_prometheus.py). Loopback only."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from koordtest.fakes.cgroup import FakeCgroups


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def run_koordd(tmp: Path, port: int, extra: str = "") -> tuple[subprocess.Popen, Path]:
    """koordd serving metrics on 127.0.0.1:`port`, be_suppress (rule threshold) on a fake v2 tree in `tmp`
    whose LS slice has 1 core (cpu.max); its stderr in tmp/stderr. Returns the process and its state_dir."""
    tree = FakeCgroups(tmp, "v2").add("be.slice").add("ls.slice", usage_us=1000)
    tree.set("ls.slice", "cpu", "cpu.max", "100000 100000\n")
    config = tmp / "koordd.toml"
    config.write_text(f"""
[daemon]
cgroup_root = "{tree.root}"
state_dir = "{tmp / 'state'}"
[metrics]
enable = true
listen = "127.0.0.1:{port}"
[[classes]]
name = "BE"
cgroups = ["be.slice"]
[[classes]]
name = "LS"
cgroups = ["ls.slice"]
[loops.be_suppress]
enabled = true
interval = "200ms"
rule = "threshold"
{extra}""")
    with open(tmp / "stderr", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "koordd.runtime.daemon", "--config", str(config)], stderr=err)
    return proc, tmp / "state"


def wait_for(url: str, text: str, proc: subprocess.Popen, timeout: float = 30) -> str:
    """The body of `url` once it answers 200 with `text` in it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "koordd exited"
        try:
            status, body = get(url)
            if status == 200 and text in body:
                return body
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never showed {text!r}")
