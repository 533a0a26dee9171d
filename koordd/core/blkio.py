"""Block IO values as koordd carries them: the cgroup-v2 text of `io.max` and `io.weight`, one form on
every host (the cgroup backend maps it onto v1's blkio.throttle.* and blkio.bfq.weight files).

`io.max` is per device: one line per device, "MAJ:MIN rbps=N wbps=N riops=N wiops=N", each field a
positive integer or "max" (no limit). The canonical text names all four fields of every line and
sorts the lines by device number, so two readings of the same limits compare equal. A line whose
fields are all "max" is kept: it says "this device, unlimited", which is what a restore writes for a
device that had no limit before koordd limited it. A write changes the devices its lines name and
no other (the kernel's own rule for io.max), so koordd's value of the knob is always scoped to the
devices koordd governs (`scope`): a device someone else limits stays theirs.

Pure: no I/O. Used by the cgroup backend, the actuator's guard and the io_qos loop.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

FIELDS = ("rbps", "wbps", "riops", "wiops")
MAX_LIMIT = 2 ** 64 - 1          # the kernel's fields are u64; U64_MAX reads back as "max"
_DEVICE = re.compile(r"([0-9]{1,9}):([0-9]{1,9})")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_AMOUNT = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)", re.IGNORECASE)

Limits = dict[str, "int | None"]          # field -> limit, None for "max"


def parse_device(text: str) -> str:
    """A device number "MAJ:MIN" as the kernel writes it (no leading zeros); ValueError otherwise."""
    m = _DEVICE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a device number \"MAJ:MIN\": {text.strip()[:40]!r}")
    return f"{int(m.group(1))}:{int(m.group(2))}"


def _device_key(dev: str) -> tuple[int, int]:
    major, minor = dev.split(":")
    return int(major), int(minor)


def parse_amount(text: str, field: str) -> int | None:
    """One field's value: "max" (None), an integer, or for rbps/wbps a size with a binary suffix
    ("10M" = 10 MiB/s). ValueError naming the field."""
    s = text.strip()
    if s.lower() == "max":
        return None
    m = _AMOUNT.fullmatch(s)
    if not m or (m.group(2) and field.endswith("iops")):
        sizes = " or a size such as 10M" if field.endswith("bps") else ""
        raise ValueError(f"io.max {field} must be a positive integer{sizes} or max, got {s[:40]!r}")
    number = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not number < MAX_LIMIT:          # inf too: hundreds of digits
        raise ValueError(f"io.max {field} is past the kernel's 64-bit limit: {s[:40]!r} (use max for no limit)")
    value = int(number)
    if value < 1:
        # 0 would mean "no limit" on v1 and a stalled device on v2: neither is what a limit of 0 says.
        raise ValueError(f"io.max {field} must be at least 1 (use max for no limit), got {s!r}")
    return value


def parse_limits(text: str, where: str = "io.max") -> Limits:
    """"rbps=10M wiops=100" -> all four fields (those not named: None, no limit)."""
    out: Limits = {f: None for f in FIELDS}
    for key, value in key_values(text, FIELDS, where).items():
        out[key] = parse_amount(value, key)
    return out


def key_values(text: str, keys, where: str) -> dict[str, str]:
    """"a=1 b=2" -> {"a": "1", "b": "2"}, each key one of `keys` and given once, else ValueError naming
    `where`."""
    got: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if not sep or key not in keys:
            raise ValueError(f"{where}: expected {'/'.join(keys)}=<value>, got {token[:40]!r}")
        if key in got:
            raise ValueError(f"{where}: {key} given twice")
        got[key] = value
    return got


def parse_io_max(text: str) -> dict[str, Limits]:
    """device -> its limits, from io.max text (the kernel's or koordd's); ValueError for a bad line or a
    device named twice."""
    out: dict[str, Limits] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        dev_text, _, rest = line.strip().partition(" ")
        try:
            dev = parse_device(dev_text)
        except ValueError as e:
            raise ValueError(f"io.max: {e}") from None
        if dev in out:
            raise ValueError(f"io.max: device {dev} named twice")
        out[dev] = parse_limits(rest, f"io.max {dev}")
    return out


def format_line(dev: str, limits: Limits) -> str:
    return dev + " " + " ".join(f"{f}={'max' if limits.get(f) is None else limits[f]}" for f in FIELDS)


def format_io_max(devices: dict[str, Limits]) -> str:
    """Canonical text: every field named, lines sorted by device number."""
    return "\n".join(format_line(dev, devices[dev]) for dev in sorted(devices, key=_device_key))


def normalize_io_max(text: str) -> str:
    return format_io_max(parse_io_max(text))


def unlimited() -> Limits:
    return {f: None for f in FIELDS}


def scope(current: str, wanted: str) -> str:
    """Of `current` (every device's limits, as read), the lines of the devices `wanted` names, a device
    without a line there reading as unlimited: what a write of `wanted` changes, and what a restore of
    it must put back."""
    have, want = parse_io_max(current), parse_io_max(wanted)
    return format_io_max({dev: have.get(dev, unlimited()) for dev in want})


def tighter(new: str, original: str) -> bool:
    """Whether `new` limits any device of `original` more than `original` does (a lower number, or a
    number where it had max); a device `original` does not name had no limit. A reading of the knob is
    scoped to the devices of koordd's hold (scope) before it is judged: a device it does not name is not
    koordd's."""
    try:
        n, o = parse_io_max(new), parse_io_max(original)
    except ValueError:
        return True         # a value we cannot compare is not one we may write on protected work
    for dev, limits in n.items():
        before = o.get(dev, unlimited())
        for f in FIELDS:
            if limits[f] is not None and (before[f] is None or limits[f] < before[f]):
                return True
    return False


# --- io.weight -------------------------------------------------------------------------------------

WEIGHT_RANGE = (1, 10000)        # v2 io.weight; v1 blkio.bfq.weight takes 1..1000


def normalize_io_weight(text: str) -> str:
    """The default weight as "default N", from "N", "default N" or the kernel's io.weight text (whose
    per-device lines, "MAJ:MIN N", are not koordd's and are left out). ValueError naming the knob."""
    default = None
    for line in text.strip().splitlines():
        words = line.split()
        if not words:
            continue
        if len(words) == 1 and default is None:
            default = words[0]
        elif words[0] == "default" and len(words) == 2:
            default = words[1]
        elif len(words) == 2 and _DEVICE.fullmatch(words[0]):
            continue            # a per-device weight: someone else's
        else:
            raise ValueError(f"io.weight: expected \"default N\" or N, got {line.strip()[:40]!r}")
    if default is None or not (default.isascii() and default.isdigit()):
        raise ValueError(f"io.weight: expected \"default N\" or N with N in 1..10000, got {text.strip()[:40]!r}")
    lo, hi = WEIGHT_RANGE
    if not lo <= int(default) <= hi:
        raise ValueError(f"io.weight must be {lo}..{hi}, got {int(default)}")
    return f"default {int(default)}"


def weight_of(value: str) -> int:
    return int(normalize_io_weight(value).split()[1])


# --- block devices: naming one by number, device path or mount path --------------------------------

BLOCK_DEVICES = "block_devices"      # the snapshot section of sensors/blockdev.py


@dataclass(frozen=True)
class BlockDevices:
    """The host's block devices and mounts, as the block_devices sensor read them (at its start, and
    again whenever a device or a mount comes or goes)."""
    disks: Mapping[str, str] = field(default_factory=dict)      # MAJ:MIN -> MAJ:MIN of its whole disk
    names: Mapping[str, str] = field(default_factory=dict)      # "/dev/vda", "/dev/mapper/vg-lv" -> MAJ:MIN
    mounts: Mapping[str, str] = field(default_factory=dict)     # mount point -> MAJ:MIN of its filesystem

    def resolve(self, spec: str) -> tuple[str | None, str]:
        """The whole disk `spec` names (a "MAJ:MIN", a device path, or any path below a mount point: the
        disk of the filesystem it is on), with how it was found; (None, why) when it names none. A
        partition gives its disk: the kernel limits whole disks. Symbolic links are not followed (name
        the device or the mount itself)."""
        s = spec.strip()
        if _DEVICE.fullmatch(s):
            dev = parse_device(s)
            if dev not in self.disks:
                return None, f"no block device {dev} on this host"
            return self.disks[dev], "device number" if self.disks[dev] == dev else f"disk of partition {dev}"
        if not s.startswith("/"):
            return None, "neither MAJ:MIN nor an absolute path"
        path = "/" + "/".join(p for p in s.split("/") if p and p != ".")
        if ".." in path.split("/"):
            return None, "a path with \"..\" (name it without)"
        if path in self.names:
            dev = self.names[path]
            disk = self.disks.get(dev, dev)
            return disk, "device" if disk == dev else f"disk of partition {path} ({dev})"
        found = max((m for m in self.mounts if path == m or path.startswith(m.rstrip("/") + "/")),
                    key=len, default=None)
        if found is None:
            return None, "not below any mount point"
        dev = self.mounts[found]
        if dev not in self.disks:
            return None, (f"mount point {found} is on {dev}, no block device (tmpfs, overlay, NFS or btrfs: "
                          "name the disk instead)")
        disk = self.disks[dev]
        return disk, f"filesystem mounted at {found} ({dev})"


# --- iocost (cgroup v2, the root's io.cost.qos and io.cost.model; one line per disk) ------------------

# key -> kind, in the kernel's order: "flag" 0/1, "ctrl" auto/user, "pct" a percentage the kernel shows
# with two decimals, "int" an integer, "model" the cost model's name.
IOCOST_KEYS = {
    "io.cost.qos": {"enable": "flag", "ctrl": "ctrl", "rpct": "pct", "rlat": "int", "wpct": "pct", "wlat": "int",
                    "min": "pct", "max": "pct"},
    "io.cost.model": {"ctrl": "ctrl", "model": "model", "rbps": "int", "rseqiops": "int", "rrandiops": "int",
                      "wbps": "int", "wseqiops": "int", "wrandiops": "int"},
}
# What a disk without iocost reads as: off, its parameters the kernel's own.
IOCOST_DEFAULTS = {"io.cost.qos": {"enable": "0", "ctrl": "auto"}, "io.cost.model": {"ctrl": "auto"}}


def _iocost_value(knob: str, key: str, kind: str, text: str) -> str:
    if kind == "flag" and text in ("0", "1"):
        return text
    if kind == "ctrl" and text in ("auto", "user"):
        return text
    if kind == "model" and text == "linear":
        return text
    if kind == "int" and text.isascii() and text.isdigit() and len(text) <= 20 and int(text) < MAX_LIMIT:
        return str(int(text))
    if kind == "pct":
        try:
            v = float(text)
        except ValueError:
            v = -1.0
        if 0 <= v <= 10000:
            return f"{v:.2f}"
    want = {"flag": "0 or 1", "ctrl": "auto or user", "model": "linear", "int": "an integer",
            "pct": "a percentage such as 95 or 95.00"}[kind]
    raise ValueError(f"{knob}: {key} must be {want}, got {text[:40]!r}")


def normalize_iocost(knob: str, text: str) -> str:
    """"key=value ..." of one disk's io.cost.qos or io.cost.model line (without the device), in the
    kernel's order and form (rpct=95 -> rpct=95.00); the keys not given are left out."""
    keys = IOCOST_KEYS[knob]
    got = {key: _iocost_value(knob, key, keys[key], value) for key, value in key_values(text, keys, knob).items()}
    if not got:
        example = "enable=1 ctrl=auto" if knob == "io.cost.qos" else "ctrl=auto"
        raise ValueError(f"{knob}: no parameters (e.g. {example})")
    return " ".join(f"{k}={got[k]}" for k in keys if k in got)


def iocost_line(knob: str, text: str, dev: str) -> str | None:
    """The parameters of disk `dev` in the root's io.cost.qos / io.cost.model text (None: no line)."""
    for line in text.splitlines():
        words = line.split(maxsplit=1)
        if len(words) == 2 and words[0] == dev:
            return normalize_iocost(knob, words[1])
    return None


def scope_iocost(knob: str, current: str, wanted: str) -> str:
    """Of a disk's `current` parameters, those `wanted` names: what a write of it changes."""
    have = dict(t.split("=", 1) for t in current.split())
    want = [t.split("=", 1)[0] for t in wanted.split()]
    return " ".join(f"{k}={have[k]}" for k in want if k in have)
