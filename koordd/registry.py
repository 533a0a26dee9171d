"""Which loops exist: the entry-point group `koordd.loops` (koordd's own and third parties')."""
from __future__ import annotations

import logging
from importlib.metadata import entry_points

from .loop import Loop

log = logging.getLogger(__name__)
GROUP = "koordd.loops"


def load_registry() -> dict[str, type[Loop]]:
    """name -> loop class. A loop that fails to import is left out with one error line, not fatal."""
    registry: dict[str, type[Loop]] = {}
    for ep in entry_points(group=GROUP):
        try:
            cls = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken third-party loop must not stop koordd
            log.error("loop %s (%s) failed to load: %s", ep.name, ep.value, e)
            continue
        if getattr(cls, "name", None) != ep.name:
            log.error("loop %s: entry point names class %s whose name is %r", ep.name, ep.value,
                      getattr(cls, "name", None))
            continue
        registry[ep.name] = cls
    return registry
