"""The Prometheus endpoint ([metrics] enable = true; docs/metrics.md): what koordd sees, holds and
does, for a fleet's monitoring, and /healthz for a liveness probe.

The main loop never waits for a scrape. After each round it publishes one `Published`: references to
frozen things (the snapshot, the held knobs, the reclaimable figure) and copies of small dicts, put
in place by a single assignment. The HTTP server (koordd/runtime/endpoint.py: one thread, bounded in connections,
request size and time, whatever clients do), in a daemon thread of its own, turns the latest one
into series when it is scraped (`families()`, a pure function): no lock, no file read, nothing the
main loop could find half-changed. A scrape that fails costs that scrape (a 500 and one log line),
not the server; a port already taken costs the endpoint (one log line), not koordd.

Workload-chosen names (cgroups, held targets) are label values, given to prometheus-client as they
are, which escapes them; their number is bounded by the allow-list and `max_cgroups`.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

from koordd.act.journal import Held
from koordd.backends.cgroup_knobs import KNOBS
from koordd.core.cgroup_text import parse_cpulist, pattern_rank
from koordd.core.histogram import merged, quantile_us
from koordd.core.listen import parse_listen
from koordd.core.reclaimable import Reclaimable, cpu_given
from koordd.core.report import NodeReport
from koordd.core.snapshot import CPI, CgroupSample, PressureStat, RUNQ_LATENCY, Snapshot, own_usage
from koordd.runtime.capabilities import Capability
from koordd.runtime.endpoint import HttpServer
from koordd.runtime.result import RoundStats

log = logging.getLogger("koordd.metrics")     # its name before the move: log lines unchanged

HEALTH_STALE = 10.0      # seconds: the main loop wakes at least once a second; ten without a tick is a hang
QUANTILES = (0.5, 0.99)
# What a round reads of the class roots while the endpoint is on, whatever the loops need: the
# per-class and per-cgroup series. A few files per class root; pods stay read as far as loops need.
FIELDS = frozenset(("cpu_usage", "throttling", "cpu_max", "cpuset_cpus", "cpu_weight", "memory_current",
                    "memory_anon", "memory_max", "oom_kills", "cpu_pressure", "memory_pressure", "io_pressure"))

GAUGE, COUNTER = "gauge", "counter"
C, CG = ("class",), ("cgroup", "class")
PSI = ("resource", "kind")
# Every series koordd exports: name -> (type, labels, help). docs/metrics.md and the Grafana
# dashboard's test read this table.
SERIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    # koordd itself
    "koordd_info": (GAUGE, ("version", "cgroups", "dry_run"), "1, labelled with koordd's version, cgroup layout and dry-run"),
    "koordd_start_time_seconds": (GAUGE, (), "when koordd started (Unix time)"),
    "koordd_last_round_timestamp_seconds": (GAUGE, (), "when koordd's last round sampled the node (Unix time)"),
    "koordd_rounds_total": (COUNTER, (), "rounds: one snapshot, the due loops' decisions, their writes"),
    "koordd_round_seconds": (GAUGE, (), "wall time of the last round: snapshot, decisions, writes"),
    "koordd_round_seconds_total": (COUNTER, (), "wall time of every round"),
    "koordd_round_cpu_seconds_total": (COUNTER, (), "CPU time of the main thread in rounds"),
    "koordd_capability": (GAUGE, ("capability",), "1 where this host has it (koordctl doctor's probes), else 0"),
    "koordd_sensor_state": (GAUGE, ("sensor", "state"), "1 for each optional sensor's state (running, unavailable, stopped)"),
    "koordd_metrics_series_dropped": (GAUGE, ("what",), "cgroups or held knobs left out by max_cgroups"),
    "koordd_metrics_scrape_errors_total": (COUNTER, (), "scrapes that failed (HTTP 500)"),
    # the loops
    "koordd_loop_interval_seconds": (GAUGE, ("loop",), "the loop's interval"),
    "koordd_loop_ticks_total": (COUNTER, ("loop",), "the loop's ticks"),
    "koordd_loop_errors_total": (COUNTER, ("loop",), "ticks whose decide or settle raised"),
    "koordd_loop_consecutive_failures": (GAUGE, ("loop",), "failed ticks in a row (the loop backs off)"),
    "koordd_loop_tick_seconds": (GAUGE, ("loop",), "wall time of the loop's last decide and settle"),
    "koordd_loop_tick_seconds_total": (COUNTER, ("loop",), "wall time of the loop's decide and settle"),
    "koordd_loop_cpu_seconds_total": (COUNTER, ("loop",), "CPU time of the loop's decide and settle"),
    "koordd_loop_last_success_timestamp_seconds": (GAUGE, ("loop",), "the loop's last tick without error (Unix time)"),
    "koordd_loop_last_changes": (GAUGE, ("loop",), "knobs the loop's last tick changed"),
    "koordd_loop_lever_verdicts_total": (COUNTER, ("loop", "lever", "signal", "verdict"), "cuts judged: helped or "
                                         "bought_nothing, by lever and the LS signal it acted on (be_suppress); "
                                         "retracted: helped cuts whose release then did not confirm them"),
    "koordd_loop_lever_mean_gain": (GAUGE, ("loop", "lever", "signal"), "mean improvement of the signal per cut "
                                    "that helped (µs for latencies, percent for pressure)"),
    "koordd_loop_lever_mean_be_cores_given_up": (GAUGE, ("loop", "lever", "signal"), "mean BE cores given up per "
                                                 "cut that helped"),
    "koordd_decisions_total": (COUNTER, ("loop", "outcome", "knob"), "decision records: applied, dry-run, "
                               "refused, restored, left, deferred, kept"),
    # knobs koordd holds changed
    "koordd_held_knobs": (GAUGE, ("owner", "knob"), "knobs koordd holds changed, by owning loop"),
    "koordd_held_knob_value": (GAUGE, ("kind", "target", "knob", "owner"), "the value koordd set (cpu.max in cores, "
                               "memory in bytes, cpuset.cpus in CPUs, others as written; +Inf for max)"),
    "koordd_held_knob_original": (GAUGE, ("kind", "target", "knob", "owner"), "the value before koordd changed it "
                                  "(its restore value), as koordd_held_knob_value"),
    # the node
    "koordd_node_cpus": (GAUGE, (), "CPUs online"),
    "koordd_node_cpu_used_cores": (GAUGE, (), "cores busy, averaged over the last round"),
    "koordd_node_steal_worst_seconds": (GAUGE, (), "steal over the last round of the vCPU that lost the most: "
                                        "seconds the hypervisor held it off while it had work"),
    "koordd_node_memory_total_bytes": (GAUGE, (), "MemTotal"),
    "koordd_node_memory_available_bytes": (GAUGE, (), "MemAvailable"),
    "koordd_node_pressure_ratio": (GAUGE, PSI, "PSI avg10 of the node, 0..1"),
    "koordd_node_pressure_stall_seconds_total": (COUNTER, PSI, "PSI total stall time of the node"),
    # classes: every class root of the class together
    "koordd_class_cgroups": (GAUGE, C, "class roots (cgroups a class rule matched)"),
    "koordd_class_cpu_usage_cores": (GAUGE, C, "cores the class used, averaged over the last round"),
    "koordd_class_cpu_limit_cores": (GAUGE, C, "cores the class may use: quotas and cpusets, the node where none"),
    "koordd_class_memory_bytes": (GAUGE, C, "memory.current of the class"),
    "koordd_class_pressure_ratio": (GAUGE, C + PSI, "PSI avg10 of the class's worst root, 0..1"),
    "koordd_class_runq_latency_seconds": (GAUGE, C + ("quantile",), "run-queue latency quantiles of the class's "
                                          "threads, last round (eBPF; quantile 1 is the maximum)"),
    "koordd_class_runq_latency_mean_seconds": (GAUGE, C, "mean run-queue latency of the class's threads, last round"),
    "koordd_class_cpi": (GAUGE, C, "cycles per instruction of the class's threads, last round (perf)"),
    # cgroups: class roots and the pods a loop reads, as the allow-list and max_cgroups let them
    "koordd_cgroup_cpu_usage_cores": (GAUGE, CG, "cores used, averaged over the last round"),
    "koordd_cgroup_cpu_limit_cores": (GAUGE, CG, "cores the cgroup may use: its quota, its cpuset, the node"),
    "koordd_cgroup_cpu_weight": (GAUGE, CG, "cpu.weight (v1: from cpu.shares)"),
    "koordd_cgroup_cpu_throttled_periods_total": (COUNTER, CG, "periods the cgroup was throttled (cpu.stat)"),
    "koordd_cgroup_cpu_throttled_seconds_total": (COUNTER, CG, "time the cgroup was throttled (cpu.stat)"),
    "koordd_cgroup_memory_bytes": (GAUGE, CG, "memory.current"),
    "koordd_cgroup_memory_anon_bytes": (GAUGE, CG, "anon + unevictable memory"),
    "koordd_cgroup_memory_limit_bytes": (GAUGE, CG, "memory.max, where it is set"),
    "koordd_cgroup_oom_kills_total": (COUNTER, CG, "kernel OOM kills inside the cgroup"),
    "koordd_cgroup_pressure_ratio": (GAUGE, CG + PSI, "PSI avg10 of the cgroup, 0..1"),
    "koordd_cgroup_pressure_stall_seconds_total": (COUNTER, CG + PSI, "PSI total stall time of the cgroup"),
    "koordd_cgroup_runq_latency_seconds": (GAUGE, CG + ("quantile",), "run-queue latency quantiles, last round "
                                           "(eBPF; quantile 1 is the maximum)"),
    "koordd_cgroup_runq_latency_mean_seconds": (GAUGE, CG + ("source",), "mean run-queue latency, last round "
                                                "(source ebpf or schedstat)"),
    "koordd_cgroup_runq_waits": (GAUGE, CG, "waits (eBPF) or timeslices (schedstat) measured last round"),
    "koordd_cgroup_cpi": (GAUGE, CG, "cycles per instruction, last round (perf)"),
    # reclaimable capacity (koordd/core/reclaimable.py)
    "koordd_reclaimable_cpu_cores": (GAUGE, (), "cores the LS classes were given but left unused over the window, "
                                     "less the margin"),
    "koordd_reclaimable_memory_bytes": (GAUGE, (), "bytes the LS classes were given but left unused over the "
                                        "window, less the margin"),
    "koordd_reclaimable_basis": (GAUGE, ("resource", "part"), "the figures behind reclaimable (cores or bytes): "
                                 "node, given, needs, peak, system"),
    # the node report (koordd/core/report.py; docs/node-report.md): workloads with an SLO, tenants' shares
    "koordd_report_workload_latency_seconds": (GAUGE, CG + ("quantile",), "response time of an LS class root with "
                                               "an SLO over the report's window, at its SLO's quantile and 0.999"),
    "koordd_report_workload_target_seconds": (GAUGE, CG, "the SLO's latency_p99"),
    "koordd_report_workload_requests": (GAUGE, CG, "requests answered over the report's window"),
    "koordd_report_workload_violation_ratio": (GAUGE, CG, "requests over latency_p99 / requests, over the "
                                               "report's window"),
    "koordd_report_tenant_share_ratio": (GAUGE, ("tenant", "resource"), "the tenant's share of the node, 0..1: "
                                         "resource cpu (cores used / CPUs), memory (bytes / MemTotal), dominant "
                                         "(the larger)"),
    "koordd_report_tenants": (GAUGE, (), "tenants in the node report"),
    "koordd_report_fairness_index": (GAUGE, (), "Jain's fairness index over the tenants' dominant shares: 1 all "
                                     "equal, 1/n one tenant holds everything"),
}


@dataclass(frozen=True)
class Published:
    """What the daemon hands the endpoint after a round. Nothing in it changes after it is made."""
    settings: Any                                   # the [metrics] Settings
    started: float                                  # Unix time
    info: Mapping[str, str] = field(default_factory=dict)
    snapshot: Snapshot | None = None
    rounds: RoundStats = RoundStats()
    loops: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)        # Runner.status()
    decisions: Mapping[tuple[str, str, str], int] = field(default_factory=dict)  # (loop, outcome, knob) -> n
    held: tuple[Held, ...] = ()
    held_values: Mapping[tuple[str, str, str], str | None] = field(default_factory=dict)  # (kind, target, knob)
    capabilities: tuple[Capability, ...] = ()
    sensors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)     # SensorManager.status()
    reclaimable: Reclaimable | None = None
    report: NodeReport | None = None


# --- series from a Published: pure -------------------------------------------------------------------

def label(value: Any) -> str:
    """A label value as UTF-8 text: a cgroup name that is not UTF-8 (its bytes kept as surrogates) has
    them as \\xNN, where prometheus-client's encoder would raise. Everything else is prometheus-client's
    to escape."""
    text = str(value)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace").decode("utf-8")


class _Series:
    """Metric families filled row by row, declared by SERIES; a None value adds no row."""

    def __init__(self):
        self.families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, name: str, labels: Iterable[Any], value: float | None) -> None:
        if value is None:
            return
        fam = self.families.get(name)
        if fam is None:
            kind, names, doc = SERIES[name]
            cls = CounterMetricFamily if kind == COUNTER else GaugeMetricFamily
            fam = self.families[name] = cls(name, doc, labels=list(names))
        fam.add_metric([label(v) for v in labels], float(value))


def families(p: Published) -> list:
    """Every series of `p`, as prometheus-client metric families."""
    out = _Series()
    _daemon(out, p)
    _loops(out, p)
    _held(out, p)
    if p.snapshot is not None:
        _node(out, p.snapshot)
        _classes(out, p.snapshot)
        _cgroups(out, p.snapshot, p.settings)
    _reclaimable(out, p.reclaimable)
    _report(out, p.report, p.settings)
    return list(out.families.values())


def _daemon(out: _Series, p: Published) -> None:
    out.add("koordd_info", [p.info.get(k, "") for k in SERIES["koordd_info"][1]], 1)
    out.add("koordd_start_time_seconds", [], p.started)
    if p.snapshot is not None:
        out.add("koordd_last_round_timestamp_seconds", [], p.snapshot.wall)
    out.add("koordd_rounds_total", [], p.rounds.rounds)
    out.add("koordd_round_seconds", [], p.rounds.last_seconds)
    out.add("koordd_round_seconds_total", [], p.rounds.seconds_total)
    out.add("koordd_round_cpu_seconds_total", [], p.rounds.cpu_seconds_total)
    for cap in p.capabilities:
        out.add("koordd_capability", [cap.name], 1 if cap.available else 0)
    for name, s in sorted(p.sensors.items()):
        out.add("koordd_sensor_state", [name, s.get("state")], 1)


def _loops(out: _Series, p: Published) -> None:
    for name, r in sorted(p.loops.items()):
        out.add("koordd_loop_interval_seconds", [name], r.get("interval"))
        out.add("koordd_loop_ticks_total", [name], r.get("ticks"))
        out.add("koordd_loop_errors_total", [name], r.get("errors"))
        out.add("koordd_loop_consecutive_failures", [name], r.get("failures"))
        out.add("koordd_loop_tick_seconds", [name], r.get("last_seconds"))
        out.add("koordd_loop_tick_seconds_total", [name], r.get("seconds_total"))
        out.add("koordd_loop_cpu_seconds_total", [name], r.get("cpu_seconds_total"))
        out.add("koordd_loop_last_success_timestamp_seconds", [name], r.get("last_ok"))
        out.add("koordd_loop_last_changes", [name], r.get("last_changes"))
        levers = (r.get("report") or {}).get("levers") or {}
        for lever, lv in sorted(levers.items()):
            for signal, rec in sorted((lv.get("by_signal") or {}).items()):
                out.add("koordd_loop_lever_verdicts_total", [name, lever, signal, "helped"], rec.get("helped"))
                out.add("koordd_loop_lever_verdicts_total", [name, lever, signal, "bought_nothing"],
                        rec.get("bought_nothing"))
                out.add("koordd_loop_lever_verdicts_total", [name, lever, signal, "retracted"], rec.get("retracted"))
                out.add("koordd_loop_lever_mean_gain", [name, lever, signal], rec.get("mean_gain"))
                out.add("koordd_loop_lever_mean_be_cores_given_up", [name, lever, signal],
                        rec.get("mean_be_cores_given_up"))
    for (loop, outcome, knob), n in sorted(p.decisions.items()):
        out.add("koordd_decisions_total", [loop, outcome, knob], n)


def knob_number(knob: str, value: str | None) -> float | None:
    """A knob's value as one number: cpu.max in cores, memory limits in bytes, cpuset.cpus as its number
    of CPUs, a plain number as itself; None for a value that is not one (a schemata, a policy)."""
    if value is None:
        return None
    k = KNOBS.get(knob)
    try:
        if k is not None and k.magnitude is not None:
            return k.magnitude(value)
        if knob == "cpuset.cpus":
            return float(len(parse_cpulist(value)))
        return float(value)
    except (ValueError, TypeError):
        return None


def _held(out: _Series, p: Published) -> None:
    counts: dict[tuple[str, str], int] = {}
    for h in p.held:
        counts[(h.owner, h.knob)] = counts.get((h.owner, h.knob), 0) + 1
    for (owner, knob), n in sorted(counts.items()):
        out.add("koordd_held_knobs", [owner, knob], n)
    cap = int(p.settings.max_cgroups)
    shown = sorted(p.held, key=lambda h: (h.kind, h.target, h.knob))
    for h in shown[:cap]:
        labels = [h.kind, h.target or "/", h.knob, h.owner]
        out.add("koordd_held_knob_value", labels, knob_number(h.knob, p.held_values.get((h.kind, h.target, h.knob))))
        out.add("koordd_held_knob_original", labels, knob_number(h.knob, h.original))
    out.add("koordd_metrics_series_dropped", ["held_knobs"], max(0, len(shown) - cap))


def _pressure(out: _Series, name: str, labels: list, resource: str, stat: PressureStat | None) -> None:
    if stat is None:
        return
    for kind in ("some", "full"):
        line = getattr(stat, kind)
        if line is not None:
            out.add(f"{name}_ratio", labels + [resource, kind], line.avg10 / 100)
            out.add(f"{name}_stall_seconds_total", labels + [resource, kind], line.total_us / 1e6)


def _pressures(out: _Series, name: str, labels: list, sample) -> None:
    for resource in ("cpu", "memory", "io"):
        _pressure(out, name, labels, resource, getattr(sample, f"{resource}_pressure"))


def _node(out: _Series, s: Snapshot) -> None:
    n = s.node
    out.add("koordd_node_cpus", [], n.cpu_count)
    out.add("koordd_node_cpu_used_cores", [], n.cpu_used)
    out.add("koordd_node_steal_worst_seconds", [], n.steal_worst)
    out.add("koordd_node_memory_total_bytes", [], n.memory_total)
    out.add("koordd_node_memory_available_bytes", [], n.memory_available)
    _pressures(out, "koordd_node_pressure", [], n)


def _classes(out: _Series, s: Snapshot) -> None:
    runq, cpi = s.section(RUNQ_LATENCY, {}), s.section(CPI, {})
    by_class: dict[str, list[CgroupSample]] = {}
    for c in s.cgroups.values():
        if c.cls:
            by_class.setdefault(c.cls, []).append(c)
    for cls, roots in sorted(by_class.items()):
        out.add("koordd_class_cgroups", [cls], len(roots))
        # Own usage: a class root nested in another (an LS job in be.slice) counts once, in its own class.
        out.add("koordd_class_cpu_usage_cores", [cls], own_usage(s, roots))
        out.add("koordd_class_cpu_limit_cores", [cls],
                min(float(s.node.cpu_count), sum(cpu_given(c, float(s.node.cpu_count)) for c in roots)))
        out.add("koordd_class_memory_bytes", [cls], own_usage(s, roots, "memory_current"))
        for resource in ("cpu", "memory", "io"):
            for kind in ("some", "full"):
                worst = [line.avg10 for c in roots if (st := getattr(c, f"{resource}_pressure")) is not None
                         and (line := getattr(st, kind)) is not None]
                out.add("koordd_class_pressure_ratio", [cls, resource, kind], max(worst) / 100 if worst else None)
        waits = [runq[c.path] for c in roots if c.path in runq]
        slots = merged(w.slots for w in waits if w.slots)
        for q in QUANTILES + (1.0,):
            us = quantile_us(slots, q) if slots else None
            out.add("koordd_class_runq_latency_seconds", [cls, f"{q:g}"], None if us is None else us / 1e6)
        counted = [(w.mean_us, w.count) for w in waits if w.mean_us is not None and w.count]
        if counted:
            out.add("koordd_class_runq_latency_mean_seconds", [cls],
                    sum(m * n for m, n in counted) / sum(n for _, n in counted) / 1e6)
        samples = [cpi[c.path] for c in roots if c.path in cpi]
        instructions = sum(x.instructions for x in samples)
        if instructions > 0:
            out.add("koordd_class_cpi", [cls], sum(x.cycles for x in samples) / instructions)


_SAMPLED = tuple(sorted(FIELDS))


def selected(s: Snapshot, settings) -> tuple[list[CgroupSample], int]:
    """The cgroups that get per-cgroup series: those of the allowed classes or under an allowed
    pattern, class roots first, then pods, each by path; at most max_cgroups. And how many were left out.
    A pod the loops only listed this round (nothing of it read) has no series to show and takes no place."""
    classes, patterns = set(settings.cgroup_classes), tuple(settings.cgroup_patterns)
    sections = [s.section(RUNQ_LATENCY, {}), s.section(CPI, {})]

    def allowed(c: CgroupSample) -> bool:
        return c.cls in classes or (bool(patterns) and pattern_rank(c.path, patterns) < len(patterns))

    def read(c: CgroupSample) -> bool:
        return any(getattr(c, f) is not None for f in _SAMPLED) or any(c.path in x for x in sections)

    roots = sorted((c for c in s.cgroups.values() if allowed(c)), key=lambda c: c.path)
    pods = sorted((m for ms in s.members.values() for m in ms if allowed(m) and read(m)), key=lambda c: c.path)
    every = roots + pods
    cap = int(settings.max_cgroups)
    return every[:cap], max(0, len(every) - cap)


def _cgroups(out: _Series, s: Snapshot, settings) -> None:
    shown, dropped = selected(s, settings)
    out.add("koordd_metrics_series_dropped", ["cgroups"], dropped)
    runq, cpi = s.section(RUNQ_LATENCY, {}), s.section(CPI, {})
    cpus = float(s.node.cpu_count)
    for c in shown:
        labels = [c.path or "/", c.cls]
        out.add("koordd_cgroup_cpu_usage_cores", labels, c.cpu_usage)
        if c.cpu_max is not None or c.cpuset_cpus is not None:
            out.add("koordd_cgroup_cpu_limit_cores", labels, cpu_given(c, cpus))
        out.add("koordd_cgroup_cpu_weight", labels, knob_number("cpu.weight", c.cpu_weight))
        if c.throttling is not None:
            out.add("koordd_cgroup_cpu_throttled_periods_total", labels, c.throttling.nr_throttled)
            out.add("koordd_cgroup_cpu_throttled_seconds_total", labels, c.throttling.throttled_us / 1e6)
        out.add("koordd_cgroup_memory_bytes", labels, c.memory_current)
        out.add("koordd_cgroup_memory_anon_bytes", labels, c.memory_anon)
        limit = knob_number("memory.max", c.memory_max)
        out.add("koordd_cgroup_memory_limit_bytes", labels, limit if limit is not None and math.isfinite(limit) else None)
        out.add("koordd_cgroup_oom_kills_total", labels, c.oom_kills)
        _pressures(out, "koordd_cgroup_pressure", labels, c)
        w = runq.get(c.path)
        if w is not None:
            for q, us in zip(QUANTILES + (1.0,), (w.p50_us, w.p99_us, w.max_us)):
                out.add("koordd_cgroup_runq_latency_seconds", labels + [f"{q:g}"], None if us is None else us / 1e6)
            out.add("koordd_cgroup_runq_latency_mean_seconds", labels + [w.source],
                    None if w.mean_us is None else w.mean_us / 1e6)
            out.add("koordd_cgroup_runq_waits", labels, w.count)
        x = cpi.get(c.path)
        out.add("koordd_cgroup_cpi", labels, x.cpi if x is not None else None)


def _reclaimable(out: _Series, r: Reclaimable | None) -> None:
    if r is None:
        return
    for resource, cap, name in (("cpu", r.cpu, "koordd_reclaimable_cpu_cores"),
                                ("memory", r.memory, "koordd_reclaimable_memory_bytes")):
        if cap is None:
            continue
        out.add(name, [], cap.reclaimable)
        for part in ("node", "given", "needs", "peak", "system"):
            out.add("koordd_reclaimable_basis", [resource, part], getattr(cap, part))


def _report(out: _Series, r: NodeReport | None, settings) -> None:
    """The node report's own figures (the node's and the reclaimable ones are above): workloads of the
    allowed classes and tenants, each at most max_cgroups, the rest counted as dropped."""
    if r is None:
        return
    cap = int(settings.max_cgroups)
    classes, patterns = set(settings.cgroup_classes), tuple(settings.cgroup_patterns)
    shown = [w for w in r.workloads if w.cls in classes
             or (bool(patterns) and pattern_rank(w.cgroup, patterns) < len(patterns))]
    for w in shown[:cap]:
        labels = [w.cgroup or "/", w.cls]
        for q, us in ((w.quantile, w.tail_us), (0.999, w.p999_us)):
            out.add("koordd_report_workload_latency_seconds", labels + [f"{q:g}"], None if us is None else us / 1e6)
        out.add("koordd_report_workload_target_seconds", labels, w.target_us / 1e6)
        out.add("koordd_report_workload_requests", labels, w.requests)
        out.add("koordd_report_workload_violation_ratio", labels, w.violation_rate)
    out.add("koordd_metrics_series_dropped", ["report_workloads"], max(0, len(shown) - cap))
    for t in r.tenants[:cap]:
        for resource, value in (("cpu", t.cpu_share), ("memory", t.memory_share), ("dominant", t.dominant_share)):
            out.add("koordd_report_tenant_share_ratio", [t.name, resource], value)
    out.add("koordd_metrics_series_dropped", ["report_tenants"], max(0, len(r.tenants) - cap))
    out.add("koordd_report_tenants", [], len(r.tenants))
    out.add("koordd_report_fairness_index", [], r.fairness)


# --- the endpoint ------------------------------------------------------------------------------------

class Exporter:
    """The latest Published and heartbeat, and the registry a scrape reads them through."""

    def __init__(self):
        self.published: Published | None = None
        self.heartbeat: tuple[float, bool] | None = None     # (time.monotonic(), no loop overdue)
        self.scrape_errors = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.registry.register(ProcessCollector(registry=None))     # process_cpu_seconds_total, RSS, fds

    def publish(self, published: Published) -> None:
        self.published = published           # one assignment: a scrape sees the old one or the new one

    def beat(self, now: float, alive: bool) -> None:
        self.heartbeat = (now, alive)

    def collect(self):
        """prometheus-client's Collector call, in the server's thread."""
        p = self.published
        if p is not None:
            yield from families(p)
        errors = CounterMetricFamily("koordd_metrics_scrape_errors", SERIES["koordd_metrics_scrape_errors_total"][2])
        errors.add_metric([], self.scrape_errors)
        yield errors

    def describe(self):
        return []       # no collect() at registration: nothing is published yet

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def health(self, now: float | None = None) -> tuple[int, str]:
        """200 while the main loop ticks and no loop is overdue; 503 otherwise, saying why."""
        now = time.monotonic() if now is None else now
        beat = self.heartbeat
        if beat is None:
            return 503, "starting: no tick yet\n"
        at, alive = beat
        if now - at > HEALTH_STALE:
            return 503, f"stalled: the main loop last ticked {now - at:.0f}s ago\n"
        if not alive:
            return 503, "a loop is overdue (koordctl status says which)\n"
        return 200, "ok\n"


def answer(exporter: Exporter, method: str, path: str) -> tuple[int, str, bytes]:
    """(status, content type, body) for a GET or HEAD of `path`."""
    text_plain = "text/plain; charset=utf-8"
    if path == "/metrics":
        try:
            return 200, CONTENT_TYPE_LATEST, exporter.exposition()
        except Exception:  # noqa: BLE001 - a bug met in one scrape must not take the endpoint down
            exporter.scrape_errors += 1
            if exporter.scrape_errors == 1 or exporter.scrape_errors % 100 == 0:
                log.exception("metrics: a scrape failed (%d so far); the endpoint stays up", exporter.scrape_errors)
            return 500, text_plain, b"scrape failed, see koordd's log\n"
    if path == "/healthz":
        status, text = exporter.health()
        return status, text_plain, text.encode()
    if path == "/":
        return 200, text_plain, b"koordd: /metrics, /healthz\n"
    return 404, text_plain, b"not found\n"


class MetricsServer:
    """The HTTP server (koordd/runtime/endpoint.py: one thread, bounded connections, request size and time) in a
    daemon thread. start() returns None when it cannot listen (one log line)."""

    def __init__(self, server: HttpServer, listen: str):
        self.server, self.listen = server, listen
        self.thread = threading.Thread(target=server.serve_forever, name="koordd-metrics", daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @classmethod
    def start(cls, listen: str, exporter: Exporter, **limits) -> MetricsServer | None:
        """`limits`: HttpServer's max_connections, max_head and deadline (tests make them small)."""
        host, port = parse_listen(listen)
        try:
            server = HttpServer(host, port, lambda method, path: answer(exporter, method, path), **limits)
        except OSError as e:
            log.error("metrics: cannot listen on %s (%s); koordd runs on without its metrics endpoint", listen,
                      e.strerror or e)
            return None
        log.info("metrics: serving http://%s/metrics and /healthz", listen)
        return cls(server, listen)

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(timeout=2)
