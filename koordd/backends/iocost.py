"""iocost's root files, one disk per target: `io.cost.qos` and `io.cost.model` (cgroup v2 only).

iocost (CONFIG_BLK_CGROUP_IOCOST, Meta's IO controller) makes `io.weight` act on a disk: it is enabled
per disk in the root cgroup's io.cost.qos ("MAJ:MIN enable=1 ctrl=auto ..."), with a cost model per
disk in io.cost.model (ctrl=auto: the kernel's for the device class; ctrl=user with model=linear and
its six coefficients, e.g. measured by resctl-bench / iocost_coef_gen.py). A target is a disk "MAJ:MIN",
node-wide; a value is that disk's "key=value ..." parameters. A write changes only the keys it names
(the kernel's rule), so a hold is scoped to them (scope()): koordd's restore puts back the keys it
wrote, and a disk koordd never configured is not touched. A disk without a line reads as iocost off,
"enable=0 ctrl=auto" (the model: "ctrl=auto").
"""
from __future__ import annotations

import os

from koordd.core import blkio
from koordd.core.backend import Backend, BackendSet, InvalidValue, KnobSpec, Unsupported
from koordd.kernel.cgroupfs import CgroupFS

SYS_DEV_BLOCK = "/sys/dev/block"


def _spec(knob: str, doc: str) -> KnobSpec:
    def normalize(text: str) -> str:
        try:
            return blkio.normalize_iocost(knob, text)
        except ValueError as e:
            raise InvalidValue(str(e)) from None
    return KnobSpec(knob, doc, normalize)


KNOBS = {
    "io.cost.qos": _spec("io.cost.qos", "iocost on a disk and its latency targets: \"enable=1 ctrl=auto\" or "
                                        "ctrl=user with rpct/rlat/wpct/wlat/min/max (cgroup v2 root; target MAJ:MIN)"),
    "io.cost.model": _spec("io.cost.model", "a disk's iocost cost model: \"ctrl=auto\", or ctrl=user model=linear "
                                            "with rbps/rseqiops/rrandiops/wbps/wseqiops/wrandiops (target MAJ:MIN)"),
}


class IocostBackend(Backend):
    kind = "iocost"
    knobs = KNOBS

    def __init__(self, fs: CgroupFS, sys_dev_block: str = SYS_DEV_BLOCK):
        layout = fs.layout
        self.root = str(layout.unified) if "io" in layout.v2_controllers and layout.unified is not None else None
        self.sys_dev_block = sys_dev_block

    def _why_not(self) -> str | None:
        if self.root is None:
            return "iocost needs cgroup v2 with the io controller (io.cost.qos lives in the v2 root)"
        if not os.path.isfile(os.path.join(self.root, "io.cost.qos")):
            return f"no {self.root}/io.cost.qos: kernel without CONFIG_BLK_CGROUP_IOCOST"
        return None

    def probe(self) -> dict[str, str]:
        why = self._why_not()
        return {k: why for k in KNOBS} if why else {}

    def read(self, target: str, knob: str) -> str:
        why = self._why_not()
        if why:
            raise Unsupported(why)
        with open(os.path.join(self.root, knob)) as f:
            text = f.read()
        line = blkio.iocost_line(knob, text, blkio.parse_device(target))
        return line if line is not None else blkio.normalize_iocost(
            knob, " ".join(f"{k}={v}" for k, v in blkio.IOCOST_DEFAULTS[knob].items()))

    def validate(self, target: str, knob: str, value: str) -> str:
        try:
            dev = blkio.parse_device(target)
        except ValueError as e:
            raise InvalidValue(f"{knob}: the target is a disk: {e}") from None
        d = os.path.join(self.sys_dev_block, dev)
        if not os.path.exists(d):
            raise InvalidValue(f"{knob}: no block device {dev} on this host")
        if os.path.exists(os.path.join(d, "partition")):
            raise InvalidValue(f"{knob}: {dev} is a partition; iocost works on whole disks")
        return KNOBS[knob].normalize(value)

    def write(self, target: str, knob: str, value: str) -> None:
        why = self._why_not()
        if why:
            raise Unsupported(why)
        fd = os.open(os.path.join(self.root, knob), os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.write(fd, f"{blkio.parse_device(target)} {value}".encode())
        finally:
            os.close(fd)

    def scope(self, knob: str, current: str, wanted: str) -> str:
        return blkio.scope_iocost(knob, current, wanted)


def backends(fs: CgroupFS) -> list[Backend]:
    return [IocostBackend(fs)]


BACKENDS = BackendSet((IocostBackend,), backends)     # koordd/core/catalogue.py BUILTIN
