"""Small servers and host checks for the tests and benchmarks of the application latency sensor and the
SLOs (tests/kernel/test_app_latency_kernel.py, tests/kernel/test_slo_kernel.py)."""
from __future__ import annotations

from koordd.kernel.libbpf import BpfError, libbpf
from koordd.sensors.cgroup_hist import KERNEL_BTF

TRACEPOINTS = (b"btf_trace_sk_data_ready", b"btf_trace_sock_send_length")

# One request per line, each answered after `delay` seconds; prints its address once listening.
SERVER = r"""
import socket, sys, threading, time
kind, delay, where = sys.argv[1], float(sys.argv[2]), sys.argv[3]
if kind == "tcp":
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    where = str(s.getsockname()[1])
else:
    s = socket.socket(socket.AF_UNIX)
    s.bind(where)
s.listen(16)
print(where, flush=True)

def answer(c):
    with c, c.makefile("rb") as requests:
        for _ in requests:
            time.sleep(delay)
            c.sendall(b"ok\n")

while True:
    threading.Thread(target=answer, args=(s.accept()[0],), daemon=True).start()
"""


def lacks_ebpf() -> str | None:
    """What this host lacks for any of koordd's BPF programs, if anything: libbpf or the kernel's BTF."""
    try:
        libbpf()
    except BpfError as e:
        return str(e)
    return None if KERNEL_BTF.exists() else f"no {KERNEL_BTF}"


def lacks_tracepoints() -> str | None:
    """The program's tracepoints the kernel lacks (before Linux 6.6), if any."""
    btf = KERNEL_BTF.read_bytes()
    missing = [t.decode() for t in TRACEPOINTS if t not in btf]
    return f"the kernel has no {', '.join(missing)} (Linux 6.6+)" if missing else None
