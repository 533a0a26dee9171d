"""What a host offers koordd, feature by feature: one probe per feature, kept by the backend or sensor
that uses it (their `features`), run by `koordctl doctor` to report and by the daemon at start to say
what it goes without (koordd/runtime/capabilities.py). A probe never raises for a missing feature: it
says why in the detail."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Capability:
    name: str
    available: bool
    detail: str


# (host: koordd.kernel.host_probe.Host, where the kernel's interfaces are) -> (available, detail)
Probe = Callable[[Any], "tuple[bool, str]"]
