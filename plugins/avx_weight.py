"""avx_weight: make up in `cpu.weight` for the frequency that AVX-512 and AVX2 code takes from its neighbours.

Wide vector code lowers a core's turbo frequency, for its SMT sibling too and for ~2 ms after the last
wide instruction (docs/avx.md), so equal CPU time buys unequal work. Gottschlag et al. (ATC'21)
charged CPU time by the frequency a task got; this loop does the user-space half of that with
weights, on the class roots of the classes in `classes` (default LSE, LSR, LS):

- `mode = "raise_victims"` (default): a class root whose threads ran on CPUs an AVX cgroup slows
  gets `cpu.weight` = base × factor, where factor = f_nominal / f_effective from the frequency model
  (`mhz_base`, `mhz_avx2`, `mhz_avx512`): 100 → 108 next to AVX-512 (3200 / 2958 MHz), → 102 next to
  AVX2 (3200 / 3147).
- `mode = "lower_avx"`: a class root that is itself AVX-heavy gets base ÷ the factor its neighbours
  suffer (100 → 92 for AVX-512), leaving the others as they are.
Weights stay within 1..10000.

The evidence: the `avx` sensor's section and `avx_cgroups`. In the section an AVX cgroup is one the
PMU's licence counters put at licence 1 (AVX2 heavy) or 2 (AVX-512 heavy) this round, slowing the CPUs
its threads ran on; where the PMU does not count it (no PMU, another CPU model, not in the v2 tree),
one with threads that used AVX-512 within 100 ms (arch_status), slowing the CPUs they last ran on. The
PMU alone decides where it counts (no verdict yet in a cgroup's first round): it sees AVX2 and tells
heavy AVX-512 use from glibc's EVEX string functions. A class root whose threads ran this round on a
slowed CPU or its SMT sibling shares it. `avx_cgroups` are cgroups the config declares AVX-heavy (a
known AVX-512 or AVX2 job): while one uses at least 0.1 core it counts, at `declared_level`, as sharing
CPUs with every class root it is not part of (without the PMU nothing sees AVX2, nor where a declared
job ran). A declared cgroup is matched among class roots and their children (pods, jobs), which the
loop then samples for their CPU use. Without the sensor (no AVX-512 or no arch_status on this host) the
loop works from `avx_cgroups` alone. A class root is never compensated for AVX use inside itself:
raising it would not help its own threads.

Base: the weight the cgroup had before this loop's first change (koordd's journaled original), else
its weight now; a cgroup whose weight cannot be read is skipped. Every change is a decision naming
the AVX cgroups with their evidence ("pmu" and the shares of their cycles at licence 1 and 2;
"arch_status", how many AVX-512 threads and how many ms ago; or "declared"), the shared CPUs, f_nominal,
f_effective, the factor, the base and the new weight. The compensation stays `hold` after the last
evidence, so a bursty AVX job does not make weights flap; then the original weight is put back.

One owner per knob: a class's `cpu.weight` belongs to qos_baseline where its weight option for that
class is set (`ls_cpu_weight`, `lsr_cpu_weight`, BE's idle or weight), and to this loop where it
compensates the class; a config with both is refused at load. To compensate LS while LS has a static
weight, leave `ls_cpu_weight` at 0 and set the weight in the unit (CPUWeight=) or let the kubelet
set it: this loop scales whatever the cgroup had. Limit: the kubelet rewrites its pods' and QoS
cgroups' weights on its own schedule; while compensating, koordd writes its value back every round
(scaled from the weight it first saw) and at the end restores that first weight: one the kubelet
chose meanwhile returns when the kubelet next applies it. Off by default.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from koordd.core.avx import (AVX256, AVX512, DEFAULT_MHZ, FrequencyModel, LEVELS, SCALAR, VectorUse,
    compensated_weight, with_siblings)
from koordd.core.cgroup_text import format_cpulist, match_pattern
from koordd.core.classes import WORKLOAD_CLASSES
from koordd.core.loop import Action, Loop, restore
from koordd.core.options import ClassList, Duration, Option, PatternList
from koordd.core.snapshot import AVX, CgroupSample, Snapshot

CLASSES = WORKLOAD_CLASSES
DECLARED_BUSY = 0.1                     # cores: a declared AVX cgroup using less is taken as idle
DECLARED_LEVELS = {"avx512": AVX512, "avx2": AVX256}
LEVEL_NAMES = {AVX512: "AVX-512", AVX256: "AVX2"}


@dataclass
class Compensation:
    seen: float                         # snapshot time of the latest evidence
    level: str                          # the widest vector use in force then
    evidence: dict                      # what showed it, for the decision record


@dataclass(frozen=True)
class Source:
    """An AVX cgroup of the sensor's section: the level it holds its cores at, the CPUs that slows (where
    its wide code ran, and their SMT siblings), and what showed it."""
    level: str
    cpus: frozenset[int]
    evidence: dict


@dataclass
class State:
    by_cgroup: dict[str, Compensation] = field(default_factory=dict)


class AvxWeight(Loop):
    __doc__ = __doc__
    name = "avx_weight"
    options = (
        ClassList("classes", tuple, ("LSE", "LSR", "LS"), "classes whose class roots are compensated",
                  choices=CLASSES),
        Option("mode", str, "raise_victims", "raise_victims: victims' cpu.weight × factor; lower_avx: an AVX-heavy "
               "class root's cpu.weight ÷ the factor its neighbours suffer", choices=("raise_victims", "lower_avx")),
        PatternList("avx_cgroups", tuple, (), "cgroups declared AVX-heavy (class roots or their children): while "
                    "one uses 0.1 core or more, every compensated class root outside it shares CPUs with it"),
        Option("declared_level", str, "avx512", "the vector width of avx_cgroups", choices=tuple(DECLARED_LEVELS)),
        Option("mhz_base", float, float(DEFAULT_MHZ[SCALAR]), "the CPU's frequency running scalar code, MHz",
               min=1, max=100000),
        Option("mhz_avx2", float, float(DEFAULT_MHZ[AVX256]), "its frequency under AVX2 (256-bit) code, MHz",
               min=1, max=100000),
        Option("mhz_avx512", float, float(DEFAULT_MHZ[AVX512]), "its frequency under AVX-512 code, MHz",
               min=1, max=100000),
        Option("hold", Duration, Duration(10.0), "how long a compensation stays after the last AVX evidence "
               "before the original weight is put back", min=0, max=3600),
    )

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        return frozenset((cls, "cpu.weight") for cls in settings.classes)

    @staticmethod
    def needs(settings) -> frozenset[str]:
        return frozenset({AVX, "cpu_weight", "cpu_usage"})

    @staticmethod
    def members_of(settings) -> frozenset[str]:
        # Declared AVX jobs are usually pods or jobs under a class root: their own CPU use says when they run.
        return frozenset(CLASSES) if settings.avx_cgroups else frozenset()

    @staticmethod
    def member_needs(settings) -> frozenset[str]:
        return frozenset({"cpu_usage"})

    @staticmethod
    def initial_state(settings) -> State:
        return State()

    @staticmethod
    def decide(snapshot: Snapshot, settings, state: State) -> list[Action]:
        if "cpu.weight" not in snapshot.supported:
            return []
        model = FrequencyModel({**DEFAULT_MHZ, SCALAR: settings.mhz_base, AVX256: settings.mhz_avx2,
                                AVX512: settings.mhz_avx512})
        evidence_of = _avx_evidence if settings.mode == "lower_avx" else _victim_evidence
        section, busy = snapshot.section(AVX), _busy_declared(snapshot, settings)
        uses = section.cgroups if section is not None else {}
        sources = _sources(uses, _siblings(snapshot))
        actions, roots = [], snapshot.of_class(*settings.classes)
        for cg in roots:
            found = evidence_of(cg.path, uses, sources, busy, DECLARED_LEVELS[settings.declared_level])
            comp = state.by_cgroup.get(cg.path)
            if found is not None:
                comp = state.by_cgroup[cg.path] = Compensation(snapshot.time, *found)
            elif comp is None or snapshot.time - comp.seen >= settings.hold:
                state.by_cgroup.pop(cg.path, None)
                if (cg.path, "cpu.weight") in snapshot.held:
                    actions.append(restore(cg.path, "cpu.weight", f"{cg.cls} {cg.path}: no AVX evidence within "
                                           f"hold ({float(settings.hold):g} s), cpu.weight back to its original",
                                           **{"class": cg.cls, "hold_s": float(settings.hold)}))
                continue
            action = _compensate(cg, comp, model, snapshot, settings.mode)
            if action is not None:
                actions.append(action)
        for gone in set(state.by_cgroup) - {cg.path for cg in roots}:
            del state.by_cgroup[gone]
        return actions


def _compensate(cg: CgroupSample, comp: Compensation, model: FrequencyModel, snapshot: Snapshot,
                mode: str) -> Action | None:
    original = snapshot.held.get((cg.path, "cpu.weight"))
    try:
        base = int(original if original is not None else cg.cpu_weight)
    except (TypeError, ValueError):
        return None                     # weight unknown: nothing to scale
    f_effective = model.effective_mhz(on_siblings=[VectorUse(comp.level)])
    factor = model.factor(f_effective)
    lower = mode == "lower_avx"
    weight = compensated_weight(base, 1 / factor if lower else factor)
    age = snapshot.time - comp.seen
    reason = {"class": cg.cls, "mode": mode, **comp.evidence, "level": comp.level,
              "f_nominal_mhz": model.nominal_mhz, "f_effective_mhz": f_effective, "factor": round(factor, 4),
              "base_weight": base, "base_from": "journal" if original is not None else "cgroup", "weight": weight,
              **({"evidence_age_s": round(age, 3)} if age > 0 else {})}
    avx = ", ".join(f"{p} ({_describe(u)})" for p, u in comp.evidence["avx_cgroups"].items())
    if lower:
        victims = comp.evidence["victims"]
        what = f"uses {LEVEL_NAMES[comp.level]} ({avx}), slowing " + (
            ", ".join(f"{v} on CPUs {c}" for v, c in victims.items()) if isinstance(victims, dict) else victims)
    else:
        what = f"shares CPUs {comp.evidence['shared_cpus']} with {avx}"
    message = (f"{cg.cls} {cg.path} {what}: cpu.weight {base} {'÷' if lower else '×'} "
               f"{model.nominal_mhz:g}/{f_effective:g} MHz = {weight}"
               + (f" (held, last evidence {age:.1f} s ago)" if age > 0 else ""))
    return Action(cg.path, "cpu.weight", str(weight), reason, message)


def _sources(uses, siblings) -> dict[str, Source]:
    """The AVX cgroups of the section (cgroup -> AvxUse)."""
    found = {cg: _source(use, siblings) for cg, use in sorted(uses.items())}
    return {cg: source for cg, source in found.items() if source is not None}


def _source(use, siblings) -> Source | None:
    """The PMU's verdict where it counts the cgroup (none yet in its first round): it sees AVX2, and tells
    heavy AVX-512 use from glibc's EVEX string functions. Elsewhere arch_status's recent AVX-512 state."""
    licence = use.licence
    if use.counted:
        if licence is None or licence.level == SCALAR:
            return None
        return Source(licence.level, with_siblings(use.ran_cpus, siblings),
                      {"evidence": "pmu", "lvl1_share": round(licence.lvl1, 3), "lvl2_share": round(licence.lvl2, 3)})
    if use.avx512_threads:
        return Source(AVX512, with_siblings(use.cpus, siblings), {"evidence": "arch_status",
                      "avx512_threads": use.avx512_threads, "avx512_ms_ago": use.min_elapsed_ms})
    return None


def _victim_evidence(path, uses, sources, busy, declared) -> tuple[str, dict] | None:
    """raise_victims: the AVX cgroups outside `path` whose slowed CPUs its threads ran on."""
    ran = uses[path].ran_cpus if path in uses else frozenset()
    avx, level, shared = {}, SCALAR, frozenset()
    for cg, source in sources.items():
        if ran & source.cpus and not _related(cg, path):
            avx[cg], level, shared = source.evidence, _widest(level, source.level), shared | (ran & source.cpus)
    for cg, usage in sorted(busy.items()):
        if not _related(cg, path):
            avx[cg], level = {"declared": LEVEL_NAMES[declared], "cpu_usage": round(usage, 2)}, _widest(level, declared)
    if not avx:
        return None
    return level, {"avx_cgroups": avx, "shared_cpus": format_cpulist(shared) if shared else "any (declared)"}


def _avx_evidence(path, uses, sources, busy, declared) -> tuple[str, dict] | None:
    """lower_avx: AVX use in `path` (or below), and who it slows."""
    avx, level, victims = {}, SCALAR, {}
    source = sources.get(path)
    if source is not None:
        victims = {v: format_cpulist(u.ran_cpus & source.cpus) for v, u in sorted(uses.items())
                   if u.ran_cpus & source.cpus and not _related(v, path)}
        if victims:
            avx, level = {path: source.evidence}, source.level
    for cg, usage in sorted(busy.items()):
        if _related(cg, path):
            avx[cg], level = {"declared": LEVEL_NAMES[declared], "cpu_usage": round(usage, 2)}, _widest(level, declared)
    if not avx:
        return None
    return level, {"avx_cgroups": avx, "victims": victims or "its neighbours (declared)"}


def _describe(use: Mapping) -> str:
    if "declared" in use:
        return f"declared {use['declared']}, {use['cpu_usage']:g} cores"
    if use["evidence"] == "pmu":
        return f"PMU: licence 1 for {use['lvl1_share']:.0%} and licence 2 for {use['lvl2_share']:.0%} of its cycles"
    n = use["avx512_threads"]
    return f"{n} AVX-512 thread{'s' if n > 1 else ''}, latest {use['avx512_ms_ago']} ms ago"


def _busy_declared(snapshot: Snapshot, settings) -> dict[str, float]:
    """Declared AVX cgroups using CPU now -> their cores."""
    if not settings.avx_cgroups:
        return {}
    sampled = [*snapshot.cgroups.values(), *(m for ms in snapshot.members.values() for m in ms)]
    return {s.path: s.cpu_usage for s in sampled
            if s.cpu_usage is not None and s.cpu_usage >= DECLARED_BUSY
            and any(match_pattern(p, s.path) for p in settings.avx_cgroups)}


def _siblings(snapshot: Snapshot) -> dict[int, frozenset[int]]:
    cores: dict[int, set[int]] = {}
    for t in snapshot.node.topology:
        cores.setdefault(t.core, set()).add(t.cpu)
    return {t.cpu: frozenset(cores[t.core]) for t in snapshot.node.topology}


def _widest(a: str, b: str) -> str:
    return max(a, b, key=LEVELS.index)


def _related(a: str, b: str) -> bool:
    """One is the other or lies below it."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")
