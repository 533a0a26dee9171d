"""Fixtures for the kernel tests (helpers: koordtest/kernel.py): cgroups of their own on the real hierarchy,
and koordd run as a subprocess. Both are removed at teardown, also when a test fails: koordd first
(SIGTERM, then SIGKILL), then the processes in our cgroups, then the cgroups, children before the parent.
"""
from __future__ import annotations

import pytest

from koordtest.kernel import CgroupEnv, Koordd, created, detect_host, stop_all, unique_name


@pytest.fixture
def cgroups():
    """Our own parent cgroup with children ls and be; always removed afterwards."""
    mode, roles = detect_host()
    yield from created(CgroupEnv(mode, roles, unique_name()))


@pytest.fixture
def koordd(tmp_path, cgroups):
    """Runs of koordd; any still running at teardown get SIGTERM (restore), then SIGKILL.
    Torn down before `cgroups`, so koordd never outlives the cgroups it manages."""
    k = Koordd(tmp_path, cgroups)
    yield k
    stop_all(k)
