"""Does proactive_reclaim cost the workload it reclaims from? Issue 29's proof, run on a pure cgroup v2 host.

    sudo /opt/koordd/bin/python scripts/bench-reclaim [--reps 3] [--arms off,koordd] [--seconds 30]
                                                     [--warmup 10] [--option psi_target=0.5 ...] [--out DIR]

The workload: a Python process, started fresh for every run as a transient systemd service in a slice of
its own (reclaimbench.slice), writes a --cache-mib file (its page cache, charged to it; fsync'ed, so the
pages are clean), touches --anon-mib of anonymous memory, then loops: read the first --hot-cache-mib of
the file, touch --hot-anon-mib of the anon memory, count the passes; it logs passes per second. The rest
(mostly cold page cache and anon) is never touched again: what a senpai-style loop should take back
without the workload noticing.

Arms, one run each per repetition, in an order rotated per repetition (off, koordd, then koordd, off, ...)
so that a drift of the host does not fall on one arm:

    off      no koordd: the spread of no reclaim
    koordd   koordd in the foreground, a config and state_dir of its own, only proactive_reclaim enabled,
             on the bench's slice as its BE class (the shipped [loops.proactive_reclaim] options, changed
             by --option)
    dry      the same with [daemon] dry_run = true: koordd decides every step and writes nothing. Its
             throughput against off is what koordd's own CPU costs; against koordd, what reclaiming costs.

A run: start the workload, wait until it has written its file and touched its memory, --warmup seconds,
(koordd arms) start koordd and wait until it has ticked twice, then measure --seconds: memory.current at
the window's start and end, memory.pressure (some avg10 at the end, the growth of some/full total over
the window), memory.stat's counters (refaults, scans, steals, faults), the CPU used by the workload, by
koordd (user and system: a memory.reclaim write does its reclaim in the writer's own system time) and by
the whole node, koordd's memory.reclaim decisions in the window, and the workload's passes per second.

Writes DIR/report.md (the command, the host, the per-arm table, every run, the verdict) and
DIR/results.json (every run's record), and prints the report. Needs root, systemd as PID 1, a pure cgroup
v2 hierarchy and memory.reclaim (Linux 5.19+). Refuses to run beside a running koordd service (its own
rounds would be in every arm's numbers): `systemctl stop koordd` first.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from koordtest.bench.common import cell, command_line, doc_parser, interrupted, page, toml_value
from koordtest.bench.procstat import cpu_times, node_cpu_ticks
from koordtest.bench.qos_stats import Spread, median_spread
from koordtest.koordd_proc import SHIPPED_CONFIG, KoorddProcess, koordd_command, to_toml
from koordd.sensors.psi import parse_psi

CGROUP = Path("/sys/fs/cgroup")
SLICE = "reclaimbench.slice"       # no dash: systemd would nest "reclaim-bench.slice" inside reclaim.slice
UNIT_PREFIX = "reclaimbench"
ARMS = ("off", "koordd", "dry")
MiB = 1 << 20
PAGE = 4096
# memory.stat counters whose growth over the window is reported (those this kernel has)
COUNTERS = ("workingset_refault_file", "workingset_refault_anon", "workingset_activate_file",
            "workingset_activate_anon", "workingset_restore_file", "workingset_restore_anon",
            "pgscan", "pgsteal", "pgscan_proactive", "pgsteal_proactive", "pgmajfault", "pgfault")
# memory.stat sizes read at the window's end
SIZES = ("anon", "file", "active_file", "inactive_file", "active_anon", "inactive_anon", "shmem")

# The workload, run by the system's python3 in its own unit. argv: data file, rate log, cache MiB, anon MiB,
# hot cache MiB, hot anon MiB. Its rate log gets "ready <t>" once set up, then "<t> <passes/s>" lines
# (t: CLOCK_MONOTONIC, which the bench reads too).
WORKLOAD = r"""
import os, sys, time
path, log_path = sys.argv[1], sys.argv[2]
cache_mib, anon_mib, hot_cache_mib, hot_anon_mib = (int(a) for a in sys.argv[3:7])
log = open(log_path, "a", buffering=1)
chunk = bytes(range(256)) * 4096                  # 1 MiB, not zeros
with open(path, "wb") as f:
    for _ in range(cache_mib):
        f.write(chunk)
    f.flush()
    os.fsync(f.fileno())                          # clean pages: reclaim drops them without writeback
anon = bytearray(anon_mib << 20)
for i in range(0, len(anon), 4096):
    anon[i] = 1                                   # a write per page: a page of its own, not the zero page
buf = bytearray(1 << 20)
log.write(f"ready {time.monotonic():.3f}\n")
passes, t0 = 0, time.monotonic()
with open(path, "rb", buffering=0) as f:
    while True:
        f.seek(0)
        for _ in range(hot_cache_mib):
            f.readinto(buf)
        for i in range(0, hot_anon_mib << 20, 4096):
            anon[i] = (anon[i] + 1) & 255
        passes += 1
        now = time.monotonic()
        if now - t0 >= 1:
            log.write(f"{now:.3f} {passes / (now - t0):.3f}\n")
            passes, t0 = 0, now
"""


# --- pure parts (tests/unit/koordtest/test_bench_reclaim.py) ----------------------------------------------------------

def parse_flat(text: str) -> dict[str, int]:
    """memory.stat / cpu.stat: "key value" lines; lines that are not that are skipped."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def counter_deltas(before: dict[str, int], after: dict[str, int], keys: Iterable[str] = COUNTERS) -> dict[str, int]:
    """Growth of each counter both samples have (a kernel without one leaves it out)."""
    return {k: after[k] - before[k] for k in keys if k in before and k in after}


def parse_rate_log(text: str) -> tuple[float | None, list[tuple[float, float]]]:
    """The workload's log: (its ready time or None, [(t, passes/s)]). A torn last line is skipped."""
    ready, samples = None, []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            if parts[0] == "ready":
                ready = float(parts[1])
            else:
                samples.append((float(parts[0]), float(parts[1])))
        except ValueError:
            continue
    return ready, samples


def rate_times(samples: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The per-second rates of the seconds that ended inside (start, end], each with its time stamp in
    seconds since the window's start: each rate covers the second before its stamp, so the first counted
    is the first second wholly inside the window."""
    return [(round(t - start, 2), rate) for t, rate in samples if start + 1 <= t + 0.05 and t <= end]


def split_by_reclaim(rates_at: list[tuple[float, float]], trajectory: list[tuple[float, int]],
                     threshold: int = MiB) -> tuple[list[float], list[float]]:
    """The window's per-second rates split into (seconds in which memory.current fell by more than
    `threshold`: reclaim at work, seconds in which it did not). A second (t-1, t] is judged by the last
    memory.current sample at or before its start and the first at or after its end; a second the samples
    do not bracket is left out."""
    active, quiet = [], []
    for t, rate in rates_at:
        before = [m for ts, m in trajectory if ts <= t - 1 + 0.05]
        after = [m for ts, m in trajectory if ts >= t - 0.05]
        if not before or not after:
            continue
        (active if before[-1] - after[0] > threshold else quiet).append(rate)
    return active, quiet


def parse_options(pairs: Iterable[str]) -> dict[str, Any]:
    """--option key=value: the value as TOML reads it (0.5, 100, true, "4M" or bare 4M as a string)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"--option wants key=value, got {pair!r}")
        if key in ("enabled", "classes"):
            raise ValueError(f"--option {key}: the bench sets it (proactive_reclaim on, BE only)")
        out[key] = toml_value(value)
    return out


def loop_section(shipped: Path = SHIPPED_CONFIG, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """[loops.proactive_reclaim] as shipped, enabled, with `options` over it."""
    section = dict(tomllib.loads(shipped.read_text()).get("loops", {}).get("proactive_reclaim", {}))
    section.update(options or {})
    section["enabled"] = True
    return section


def koordd_config(state_dir: Path, section: dict[str, Any], dry_run: bool, slice_: str = SLICE) -> str:
    """koordd with one class (BE: the bench's slice, so every workload unit below it is a BE job) and
    one loop; every other loop is off by default."""
    return to_toml({
        "daemon": {"cgroup_root": "", "state_dir": str(state_dir), "dry_run": dry_run, "log_level": "info"},
        "classes": [{"name": "BE", "cgroups": [slice_]}],
        "loops": {"proactive_reclaim": section},
    })


def run_order(arms: list[str], reps: int) -> list[tuple[int, str]]:
    """(rep, arm) pairs: every arm once per repetition, the order rotated by one each repetition."""
    out = []
    for rep in range(reps):
        k = rep % len(arms)
        out += [(rep + 1, arm) for arm in arms[k:] + arms[:k]]
    return out


def reclaim_decisions(decisions: list[dict], cgroup: str, start: float, end: float) -> dict[str, Any]:
    """koordd's memory.reclaim decisions on `cgroup` in the window (wall clock): how many of each outcome,
    the bytes asked by the applied ones (a write that returned reclaimed at least that much), and the PSI
    each was decided at."""
    mine = [d for d in decisions if d.get("loop") == "proactive_reclaim" and d.get("knob") == "memory.reclaim"
            and d.get("cgroup") == cgroup and start <= d.get("time", 0) <= end]
    outcomes: dict[str, int] = {}
    for d in mine:
        outcomes[d.get("outcome", "?")] = outcomes.get(d.get("outcome", "?"), 0) + 1
    applied = [d for d in mine if d.get("outcome") == "applied"]
    psi = [d["reason"]["psi_some_percent"] for d in mine if "psi_some_percent" in d.get("reason", {})]
    return {"outcomes": outcomes, "steps": len(mine),
            # each step: seconds into the window, bytes asked, outcome, the PSI it was decided at
            "timeline": [(round(d["time"] - start, 2), int(d.get("reason", {}).get("reclaim_bytes", 0)),
                          d.get("outcome"), d.get("reason", {}).get("psi_some_percent")) for d in mine],
            "asked_bytes": sum(int(d.get("reason", {}).get("reclaim_bytes", 0)) for d in mine),
            "applied_bytes": sum(int(d.get("reason", {}).get("reclaim_bytes", 0)) for d in applied),
            "psi_at_decisions_max": max(psi) if psi else None}


def spread_dict(s: Spread | None) -> dict | None:
    return None if s is None else {"median": s.median, "low": s.low, "high": s.high, "n": s.n}


def summarise(runs: list[dict], arms: list[str]) -> dict[str, dict[str, Spread | None]]:
    """Per arm, each quantity's median and range over the repetitions (one value per run)."""
    quantities = {
        "throughput": lambda r: r["throughput"]["median"],
        "throughput_min": lambda r: r["throughput"]["min"],
        "mem_start_mib": lambda r: r["memory"]["start"] / MiB,
        "mem_end_mib": lambda r: r["memory"]["end"] / MiB,
        "mem_drop_mib": lambda r: (r["memory"]["start"] - r["memory"]["end"]) / MiB,
        "psi_some_percent": lambda r: r["psi"]["some_percent"],
        "psi_full_percent": lambda r: r["psi"]["full_percent"],
        "psi_some_avg10_end": lambda r: r["psi"]["some_avg10_end"],
        "refault_file_mib": lambda r: r["stat_delta"].get("workingset_refault_file", 0) * PAGE / MiB,
        "refault_anon_mib": lambda r: r["stat_delta"].get("workingset_refault_anon", 0) * PAGE / MiB,
        "pgsteal_mib": lambda r: r["stat_delta"].get("pgsteal", 0) * PAGE / MiB,
        "reclaim_applied_mib": lambda r: r["reclaim"]["applied_bytes"] / MiB if r["reclaim"] else None,
        "reclaim_steps": lambda r: r["reclaim"]["steps"] if r["reclaim"] else None,
        "workload_cpus": lambda r: r["cpu"]["workload"],
        "koordd_cpus": lambda r: r["cpu"]["koordd"],
        "koordd_sys_cpus": lambda r: r["cpu"]["koordd_sys"],
        "node_busy_cpus": lambda r: r["cpu"]["node_busy"],
    }
    out = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        out[arm] = {name: median_spread(f(r) for r in mine) for name, f in quantities.items()}
    return out


@dataclass(frozen=True)
class Verdict:
    within: bool | None            # None: not enough runs of both arms to say
    text: str


def verdict(runs: list[dict], arm: str = "koordd", base: str = "off") -> Verdict:
    """Is `arm`'s throughput within the spread of `base`? Each run is one value (its per-second median);
    within: `arm`'s median run lies at or above the lowest `base` run. Also said: how many `arm` runs fall
    under that lowest one, the ratio of medians, and the paired ratios (same repetition)."""
    a = [r["throughput"]["median"] for r in runs if r["arm"] == arm]
    b = [r["throughput"]["median"] for r in runs if r["arm"] == base]
    if not a or not b:
        return Verdict(None, f"no verdict: {len(a)} `{arm}` and {len(b)} `{base}` runs")
    lo, hi, med_a, med_b = min(b), max(b), statistics.median(a), statistics.median(b)
    under = sum(1 for x in a if x < lo)
    pairs = {r["rep"]: r["throughput"]["median"] for r in runs if r["arm"] == base}
    paired = [r["throughput"]["median"] / pairs[r["rep"]] for r in runs
              if r["arm"] == arm and pairs.get(r["rep"])]
    within = med_a >= lo
    text = (f"`{arm}` median {med_a:.1f} passes/s against `{base}`'s {med_b:.1f} (its runs {lo:.1f}-{hi:.1f}): "
            f"{med_a / med_b:.3f}x; {under} of {len(a)} `{arm}` runs under `{base}`'s lowest"
            + (f"; paired ratios (same repetition) " + ", ".join(f"{p:.3f}" for p in paired) if paired else "")
            + (f". **Within the spread of `{base}`**" if within else f". **Not within the spread of `{base}`**")
            + (f" (above its highest)" if med_a > hi else "") + ".")
    return Verdict(within, text)


TABLE = (("throughput", "passes/s (median of runs' medians)", 1),
         ("throughput_min", "slowest second, passes/s", 1),
         ("mem_start_mib", "memory.current at window start, MiB", 0),
         ("mem_end_mib", "memory.current at window end, MiB", 0),
         ("mem_drop_mib", "memory.current drop over the window, MiB", 0),
         ("reclaim_applied_mib", "koordd: reclaim written (applied), MiB", 0),
         ("reclaim_steps", "koordd: memory.reclaim decisions", 0),
         ("pgsteal_mib", "memory.stat pgsteal, MiB", 0),
         ("refault_file_mib", "workingset_refault_file, MiB", 1),
         ("refault_anon_mib", "workingset_refault_anon, MiB", 1),
         ("psi_some_percent", "memory PSI some over the window, %", 3),
         ("psi_full_percent", "memory PSI full over the window, %", 3),
         ("psi_some_avg10_end", "memory PSI some avg10 at the end, %", 2),
         ("workload_cpus", "workload CPUs", 2),
         ("koordd_cpus", "koordd CPUs (user+system)", 3),
         ("koordd_sys_cpus", "koordd system CPUs", 3),
         ("node_busy_cpus", "node busy CPUs (/proc/stat)", 2))


def markdown(runs: list[dict], arms: list[str], command: str, about: list[str], notes: list[str]) -> str:
    summary = summarise(runs, arms)
    lines = ["## Per arm: median (lowest-highest) over repetitions", "",
              "| | " + " | ".join(f"`{a}`" for a in arms) + " |", "|---|" + "---|" * len(arms)]
    for key, label, digits in TABLE:
        cells = [cell(summary[a][key], digits) for a in arms]
        if all(c == "-" for c in cells):
            continue
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "## Verdict", ""]
    if "koordd" in arms and "off" in arms:
        lines.append("- " + verdict(runs, "koordd", "off").text)
    if "dry" in arms and "off" in arms:
        lines.append("- koordd's own cost (dry run, nothing written): " + verdict(runs, "dry", "off").text)
    if "dry" in arms and "koordd" in arms:
        lines.append("- reclaim's own cost (koordd against its dry run): " + verdict(runs, "koordd", "dry").text)
    lines += [f"- {n}" for n in notes]
    lines += ["", "## Every run", "",
              "| rep | arm | passes/s median (min-max) | memory.current start → end MiB | reclaimed MiB (steps) "
              "| refault file MiB | PSI some % | koordd CPUs (sys) | node busy CPUs |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        t, m, rc = r["throughput"], r["memory"], r["reclaim"]
        reclaimed = f"{rc['applied_bytes'] / MiB:.0f} ({rc['steps']})" if rc else "-"
        lines.append(
            f"| {r['rep']} | {r['arm']} | {t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}) "
            f"| {m['start'] / MiB:.0f} → {m['end'] / MiB:.0f} "
            f"| {reclaimed} "
            f"| {r['stat_delta'].get('workingset_refault_file', 0) * PAGE / MiB:.1f} "
            f"| {r['psi']['some_percent']:.3f} "
            f"| {r['cpu']['koordd']:.3f} ({r['cpu']['koordd_sys']:.3f}) | {r['cpu']['node_busy']:.2f} |")
    return page("proactive_reclaim: the workload's throughput, memory and PSI with and without koordd", command,
                about, lines, fence="")


def reclaim_seconds_note(runs: list[dict], arm: str = "koordd") -> str | None:
    """`arm`'s per-second throughput in the seconds memory.current fell (reclaim at work) against the
    seconds it did not, pooled over its runs: whether the cost, if any, comes with the reclaim steps."""
    active, quiet = [], []
    for r in runs:
        if r["arm"] == arm and r.get("rates_at"):
            a, q = split_by_reclaim(r["rates_at"], r["trajectory"])
            active += a
            quiet += q
    if not active or not quiet:
        return None
    return (f"`{arm}` per second: {statistics.median(active):.1f} passes/s (median of {len(active)} s) in the seconds "
            f"memory.current fell by more than 1 MiB, {statistics.median(quiet):.1f} (of {len(quiet)} s) in the others")


# --- the host ------------------------------------------------------------------------------------------

def host_problem(data_dir: Path) -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not os.path.isdir("/run/systemd/system"):
        return "needs systemd as PID 1 (the workload runs as a transient unit)"
    if not (CGROUP / "cgroup.controllers").is_file():
        return "needs a pure cgroup v2 hierarchy at /sys/fs/cgroup (this host's memory controller is v1)"
    if not (CGROUP / "system.slice" / "memory.reclaim").exists():
        return "this kernel has no memory.reclaim (Linux 5.19+)"
    if fs_type(data_dir) in ("tmpfs", "ramfs"):
        return f"{data_dir} is {fs_type(data_dir)}: its pages are shmem, not page cache (--data-dir on a disk)"
    if subprocess.run(["systemctl", "is-active", "--quiet", "koordd"]).returncode == 0:
        return "koordd.service is running: its rounds would be in every arm (systemctl stop koordd first)"
    return None


def fs_type(path: Path) -> str:
    best, kind = "", "?"
    path = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        mnt = fields[1]
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, kind = mnt, fields[2]
    return kind


def read(cgroup: str, name: str) -> str:
    return (CGROUP / cgroup / name).read_text()


def psi_fields(text: str) -> dict[str, float]:
    """A memory.pressure file's some/full totals (µs) and some avg10 (percent); 0 for a missing line."""
    psi = parse_psi(text)
    return {"psi_some_total": psi.some.total_us if psi.some else 0,
            "psi_some_avg10": psi.some.avg10 if psi.some else 0.0,
            "psi_full_total": psi.full.total_us if psi.full else 0}


def snapshot(cgroup: str, koordd_pid: int | None) -> dict[str, Any]:
    return {"mono": time.monotonic(), "wall": time.time(),
            "current": int(read(cgroup, "memory.current")),
            "stat": parse_flat(read(cgroup, "memory.stat")),
            "usage_usec": parse_flat(read(cgroup, "cpu.stat")).get("usage_usec", 0),
            **psi_fields(read(cgroup, "memory.pressure")),
            "node": node_cpu_ticks(), "koordd": cpu_times(koordd_pid) if koordd_pid else (0.0, 0.0)}


def window_record(a: dict, b: dict) -> dict[str, Any]:
    """What changed between two snapshots (pure: tests feed it made-up snapshots)."""
    secs = b["mono"] - a["mono"]
    busy = (b["node"][0] - a["node"][0]) / max(1, b["node"][1] - a["node"][1]) * (os.cpu_count() or 1)
    return {
        "seconds": secs,
        "memory": {"start": a["current"], "end": b["current"]},
        "psi": {"some_percent": (b["psi_some_total"] - a["psi_some_total"]) / 1e4 / secs,
                "full_percent": (b["psi_full_total"] - a["psi_full_total"]) / 1e4 / secs,
                "some_avg10_end": b["psi_some_avg10"]},
        "stat_delta": counter_deltas(a["stat"], b["stat"]),
        "stat_end": {k: b["stat"][k] for k in SIZES if k in b["stat"]},
        "cpu": {"workload": (b["usage_usec"] - a["usage_usec"]) / 1e6 / secs,
                "koordd": (sum(b["koordd"]) - sum(a["koordd"])) / secs,
                "koordd_sys": (b["koordd"][1] - a["koordd"][1]) / secs,
                "node_busy": busy},
    }


# --- a run ----------------------------------------------------------------------------------------------

class Workload:
    """The workload as the transient unit `unit` in SLICE; stop() stops it and removes its files."""

    def __init__(self, unit: str, args, rundir: Path):
        self.unit, self.args = unit, args
        self.cgroup = f"{SLICE}/{unit}"
        self.data = args.data_dir / f"{unit}.data"
        self.log = rundir / f"{unit}.rates"

    def start(self) -> None:
        self.stop()
        a = self.args
        subprocess.run(["systemd-run", "--quiet", f"--unit={self.unit}", f"--slice={SLICE}", "-p", "MemoryAccounting=yes",
                        "-p", "CPUAccounting=yes", "/usr/bin/python3", "-c", WORKLOAD, str(self.data), str(self.log),
                        str(a.cache_mib), str(a.anon_mib), str(a.hot_cache_mib), str(a.hot_anon_mib)], check=True)

    def samples(self) -> tuple[float | None, list[tuple[float, float]]]:
        try:
            return parse_rate_log(self.log.read_text())
        except FileNotFoundError:
            return None, []

    def wait_ready(self, timeout: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.samples()[0] is not None:
                return time.monotonic() - t0
            if subprocess.run(["systemctl", "is-active", "--quiet", self.unit]).returncode != 0 \
                    and time.monotonic() - t0 > 5:
                raise RuntimeError(f"the workload {self.unit} stopped: "
                                   + subprocess.run(["journalctl", "-u", self.unit, "-n", "20", "--no-pager"],
                                                    capture_output=True, text=True).stdout)
            time.sleep(0.5)
        raise RuntimeError(f"the workload {self.unit} was not set up after {timeout:g}s")

    def stop(self) -> None:
        subprocess.run(["systemctl", "stop", self.unit], capture_output=True)
        subprocess.run(["systemctl", "reset-failed", self.unit], capture_output=True)
        self.data.unlink(missing_ok=True)
        self.log.unlink(missing_ok=True)


def run_one(args, rep: int, arm: str, section: dict, rundir: Path) -> dict[str, Any]:
    unit = f"{UNIT_PREFIX}-{rep}-{arm}.service"
    work = Workload(unit, args, rundir)
    koordd = None
    try:
        t_start = time.monotonic()
        work.start()
        setup = work.wait_ready(args.setup_timeout)
        time.sleep(args.warmup)
        koordd_ready = None
        if arm != "off":
            kdir = rundir / f"koordd-{rep}-{arm}"
            koordd = KoorddProcess(koordd_config(kdir / "state", section, dry_run=arm == "dry"), kdir,
                                   koordd_command())
            koordd.start()
            koordd_ready = koordd.wait_ready(timeout=args.koordd_timeout, ticks=2)
        pid = koordd.proc.pid if koordd else None
        a = snapshot(work.cgroup, pid)
        trajectory = [(0.0, a["current"])]
        while time.monotonic() - a["mono"] < args.seconds:
            time.sleep(min(1.0, args.seconds - (time.monotonic() - a["mono"])))
            trajectory.append((round(time.monotonic() - a["mono"], 2), int(read(work.cgroup, "memory.current"))))
            if koordd:
                koordd.check_running()
        b = snapshot(work.cgroup, pid)
        rates_at = rate_times(work.samples()[1], a["mono"], b["mono"])
        rates = [rate for _, rate in rates_at]
        if not rates:
            raise RuntimeError(f"the workload {unit} logged no rate in the window")
        record = {"rep": rep, "arm": arm, "unit": unit, "setup_s": round(setup, 1),
                  "koordd_ready_s": None if koordd_ready is None else round(koordd_ready, 1),
                  **window_record(a, b),
                  "throughput": {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
                                 "n": len(rates)},
                  "rates": rates, "rates_at": rates_at, "trajectory": trajectory,
                  "reclaim": reclaim_decisions(koordd.decisions(), work.cgroup, a["wall"], b["wall"]) if koordd else None,
                  "total_s": None}
        if koordd:
            rc = koordd.stop()
            record["koordd_exit"] = rc
            koordd = None
        record["total_s"] = round(time.monotonic() - t_start, 1)
        return record
    finally:
        if koordd:
            koordd.stop()
        work.stop()


def one_line(r: dict) -> str:
    t, m, rc = r["throughput"], r["memory"], r["reclaim"]
    return (f"[rep {r['rep']} {r['arm']:6}] passes/s {t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}); memory.current "
            f"{m['start'] // MiB} -> {m['end'] // MiB} MiB"
            + (f"; reclaimed {rc['applied_bytes'] // MiB} MiB in {rc['steps']} steps {rc['outcomes']}" if rc else "")
            + f"; refault file {r['stat_delta'].get('workingset_refault_file', 0) * PAGE // MiB} MiB"
            + f"; PSI some {r['psi']['some_percent']:.3f}%; koordd {r['cpu']['koordd']:.3f} CPUs"
            + f"; node busy {r['cpu']['node_busy']:.2f}; run {r['total_s']} s")


def about_host(args, section: dict) -> list[str]:
    def first(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return "(none)"
    swap = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("SwapTotal:")), "?")
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:")), "?")
    virt = subprocess.run(["systemd-detect-virt"], capture_output=True, text=True).stdout.strip() or "?"
    return [
        f"host: Linux {platform.release()}, {os.cpu_count()} CPUs, MemTotal {mem} kB, SwapTotal {swap} kB, "
        f"virtualisation {virt}, MGLRU (lru_gen/enabled) {first('/sys/kernel/mm/lru_gen/enabled')}; "
        f"Python {platform.python_version()}",
        f"workload: {args.cache_mib} MiB page cache (file on {fs_type(args.data_dir)}, fsync'ed) + {args.anon_mib} MiB "
        f"anon; hot: {args.hot_cache_mib} MiB of the file read and {args.hot_anon_mib} MiB of the anon touched per "
        f"pass; a fresh transient unit in {SLICE} per run",
        f"runs: {args.warmup:g} s warm-up after set-up (then koordd started and ticked twice), {args.seconds:g} s "
        f"measured, {args.reps} repetitions of {', '.join(args.arms)}, order rotated per repetition",
        "koordd's [loops.proactive_reclaim]: " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in section.items()),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser(__doc__)
    p.add_argument("--reps", type=int, default=3, help="repetitions of every arm (default 3)")
    p.add_argument("--arms", default="off,koordd", help="comma-separated, of off, koordd, dry (default off,koordd)")
    p.add_argument("--seconds", type=float, default=30.0, help="measured window of a run (default 30)")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds after the workload is set up (default 10)")
    p.add_argument("--cache-mib", type=int, default=256, help="the workload's file, MiB (default 256)")
    p.add_argument("--anon-mib", type=int, default=96, help="the workload's anon memory, MiB (default 96)")
    p.add_argument("--hot-cache-mib", type=int, default=16, help="of the file, read every pass (default 16)")
    p.add_argument("--hot-anon-mib", type=int, default=8, help="of the anon memory, touched every pass (default 8)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a [loops.proactive_reclaim] option over the shipped one (repeatable), e.g. psi_target=0.5")
    p.add_argument("--data-dir", type=Path, default=Path("/var/tmp"), help="where the workload's file goes (a disk)")
    p.add_argument("--setup-timeout", type=float, default=300.0, help="seconds the workload may take to set up")
    p.add_argument("--koordd-timeout", type=float, default=240.0, help="seconds koordd may take to tick twice")
    p.add_argument("--out", type=Path, help="directory for report.md and results.json (default ./bench-reclaim-<time>)")
    args = p.parse_args(argv)
    args.arms = [a for a in args.arms.split(",") if a]
    if not args.arms or set(args.arms) - set(ARMS) or len(set(args.arms)) != len(args.arms):
        p.error(f"--arms: distinct names of {', '.join(ARMS)}")
    if args.reps < 1 or args.seconds < 2 or args.warmup < 0:
        p.error("--reps at least 1, --seconds at least 2, --warmup not negative")
    if not 0 < args.hot_cache_mib <= args.cache_mib or not 0 < args.hot_anon_mib <= args.anon_mib:
        p.error("the hot parts must be positive and no larger than the file and the anon memory")
    try:
        args.options = parse_options(args.option)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = host_problem(args.data_dir)
    if problem:
        print(f"bench-reclaim: {problem}", file=sys.stderr)
        return 2
    section = loop_section(SHIPPED_CONFIG, args.options)
    # koordd's own loader checks the options before any run (a typo fails now, not after the first run)
    from koordd.core.config import parse_config
    from koordd.core.catalogue import load_registry
    parse_config(koordd_config(Path("/nonexistent"), section, False), "bench-reclaim.toml", load_registry())
    out = args.out or Path(f"bench-reclaim-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, interrupted)
    rundir = Path(tempfile.mkdtemp(prefix="bench-reclaim-", dir="/run"))
    command = command_line()
    about = about_host(args, section)
    runs: list[dict] = []
    ok = False
    try:
        for rep, arm in run_order(args.arms, args.reps):
            subprocess.run(["sync"])
            record = run_one(args, rep, arm, section, rundir)
            runs.append(record)
            print(one_line(record), file=sys.stderr, flush=True)
            (out / "results.json").write_text(json.dumps({"command": command, "about": about, "runs": runs}, indent=1))
        ok = True
    except KeyboardInterrupt:
        print("bench-reclaim: interrupted; cleaned up", file=sys.stderr)
    finally:
        subprocess.run(["systemctl", "stop", SLICE], capture_output=True)
        if ok:
            shutil.rmtree(rundir, ignore_errors=True)
        else:
            print(f"bench-reclaim: koordd's logs and state are kept in {rundir}", file=sys.stderr)
    if not runs:
        return 1
    notes = [n for n in (reclaim_seconds_note(runs),) if n]
    if not ok:
        notes.append(f"incomplete: {len(runs)} of {len(args.arms) * args.reps} runs")
    report = markdown(runs, args.arms, command, about, notes)
    (out / "report.md").write_text(report)
    summary = {arm: {k: spread_dict(v) for k, v in row.items()} for arm, row in summarise(runs, args.arms).items()}
    (out / "results.json").write_text(json.dumps({"command": command, "about": about, "summary": summary,
                                                  "verdict": verdict(runs).text if "koordd" in args.arms else None,
                                                  "runs": runs}, indent=1))
    print(report)
    print(f"written: {out / 'report.md'}, {out / 'results.json'}")
    return 0 if ok else 1
