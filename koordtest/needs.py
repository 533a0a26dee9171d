"""Every decide() reads only the sample fields and sections its loop's needs() name (or the classes' SLOs
are measured by): the sensors read only what the enabled loops' needs() name, so a loop reading one it does
not name would see nothing on a real host. tests/conftest.py wraps every shipped loop's decide() with
reads_only_what_it_needs in every test."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from koordd.core.snapshot import CGROUP_FIELDS, CgroupSample


class Spied(CgroupSample):
    """A sample that notes which fields are read (into the `seen` set the test passes in)."""
    def __getattribute__(self, name):
        if name in CGROUP_FIELDS:
            object.__getattribute__(self, "_seen").add(name)
        return object.__getattribute__(self, name)


def spy(sample, seen: set[str]):
    """`sample` as a Spied copy noting what is read into `seen` (anything else as it is)."""
    if not isinstance(sample, CgroupSample):
        return sample
    copy = Spied(**{f: object.__getattribute__(sample, f) for f in CgroupSample.__dataclass_fields__})
    object.__setattr__(copy, "_seen", seen)
    return copy


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
    original = cls.decide

    def decide(snapshot, settings, state):
        seen: set[str] = set()
        seen_of_own: set[str] = set()           # of the class roots of the loop's own classes (class_needs)
        seen_of_members: set[str] = set()
        seen_sections: set[str] = set()
        if dataclasses.is_dataclass(snapshot):
            own = cls.members_of(settings)
            snapshot = dataclasses.replace(
                snapshot, cgroups={k: spy(v, seen_of_own if getattr(v, "cls", None) in own else seen)
                                   for k, v in snapshot.cgroups.items()},
                members={k: tuple(spy(m, seen_of_members) for m in v) for k, v in snapshot.members.items()},
                sections=SpiedSections(snapshot.sections, seen_sections))
        out = original(snapshot, settings, state)
        unnamed = seen - cls.needs(settings)
        assert not unnamed, f"{cls.name}.decide read {sorted(unnamed)}, which its needs() does not name"
        unnamed = seen_of_own - cls.needs(settings) - cls.class_needs(settings)
        assert not unnamed, f"{cls.name}.decide read {sorted(unnamed)} of its classes' roots; neither needs() nor " \
                            "class_needs() names it"
        unnamed = seen_of_members - cls.member_needs(settings)
        assert not unnamed, f"{cls.name}.decide read {sorted(unnamed)} of members; member_needs() does not name it"
        # The sections the classes' SLOs are measured by run whatever the loops need (runtime/service.py).
        slo_sections = snapshot.slo_sections() if hasattr(snapshot, "slo_sections") else frozenset()
        unnamed = seen_sections - cls.needs(settings) - slo_sections
        assert not unnamed, f"{cls.name}.decide read the section {sorted(unnamed)}, which its needs() does not name"
        return out

    return staticmethod(decide)
