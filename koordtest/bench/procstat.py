"""What a running process holds, read from outside it: its memory, threads, open files, CPU time and
the entries of its BPF maps; and the CPU time of the whole node.

BPF map entries: /proc/<pid>/fdinfo/<fd> of a map's file descriptor names the map (map_id, map_type,
key_size, max_entries) but not how many entries it holds; those are counted here by walking the
map's keys with the bpf(2) syscall (BPF_MAP_GET_FD_BY_ID, then BPF_MAP_GET_NEXT_KEY until ENOENT), as
`bpftool map dump` does, without needing bpftool. Root only. An array map always holds max_entries.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
from dataclasses import dataclass

from koordd.sensors.node import CLOCK_TICKS

TICK = CLOCK_TICKS          # /proc clock ticks a second: the daemon's node sensor reads the same unit
BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
BPF_MAP_GET_NEXT_KEY, BPF_MAP_GET_FD_BY_ID, BPF_OBJ_GET_INFO_BY_FD = 4, 14, 15
BPF_F_RDONLY = 1 << 3
HASH_TYPES = {1, 5, 9, 10, 13}        # hash, percpu_hash, lru_hash, lru_percpu_hash, hash_of_maps: count keys
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class BpfMap:
    id: int
    name: str
    type: int
    max_entries: int
    entries: int | None          # None: could not be counted (no bpf syscall here, or no permission)


def status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (KiB) and Threads from /proc/<pid>/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                out[key] = int(value.split()[0])
    return out


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) seconds of the whole process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process."""
    return sum(cpu_times(pid))


def node_cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from /proc/stat's first line: busy is user, nice, system,
    irq, softirq and steal (not idle nor iowait); guest and guest_nice are inside user and nice."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    total = sum(fields[:8])
    return total - fields[3] - fields[4], total


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _fdinfo(pid: int, fd: str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {}


def _bpf(cmd: int, attr: ctypes.Array) -> int:
    r = _libc.syscall(BPF_SYSCALL, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def _map_fd(map_id: int) -> int:
    attr = (ctypes.c_uint8 * 128)()
    ctypes.c_uint32.from_buffer(attr, 0).value = map_id
    ctypes.c_uint32.from_buffer(attr, 8).value = BPF_F_RDONLY
    return _bpf(BPF_MAP_GET_FD_BY_ID, attr)


def _map_name(fd: int) -> str:
    info = (ctypes.c_uint8 * 128)()           # struct bpf_map_info: 6 u32, then char name[16]
    attr = (ctypes.c_uint8 * 128)()
    ctypes.c_uint32.from_buffer(attr, 0).value = fd
    ctypes.c_uint32.from_buffer(attr, 4).value = ctypes.sizeof(info)
    ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(info)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return bytes(info[24:40]).split(b"\0")[0].decode(errors="replace")


def _count_keys(fd: int, key_size: int) -> int:
    key, next_key = (ctypes.c_uint8 * key_size)(), (ctypes.c_uint8 * key_size)()
    attr = (ctypes.c_uint8 * 128)()
    ctypes.c_uint32.from_buffer(attr, 0).value = fd
    ctypes.c_uint64.from_buffer(attr, 8).value = 0           # no key: the first one
    ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(next_key)
    n = 0
    while True:
        try:
            _bpf(BPF_MAP_GET_NEXT_KEY, attr)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return n
            raise
        n += 1
        ctypes.memmove(key, next_key, key_size)
        ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(key)


def bpf_maps(pid: int) -> list[BpfMap]:
    """The BPF maps `pid` holds open, each with its entries counted (hash maps) or its size (arrays)."""
    out, seen = [], set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        info = _fdinfo(pid, fd)
        if "map_id" not in info or int(info["map_id"]) in seen:
            continue
        map_id, map_type = int(info["map_id"]), int(info["map_type"])
        seen.add(map_id)
        max_entries, key_size = int(info["max_entries"]), int(info["key_size"])
        name, entries = f"map {map_id}", None
        if BPF_SYSCALL is not None:
            try:
                mfd = _map_fd(map_id)
            except OSError:
                mfd = None
            if mfd is not None:
                try:
                    name = _map_name(mfd) or name
                    entries = _count_keys(mfd, key_size) if map_type in HASH_TYPES else max_entries
                except OSError:
                    pass
                finally:
                    os.close(mfd)
        out.append(BpfMap(map_id, name, map_type, max_entries, entries))
    return sorted(out, key=lambda m: m.id)
