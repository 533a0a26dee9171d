"""Node-wide kernel tunables under /proc/sys, one knob per sysctl: target kind `sysctl`.

A knob is the sysctl's dotted name ("vm.watermark_scale_factor"), its file the name with dots turned
into slashes below /proc/sys (/proc/sys/vm/watermark_scale_factor). The target is the node, named
SYSCTL_TARGET (koordd/core/targets.py): a sysctl has one value per host (per network namespace for
net.*, which koordd does not take).

Only the names below are served, each with the range the kernel's own handler enforces
(proc_dointvec_minmax's extra1/extra2 in mm/page_alloc.c): koordd checks it before writing, so an
out-of-range value is refused naming the knob instead of an EINVAL from the kernel. A name koordd
does not know is no knob at all: the actuator refuses it as unknown, so a config cannot make koordd
write an arbitrary sysctl.

Values are journaled and restored like any knob (koordd/act/actuator.py): the original goes back on
stop, when the loop is disabled or its option unset, and after a crash from the journal, but only
while the sysctl still reads what koordd wrote. The kernel itself rewrites some of these behind
koordd's back (transparent hugepages raise vm.min_free_kbytes when khugepaged starts; memory hotplug
recomputes it): such a value is someone else's, left as it is with a decision saying so. A restore
meets the rules of a write: an original above 10% of memory (never the kernel's own, which stays
below 5%: a forged or hand-made journal line) is not written back; the sysctl is left as it is, with a
decision saying so, and the hold dropped (tests/unit/test_trust_restore_rules.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from koordd.core.backend import Backend, BackendSet, InvalidValue, KnobSpec, TargetGone, UnsafeValue, Unsupported
from koordd.core.cgroup_text import parse_int
from koordd.core.targets import SYSCTL_TARGET
from koordd.kernel.host_probe import Host

INT_MAX = 2**31 - 1
MAX_MIN_FREE_FRACTION = 0.10     # of MemTotal: a min watermark above it leaves the kernel OOM-killing at once


@dataclass(frozen=True)
class Sysctl:
    """One sysctl koordd may write: its kernel range (inclusive) and what it does."""
    name: str
    lo: int
    hi: int
    doc: str

    @property
    def relpath(self) -> str:
        return self.name.replace(".", "/")

    def normalize(self, text: str) -> str:
        t = text.strip()
        if not (t.lstrip("-").isascii() and t.lstrip("-").isdigit()):     # int() also takes "1_0" and "²"
            raise InvalidValue(f"{self.name} must be an integer, got {text!r}")
        v = parse_int(t, self.name)
        if not self.lo <= v <= self.hi:
            raise InvalidValue(f"{self.name} must be {self.lo}..{self.hi} (the kernel's range), got {v}")
        return str(v)


# The allowlist. Ranges as of Linux 5.x/6.x mm/page_alloc.c (min_free_kbytes: SYSCTL_ZERO..INT_MAX;
# watermark_scale_factor: SYSCTL_ONE..SYSCTL_THREE_THOUSAND; watermark_boost_factor: SYSCTL_ZERO..INT_MAX).
SYSCTLS: dict[str, Sysctl] = {s.name: s for s in (
    Sysctl("vm.min_free_kbytes", 0, INT_MAX,
           "free memory (KiB) the kernel keeps for atomic allocations: the min watermark; raising it makes "
           "kswapd start earlier and keeps headroom for bursts"),
    Sysctl("vm.watermark_scale_factor", 1, 3000,
           "distance between the min, low and high watermarks in 1/10000 of memory: how early kswapd wakes "
           "and how much it frees before sleeping"),
    Sysctl("vm.watermark_boost_factor", 0, INT_MAX,
           "temporary watermark boost after fragmentation events, in 1/10000 of the high watermark"),
)}


def sysctl_path(proc: Path | str, name: str) -> Path:
    """The file of an allowlisted sysctl; Unsupported for any other name (never a path built from input)."""
    s = SYSCTLS.get(name)
    if s is None:
        raise Unsupported(f"{name!r} is not a sysctl koordd writes ({', '.join(SYSCTLS)})")
    return Path(proc) / "sys" / s.relpath


def _writable(path: Path) -> str | None:
    """Why `path` cannot be written, or None: missing, read-only /proc/sys (a container), no access."""
    if not path.exists():
        return f"no {path} on this kernel"
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return f"{path} is on a read-only mount (a container's /proc/sys?)"
    except OSError as e:
        return f"{path}: {e.strerror}"
    if not os.access(path, os.W_OK):
        return f"{path} is not writable by this user (koordd writes sysctls as root)"
    return None


def probe_sysctl(host: Host) -> tuple[bool, str]:
    """Whether koordd can write each allowlisted sysctl on this host, and its current value."""
    parts, ok = [], True
    for name in SYSCTLS:
        path = sysctl_path(host.proc, name)
        why = _writable(path)
        if why is None:
            try:
                parts.append(f"{name} = {path.read_text().strip()} (writable)")
            except OSError as e:
                ok = False
                parts.append(f"{name}: {e.strerror}")
        else:
            ok = False
            parts.append(f"{name}: {why}")
    return ok, "; ".join(parts)


class SysctlBackend(Backend):
    """The allowlisted sysctls (SYSCTLS) of this node; the only target is SYSCTL_TARGET."""
    kind = "sysctl"
    knobs = {s.name: KnobSpec(s.name, f"sysctl {s.name} ({s.lo}..{s.hi}): {s.doc}", s.normalize)
             for s in SYSCTLS.values()}
    features = {"sysctl": probe_sysctl}

    def __init__(self, proc: Path | str = "/proc"):
        self.proc = Path(proc)

    def _path(self, target: str, knob: str) -> Path:
        if target != SYSCTL_TARGET:
            # Not a node: a journal entry or a third-party loop naming something else; never written.
            raise InvalidValue(f"{knob}: target must be {SYSCTL_TARGET!r} (the node), got {target!r}")
        return sysctl_path(self.proc, knob)

    def probe(self) -> dict[str, str]:
        out = {}
        for name in SYSCTLS:
            why = _writable(sysctl_path(self.proc, name))
            if why is not None:
                out[name] = f"{name}: {why}"
        return out

    def read(self, target: str, knob: str) -> str:
        path = self._path(target, knob)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise Unsupported(f"{knob}: no {path} on this kernel") from None
        return SYSCTLS[knob].normalize(text)

    def validate(self, target: str, knob: str, value: str) -> str:
        self._path(target, knob)
        canonical = SYSCTLS[knob].normalize(value)
        if knob == "vm.min_free_kbytes":
            total = self._mem_total_kib()
            if total is not None and int(canonical) > MAX_MIN_FREE_FRACTION * total:
                # The kernel takes it, then finds every zone below its min watermark and OOM-kills.
                raise UnsafeValue(f"vm.min_free_kbytes {canonical} KiB is above {MAX_MIN_FREE_FRACTION:.0%} of this "
                                   f"node's memory ({total} KiB): koordd does not write it")
        return canonical

    def _mem_total_kib(self) -> int | None:
        try:
            for line in (self.proc / "meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
        return None

    def write(self, target: str, knob: str, value: str) -> None:
        path = self._path(target, knob)
        canonical = SYSCTLS[knob].normalize(value)     # checked again: write() is the last gate
        try:
            # Without O_CREAT: a sysctl that is not there is never made as a file (O_TRUNC: procfs ignores it).
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        except FileNotFoundError:
            raise TargetGone(f"{path}") from None
        try:
            os.write(fd, canonical.encode())
        finally:
            os.close(fd)


def backends(fs) -> list[Backend]:
    """What this module brings to koordd's backends (the cgroup layout is not used)."""
    return [SysctlBackend()]


BACKENDS = BackendSet((SysctlBackend,), backends)     # koordd/core/catalogue.py BUILTIN
