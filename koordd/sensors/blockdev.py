"""The host's block devices and mounts: the "block_devices" section (koordd/core/blkio.py BlockDevices).

io_qos names its devices by number, device path or mount path; the loop is pure, so the names are
looked up here: every block device of /sys/dev/block (MAJ:MIN -> its whole disk, its /dev name and,
for device-mapper, its /dev/mapper name) and every mount of /proc/self/mountinfo (mount point -> the
device number of its filesystem). Read at start, and again only when the list of devices changes
(one directory listing a round) or the mount table does (the kernel marks /proc/self/mountinfo
with POLLPRI on every mount and unmount: one poll(2) a round), so a node with thousands of mounts
pays nothing while they stay as they are.
"""
from __future__ import annotations

import logging
import os
import select

from koordd.core.blkio import BLOCK_DEVICES, BlockDevices
from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable

log = logging.getLogger("koordd.sensors")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _unescape(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 4 <= len(text) and text[i + 1:i + 4].isdigit():
            out.append(chr(int(text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> dict[str, str]:
    """mount point -> MAJ:MIN of the mounted filesystem (the last mount on a point wins: it is the one
    seen there). Filesystems without a block device (major 0) are kept: resolve() says why they fail."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or ":" not in fields[2]:
            continue
        out[_unescape(fields[4])] = fields[2]
    return out


def read_devices(sys_dev_block: str) -> tuple[dict[str, str], dict[str, str]]:
    """(MAJ:MIN -> MAJ:MIN of its whole disk, /dev path -> MAJ:MIN) of every block device."""
    disks: dict[str, str] = {}
    names: dict[str, str] = {}
    for dev in sorted(os.listdir(sys_dev_block)):
        d = os.path.join(sys_dev_block, dev)
        real = os.path.realpath(d)
        names[f"/dev/{os.path.basename(real)}"] = dev
        disk = dev
        if os.path.exists(os.path.join(d, "partition")):
            disk = _read(os.path.join(os.path.dirname(real), "dev")) or dev
        disks[dev] = disk
        mapper = _read(os.path.join(d, "dm", "name"))
        if mapper:
            names[f"/dev/mapper/{mapper}"] = dev
    return disks, names


class BlockDeviceSensor(OptionalSensor):
    name = BLOCK_DEVICES

    def __init__(self, sys_root: str = "/sys", proc_root: str = "/proc"):
        self.sys_dev_block = os.path.join(sys_root, "dev", "block")
        self.mountinfo = os.path.join(proc_root, "self", "mountinfo")
        self.fd: int | None = None
        self.poller: select.poll | None = None
        self.listed: frozenset[str] = frozenset()
        self.section: BlockDevices | None = None

    def start(self) -> None:
        if not os.path.isdir(self.sys_dev_block):
            raise SensorUnavailable(f"no {self.sys_dev_block}: sysfs not mounted")
        try:
            self.fd = os.open(self.mountinfo, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise SensorUnavailable(f"cannot open {self.mountinfo}: {e.strerror or e}") from None
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLPRI | select.POLLERR)
        self._refresh(mounts_changed=True)

    def _mounts_changed(self) -> bool:
        if self.poller is None:
            return True
        return bool(self.poller.poll(0))

    def _refresh(self, mounts_changed: bool) -> None:
        listed = frozenset(os.listdir(self.sys_dev_block))
        if not mounts_changed and listed == self.listed and self.section is not None:
            return
        disks, names = read_devices(self.sys_dev_block)
        mounts = self.section.mounts if self.section is not None and not mounts_changed else None
        if mounts is None:
            # Read through the polled descriptor from its start: that read also clears the change mark.
            chunks, offset = [], 0
            while True:
                chunk = os.pread(self.fd, 1 << 16, offset) if self.fd is not None else b""
                if not chunk:
                    break
                chunks.append(chunk)
                offset += len(chunk)
            mounts = parse_mountinfo(b"".join(chunks).decode(errors="replace"))
        self.listed = listed
        self.section = BlockDevices(disks, names, mounts)

    def sample(self, context: SensorContext | None = None) -> BlockDevices:
        self._refresh(self._mounts_changed())
        return self.section

    def stop(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.poller = None, None
