"""A fake /proc for the sysctl backend (koordd/backends/sysctl.py): the vm sysctls it may write, at the
kernel's defaults, and a meminfo whose MemTotal bounds vm.min_free_kbytes (a tenth of it)."""
from __future__ import annotations

from pathlib import Path

VM_DEFAULTS = {"min_free_kbytes": "67584", "watermark_scale_factor": "10", "watermark_boost_factor": "15000"}


def fake_proc(parent: Path, mem_total_kib: int = 8_000_000) -> Path:
    """`parent`/proc with sys/vm/<VM_DEFAULTS> and a meminfo of `mem_total_kib` KiB; returns it."""
    p = parent / "proc"
    (p / "sys" / "vm").mkdir(parents=True)
    for name, value in VM_DEFAULTS.items():
        (p / "sys" / "vm" / name).write_text(value + "\n")
    (p / "meminfo").write_text(f"MemTotal:        {mem_total_kib} kB\nMemFree:         1000 kB\n")
    return p
