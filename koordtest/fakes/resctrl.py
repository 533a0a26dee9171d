"""A resctrl tree in a temporary directory that refuses what the kernel refuses.

Files are plain files, so tests can read what landed; writes go through FakeResctrl.write(), which
checks them as arch/x86/kernel/cpu/resctrl does: a schemata write needs its trailing newline, a
known resource and domain ids, contiguous masks (Intel) within cbm_mask of at least min_cbm_bits,
MB within [min_bandwidth, 100] rounded up to bandwidth_gran; `tasks` takes one id per write and
refuses an id that is not alive; mkdir fails with ENOSPC when every CLOSID is taken; rmdir hands a
group's tasks back to the default group. A refusal raises OSError(EINVAL/ESRCH/ENOSPC) and leaves
the kernel's text in info/last_cmd_status (for an unknown domain id the kernel has none).
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from koordd.kernel.resctrl import ResctrlFS

NOT_GROUPS = {"info", "mon_groups", "mon_data"}


class FakeResctrl(ResctrlFS):
    def __init__(self, root: Path, cbm_mask: int = 0x7FF, min_cbm_bits: int = 1, num_closids: int = 4,
                 cache_ids: tuple[int, ...] = (0, 1), mb: bool = True, bandwidth_gran: int = 10,
                 min_bandwidth: int = 10, alive: set[int] | None = None, mounted: bool = True):
        super().__init__(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.cbm_mask, self.min_cbm_bits, self.num_closids = cbm_mask, min_cbm_bits, num_closids
        self.cache_ids, self.mb = cache_ids, mb
        self.bandwidth_gran, self.min_bandwidth = bandwidth_gran, min_bandwidth
        self.alive = alive if alive is not None else set()      # thread ids that exist
        self.writes: list[tuple[str, str]] = []                  # every write tried, in order
        if mounted:
            self.mount()

    def mount(self) -> None:
        """What mount -t resctrl shows: info/ and the default group holding every thread."""
        if self.mounted():
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(self.root))
        info = {"L3/cbm_mask": f"{self.cbm_mask:x}", "L3/min_cbm_bits": str(self.min_cbm_bits),
                "L3/num_closids": str(self.num_closids), "L3/shareable_bits": "0", "last_cmd_status": "ok"}
        if self.mb:
            info.update({"MB/min_bandwidth": str(self.min_bandwidth), "MB/bandwidth_gran": str(self.bandwidth_gran),
                         "MB/num_closids": str(self.num_closids), "MB/delay_linear": "1"})
        for rel, text in info.items():
            (self.root / "info" / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.root / "info" / rel).write_text(text + "\n")
        self._new_group(self.root, tasks=sorted(self.alive))

    def umount(self) -> None:
        """The kernel removes every group on unmount; the mount point stays, empty."""
        if not self.mounted():
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(self.root))
        shutil.rmtree(self.root)
        self.root.mkdir()

    # --- what the kernel shows ---------------------------------------------------------------------

    def _new_group(self, d: Path, tasks=()) -> None:
        d.mkdir(parents=True, exist_ok=True)
        self._show(d, {"L3": {i: self.cbm_mask for i in self.cache_ids},
                       **({"MB": {i: 100 for i in self.cache_ids}} if self.mb else {})})
        (d / "tasks").write_text("".join(f"{t}\n" for t in tasks))
        (d / "cpus").write_text("0\n")

    def _show(self, d: Path, lines: dict[str, dict[int, int]]) -> None:
        width = len(f"{self.cbm_mask:x}")
        text = ""
        for name, doms in lines.items():
            fmt = (lambda v: f"{v:0{width}x}") if name == "L3" else (lambda v: f"{v:>3}")
            text += f"{name:>4}:" + ";".join(f"{i}={fmt(v)}" for i, v in sorted(doms.items())) + "\n"
        (d / "schemata").write_text(text)

    def _values(self, d: Path) -> dict[str, dict[int, int]]:
        out = {}
        for line in (d / "schemata").read_text().splitlines():
            name, _, rest = line.strip().partition(":")
            out[name] = {int(k): int(v, 16 if name == "L3" else 10)
                         for k, v in (p.split("=") for p in rest.split(";"))}
        return out

    def groups(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and p.name not in NOT_GROUPS)

    def tasks_of(self, group: str = "") -> list[int]:
        return [int(t) for t in (self.root / group / "tasks").read_text().split()]

    # --- what the kernel does ----------------------------------------------------------------------

    def _status(self, text: str) -> None:
        (self.root / "info" / "last_cmd_status").write_text((text or "ok") + "\n")

    def _refuse(self, code: int, text: str):
        self._status(text)
        raise OSError(code, os.strerror(code))

    def write(self, rel: str, text: str) -> None:
        self.writes.append((rel, text))
        path = self.root / rel
        if not path.parent.is_dir():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        if path.name == "schemata":
            return self._write_schemata(path.parent, text)
        if path.name == "tasks":
            return self._write_task(path.parent, text)
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    def _write_schemata(self, group: Path, text: str) -> None:
        self._status("")
        if not text.endswith("\n"):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))      # no newline: no message either
        values = self._values(group)
        for line in text[:-1].split("\n"):
            name, sep, rest = line.partition(":")
            name = name.strip()
            if not sep:
                self._refuse(errno.EINVAL, "Missing ':'")
            if not rest:
                self._refuse(errno.EINVAL, f"Missing '{name}' value")
            if name not in values:
                self._refuse(errno.EINVAL, f"Unknown or unsupported resource name '{name}'")
            for part in rest.split(";"):
                dom, eq, value = part.partition("=")
                if not eq or not dom.strip().isdigit():
                    self._refuse(errno.EINVAL, "Missing '=' or non-numeric domain")
                if int(dom) not in values[name]:
                    self._refuse(errno.EINVAL, "")                     # the kernel says nothing here
                values[name][int(dom)] = self._cbm(value.strip()) if name == "L3" else self._bw(value.strip())
        self._show(group, values)

    def _cbm(self, text: str) -> int:
        try:
            val = int(text, 16)
        except ValueError:
            self._refuse(errno.EINVAL, f"Non-hex character in the mask {text}")
        if (self.min_cbm_bits > 0 and val == 0) or val > self.cbm_mask:
            self._refuse(errno.EINVAL, "Mask out of range")
        low = (val & -val).bit_length() - 1
        run = (val >> low) if val else 0
        if run & (run + 1):
            self._refuse(errno.EINVAL, f"The mask {val:x} has non-consecutive 1-bits")
        if bin(val).count("1") < self.min_cbm_bits:
            self._refuse(errno.EINVAL, f"Need at least {self.min_cbm_bits} bits in the mask")
        return val

    def _bw(self, text: str) -> int:
        if not text.isdigit():
            self._refuse(errno.EINVAL, f"Non-decimal digit in MB value {text}")
        bw = int(text)
        if bw < self.min_bandwidth or bw > 100:
            self._refuse(errno.EINVAL, f"MB value {bw} out of range [{self.min_bandwidth},100]")
        return -(-bw // self.bandwidth_gran) * self.bandwidth_gran

    def _write_task(self, group: Path, text: str) -> None:
        self._status("")
        word = text.strip()
        if not word.isdigit():
            self._refuse(errno.EINVAL, f"Task list parsing error pid {word}")
        tid = int(word)
        if tid not in self.alive:
            self._refuse(errno.ESRCH, f"No task {tid}")
        for g in [self.root] + [self.root / n for n in self.groups()]:
            tasks = [t for t in self.tasks_of(g.name if g != self.root else "") if t != tid]
            if g == group:
                tasks.append(tid)
            (g / "tasks").write_text("".join(f"{t}\n" for t in tasks))

    def mkdir(self, rel: str) -> None:
        self._status("")
        path = self.root / rel
        if path.exists():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
        if len(self.groups()) + 1 >= self.num_closids:           # the default group holds CLOSID 0
            self._refuse(errno.ENOSPC, "Out of CLOSIDs")
        self._new_group(path)

    def rmdir(self, rel: str) -> None:
        path = self.root / rel
        if rel in ("", ".") or path.name in NOT_GROUPS:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(path))
        if not path.is_dir():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        moved = self.tasks_of(rel)
        (self.root / "tasks").write_text("".join(f"{t}\n" for t in self.tasks_of() + moved))
        for f in path.iterdir():
            f.unlink()
        path.rmdir()

    def exit(self, tid: int) -> None:
        """Thread `tid` exits: it leaves every group."""
        self.alive.discard(tid)
        for g in [""] + self.groups():
            (self.root / g / "tasks").write_text("".join(f"{t}\n" for t in self.tasks_of(g) if t != tid))
