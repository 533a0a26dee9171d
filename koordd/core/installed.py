"""The installed packages' metadata koordd reads at start: their entry points (koordd/core/catalogue.py) and
koordd's own version. The same answer as `importlib.metadata.entry_points(group=...)` gives for packages
installed as folders on sys.path (pip, a .deb, an editable install, a checkout's `koordd.egg-info`), without
importing it: importlib.metadata imports email, zipfile, csv, tempfile and socket at its top, 2.6-3.5 MB of
RSS in every koordd for reading one small INI file per package (docs/benchmarks.md, "Footprint").

What it leaves out, on purpose: packages inside zip files on sys.path (eggs), and metadata served by a custom
import finder. The format of `entry_points.txt` is the PyPA specification's (an INI file: `[group]`, then
`name = module:attr`); `tests/unit/core/test_installed.py` compares this reader with importlib.metadata on
the test's own environment and on folders written to be awkward.

A package's metadata is written by whoever installed it: nothing in it can crash koordd. A line that is no
`name = value` is skipped with one error line naming the file and line; an unreadable folder or file is
skipped (a debug line); a file is read up to READ_LIMIT bytes, and names at most BAD_LINES_LOGGED bad
lines before it counts the rest.
"""
from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from dataclasses import dataclass
from functools import reduce
from typing import Any, Iterable, Iterator

log = logging.getLogger("koordd.registry")
READ_LIMIT = 1 << 20        # a megabyte: koordd's own entry_points.txt is 600 bytes
BAD_LINES_LOGGED = 10       # a file's malformed lines named one by one, then counted
SUFFIXES = (".dist-info", ".egg-info")


def normalized(name: str) -> str:
    """A project's name as packaging compares it (PEP 503), with '_' for the separator as a folder name has it."""
    return re.sub(r"[-_.]+", "_", name).lower()


@dataclass(frozen=True)
class Distribution:
    """One installed package: its metadata folder, and the name that folder gives (the part before the
    first '-', as importlib.metadata takes it to tell duplicates apart)."""
    path: str

    @property
    def name(self) -> str:
        stem = os.path.basename(self.path).rsplit(".", 1)[0]
        return stem.split("-", 1)[0]

    def read(self, filename: str) -> str | None:
        try:
            with open(os.path.join(self.path, filename), "rb") as f:
                return f.read(READ_LIMIT).decode("utf-8", "replace")
        except OSError as e:
            log.debug("%s: %s", self.path, e)
            return None

    @property
    def version(self) -> str | None:
        """The `Version:` header of METADATA (a .dist-info) or PKG-INFO (an .egg-info)."""
        text = self.read("METADATA") or self.read("PKG-INFO") or ""
        for line in text.splitlines():
            if not line.strip():
                return None         # the headers end at the first empty line
            key, _, value = line.partition(":")
            if key.strip().lower() == "version":
                return value.strip()
        return None

    def entry_points(self) -> Iterator[EntryPoint]:
        text = self.read("entry_points.txt")
        where = os.path.join(self.path, "entry_points.txt")
        group, bad = None, 0
        for number, raw in enumerate((text or "").splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                group = line[1:-1].strip()
                continue
            name, eq, value = line.partition("=")
            if not eq or group is None or not name.strip() or not value.strip():
                bad += 1
                if bad <= BAD_LINES_LOGGED:     # a megabyte of junk is not half a million log lines
                    log.error("%s line %d: %r is no 'name = value' under a [group]: left out", where, number,
                              raw[:200])
                continue
            yield EntryPoint(name.strip(), value.strip(), group, self)
        if bad > BAD_LINES_LOGGED:
            log.error("%s: %d more lines like those left out", where, bad - BAD_LINES_LOGGED)


@dataclass(frozen=True)
class EntryPoint:
    """`name = value` under `[group]`; `value` is `module` or `module:attr.attr`, an `[extras]` after it
    ignored, as importlib.metadata's EntryPoint.load does."""
    name: str
    value: str
    group: str
    dist: Distribution | None = None

    def load(self) -> Any:
        target = self.value.split("[", 1)[0].strip()
        module, _, attrs = target.partition(":")
        names = [a.strip() for a in attrs.split(".") if a.strip()]
        return reduce(getattr, names, importlib.import_module(module.strip()))


def distributions(path: Iterable[str] | None = None) -> Iterator[Distribution]:
    """The installed packages on `path` (sys.path), the first of each name only: a checkout's
    koordd.egg-info shadows the venv's koordd, as it does for the import system and importlib.metadata."""
    seen: set[str] = set()
    for entry in sys.path if path is None else path:
        if not isinstance(entry, str):
            continue        # sys.path may hold anything; the import system skips what is no str too
        try:
            children = sorted(os.scandir(entry or "."), key=lambda d: d.name)
        except (OSError, ValueError):
            continue        # a zip file, or a folder that is gone or unreadable
        for child in children:
            if not child.name.endswith(SUFFIXES):
                continue
            try:
                if not child.is_dir():
                    continue        # an old distutils .egg-info file: it has no entry points
            except OSError:
                continue
            dist = Distribution(child.path)
            key = normalized(dist.name)
            if key not in seen:
                seen.add(key)
                yield dist


def entry_points(group: str, path: Iterable[str] | None = None) -> list[EntryPoint]:
    """Every installed package's entry points of `group`, in the order of sys.path, then of each file."""
    return [ep for dist in distributions(path) for ep in dist.entry_points() if ep.group == group]


def distribution(name: str, path: Iterable[str] | None = None) -> Distribution | None:
    """The installed package `name` as entry_points() sees it (the first on sys.path), or None."""
    return next((d for d in distributions(path) if normalized(d.name) == normalized(name)), None)


def version(name: str) -> str | None:
    dist = distribution(name)
    return dist.version if dist else None
