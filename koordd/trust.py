"""Whether a config file may be trusted, as sshd's StrictModes decide: koordd runs as root and does
what the file says (which cgroups to throttle, kill, freeze), so anyone who can change the file, or
swap it by renaming in a directory on its path, could turn koordd against the host.

Trusted: the file and every directory up to / owned by root (or by koordd's own user) and writable
by no one else. A directory with the sticky bit (/tmp) may be world-writable: there only an
entry's owner can rename or remove it. Both the path as named and the file a symlink leads to are
checked.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

# Test-only: the test suite runs koordd on configs in checkouts whose owner it does not choose.
# Never set in a unit file; not a config key, so the file cannot switch its own check off.
SKIP_ENV = "KOORDD_TEST_SKIP_CONFIG_OWNER_CHECK"


def _problem(path: str, st: os.stat_result, owners: set[int]) -> str | None:
    if st.st_uid not in owners:
        return f"{path} is owned by uid {st.st_uid}, not root"
    writable = 0 if stat.S_ISLNK(st.st_mode) else st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)  # a link's mode means nothing
    if writable and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        who = "group- and world" if writable == (stat.S_IWGRP | stat.S_IWOTH) else \
            "group" if writable == stat.S_IWGRP else "world"
        return f"{path} is {who}-writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _chain(path: str) -> list[str]:
    """`path` and each directory above it, up to /."""
    out = [path]
    while path != os.path.dirname(path):
        path = os.path.dirname(path)
        out.append(path)
    return out


def untrusted(path: Path | str) -> str | None:
    """Why `path` may not be trusted, or None. A missing file is not this check's business."""
    if os.environ.get(SKIP_ENV) == "1":
        return None
    owners = {0, os.geteuid()}
    named = os.path.abspath(path)
    for p in dict.fromkeys(_chain(named) + _chain(os.path.realpath(named))):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{p}: cannot check its owner: {e.strerror}"
        why = _problem(p, st, owners)
        if why:
            return why
    return None
