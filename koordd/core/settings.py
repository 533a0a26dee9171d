"""A section's checked values, as loops and the daemon's parts read them (`settings.interval`).

Each section's settings are a frozen dataclass generated from its declared options (`settings_type`): a
field per `Option`, of the option's type, with its default. A loop's, koordd's or a third party's, gets
its own from its `options` (`Loop.settings_type()`); nothing is looked up by name at run time, and a
name no option declares fails where the settings are built (`make_settings`, or the type's constructor).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

from koordd.core.options import COMMON_LOOP_OPTIONS, Option


class Settings:
    """The base of every settings type: one section's checked values, immutable, equal by value (reload
    compares them). The fields are the section's options (settings_type)."""
    __slots__ = ()
    _options: tuple[Option, ...] = ()       # set on each generated type: the options it was made from

    def __getattr__(self, name: str) -> Any:
        # Reached only for a name that is no field: say so in the config's words.
        raise AttributeError(f"no option {name!r}")

    def __reduce__(self):
        # A generated type cannot be found by its name: pickle and copy rebuild it from its options.
        return _rebuild, (type(self)._options, self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def settings_type(options: tuple[Option, ...]) -> type[Settings]:
    """The frozen dataclass of a section declaring `options`: one per distinct tuple of options, so two
    settings of one section compare (and hash) by value. A later declaration of a name replaces an
    earlier one."""
    known = tuple({o.name: o for o in options}.values())
    try:
        hash(known)
    except TypeError:       # an option whose default cannot be hashed (a third party's): not cached
        return _settings_type.__wrapped__(known)
    return _settings_type(known)


@functools.lru_cache(maxsize=None)
def _settings_type(options: tuple[Option, ...]) -> type[Settings]:
    def default(o: Option) -> dataclasses.Field:
        if type(o.default).__hash__ is None:        # dataclasses refuse a mutable default as it is
            return dataclasses.field(default_factory=lambda d=o.default: d)
        return dataclasses.field(default=o.default)

    return dataclasses.make_dataclass(
        "Settings", [(o.name, o.type, default(o)) for o in options], bases=(Settings,),
        namespace={"_options": options, "__module__": __name__}, frozen=True, slots=True)


def _rebuild(options: tuple[Option, ...], values: Mapping[str, Any]) -> Settings:
    return settings_type(options)(**values)


def make_settings(options: tuple[Option, ...], values: Mapping[str, Any]) -> Settings:
    """Settings holding every option: `values` converted by their Option, the defaults for the rest.

    ValueError for an unknown name or a bad value (tests and tools build settings this way too).
    """
    known = {o.name: o for o in options}  # a later declaration of a name replaces an earlier one
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s): {', '.join(unknown)}")
    out = {}
    for name, opt in known.items():
        if name not in values:
            out[name] = opt.default
            continue
        try:
            out[name] = opt.convert(values[name])
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    return settings_type(options)(**out)


def loop_options(loop_cls: type) -> tuple[Option, ...]:
    """`enabled` and `interval`, then the loop's own options."""
    return COMMON_LOOP_OPTIONS + tuple(getattr(loop_cls, "options", ()))
