"""Two backends of targets that are not cgroups, over fake kernels that behave like the real ones
where it matters, to show a non-cgroup knob goes through the actuator's pipeline like any other.

- FakeResctrl: a resctrl tree (one directory per group, a `schemata` file, `info/L3/cbm_mask` and
  `min_cbm_bits`, `info/last_cmd_status`); its "kernel" refuses a non-contiguous, too short or
  unknown-cache-id mask with EINVAL and a last_cmd_status text, as resctrl does.
- FakeNetlink: tc HTB classes held by a fake kernel object (what a netlink socket would talk to),
  kept across backend instances as the kernel keeps them across a koordd crash.
"""
from __future__ import annotations

import errno
from pathlib import Path

from koordd.core.backend import Backend, InvalidValue, KnobSpec, TargetGone, Unsupported


# --- resctrl ----------------------------------------------------------------------------------------

def parse_l3(text: str) -> dict[int, int]:
    """"0=ff;1=f0" -> {0: 0xff, 1: 0xf0}."""
    out = {}
    for part in text.strip().split(";"):
        cache, _, mask = part.partition("=")
        try:
            out[int(cache)] = int(mask, 16)
        except ValueError:
            raise InvalidValue(f"L3 schema wants <cache id>=<hex mask>;..., got {text!r}") from None
    return out


def format_l3(masks: dict[int, int]) -> str:
    return ";".join(f"{c}={m:x}" for c, m in sorted(masks.items()))


def mask_problem(mask: int, full: int, min_bits: int) -> str | None:
    """Why resctrl would refuse this mask on Intel, or None."""
    if mask & ~full:
        return "Mask out of range"
    if mask == 0 or bin(mask).count("1") < min_bits:
        return f"Mask {mask:x} has fewer than {min_bits} bits"
    low = mask & -mask
    if (mask + low) & mask:              # a contiguous run of ones plus its lowest bit clears the run
        return f"The mask {mask:x} has non-consecutive 1-bits"
    return None


class FakeResctrlKernel:
    """The resctrl filesystem under `root`: cache ids 0 and 1, a 12-bit mask, at least 2 bits."""

    def __init__(self, root: Path, groups=("LS", "BE")):
        self.root, self.full, self.min_bits, self.caches = root, 0xfff, 2, (0, 1)
        (root / "info" / "L3").mkdir(parents=True, exist_ok=True)
        (root / "info" / "L3" / "cbm_mask").write_text(f"{self.full:x}\n")
        (root / "info" / "L3" / "min_cbm_bits").write_text(f"{self.min_bits}\n")
        (root / "info" / "last_cmd_status").write_text("ok\n")
        for group in groups:
            self.mkgroup(group)

    def mkgroup(self, group: str) -> None:
        (self.root / group).mkdir(exist_ok=True)
        (self.root / group / "schemata").write_text(
            f"L3:{format_l3({c: self.full for c in self.caches})}\nMB:0=100;1=100\n")

    def write_schemata(self, group: str, line: str) -> None:
        """What the kernel does with a write to <group>/schemata: all or nothing."""
        path = self.root / group / "schemata"
        if not path.parent.is_dir():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        resource, _, schema = line.strip().partition(":")
        problem = None
        try:
            masks = parse_l3(schema)
        except InvalidValue:
            problem, masks = f"Missing '=' or non-numeric domain: {schema!r}", {}
        for cache, mask in masks.items():
            problem = problem or (f"Unknown domain {cache}" if cache not in self.caches
                                  else mask_problem(mask, self.full, self.min_bits))
        (self.root / "info" / "last_cmd_status").write_text((problem or "ok") + "\n")
        if problem:
            raise OSError(errno.EINVAL, "Invalid argument")
        lines = [ln for ln in path.read_text().splitlines() if not ln.startswith(resource + ":")]
        current = parse_l3(next(ln for ln in path.read_text().splitlines() if ln.startswith("L3:"))[3:])
        path.write_text("\n".join([f"L3:{format_l3({**current, **masks})}"] + lines) + "\n")


class FakeResctrl(Backend):
    """Targets: resctrl groups by name. Knob `resctrl.l3`: the group's L3 masks, "0=ff;1=f0"."""
    kind = "resctrl"
    knobs = {"resctrl.l3": KnobSpec("resctrl.l3", "L3 cache ways per cache id (hex masks)",
                                    lambda v: format_l3(parse_l3(v)))}

    def __init__(self, kernel: FakeResctrlKernel):
        self.kernel, self.root = kernel, kernel.root    # reads are files; a write goes through the "kernel"
        self.opened = True           # a real backend may hold an fd on the mount: closed on stop

    def probe(self) -> dict[str, str]:
        return {} if (self.root / "info" / "L3").is_dir() else {"resctrl.l3": "no L3 allocation (cat_l3)"}

    def _group(self, target: str) -> Path:
        path = self.root / target
        if not path.is_dir():
            raise TargetGone(target)
        return path

    def read(self, target: str, knob: str) -> str:
        for line in (self._group(target) / "schemata").read_text().splitlines():
            if line.startswith("L3:"):
                return format_l3(parse_l3(line[3:]))
        raise Unsupported("no L3 line in schemata")

    def validate(self, target: str, knob: str, value: str) -> str:
        masks = parse_l3(value)
        full = int((self.root / "info" / "L3" / "cbm_mask").read_text(), 16)
        min_bits = int((self.root / "info" / "L3" / "min_cbm_bits").read_text())
        for cache, mask in masks.items():
            problem = mask_problem(mask, full, min_bits)
            if problem:
                raise InvalidValue(f"cache {cache}: {problem}")
        return format_l3(masks)

    def write(self, target: str, knob: str, value: str) -> None:
        self._group(target)
        try:
            self.kernel.write_schemata(target, f"L3:{value}")
        except OSError as e:
            status = (self.root / "info" / "last_cmd_status").read_text().strip()
            raise OSError(e.errno, f"{e.strerror}; last_cmd_status: {status}") from None

    def close(self) -> None:
        self.opened = False


# --- netlink (tc HTB classes) ------------------------------------------------------------------------

class FakeNetlinkKernel:
    """HTB classes by (device, classid) -> ceil in bit/s; the link's speed bounds every ceil."""

    def __init__(self, link_bps: int = 10_000_000_000):
        self.link_bps = link_bps
        self.classes: dict[tuple[str, str], int] = {("eth0", "1:10"): link_bps, ("eth0", "1:20"): link_bps}
        self.refuse_next: int | None = None          # an errno the next change fails with

    def change(self, dev: str, classid: str, ceil: int) -> None:
        if (dev, classid) not in self.classes:
            raise OSError(errno.ENOENT, "No such file or directory")
        if self.refuse_next is not None:
            err, self.refuse_next = self.refuse_next, None
            raise OSError(err, "refused by the fake kernel")
        self.classes[(dev, classid)] = ceil


class FakeNetlink(Backend):
    """Targets: "<device>/<classid>" of an HTB class. Knob `tc.htb.ceil`: its ceiling in bit/s."""
    kind = "tc"
    knobs = {"tc.htb.ceil": KnobSpec("tc.htb.ceil", "HTB class ceiling, bit/s", str, magnitude=float)}

    def __init__(self, kernel: FakeNetlinkKernel):
        self.kernel = kernel
        self.socket_open = True      # a real one holds a netlink socket from open to close

    def _key(self, target: str) -> tuple[str, str]:
        dev, _, classid = target.partition("/")
        if (dev, classid) not in self.kernel.classes:
            raise TargetGone(target)
        return dev, classid

    def read(self, target: str, knob: str) -> str:
        return str(self.kernel.classes[self._key(target)])

    def validate(self, target: str, knob: str, value: str) -> str:
        try:
            ceil = int(value)
        except ValueError:
            raise InvalidValue(f"tc.htb.ceil wants bit/s as an integer, got {value!r}") from None
        if not 0 < ceil <= self.kernel.link_bps:
            raise InvalidValue(f"tc.htb.ceil must be 1..{self.kernel.link_bps} (the link's speed), got {ceil}")
        return str(ceil)

    def write(self, target: str, knob: str, value: str) -> None:
        try:
            self.kernel.change(*self._key(target), int(value))
        except FileNotFoundError:
            raise TargetGone(target) from None

    def close(self) -> None:
        self.socket_open = False
