"""Load koordd's own sched_ext scheduler (koordd/bpf/koordd_sched.bpf.o) with libbpf, and switch to it safely.

The object is opened and loaded through koordd's one loader (koordd/kernel/libbpf.py). The scheduler is
attached through a BPF link, never a bare struct_ops map: a link belongs to the process holding its fd,
so when koordd exits, or is killed, the kernel unloads the scheduler and its threads go back to the
fair class.

The scheduler reads each thread's class from its `classes` map (cgroup id -> class), filled by
`Scheduler.set_classes` from cgroup directories (a v2 cgroup's id is its directory's inode number).

`switch_to` is the safe switch: stop our old scheduler, wait for `disabled`, load, confirm
`enabled`, `root/ops` = "koordd" and a higher `enable_seq`; otherwise unload what was loaded (the
kernel's scheduler takes the threads back) and say why. A scheduler loaded by another program is
not stopped: the switch is refused, naming it.
"""
from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path

from koordd.core.classes import BE, LATENCY_SENSITIVE
from koordd.core.snapshot import SchedExtStatus
from koordd.kernel import bpf_objects
from koordd.kernel.bpf_shared import CLASS_BE, CLASS_LS
from koordd.kernel.libbpf import BPF_F_LINK, BpfError, BpfObject
from koordd.kernel.sched_ext import missing_reason, read_sched_ext

OBJECT = bpf_objects.KOORDD_SCHED
OPS_NAME = "koordd"                 # sched_ext_ops.name: what root/ops shows
CLASS_VALUES = {**{c: CLASS_LS for c in LATENCY_SENSITIVE}, BE: CLASS_BE}     # the `classes` map's values
SLEEPABLE_PROGRAMS = ("koordd_init",)   # may sleep (scx_bpf_create_dsq); libbpf 1.1 has no struct_ops.s/


class SchedExtError(BpfError):
    pass


def cgroup_id(path: Path | str) -> int:
    """A cgroup-v2 cgroup's id, as the kernel (and kernfs_node.id) gives it: its directory's inode."""
    return os.stat(path).st_ino


class Scheduler:
    """koordd's scheduler, loaded into the kernel (through koordd's one loader, koordd/kernel/libbpf.py);
    `attach` starts it, `unload` (or the end of this process: its link goes with the fd) stops it."""

    def __init__(self, obj_path: Path | str = OBJECT):
        self._obj = BpfObject(obj_path, prepare=self._prepare)
        self._classes = self._obj.map("classes", ctypes.c_uint64, ctypes.c_uint32)
        self._written: set[int] = set()

    @staticmethod
    def _prepare(obj: BpfObject) -> None:
        for name in SLEEPABLE_PROGRAMS:
            obj.set_sleepable(name)
        obj.set_map_flags("koordd_ops", BPF_F_LINK)

    def attach(self) -> None:
        """Start scheduling (fill `classes` first: until then every thread counts as LS)."""
        self._obj.attach_struct_ops("koordd_ops")

    def set_classes(self, classes: dict[int, str]) -> None:
        """Make `classes` (cgroup id -> class name) the map's whole content."""
        for cgid, cls in classes.items():
            try:
                self._classes.update(ctypes.c_uint64(cgid), ctypes.c_uint32(CLASS_VALUES[cls]))
            except BpfError as e:
                raise SchedExtError(f"classes[{cgid}] = {cls}: {e}") from None
        for cgid in self._written - classes.keys():
            self._classes.delete(ctypes.c_uint64(cgid))
        self._written = set(classes)

    def unload(self) -> None:
        """Detach (the kernel disables the scheduler when its link goes) and free everything."""
        self._obj.close()


@dataclass(frozen=True)
class SwitchResult:
    scheduler: Scheduler | None     # ours, running; None when the kernel's scheduler runs the threads
    reason: str
    status: SchedExtStatus | None   # what the kernel said last
    busy: bool = False              # another scheduler holds sched_ext (or ours would not stop): nothing loaded


def wait_state(want: str, sys_root: Path | str, timeout: float) -> SchedExtStatus | None:
    """Poll until `state` is `want` or `timeout` passes; the last status read."""
    deadline = time.monotonic() + timeout
    while True:
        status = read_sched_ext(sys_root)
        if status is None or status.state == want or time.monotonic() >= deadline:
            return status
        time.sleep(0.05)


def switch_to(classes: dict[int, str], old: Scheduler | None = None, *, sys_root: Path | str = "/sys",
              timeout: float = 10.0, load=Scheduler) -> SwitchResult:
    """Stop `old` (ours), wait for `disabled`, load koordd's scheduler with `classes`, and confirm it
    runs: `enabled`, root/ops "koordd", enable_seq above what it was. Anything else: unload it and
    leave the threads to the kernel's scheduler, saying why."""
    status = read_sched_ext(sys_root)
    if status is None:
        return SwitchResult(None, missing_reason(sys_root), None)
    if old is not None:
        old.unload()
    elif status.state != "disabled":
        return SwitchResult(None, f"another BPF scheduler is loaded ({status.describe()}): "
                                  "koordd does not stop it", status, busy=True)
    status = wait_state("disabled", sys_root, timeout)
    if status is None or status.state != "disabled":
        return SwitchResult(None, f"the old scheduler did not stop within {timeout:g}s "
                                  f"({status.describe() if status else 'no sched_ext'})", status, busy=True)
    before, scheduler = status.enable_seq, None
    try:
        scheduler = load()
        scheduler.set_classes(classes)      # before attaching: no thread is ever misclassified
        scheduler.attach()
    except (OSError, BpfError) as err:
        if scheduler is not None:
            scheduler.unload()
        return SwitchResult(None, f"loading failed, the kernel's scheduler runs: {err}",
                            read_sched_ext(sys_root))
    status = wait_state("enabled", sys_root, timeout)
    problem = _not_ours(status, before)
    if problem:
        scheduler.unload()
        return SwitchResult(None, f"{problem}: unloaded, the kernel's scheduler runs", status)
    return SwitchResult(scheduler, f"koordd's scheduler runs ({status.describe()})", status)


def _not_ours(status: SchedExtStatus | None, seq_before: int | None) -> str:
    if status is None or status.state != "enabled":
        return f"state is {status.state if status else 'unknown'}, not enabled"
    if status.ops != OPS_NAME:
        return f"root/ops is {status.ops!r}, not {OPS_NAME!r}"
    if seq_before is not None and (status.enable_seq is None or status.enable_seq <= seq_before):
        return f"enable_seq {status.enable_seq} did not rise above {seq_before}"
    return ""


def main(argv: list[str] | None = None) -> int:
    """`python -m koordd.kernel.sched_ext_scheduler --ls CGROUP --be CGROUP`: run koordd's scheduler until SIGTERM or
    SIGINT, then unload it (for trying it out and for the VM tests; koordd itself loads it through the
    sched_ext loop's `scheduler` option, koordd/backends/sched_ext.py)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m koordd.kernel.sched_ext_scheduler", description=main.__doc__)
    for cls in ("LS", "BE"):
        parser.add_argument(f"--{cls.lower()}", action="append", default=[], metavar="CGROUP",
                            help=f"a cgroup-v2 directory whose threads (and those below) are {cls}")
    args = parser.parse_args(argv)
    classes = {cgroup_id(path): "LS" for path in args.ls} | {cgroup_id(path): "BE" for path in args.be}
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    result = switch_to(classes)
    print(result.reason, flush=True)
    if result.scheduler is None:
        return 1
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    result.scheduler.unload()
    status = wait_state("disabled", "/sys", 10.0)
    print(f"unloaded ({status.describe() if status else 'no sched_ext'})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
