"""koordd's own sched_ext scheduler as two knobs: whether it runs, and the class of each cgroup in it.

- `scheduler`, on the node-wide target "sched_ext": "koordd" loads koordd's scheduler
  (koordd/bpf/koordd_sched.bpf.o) through koordd/kernel/sched_ext_scheduler.py's safe switch; "none" unloads it. It reads what
  the kernel says: "koordd" while ours runs, "none" while no BPF scheduler does, else the name of
  another program's scheduler (or the state, mid-switch). koordd never stops another program's
  scheduler: loading over one is refused naming it, and "none" counts as reached while it runs.
  The scheduler lives as long as this process holds its link: on exit, or kill -9, the kernel
  unloads it, so a restart finds "none", which is what the restore journal holds.
- `scheduler_class`, on a cgroup: the class the scheduler gives the threads of that cgroup and
  those below it (LS, LSR, LSE: served first; BE: only where LS leaves a CPU idle), "none" for
  none. koordd keeps the classes itself, so they are in the scheduler's `classes` map before it
  starts scheduling, and puts each change into the map while it runs. An entry is keyed by the
  cgroup-v2 id: a cgroup removed and made again under the same name reads "none" until written.
"""
from __future__ import annotations

import errno
import logging
from pathlib import Path

from koordd.core.backend import Backend, BackendSet, Harm, InvalidValue, KnobSpec, TargetGone, Unsupported
from koordd.core.targets import SCHED_EXT_TARGET
from koordd.kernel.cgroupfs import CgroupFS
from koordd.kernel.host_probe import Host
from koordd.kernel.libbpf import BpfError, libbpf
from koordd.kernel.sched_ext import missing_reason, read_sched_ext
from koordd.kernel.sched_ext_scheduler import (CLASS_VALUES, OBJECT, OPS_NAME, Scheduler, SchedExtError, cgroup_id, switch_to,
    wait_state)

log = logging.getLogger("koordd.scx_backend")     # its name before the move: log lines unchanged
TARGET = SCHED_EXT_TARGET       # the node-wide target of `scheduler`
NONE = "none"


def _scheduler_value(value: str) -> str:
    v = value.strip()
    if v not in (OPS_NAME, NONE):
        raise InvalidValue(f"scheduler must be {OPS_NAME!r} (koordd's own) or {NONE!r}, got {value!r}")
    return v


def _class_value(value: str) -> str:
    v = value.strip()
    if v not in CLASS_VALUES and v != NONE:
        raise InvalidValue(f"scheduler_class must be one of {', '.join(CLASS_VALUES)} or {NONE!r}, got {value!r}")
    return v


class OwnScheduler:
    """What the two backends share: the classes koordd gives the scheduler, and the scheduler while it
    runs. `load` makes a Scheduler (tests give a fake)."""

    def __init__(self, sys_root: Path | str = "/sys", load=Scheduler, timeout: float = 5.0):
        self.sys_root, self.load, self.timeout = sys_root, load, timeout
        self.classes: dict[str, tuple[int, str]] = {}      # cgroup -> (its v2 id, class)
        self.running: Scheduler | None = None

    def why_not(self) -> str | None:
        """Why koordd's scheduler cannot run on this host, or None."""
        if read_sched_ext(self.sys_root) is None:
            return missing_reason(self.sys_root)
        try:
            libbpf()                # the loader's own: the library and every function it calls
        except (BpfError, AttributeError) as e:
            return f"no usable libbpf.so.1 (Debian: libbpf1) to load koordd's scheduler with: {e}"
        if not OBJECT.is_file():
            return f"{OBJECT} is missing (scripts/build-bpf builds it)"
        return None

    def class_map(self) -> dict[int, str]:
        return dict(self.classes.values())

    def set_class(self, cgroup: str, cgid: int, cls: str) -> None:
        if cls == NONE:
            self.classes.pop(cgroup, None)
        else:
            self.classes[cgroup] = (cgid, cls)
        if self.running is not None:
            try:
                self.running.set_classes(self.class_map())
            except SchedExtError as e:
                raise OSError(errno.EIO, str(e)) from None

    def start(self) -> None:
        """Switch to koordd's scheduler (after ours, if the kernel stopped it); OSError saying why not."""
        result = switch_to(self.class_map(), self.running, sys_root=self.sys_root, timeout=self.timeout,
                           load=self.load)
        self.running = result.scheduler
        if self.running is None:
            raise OSError(errno.EBUSY if result.busy else errno.EIO, result.reason)
        log.info("%s", result.reason)

    def stop(self) -> None:
        if self.running is None:
            return
        self.running.unload()
        self.running = None
        status = wait_state("disabled", self.sys_root, self.timeout)
        if status is not None and status.state != "disabled":
            raise OSError(errno.EBUSY, f"koordd's scheduler did not stop within {self.timeout:g}s "
                                       f"({status.describe()})")


def probe_sched_ext(host: Host) -> tuple[bool, str]:
    status = read_sched_ext(host.sys)
    return (False, missing_reason(host.sys)) if status is None else (True, status.describe())


class SchedulerBackend(Backend):
    kind = "sched_ext"
    features = {"sched_ext": probe_sched_ext}
    knobs = {"scheduler": KnobSpec("scheduler", "the BPF scheduler sched_ext runs: koordd (koordd's own) or none",
                                   _scheduler_value)}

    def __init__(self, own: OwnScheduler):
        self.own = own

    def probe(self) -> dict[str, str]:
        why = self.own.why_not()
        return {"scheduler": why} if why else {}

    def read(self, target: str, knob: str) -> str:
        if target != TARGET:
            raise InvalidValue(f"scheduler is a knob of the node (target {TARGET!r}), not of {target!r}")
        status = read_sched_ext(self.own.sys_root)
        if status is None:
            raise Unsupported(missing_reason(self.own.sys_root))
        if status.state == "disabled":
            return NONE
        if status.state == "enabled" and status.ops == OPS_NAME and self.own.running is not None:
            return OPS_NAME
        return status.ops or status.state

    def same(self, current: str, wanted: str) -> bool:
        # "none" is koordd's scheduler not running: another program's is not koordd's to stop.
        return current == wanted or (wanted == NONE and current != OPS_NAME)

    def write(self, target: str, knob: str, value: str) -> None:
        if value == OPS_NAME:
            self.own.start()
        else:
            self.own.stop()

    def close(self) -> None:
        if self.own.running is not None:        # restore normally stopped it; this is the last resort
            self.own.running.unload()
            self.own.running = None


class SchedulerClassBackend(Backend):
    kind = "sched_ext_class"
    cgroup_targets = True
    knobs = {"scheduler_class": KnobSpec("scheduler_class", "the class koordd's scheduler gives the cgroup's "
                                         "threads and those below it (LS, LSR, LSE, BE) or none", _class_value,
                                         harm=Harm("put in the BE class", lambda new, old: new == "BE" and new != old))}

    def __init__(self, fs: CgroupFS, own: OwnScheduler):
        self.fs, self.own = fs, own

    def probe(self) -> dict[str, str]:
        why = self.own.why_not()
        if why is None and self.fs.dir(None, "") is None:
            why = f"no cgroup-v2 tree ({self.fs.layout.describe()}): the scheduler finds a thread's class by its v2 cgroup"
        return {"scheduler_class": why} if why else {}

    def _id(self, target: str) -> int:
        directory = self.fs.dir(None, target)
        if directory is None:
            raise Unsupported("no cgroup-v2 tree")
        try:
            return cgroup_id(directory)
        except FileNotFoundError:
            if target in self.own.classes:          # removed: its entry goes from the map too
                try:
                    self.own.set_class(target, 0, NONE)
                except OSError:
                    pass
            raise TargetGone(target) from None

    def read(self, target: str, knob: str) -> str:
        cgid = self._id(target)
        held = self.own.classes.get(target)
        return held[1] if held is not None and held[0] == cgid else NONE

    def write(self, target: str, knob: str, value: str) -> None:
        self.own.set_class(target, self._id(target) if value != NONE else 0, value)


def scheduler_backends(fs: CgroupFS, sys_root: Path | str = "/sys") -> list[Backend]:
    own = OwnScheduler(sys_root)
    return [SchedulerBackend(own), SchedulerClassBackend(fs, own)]


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends: whether koordd's
    sched_ext scheduler runs, and which class a cgroup's threads have in it."""
    return scheduler_backends(fs)


BACKENDS = BackendSet((SchedulerBackend, SchedulerClassBackend), backends)     # koordd/core/catalogue.py BUILTIN
