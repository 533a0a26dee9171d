"""Fake cgroup trees (see tests/fakecgroup.py): `tree` runs a test once per layout."""
from __future__ import annotations

import pytest

from fakecgroup import LAYOUTS, FakeCgroups


@pytest.fixture(params=LAYOUTS)
def tree(request, tmp_path) -> FakeCgroups:
    """A fake tree with be.slice/job, once per layout: v2, v1, hybrid, v1-comount."""
    return FakeCgroups(tmp_path, request.param).add("be.slice/job")

