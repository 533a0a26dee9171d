"""What third parties bring through entry points: loops (`koordd.loops`, koordd's own too), optional
sensors (`koordd.sensors`) and backends (`koordd.backends`), loaded the same way."""
from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any, Mapping

from koordd.core.backend import Backend, Backends
from koordd.core.loop import Loop

log = logging.getLogger("koordd.registry")     # its name before the move: log lines unchanged
GROUP = "koordd.loops"
BACKENDS_GROUP = "koordd.backends"


def load_named(group: str, what: str, attr: str = "name", taken: Mapping[str, str] | None = None) -> dict[str, Any]:
    """entry-point name -> the object it names, for those whose `attr` says the same name. One that
    fails to import, is misnamed, or whose name is taken (`taken`: name -> what already has it) is
    left out with one error line: a broken third-party package must not stop koordd."""
    out: dict[str, Any] = {}
    for ep in entry_points(group=group):
        if taken and ep.name in taken:
            log.error("%s %s (%s) left out: %s is already %s", what, ep.name, ep.value, ep.name, taken[ep.name])
            continue
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001
            log.error("%s %s (%s) failed to load: %s", what, ep.name, ep.value, e)
            continue
        if getattr(obj, attr, None) != ep.name:
            log.error("%s %s: entry point names class %s whose %s is %r", what, ep.name, ep.value, attr,
                      getattr(obj, attr, None))
            continue
        out[ep.name] = obj
    return out


def load_registry() -> dict[str, type[Loop]]:
    """name -> loop class."""
    return load_named(GROUP, "loop")


def load_backends(*builtin: Backend) -> Backends:
    """koordd's own backends plus those of the entry-point group (named by their kind); one that fails
    to load, to start or clashes with another is left out with one error line."""
    out = Backends(builtin)
    for kind, cls in load_named(BACKENDS_GROUP, "backend", attr="kind").items():
        try:
            out.add(cls())
        except Exception as e:  # noqa: BLE001 - a broken third-party backend must not stop koordd
            logging.getLogger("koordd.backend").error("backend %s (%s) left out: %s", kind, cls, e)
    return out
