"""The cgroup filesystem: layout detection, paths, and raw reads and writes.

A cgroup is named by its path relative to the hierarchy root ("be.slice/job1"),
the same name on v2 and on every v1 hierarchy. `CgroupFS` turns that name plus
a controller into a directory. It holds no policy; the knob table
(`koordd.backends.cgroup_knobs`) decides which file a logical knob lives in.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

from koordd.core.backend import TargetGone
from koordd.core.cgroup_text import CGROUP_MOUNT, depth

DEFAULT_ROOT = Path(CGROUP_MOUNT)
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "freezer", "blkio", "pids", "net_cls")


class CgroupGone(TargetGone):
    """The cgroup disappeared (normal churn): callers skip it silently."""


class OutsideRoot(ValueError):
    """A cgroup name that leads out of its hierarchy ('..', a symlink): a forged or corrupt target,
    never something koordd made. Refused before any read or write."""


class GarbledFile(OSError):
    """A kernel file that does not read the way the kernel writes it. An OSError (EIO), so that every
    caller already handling an unreadable file handles this one too: a refused decision, not a
    traceback out of a loop."""


def thread_ids(text: str, path: str) -> list[int]:
    """The ids a `tasks`, `cgroup.threads` or `cgroup.procs` file lists, one decimal a line."""
    ids = []
    for token in text.split():
        # ASCII digits only, and no more than a pid can have: int() takes "²" and "1_0", and 4300 digits
        # or more raise a ValueError of their own.
        if not (token.isascii() and token.isdigit() and len(token) <= 10):
            raise GarbledFile(errno.EIO, f"{path} is not a list of thread ids (read {token[:20]!r})")
        ids.append(int(token))
    return ids


class LayoutError(Exception):
    """No cgroup hierarchy could be recognised under the root."""


@dataclass(frozen=True)
class Layout:
    """Where each controller lives. mode: "v2", "v1" or "hybrid" (v1 controllers plus a v2 tree)."""
    root: Path
    mode: str
    unified: Path | None = None
    v1: Mapping[str, Path] = field(default_factory=dict)
    v2_controllers: frozenset[str] = frozenset()

    def has(self, controller: str) -> bool:
        return controller in self.v2_controllers or controller in self.v1

    def describe(self) -> str:
        parts = [f"mode={self.mode}"]
        if self.unified is not None:
            parts.append(f"unified={self.unified} ({' '.join(sorted(self.v2_controllers)) or 'no controllers'})")
        if self.v1:
            parts.append("v1=" + ",".join(sorted(self.v1)))
        return " ".join(parts)


def detect_layout(root: Path | str = DEFAULT_ROOT) -> Layout:
    """Recognise v2, v1 (one hierarchy per controller, or co-mounted "cpu,cpuacct") or hybrid."""
    root = Path(root)
    if (root / "cgroup.controllers").is_file():
        return Layout(root, "v2", unified=root, v2_controllers=_read_controllers(root))
    if not root.is_dir():
        raise LayoutError(f"{root}: no such directory")
    unified: Path | None = None
    v1: dict[str, Path] = {}
    for entry in sorted(root.iterdir()):
        if not entry.is_dir():
            continue
        if (entry / "cgroup.controllers").is_file():
            unified = entry
        elif (entry / "cgroup.procs").is_file():
            # "cpu,cpuacct" (co-mounted) and links such as cpu -> cpu,cpuacct both name their controllers.
            for name in entry.resolve().name.split(",") + entry.name.split(","):
                if name in V1_CONTROLLERS:
                    v1.setdefault(name, entry)
    if not v1 and unified is None:
        raise LayoutError(f"{root}: no cgroup hierarchy found (neither cgroup.controllers nor v1 controllers)")
    if not v1:
        return Layout(root, "v2", unified=unified, v2_controllers=_read_controllers(unified))
    v2c = _read_controllers(unified) if unified else frozenset()
    return Layout(root, "hybrid" if unified else "v1", unified=unified, v1=v1, v2_controllers=v2c)


def _read_controllers(d: Path | None) -> frozenset[str]:
    try:
        return frozenset((d / "cgroup.controllers").read_text().split())
    except OSError:
        return frozenset()


class CgroupFS:
    """Reads and writes files of named cgroups under one layout."""

    def __init__(self, layout: Layout, keep_open: bool = False, max_open: int = 4096):
        self.layout = layout
        # Plain strings, resolved once: path building runs for every file of every cgroup each tick.
        self._bases: dict[str | None, str | None] = {}
        # keep_open: files read every tick stay open and are re-read with one pread at offset 0 (the
        # kernel regenerates cgroup files on every read); a removed cgroup's file answers ENODEV and
        # is opened afresh. Only for kernfs: a plain file unlinked and re-made would read stale.
        self.keep_open, self.max_open = keep_open, max_open
        self._open: dict[str, tuple[str, int]] = {}       # path -> (cgroup, fd)

    def _base(self, controller: str | None) -> str | None:
        try:
            return self._bases[controller]
        except KeyError:
            if controller is None or controller in self.layout.v2_controllers:
                base = self.layout.unified
            else:
                base = self.layout.v1.get(controller)
            self._bases[controller] = None if base is None else str(base)
            return self._bases[controller]

    def _dir(self, controller: str | None, cgroup: str) -> str:
        base = self._base(controller)
        if base is None:
            raise FileNotFoundError(errno.ENOENT, f"no hierarchy for {controller}")
        # A leading "/" stays below base in this join; only ".." leads out (checked cheaply: every
        # file read of every tick comes through here).
        if ".." in cgroup and ".." in cgroup.split("/"):
            raise OutsideRoot(f"cgroup {cgroup!r} leads out of {base} ('..')")
        return f"{base}/{cgroup}" if cgroup else base

    def _real_dir(self, controller: str | None, cgroup: str) -> str:
        """The directory, refused if a symlink on the way leads out of the hierarchy. For writes only:
        kernfs has no symlinks, but a tree koordd is pointed at by mistake (or by an attacker) may."""
        d = self._dir(controller, cgroup)
        base = os.path.realpath(self._base(controller))
        real = os.path.realpath(d)
        if real != base and not real.startswith(base + "/"):
            raise OutsideRoot(f"cgroup {cgroup!r} leads out of {base} (to {real})")
        return d

    def dir(self, controller: str | None, cgroup: str) -> Path | None:
        """Directory of `cgroup` in the hierarchy serving `controller` (None: the v2 tree)."""
        base = self._base(controller)
        return None if base is None else Path(self._dir(controller, cgroup))

    def read(self, controller: str | None, cgroup: str, filename: str) -> str:
        """File text; CgroupGone when the cgroup is missing, FileNotFoundError when only the file is."""
        d = self._dir(controller, cgroup)
        path = f"{d}/{filename}"
        kept = self._open.get(path)
        if kept is not None:
            try:
                return _pread_all(kept[1])
            except OSError:              # ENODEV: the cgroup was removed (maybe made again): reopen
                self._close(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not os.path.isdir(d):
                raise CgroupGone(cgroup) from None
            raise
        if self.keep_open and len(self._open) < self.max_open and not self._v1_pid_list(controller, filename):
            self._open[path] = (cgroup, fd)
            return _pread_all(fd)
        try:
            return _pread_all(fd)
        finally:
            os.close(fd)

    def _v1_pid_list(self, controller: str | None, filename: str) -> bool:
        """A v1 hierarchy's `tasks` or `cgroup.procs`: the kernel keeps the list it built for an open file
        and hands it out again to a re-read of that file for a second after (CGROUP_PIDLIST_DESTROY_DELAY),
        so a kept file would miss the threads started since; only a fresh open lists them."""
        return filename in ("tasks", "cgroup.procs") and controller is not None \
            and controller not in self.layout.v2_controllers

    def _close(self, path: str) -> None:
        _, fd = self._open.pop(path)
        os.close(fd)

    def close_except(self, cgroups: set[str]) -> None:
        """Close the kept files of cgroups no longer sampled (gone, or out of every class)."""
        for path in [p for p, (cg, _) in self._open.items() if cg not in cgroups]:
            self._close(path)

    def close(self) -> None:
        for path in list(self._open):
            self._close(path)

    def write(self, controller: str | None, cgroup: str, filename: str, text: str) -> None:
        """One write(2) of `text`; the kernel's error comes back as OSError.
        O_TRUNC as `echo >` does: cgroupfs ignores it, a plain file (a test tree) needs it; O_NOFOLLOW:
        the knob file itself is no symlink either."""
        d = self._real_dir(controller, cgroup)
        try:
            fd = os.open(f"{d}/{filename}", os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        except FileNotFoundError:
            if not os.path.isdir(d):
                raise CgroupGone(cgroup) from None
            raise
        try:
            os.write(fd, text.encode())
        except OSError as e:
            if e.errno == errno.ENODEV and not os.path.isdir(d):
                raise CgroupGone(cgroup) from None      # removed after the open: churn, as before it
            raise
        finally:
            os.close(fd)

    def exists(self, controller: str | None, cgroup: str) -> bool:
        d = self.dir(controller, cgroup)
        return d is not None and d.is_dir()

    def walk(self, controller: str | None, max_depth: int,
             prune: Callable[[str], bool] | None = None) -> Iterator[str]:
        """Cgroup names below the root, parents first, down to max_depth levels; the subtree of a
        cgroup for which prune(cgroup) is true is not entered."""
        if self._base(controller) is None:
            return
        stack = [""]
        while stack:
            cg = stack.pop()
            if cg:
                yield cg
                if prune is not None and prune(cg):
                    continue
            if depth(cg) >= max_depth:
                continue
            stack.extend(reversed(self.children(controller, cg)))

    def children(self, controller: str | None, cgroup: str) -> list[str]:
        """Direct child cgroups, sorted; [] when the cgroup is gone. Any other error (EMFILE, ENOMEM,
        EACCES) raises: a tree that could not be listed is not an empty one, and a round that took it for
        one would find no classes and give back every knob koordd holds on them."""
        try:
            with os.scandir(self._dir(controller, cgroup)) as it:
                names = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [f"{cgroup}/{n}" if cgroup else n for n in names]

    def walk_controller(self) -> str | None:
        """The hierarchy whose tree names the cgroups koordd manages: cpu's on v1, the v2 tree otherwise."""
        if "cpu" in self.layout.v1 and "cpu" not in self.layout.v2_controllers:
            return "cpu"
        return None


def on_cgroupfs(layout: Layout, mounts: str = "/proc/self/mounts") -> bool:
    """True when every hierarchy of `layout` is a mounted cgroup filesystem (not a tree of plain
    files, as in tests): only there may files be kept open and re-read (CgroupFS keep_open)."""
    try:
        with open(mounts) as f:
            points = {fields[1] for fields in (line.split() for line in f)
                      if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2")}
    except OSError:
        return False
    bases = ([layout.unified] if layout.unified is not None else []) + list(layout.v1.values())
    return bool(bases) and all(os.path.realpath(b) in points for b in bases)


SEQ_PAGE = 4096


def _pread_all(fd: int, size: int = 65536) -> str:
    """The whole file from offset 0, no text-layer cost. A cgroup file is a seq_file: one read returns
    at most a page of whole lines, however much is asked. A first read under half a page is the whole
    file (nearly every file: one pread); a longer one may be the first page of a long list
    (cgroup.threads, tasks: ~680 thread ids a page), so the rest is read until a read returns nothing."""
    chunks, offset = [], 0
    while True:
        chunk = os.pread(fd, size, offset)
        chunks.append(chunk)
        if not chunk or len(chunk) < SEQ_PAGE // 2 and offset == 0:
            return b"".join(chunks).decode(errors="replace")   # garbled bytes: the parsers refuse U+FFFD
        offset += len(chunk)

