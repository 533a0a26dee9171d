"""resctrl sensor: what the hardware offers (`info/`) and each control group's schemata.

An optional sensor, the snapshot's "resctrl" section, for loops that partition the cache or memory
bandwidth: they compute masks from `info` (ways, cache ids, min_cbm_bits) without reading files
themselves. `info/` is read once the tree is mounted; the groups every round (a directory listing and
one small file per group). Unavailable where the CPU or kernel lacks resctrl; no section while it is
not mounted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from koordd.backends.resctrl import RESERVED, cpu_support
from koordd.core.schemata import ResctrlInfo
from koordd.core.snapshot import RESCTRL
from koordd.kernel.resctrl import DEFAULT_MOUNT, ResctrlError, ResctrlFS, cpu_vendor, parse_schemata, read_info
from koordd.sensors.contract import OptionalSensor, SensorContext, SensorUnavailable


@dataclass(frozen=True)
class ResctrlSection:
    info: ResctrlInfo
    # group name -> resource -> domain id -> value as shown ("7ff", "100"); the default group is "default"
    groups: Mapping[str, Mapping[str, Mapping[int, str]]] = field(default_factory=dict)


class ResctrlSensor(OptionalSensor):
    name = RESCTRL

    def __init__(self, fs: ResctrlFS | None = None, proc_root: Path | str = "/proc"):
        self.fs = fs if fs is not None else ResctrlFS(DEFAULT_MOUNT)
        self.proc = Path(proc_root)
        self.info: ResctrlInfo | None = None

    def start(self) -> None:
        why = cpu_support(self.proc)
        if why:
            raise SensorUnavailable(why)

    def sample(self, context: SensorContext | None = None) -> ResctrlSection | None:
        """None while resctrl is not mounted (a loop may mount it)."""
        if not self.fs.mounted():
            self.info = None
            return None
        if self.info is None:
            try:
                self.info = read_info(self.fs, cpu_vendor((self.proc / "cpuinfo").read_text()))
            except (ResctrlError, ValueError) as e:      # ValueError: a file that is not UTF-8
                raise OSError(f"cannot read resctrl's info: {e}") from None
        groups = {}
        for name in ["", *self.fs.listdir()]:
            if name in RESERVED:
                continue
            rel = f"{name}/schemata" if name else "schemata"
            try:
                groups[name or "default"] = parse_schemata(self.fs.read(rel))
            except (FileNotFoundError, NotADirectoryError):
                continue            # removed meanwhile, or a file at the root
            except (ResctrlError, ValueError) as e:     # the section is lost this round: say which file
                raise ResctrlError(f"{self.fs.root / rel}: {e}") from None
        return ResctrlSection(self.info, groups)

    def stop(self) -> None:
        self.info = None
