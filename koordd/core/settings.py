"""A section's checked values, as loops and the daemon's parts read them (`settings.interval`)."""
from __future__ import annotations

from typing import Any, Mapping

from koordd.core.options import COMMON_LOOP_OPTIONS, Option


class Settings:
    """One section's checked values: attribute access, immutable, equal by value (reload compares them)."""
    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never look up our own slot here (copy/pickle probe before __init__)
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no option {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Settings are immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Settings are immutable")

    def __eq__(self, other: object) -> bool:
        return self._values == other._values if isinstance(other, Settings) else NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._values.items()))

    def __reduce__(self):
        return Settings, (self._values,)

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


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
    return Settings(out)


def loop_options(loop_cls: type) -> tuple[Option, ...]:
    """`enabled` and `interval`, then the loop's own options."""
    return COMMON_LOOP_OPTIONS + tuple(getattr(loop_cls, "options", ()))
