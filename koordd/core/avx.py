"""The AVX frequency model, with nothing read: licence level -> MHz, the frequency a CPU runs at given
what runs on it and on its SMT siblings, the compensation factor and weight, and a cgroup's level from
the licence cycles its tasks ran. Pure: the avx_weight loop computes with it; what is read from /proc,
the MSRs and the PMU is koordd/kernel/avx.py (the module docstring there says what each source sees)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping


def recent(elapsed_ms: int, within_ms: float) -> bool:
    """Seen using AVX-512 within the last `within_ms` (NEVER is negative)."""
    return 0 <= elapsed_ms <= within_ms


def with_siblings(cpus: Iterable[int], siblings: Mapping[int, frozenset[int]]) -> frozenset[int]:
    """The CPUs and every SMT sibling of theirs."""
    out: set[int] = set()
    for c in cpus:
        out |= siblings.get(c, {c})
    return frozenset(out)


SCALAR, AVX128, AVX256, AVX512 = "scalar", "avx128", "avx256", "avx512"


LEVELS = (SCALAR, AVX128, AVX256, AVX512)      # from no drop to the deepest


# Gottschlag et al., ATC'21, one Intel host (MHz): base 3200; 128-bit vectors 3184-3191; 256-bit 3147;
# 512-bit 2949-2967 (midpoints of the ranges).
DEFAULT_MHZ: Mapping[str, float] = {SCALAR: 3200, AVX128: 3188, AVX256: 3147, AVX512: 2958}


HOLD_MS = 2.0               # the licence outlasts the last wide instruction by about this


MIN_WEIGHT, MAX_WEIGHT = 1, 10000               # cgroup v2 cpu.weight's range


@dataclass(frozen=True)
class VectorUse:
    """What one task asks of a core: its widest vector level and how long ago it last used it (0: now)."""
    level: str = SCALAR
    ago_ms: float = 0.0


@dataclass(frozen=True)
class FrequencyModel:
    mhz: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MHZ))
    hold_ms: float = HOLD_MS

    @property
    def nominal_mhz(self) -> float:
        return self.mhz[SCALAR]

    def effective_mhz(self, on_cpu: Iterable[VectorUse] = (), on_siblings: Iterable[VectorUse] = ()) -> float:
        """The frequency of a CPU given the tasks on it (the one running, and the one before it) and on its SMT
        siblings: the core runs at the level of the widest use still in force (used within hold_ms), on any
        of its hardware threads, so a scalar task next to or right after AVX-512 code runs at AVX-512's."""
        in_force = [u.level for u in (*on_cpu, *on_siblings) if u.ago_ms <= self.hold_ms]
        return self.mhz[max(in_force, key=LEVELS.index, default=SCALAR)]

    def factor(self, effective_mhz: float) -> float:
        """f_nominal / f_effective: how much more CPU time a task needs for the work it would do at the
        nominal frequency. Never below 1: a task that ran faster (turbo) is not charged for it."""
        return max(1.0, self.nominal_mhz / effective_mhz) if effective_mhz > 0 else 1.0


def compensated_weight(base: int, factor: float) -> int:
    """A cpu.weight raised by `factor`, kept in the kernel's 1..10000."""
    return min(MAX_WEIGHT, max(MIN_WEIGHT, round(base * factor)))


# Ordinary code counts no licence cycles at all; a cgroup under a tenth of its cycles at a licence drops a
# neighbour's frequency by under 1% on average (0.1 x 8% at AVX-512): not worth a weight change.
LICENCE_SHARE = 0.1


@dataclass(frozen=True)
class Licence:
    """What the PMU counted for a cgroup over a round, and the level that makes it."""
    cycles: float           # its tasks' cycles (unhalted, while they ran)
    lvl1: float             # the share of them at licence 1: heavy AVX2, light AVX-512
    lvl2: float             # the share at licence 2: heavy AVX-512
    level: str              # SCALAR, AVX256 (licence 1) or AVX512 (licence 2)


def licence_of(cycles: float, lvl1_cycles: float, lvl2_cycles: float, avx512_seen: bool,
               share: float = LICENCE_SHARE) -> Licence:
    """A cgroup's level from its cycles at licence 1 and 2: AVX512 when licence 2 held for `share` of its
    cycles, AVX256 when licence 1 or 2 did, else SCALAR. The licence is the core's: a task next to wide code
    (SMT sibling) or right after it on its CPU (~2 ms) counts those cycles too. Licence 2 needs AVX-512
    instructions, so in a cgroup whose threads were never seen with AVX-512 state (`avx512_seen`, from
    arch_status) its licence-2 cycles are a neighbour's and count for nothing."""
    lvl1, lvl2 = (min(1.0, max(0.0, c / cycles)) if cycles > 0 else 0.0 for c in (lvl1_cycles, lvl2_cycles))
    own2 = lvl2 if avx512_seen else 0.0
    level = AVX512 if own2 >= share else AVX256 if lvl1 + own2 >= share else SCALAR
    return Licence(cycles, lvl1, lvl2, level)
