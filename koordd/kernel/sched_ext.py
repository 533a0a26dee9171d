"""The kernel's sched_ext status, read from `<sys>/kernel/sched_ext/` (Linux 6.12+).

Every file there is read-only status: `state` (disabled, enabling, enabled, disabling), the counters
`enable_seq` (BPF schedulers loaded since boot), `nr_rejected` (tasks a scheduler refused),
`hotplug_seq`, `switch_all` (1: every fair task runs on the BPF scheduler, 0: only SCHED_EXT ones),
and `root/ops`, the loaded scheduler's name, present only while one is. A BPF scheduler is loaded by
a program of its own (scx_flatcg, scx_layered, scx_loader); koordd only reads what the kernel says.
Older kernels lack some counters: those are None.
"""
from __future__ import annotations

from pathlib import Path

from koordd.core.snapshot import SchedExtStatus

SCHED_EXT_DIR = "kernel/sched_ext"


def sched_ext_dir(sys_root: Path | str = "/sys") -> Path:
    return Path(sys_root) / SCHED_EXT_DIR


def missing_reason(sys_root: Path | str = "/sys") -> str:
    return f"no {sched_ext_dir(sys_root)}/state: kernel without sched_ext (CONFIG_SCHED_CLASS_EXT)"


def has_sched_ext(sys_root: Path | str = "/sys") -> bool:
    return (sched_ext_dir(sys_root) / "state").is_file()


def read_sched_ext(sys_root: Path | str = "/sys") -> SchedExtStatus | None:
    """The status, or None on a kernel without sched_ext (no `state`)."""
    base = sched_ext_dir(sys_root)
    state = _text(base / "state")
    if state is None:
        return None
    return SchedExtStatus(state, _text(base / "root/ops") or "", _int(base / "enable_seq"),
                          _int(base / "nr_rejected"), _int(base / "switch_all"), _int(base / "hotplug_seq"))


def _text(path: Path) -> str | None:
    try:
        # Bytes that are not UTF-8 show as U+FFFD (in doctor's line) instead of failing the read.
        return path.read_bytes().decode("utf-8", "replace").strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
