"""Load koordd's own sched_ext scheduler (koordd/bpf/koordd_sched.bpf.o) with libbpf, and switch to it safely.

The object is opened and loaded through libbpf's C API (ctypes, libbpf.so.1: Debian's libbpf1, 1.1
on bookworm). The scheduler is attached through a BPF link, never a bare struct_ops map: a link
belongs to the process holding its fd, so when koordd exits, or is killed, the kernel unloads the
scheduler and its threads go back to the fair class. libbpf 1.1 cannot make struct_ops links
(1.2+ can), so the map is created with BPF_F_LINK and the link made here with bpf_link_create.

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
from importlib.resources import files
from pathlib import Path

from koordd.core.classes import BE, LATENCY_SENSITIVE
from koordd.core.snapshot import SchedExtStatus
from koordd.kernel.bpf_shared import CLASS_BE, CLASS_LS
from koordd.kernel.sched_ext import missing_reason, read_sched_ext

OBJECT = Path(str(files("koordd.bpf") / "koordd_sched.bpf.o"))
OPS_NAME = "koordd"                 # sched_ext_ops.name: what root/ops shows
CLASS_VALUES = {**{c: CLASS_LS for c in LATENCY_SENSITIVE}, BE: CLASS_BE}     # the `classes` map's values
BPF_F_SLEEPABLE = 1 << 4
BPF_F_LINK = 1 << 13
BPF_STRUCT_OPS = 44                 # enum bpf_attach_type
SLEEPABLE_PROGRAMS = ("koordd_init",)   # may sleep (scx_bpf_create_dsq); libbpf 1.1 has no struct_ops.s/


class ScxError(RuntimeError):
    pass


def load_libbpf() -> ctypes.CDLL:
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    p, i, u = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32
    for name, restype, argtypes in (
            ("bpf_object__open_file", p, [ctypes.c_char_p, p]),
            ("bpf_object__load", i, [p]),
            ("bpf_object__close", None, [p]),
            ("bpf_object__find_map_by_name", p, [p, ctypes.c_char_p]),
            ("bpf_object__find_program_by_name", p, [p, ctypes.c_char_p]),
            ("bpf_program__set_flags", i, [p, u]),
            ("bpf_map__set_map_flags", i, [p, u]),
            ("bpf_map__fd", i, [p]),
            ("bpf_map__attach_struct_ops", p, [p]),
            ("bpf_link__fd", i, [p]),
            ("bpf_link__destroy", i, [p]),
            ("bpf_link_create", i, [i, i, i, p]),
            ("bpf_map_update_elem", i, [i, p, p, ctypes.c_uint64]),
            ("bpf_map_delete_elem", i, [i, p])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _fail(what: str, code: int | None = None) -> ScxError:
    err = -code if code is not None and code < 0 else ctypes.get_errno()
    return ScxError(f"{what}: {os.strerror(err) if err else 'failed'}")


def cgroup_id(path: Path | str) -> int:
    """A cgroup-v2 cgroup's id, as the kernel (and kernfs_node.id) gives it: its directory's inode."""
    return os.stat(path).st_ino


class Scheduler:
    """koordd's scheduler, loaded into the kernel; `attach` starts it, `unload` (or the end of this
    process) stops it."""

    def __init__(self, obj_path: Path | str = OBJECT):
        self._lib = lib = load_libbpf()
        self._obj = lib.bpf_object__open_file(str(obj_path).encode(), None)
        if not self._obj:
            raise _fail(f"opening {obj_path}")
        self._libbpf_link = None
        self._link_fd = -1
        self._written: set[int] = set()
        try:
            self._load()
        except BaseException:
            self.unload()
            raise

    def _load(self) -> None:
        lib, obj = self._lib, self._obj
        ops = lib.bpf_object__find_map_by_name(obj, b"koordd_ops")
        classes = lib.bpf_object__find_map_by_name(obj, b"classes")
        if not ops or not classes:
            raise ScxError("the object has no koordd_ops or classes map")
        for name in SLEEPABLE_PROGRAMS:
            prog = lib.bpf_object__find_program_by_name(obj, name.encode())
            if not prog or lib.bpf_program__set_flags(prog, BPF_F_SLEEPABLE):
                raise ScxError(f"cannot mark {name} sleepable")
        lib.bpf_map__set_map_flags(ops, BPF_F_LINK)
        if (err := lib.bpf_object__load(obj)) < 0:
            raise _fail("loading the scheduler (the kernel's reason is in libbpf's log above)", err)
        self._ops = ops
        self._classes_fd = lib.bpf_map__fd(classes)

    def attach(self) -> None:
        """Start scheduling (fill `classes` first: until then every thread counts as LS)."""
        lib, ops = self._lib, self._ops
        # libbpf writes the struct_ops value (program fds filled in); with BPF_F_LINK that only
        # stores it, and the link below registers it. libbpf 1.2+ makes the link itself.
        self._libbpf_link = lib.bpf_map__attach_struct_ops(ops)
        if not self._libbpf_link:
            raise _fail("writing the struct_ops value")
        map_fd = lib.bpf_map__fd(ops)
        link_fd = lib.bpf_link__fd(self._libbpf_link)
        if link_fd == map_fd:
            link_fd = lib.bpf_link_create(map_fd, 0, BPF_STRUCT_OPS, None)
            if link_fd < 0:
                raise _fail("attaching the scheduler (bpf_link_create)", link_fd)
            self._link_fd = link_fd

    def set_classes(self, classes: dict[int, str]) -> None:
        """Make `classes` (cgroup id -> class name) the map's whole content."""
        key, value = ctypes.c_uint64(), ctypes.c_uint32()
        for cgid, cls in classes.items():
            key.value, value.value = cgid, CLASS_VALUES[cls]
            if (err := self._lib.bpf_map_update_elem(self._classes_fd, ctypes.byref(key),
                                                     ctypes.byref(value), 0)) < 0:
                raise _fail(f"classes[{cgid}] = {cls}", err)
        for cgid in self._written - classes.keys():
            key.value = cgid
            self._lib.bpf_map_delete_elem(self._classes_fd, ctypes.byref(key))
        self._written = set(classes)

    def unload(self) -> None:
        """Detach (the kernel disables the scheduler when its link goes) and free everything."""
        if self._link_fd >= 0:
            os.close(self._link_fd)
            self._link_fd = -1
        if self._libbpf_link:
            self._lib.bpf_link__destroy(self._libbpf_link)   # libbpf 1.1: frees only; 1.2+: detaches
            self._libbpf_link = None
        if self._obj:
            self._lib.bpf_object__close(self._obj)
            self._obj = None


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
    except (OSError, ScxError) as err:
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
    """`python -m koordd.kernel.scx --ls CGROUP --be CGROUP`: run koordd's scheduler until SIGTERM or
    SIGINT, then unload it (for trying it out and for the VM tests; koordd itself loads it through the
    sched_ext loop's `scheduler` option, koordd/backends/scx.py)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m koordd.kernel.scx", description=main.__doc__)
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
