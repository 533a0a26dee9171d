"""Whether a config file (and the state_dir) may be trusted, as sshd's StrictModes decide: koordd runs as root and does
what the file says (which cgroups to throttle, kill, freeze), so anyone who can change the file, or
swap it by renaming in a directory on its path, could turn koordd against the host.

Trusted: the file and every directory up to / owned by root (or by koordd's own user) and writable
by no one else. A directory with the sticky bit (/tmp) may be world-writable: there only an
entry's owner can rename or remove it. Every path the kernel walks to open the file is checked:
each directory, each symlink, and what each symlink leads to (a link through a directory others may
write could be repointed between the check and the read).

The state_dir is held to the same rule, and more: koordd undoes what its journal there says, so a
journal others could write (or add, where the directory is world-writable even with the sticky bit)
would have koordd write what they chose. Its files too: the journal, the decision log, status and
the koordctl top files.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable

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


def walked_paths(path: str, max_links: int = 40) -> list[str]:
    """Every path the kernel looks up to reach `path` (absolute): / and each directory entered, each
    symlink met and, in place of it, the path it leads to, down to the last component."""
    out, cur, links = ["/"], "/", 0
    todo = [c for c in path.split("/") if c]
    while todo:
        name = todo.pop(0)
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)          # physical: cur never holds a symlink
            continue
        nxt = os.path.join(cur, name)
        out.append(nxt)
        if os.path.islink(nxt) and links < max_links:
            links += 1
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo = [c for c in target.split("/") if c] + todo
        else:
            cur = nxt
    return out


def untrusted(path: Path | str) -> str | None:
    """Why the config at `path` may not be trusted, or None. A missing file is not this check's business."""
    if os.environ.get(SKIP_ENV) == "1":
        return None
    return untrusted_always(path)


def untrusted_always(path: Path | str) -> str | None:
    """untrusted(), whatever SKIP_ENV says: for what test checkouts need not skip (the state_dir, the
    host lock), which tests make in their own temporary directories."""
    owners = {0, os.geteuid()}
    for p in dict.fromkeys(walked_paths(os.path.abspath(path))):
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


def untrusted_state_dir(state_dir: Path | str, names: Iterable[str]) -> str | None:
    """Why koordd may not trust `state_dir` and its files `names`, or None. Not skipped by SKIP_ENV."""
    why = untrusted_always(state_dir)
    if why:
        return why
    try:
        st = os.stat(state_dir)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{state_dir}: cannot check its owner: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{state_dir} is not a directory"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        # The sticky bit does not help here: others could add a journal where there is none yet.
        return f"{state_dir} may be written by others than root (mode {stat.S_IMODE(st.st_mode):04o})"
    for name in names:
        path = os.path.join(state_dir, name)
        why = untrusted_always(path)
        if why:
            return why
        if os.path.lexists(path) and not os.path.isfile(path):
            return f"{path} is not a regular file"
    return None
