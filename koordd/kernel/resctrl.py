"""resctrl: the kernel's interface to cache allocation (L3 CAT) and memory bandwidth allocation (MBA).

The filesystem (usually /sys/fs/resctrl) has `info/` (what the hardware offers) and one directory
per control group: `schemata` (one line per resource: `L3:0=fff;1=fff`, a capacity bitmask per cache
id; `MB:0=100;1=100`, a bandwidth limit per memory domain) and `tasks` (thread ids, one per write).
The root is the default group: every thread not moved elsewhere. A failed write returns EINVAL and
`info/last_cmd_status` says why.

This module reads `info/`, computes masks and limits from percentages the way koordlet does, and
parses schemata; I/O goes through `ResctrlFS`, so tests can hand in a tree that refuses what the
kernel refuses (koordtest/fakes/resctrl.py).
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from koordd.core.schemata import L3Info, MBInfo, ResctrlInfo

DEFAULT_MOUNT = Path("/sys/fs/resctrl")


class ResctrlError(Exception):
    """resctrl is unusable here, or a file of it does not read as the kernel writes it."""


class ResctrlFS:
    """File operations on a mounted resctrl tree, paths relative to its root. Raises OSError as the
    kernel does; `last_cmd_status()` says why the last write failed."""

    def __init__(self, root: Path | str = DEFAULT_MOUNT):
        self.root = Path(root)

    def mounted(self) -> bool:
        return (self.root / "schemata").exists()

    def mount(self) -> None:
        """mount -t resctrl resctrl <root>: mount(2) through libc."""
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(b"resctrl", str(self.root).encode(), b"resctrl", 0, None) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), str(self.root))

    def umount(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.umount2(str(self.root).encode(), 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), str(self.root))

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def write(self, rel: str, text: str) -> None:
        # One write(2) per call: the kernel parses each write on its own (tasks takes one id per write).
        fd = os.open(self.root / rel, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def mkdir(self, rel: str) -> None:
        os.mkdir(self.root / rel)

    def rmdir(self, rel: str) -> None:
        os.rmdir(self.root / rel)

    def listdir(self, rel: str = "") -> list[str]:
        return sorted(os.listdir(self.root / rel))

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def last_cmd_status(self) -> str:
        try:
            return self.read("info/last_cmd_status").strip()
        except OSError:
            return ""


def parse_schemata(text: str) -> dict[str, dict[int, str]]:
    """`    L3:0=fff;1=fff` lines (names padded to align) -> {"L3": {0: "fff", 1: "fff"}}."""
    out: dict[str, dict[int, str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        name, sep, rest = line.partition(":")
        if not sep:
            raise ResctrlError(f"schemata line {n}: no ':' in {line!r}")
        domains: dict[int, str] = {}
        for part in rest.split(";"):
            key, eq, value = part.partition("=")
            try:
                # Digits only ("-1", "+1", " 1_0" are not ids); int() refuses "²" and 4300 digits or more.
                if not eq or not key.strip().isdigit():
                    raise ValueError
                domains[int(key)] = value.strip()
            except ValueError:
                raise ResctrlError(f"schemata line {n}: {part[:80]!r} is not <domain id>=<value>") from None
        out[name.strip()] = domains
    return out


def domain_ids(fs: ResctrlFS, resource: str) -> tuple[int, ...]:
    """The cache or memory domain ids of `resource`, from the default group's schemata."""
    line = parse_schemata(fs.read("schemata")).get(resource)
    if not line:
        raise ResctrlError(f"schemata has no {resource} line")
    return tuple(sorted(line))


def _int_file(fs: ResctrlFS, rel: str, base: int = 10) -> int:
    text = fs.read(rel).strip()
    try:
        return int(text, base)
    except ValueError:
        raise ResctrlError(f"{rel}: expected a {'hex ' if base == 16 else ''}number, got {text!r}") from None


def read_info(fs: ResctrlFS, vendor: str) -> ResctrlInfo:
    """What `info/` says of L3 and MB (None for a resource the host lacks). `vendor`: "intel" or "amd"
    (/proc/cpuinfo's vendor_id), which decides MB's unit."""
    l3 = mb = None
    if fs.exists("info/L3"):
        l3 = L3Info(_int_file(fs, "info/L3/cbm_mask", 16), _int_file(fs, "info/L3/min_cbm_bits"),
                    _int_file(fs, "info/L3/num_closids"), _int_file(fs, "info/L3/shareable_bits", 16),
                    domain_ids(fs, "L3"))
    if fs.exists("info/MB"):
        mb = MBInfo(_int_file(fs, "info/MB/min_bandwidth"), _int_file(fs, "info/MB/bandwidth_gran"),
                    _int_file(fs, "info/MB/num_closids"), domain_ids(fs, "MB"), vendor)
    return ResctrlInfo(l3, mb, vendor)


def cpu_vendor(cpuinfo: str) -> str:
    """"intel", "amd" or "" from /proc/cpuinfo's first vendor_id."""
    for line in cpuinfo.splitlines():
        if line.startswith("vendor_id"):
            v = line.partition(":")[2].strip()
            return {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "amd"}.get(v, "")
    return ""


def refused(fs: ResctrlFS, e: OSError) -> OSError:
    """`e` with the kernel's reason from info/last_cmd_status added to its text, for the decision log
    ("EINVAL: Invalid argument (The mask 5 has non-consecutive 1-bits)")."""
    status = fs.last_cmd_status()
    text = e.strerror or str(e)
    return OSError(e.errno, f"{text} ({status})" if status and status != "ok" else text)
