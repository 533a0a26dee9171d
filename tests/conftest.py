"""Fake cgroup trees (see tests/fakecgroup.py): `tree` runs a test once per layout."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import pytest

from fakecgroup import LAYOUTS, FakeCgroups


@pytest.fixture(params=LAYOUTS)
def tree(request, tmp_path) -> FakeCgroups:
    """A fake tree with be.slice/job, once per layout: v2, v1, hybrid, v1-comount."""
    return FakeCgroups(tmp_path, request.param).add("be.slice/job")



# --- every decide() reads only the sample fields and sections its loop's needs() names --------------

def _spy_class():
    from koordd.core.snapshot import CGROUP_FIELDS, CgroupSample

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


class SpiedSections(Mapping):
    """Snapshot.sections noting which sections are looked up (or all of them, when iterated)."""

    def __init__(self, sections, seen: set[str]):
        self._sections, self._seen = dict(sections), seen

    def __getitem__(self, name):
        self._seen.add(name)
        return self._sections[name]

    def __contains__(self, name):
        self._seen.add(name)
        return name in self._sections

    def __iter__(self):
        self._seen.update(self._sections)
        return iter(self._sections)

    def __len__(self):
        return len(self._sections)


def reads_only_what_it_needs(cls):
    """cls.decide, wrapped: it runs on a snapshot that notes what is read, and fails on a sample field or
    section needs() (member_needs() for members) does not name."""
    spy = _spy_class()
    original = cls.decide

    def decide(snapshot, settings, state):
        seen: set[str] = set()
        seen_of_members: set[str] = set()
        seen_sections: set[str] = set()
        if dataclasses.is_dataclass(snapshot):
            snapshot = dataclasses.replace(
                snapshot, cgroups={k: spy(v, seen) for k, v in snapshot.cgroups.items()},
                members={k: tuple(spy(m, seen_of_members) for m in v) for k, v in snapshot.members.items()},
                sections=SpiedSections(snapshot.sections, seen_sections))
        out = original(snapshot, settings, state)
        unnamed = seen - cls.needs(settings)
        assert not unnamed, f"{cls.name}.decide read {sorted(unnamed)}, which its needs() does not name"
        unnamed = seen_of_members - cls.member_needs(settings)
        assert not unnamed, f"{cls.name}.decide read {sorted(unnamed)} of members; member_needs() does not name it"
        unnamed = seen_sections - cls.needs(settings)
        assert not unnamed, f"{cls.name}.decide read the section {sorted(unnamed)}, which its needs() does not name"
        return out

    return staticmethod(decide)


@pytest.fixture(autouse=True)
def decide_reads_only_what_it_needs(monkeypatch):
    """The sensors read only what the enabled loops' needs() name (every other field stays None, every
    other section is absent), so a loop that reads one it does not name would see nothing on a real
    host. Every decide() in every test runs on a snapshot that notes what is read, and the test fails
    on a field or section needs() left out."""
    from koordd.runtime.docs import shipped_loops
    for cls in shipped_loops().values():
        monkeypatch.setattr(cls, "decide", reads_only_what_it_needs(cls))


# --- unit tests load no BPF program into the host's kernel --------------------------------------

@pytest.fixture(autouse=True)
def no_bpf_outside_kernel_tests(request, monkeypatch):
    """The run-queue sensor koordd's registry makes reads schedstat in unit tests (doctor starts every
    sensor to see which work): loading the real BPF program is for tests/kernel, on purpose."""
    if "/kernel/" not in str(request.node.fspath):
        from koordd.sensors import runq
        monkeypatch.setattr(runq, "DEFAULT_SOURCES", (runq.SCHEDSTAT,))


# The config owner check (koordd/core/trust.py) is tested in tests/test_security.py; elsewhere tests load
# configs from a checkout whose owner they do not choose. Inherited by the koordd processes they start.
os.environ.setdefault("KOORDD_TEST_SKIP_CONFIG_OWNER_CHECK", "1")


# One koordd per host (koordd/act/owner.py): each test's koordd, in-process or started as a process, locks a
# file of the test's own, so tests running side by side (and a koordd service on the host) do not refuse
# each other. The tests of the lock itself choose their file.
@pytest.fixture(autouse=True)
def owner_lock_of_the_test(tmp_path_factory, monkeypatch):
    from koordd.act.owner import TEST_ENV
    monkeypatch.setenv(TEST_ENV, str(tmp_path_factory.mktemp("owner") / "owner.lock"))
