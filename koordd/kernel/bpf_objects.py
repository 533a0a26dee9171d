"""Where koordd's shipped BPF files are, for every module that loads a program or reads the shared header.

They are package data of `koordd.bpf` (koordd/bpf/ in the tree, <site-packages>/koordd/bpf/ installed),
all made by scripts/build-bpf from the sources in the tree's top-level bpf/: one CO-RE object per program
and a copy of bpf/koordd_shared.h, the header C and Python share (koordd/kernel/bpf_shared.py reads it).
A module finds its object here and opens it with koordd's one loader, koordd/kernel/libbpf.py's BpfObject.
"""
from __future__ import annotations

from pathlib import Path

import koordd.bpf

# The package koordd.bpf's folder, taken from the package itself rather than through importlib.resources, whose readers import
# zipfile: 0.8 MB of RSS in every koordd for a package that is always a folder (libbpf opens a path, and a
# wheel or a .deb installs unpacked).
FOLDER = Path(koordd.bpf.__file__).parent


def shipped(name: str) -> Path:
    """koordd/bpf/<name> of this koordd as a file path."""
    return FOLDER / name


RUNQ_LATENCY = shipped("runq_latency.bpf.o")    # the run-queue latency sensor's (koordd/sensors/runq.py)
APP_LATENCY = shipped("app_latency.bpf.o")      # the application latency sensor's (koordd/sensors/app_latency.py)
NET_CLASSIFY = shipped("net_classify.bpf.o")    # the egress classifier (koordd/kernel/netclass.py)
KOORDD_SCHED = shipped("koordd_sched.bpf.o")    # koordd's sched_ext scheduler (koordd/kernel/sched_ext_scheduler.py)
OBJECTS = (RUNQ_LATENCY, APP_LATENCY, NET_CLASSIFY, KOORDD_SCHED)
SHARED_HEADER = shipped("koordd_shared.h")      # read by koordd/kernel/bpf_shared.py at import
