"""Fake cgroup trees (see tests/fakecgroup.py): `tree` runs a test once per layout."""
from __future__ import annotations

import pytest

from fakecgroup import LAYOUTS, FakeCgroups


@pytest.fixture(params=LAYOUTS)
def tree(request, tmp_path) -> FakeCgroups:
    """A fake tree with be.slice/job, once per layout: v2, v1, hybrid, v1-comount."""
    return FakeCgroups(tmp_path, request.param).add("be.slice/job")



# --- every decide() reads only the sample fields its loop's needs() names --------------------------

def _spy_class():
    from koordd.snapshot import CGROUP_FIELDS, CgroupSample

    class Spied(CgroupSample):
        """A sample that notes which fields are read (into the `seen` set the test passes in)."""
        def __getattribute__(self, name):
            if name in CGROUP_FIELDS:
                object.__getattribute__(self, "_seen").add(name)
            return object.__getattribute__(self, name)

    def spy(sample, seen):
        if not isinstance(sample, CgroupSample):
            return sample
        copy = Spied(**{f: object.__getattribute__(sample, f) for f in CgroupSample.__dataclass_fields__})
        object.__setattr__(copy, "_seen", seen)
        return copy

    return spy


@pytest.fixture(autouse=True)
def decide_reads_only_what_it_needs(monkeypatch):
    """The sensors read only what the enabled loops' needs() name (every other field stays None), so
    a loop that reads a field it does not name would see None on a real host. Every decide() in every
    test runs on samples that note what is read, and the test fails on a field needs() left out."""
    import dataclasses

    from koordd.docs import shipped_loops
    spy = _spy_class()
    for cls in shipped_loops().values():
        original = cls.decide

        def decide(snapshot, settings, state, _original=original, _cls=cls):
            seen: set[str] = set()
            seen_of_members: set[str] = set()
            if dataclasses.is_dataclass(snapshot):
                snapshot = dataclasses.replace(
                    snapshot, cgroups={k: spy(v, seen) for k, v in snapshot.cgroups.items()},
                    members={k: tuple(spy(m, seen_of_members) for m in v) for k, v in snapshot.members.items()})
            out = _original(snapshot, settings, state)
            unnamed = seen - _cls.needs(settings)
            assert not unnamed, f"{_cls.name}.decide read {sorted(unnamed)}, which its needs() does not name"
            unnamed = seen_of_members - _cls.member_needs(settings)
            assert not unnamed, f"{_cls.name}.decide read {sorted(unnamed)} of members; member_needs() does not name it"
            return out

        monkeypatch.setattr(cls, "decide", staticmethod(decide))
