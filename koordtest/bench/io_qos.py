"""What io_qos buys LS against a BE writer: LS random-read latency and BE write throughput under each setup.

    sudo .venv/bin/python scripts/bench-io [--setups ls-alone,none,static,koordd,iocost] [--reps 3]
                                         [--seconds 15] [--warmup 5] [--static-wbps 50M] [--out DIR]
    # in the project's VM (pure cgroup v2, TCG: slow, so short runs)
    KOORDD_VMTEST_EXTRA_PACKAGES="fio redis-server redis-tools memcached" scripts/vmtest --cmd \\
        'python3 scripts/bench-io --size 256M --seconds 8 --warmup 4 --reps 1 --ls-iops 100 --static-wbps 10% \\
         --koordd-wbps 100% --out /tmp/x; cat /tmp/x/report.md'

The disk is a loop device the script makes over a file in /var/tmp (--scratch-dir), or --device (its
contents are overwritten: needs --destroy-data). LS is fio reading 4 KiB blocks at random offsets of the
disk's first half with direct IO, --ls-jobs synchronous jobs at --ls-iops together (Poisson arrivals):
its completion latency (fio's clat) p50/p99/p99.9. BE is fio writing the second half sequentially in 1
MiB blocks, direct IO with --be-iodepth in flight (--be-buffered: through the page cache), as fast as it
is let: its MB/s over the same window. Each setup, in a random order per repetition (every setup once
per repetition, so drift on the host spreads over all of them):

    ls-alone  LS without BE: the latency baseline
    none      LS and BE, nothing limited
    static    BE write bandwidth capped at --static-wbps (v1: blkio.throttle.write_bps_device; v2: io.max)
    koordd    koordd in the foreground with only io_qos on, its LS and BE classes on our cgroups, dynamic:
              BE's wbps follows LS's io.pressure, ceiling --koordd-wbps (see --koordd-option)
    iocost    cgroup v2 with iocost only: iocost on the disk (--iocost-qos), io.weight LS 1000, BE
              --iocost-be-weight

BE and LS start together; both count from --warmup seconds later over --seconds (fio's ramp_time and
runtime), so BE's MB/s is its rate while LS was measured, and koordd has the warm-up to settle.

The cgroups are koordd-io-<pid>/{ls,be}: on hybrid hosts in the v1 blkio hierarchy (the throttle), the v1
cpu and cpuacct ones (where koordd finds its classes) and the unified tree (io.pressure); on cgroup v2
one tree with io passed down. Where the v2 root does not pass io to its children, the script makes it:
with systemd as PID 1 through a transient unit with IOAccounting=yes (systemd enables io down to it)
kept while the benchmark runs; otherwise by writing +io to the root's cgroup.subtree_control, taken
back at the end. Everything it made or changed (cgroups, their processes, the loop device and its file,
limits, iocost, koordd, io at the root) is removed or put back on exit, on errors and on Ctrl-C or SIGTERM;
after every run BE's and LS's io.max must read as before it. Needs root, fio and losetup.

Writes DIR/report.md (the command, the host, the table), DIR/results.json (every run's record) and
prints the report.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from koordd.core.blkio import parse_amount, parse_io_max
from koordtest.bench.common import cell, command_line, cpu_model, doc_parser, git_describe, interrupted, page, toml_value
from koordtest.bench.qos_stats import Spread, median_spread
from koordtest.koordd_proc import to_toml

LS_ALONE, NONE, STATIC, KOORDD, IOCOST = "ls-alone", "none", "static", "koordd", "iocost"
SETUPS = (LS_ALONE, NONE, STATIC, KOORDD, IOCOST)
PERCENTILES = {"p50": 50.0, "p99": 99.0, "p999": 99.9}
SAMPLE_EVERY = 0.25               # seconds between readings of LS io.pressure and BE's limit during a run
CGROUP = Path("/sys/fs/cgroup")


# --- fio: the two jobs and their JSON ----------------------------------------------------------------

@dataclass(frozen=True)
class Jobs:
    """What stays the same for the fio jobs of every run."""
    device: str
    size: int                   # bytes of the device used: LS reads the first half, BE writes the second
    ls_jobs: int
    ls_iops: int                # all LS jobs together
    be_iodepth: int
    be_buffered: bool
    warmup: float
    seconds: float

    @property
    def half(self) -> int:
        return self.size // 2 // (1 << 20) * (1 << 20)        # MiB-aligned: BE's 1 MiB blocks fit exactly


def fio_ls_args(jobs: Jobs, seed: int, output: Path) -> list[str]:
    """LS: random 4 KiB direct reads. psync, not libaio: a task waiting in pread() is in iowait, which
    is what io.pressure counts (and koordd follows); a task waiting in io_getevents() is not. Rate-limited
    with Poisson arrivals so LS offers the same load whatever BE does; --ls-jobs of them give a modest
    queue depth."""
    per_job = max(1, round(jobs.ls_iops / jobs.ls_jobs))
    return ["fio", "--name=ls", f"--filename={jobs.device}", "--rw=randread", "--bs=4k", "--direct=1",
            "--ioengine=psync", f"--numjobs={jobs.ls_jobs}", "--offset=0", f"--size={jobs.half}",
            f"--rate_iops={per_job}", "--rate_process=poisson", "--time_based", f"--ramp_time={jobs.warmup:g}",
            f"--runtime={jobs.seconds:g}", f"--randseed={seed}", "--norandommap", "--group_reporting",
            "--percentile_list=50:90:99:99.9", "--output-format=json", f"--output={output}"]


def fio_be_args(jobs: Jobs, output: Path) -> list[str]:
    """BE: sequential 1 MiB writes over the second half, looping, as fast as it is let. Direct IO by
    default: on cgroup v1 the throttle sees only direct IO (writeback is not charged to the writer)."""
    how = ["--direct=0", "--ioengine=psync"] if jobs.be_buffered else \
        ["--direct=1", "--ioengine=libaio", f"--iodepth={jobs.be_iodepth}"]
    return ["fio", "--name=be", f"--filename={jobs.device}", "--rw=write", "--bs=1M", *how,
            f"--offset={jobs.half}", f"--size={jobs.half}", "--time_based", f"--ramp_time={jobs.warmup:g}",
            f"--runtime={jobs.seconds:g}", "--group_reporting", "--output-format=json", f"--output={output}"]


def parse_fio(text: str, direction: str) -> dict[str, Any]:
    """One direction ("read" or "write") of a fio JSON report, all its jobs together: IOPS, bytes/s, the
    completion latency percentiles in seconds, and the IO count. fio may print a line or two before the
    JSON (warnings): skipped. With several jobs (no group_reporting) IOPS and bandwidth add up and each
    percentile is the worst job's (a bound, not the merged distribution)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON in fio's output: " + text[:200])
    data = json.loads(text[start:])
    jobs = data.get("jobs") or []
    if not jobs:
        raise ValueError("fio's JSON has no jobs")
    out: dict[str, Any] = {"iops": 0.0, "bytes_per_s": 0.0, "ios": 0, "errors": 0}
    pct: dict[str, float] = {}
    for job in jobs:
        d = job[direction]
        out["iops"] += d["iops"]
        out["bytes_per_s"] += d["bw_bytes"]
        out["ios"] += d.get("total_ios", 0)
        out["errors"] += job.get("error", 0)
        for key, value in ((d.get("clat_ns") or {}).get("percentile") or {}).items():
            for name, p in PERCENTILES.items():
                if abs(float(key) - p) < 1e-6:
                    pct[name] = max(pct.get(name, 0.0), value / 1e9)
    out.update({name: pct.get(name) for name in PERCENTILES})
    return out


# --- the kernel's files, as text ------------------------------------------------------------------------

def psi_some_total(text: str) -> int:
    """µs of "some" stall from a *.pressure file."""
    for line in text.splitlines():
        if line.startswith("some "):
            for item in line.split()[1:]:
                key, _, value = item.partition("=")
                if key == "total":
                    return int(value)
    raise ValueError(f"no \"some ... total=\" line in {text[:80]!r}")


def wbps_of(io_max: str, disk: str) -> int | None:
    """BE's write bandwidth limit on `disk` from io.max text (koordd's canonical v2 form); None = none."""
    return parse_io_max(io_max).get(disk, {}).get("wbps") if io_max.strip() else None


def pressure_percent(samples: Sequence[tuple[float, int | None, int | None]], start: float, end: float) -> float | None:
    """LS io.pressure "some" over [start, end], percent of the time: from the first sample at or after
    `start` to the last at or before `end` (samples: (time, some total µs, wbps))."""
    inside = [(t, total) for t, total, _ in samples if start <= t <= end and total is not None]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    (t0, a), (t1, b) = inside[0], inside[-1]
    return 100.0 * (b - a) / 1e6 / (t1 - t0)


def limit_stats(samples: Sequence[tuple[float, int | None, int | None]], start: float, end: float) -> dict | None:
    """BE's wbps limit over [start, end], each sample holding until the next: its time-weighted mean,
    min and max (bytes/s), and the share of the time it had none. None without samples in the window."""
    inside = [(t, w) for t, _, w in samples if start <= t <= end]
    if not inside:
        return None
    spans = [(w, (inside[i + 1][0] if i + 1 < len(inside) else end) - t) for i, (t, w) in enumerate(inside)]
    total = sum(d for _, d in spans) or 1.0
    limited = [(w, d) for w, d in spans if w is not None]
    unlimited = 1.0 - sum(d for _, d in limited) / total
    if not limited:
        return {"mean": None, "min": None, "max": None, "unlimited_share": 1.0}
    weight = sum(d for _, d in limited)
    mean = sum(w * d for w, d in limited) / weight if weight > 0 else statistics.mean(w for w, _ in limited)
    return {"mean": mean, "min": min(w for w, _ in limited), "max": max(w for w, _ in limited),
            "unlimited_share": round(unlimited, 4)}


# --- koordd's config ------------------------------------------------------------------------------------

def koordd_config(ls: str, be: str, state_dir: Path, disk: str, ceiling: int, options: dict[str, Any]) -> str:
    """A config with the LS and BE classes on our cgroups and only io_qos on (every other loop is off by
    default when its section is absent), in dynamic mode: BE's wbps from `ceiling` down to its floor,
    following LS's io.pressure, with the loop's own defaults (interval, target, steps) as an operator
    gets them. No SLO is declared, so follow_slo is off. `options` override io_qos's (--koordd-option)."""
    io_qos: dict[str, Any] = {"enabled": True, "devices": [disk], "be_io_max": f"wbps={ceiling}",
                              "dynamic": True, "follow_slo": False}
    io_qos.update(options)
    data = {"daemon": {"cgroup_root": "", "state_dir": str(state_dir), "log_level": "info"},
            "classes": [{"name": "LS", "cgroups": [ls]}, {"name": "BE", "cgroups": [be]}],
            "loops": {"io_qos": io_qos}}
    return to_toml(data)


def parse_option(text: str) -> tuple[str, Any]:
    """--koordd-option KEY=VALUE: VALUE as TOML reads it (10, 2.5, true, "1s"); a bare word is a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{text!r}: expected KEY=VALUE, e.g. io_pressure_target=20")
    return key.strip(), toml_value(value.strip())


def parse_rate(text: str) -> tuple[int | None, float | None]:
    """--static-wbps / --koordd-wbps: bytes/s ("50M": (52428800, None)) or a share of BE alone's write rate,
    measured at the start ("10%": (None, 0.1)); ValueError for "max", 0 or a bad number."""
    t = text.strip()
    if t.endswith("%"):
        share = float(t[:-1]) / 100
        if not 0 < share <= 10:
            raise ValueError(f"{text!r}: a share of BE alone's rate between 0% and 1000%")
        return None, share
    value = parse_amount(t, "wbps")
    if not value:
        raise ValueError(f"{text!r}: a number of bytes/s (K/M/G suffixes) or a percentage, not max")
    return value, None


def resolve_rate(rate: tuple[int | None, float | None], measured: float | None) -> int:
    value, share = rate
    if value is not None:
        return value
    if not measured:
        raise ValueError("a share of BE alone's rate, with no rate measured")
    return max(1, round(share * measured))


# --- statistics and the report --------------------------------------------------------------------------

def run_order(setups: Sequence[str], reps: int, seed: int) -> list[tuple[int, str]]:
    """(rep, setup): every setup once per repetition, in a shuffled order of its own per repetition."""
    rng = random.Random(seed)
    order = []
    for rep in range(reps):
        batch = list(setups)
        rng.shuffle(batch)
        order += [(rep, s) for s in batch]
    return order


@dataclass(frozen=True)
class Row:
    setup: str
    reps: int
    ls_ms: dict[str, Spread | None]          # p50/p99/p999 in ms
    p99_ratio: Spread | None                 # LS p99 / ls-alone's median p99
    ls_iops: Spread | None
    be_mbps: Spread | None                   # MB/s (10^6 bytes)
    be_share: Spread | None                  # BE MB/s / none's median
    ls_pressure: Spread | None               # percent
    be_limit_mbps: Spread | None             # the time-weighted mean limit, MB/s
    extra: dict = field(default_factory=dict)


def summarise(runs: Sequence[dict], setups: Sequence[str]) -> list[Row]:
    """One row per setup in `setups` order (those with runs): medians and ranges over repetitions."""
    def median_of(setup: str, get) -> float | None:
        s = median_spread(get(r) for r in runs if r["setup"] == setup)
        return s.median if s else None

    base_p99 = median_of(LS_ALONE, lambda r: r["ls"]["p99"])
    base_be = median_of(NONE, lambda r: r["be"]["bytes_per_s"] if r.get("be") else None)
    rows = []
    for setup in setups:
        mine = [r for r in runs if r["setup"] == setup]
        if not mine:
            continue
        ms = {name: median_spread(None if r["ls"][name] is None else r["ls"][name] * 1e3 for r in mine)
              for name in PERCENTILES}
        be = [r["be"]["bytes_per_s"] for r in mine if r.get("be")]
        limits = [(r.get("be_limit") or {}).get("mean") for r in mine]
        rows.append(Row(
            setup=setup, reps=len(mine), ls_ms=ms,
            p99_ratio=median_spread(r["ls"]["p99"] / base_p99 if base_p99 and r["ls"]["p99"] else None
                                    for r in mine),
            ls_iops=median_spread(r["ls"]["iops"] for r in mine),
            be_mbps=median_spread(b / 1e6 for b in be),
            be_share=median_spread(b / base_be for b in be) if base_be else None,
            ls_pressure=median_spread(r.get("ls_io_pressure") for r in mine),
            be_limit_mbps=median_spread(None if v is None else v / 1e6 for v in limits)))
    return rows


COLUMNS = ("setup", "LS p50 (ms)", "LS p99 (ms)", "LS p99.9 (ms)", "p99 / ls-alone", "LS IOPS", "BE MB/s",
           "BE / none", "LS io.pressure some %", "BE wbps limit (MB/s)")


def table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join([
            r.setup, cell(r.ls_ms["p50"], 3), cell(r.ls_ms["p99"]), cell(r.ls_ms["p999"]), cell(r.p99_ratio, 2, "x"),
            cell(r.ls_iops, 0), cell(r.be_mbps, 0), cell(r.be_share, 2, "x"), cell(r.ls_pressure, 1),
            cell(r.be_limit_mbps, 0)]) + " |")
    return "\n".join(lines)


def markdown(rows: Sequence[Row], command: str, about: Sequence[str], notes: Sequence[str] = ()) -> str:
    reps = max((r.reps for r in rows), default=0)
    return page("koordd IO QoS benchmark (io_qos)", command, about, [
        table(rows), "",
        f"Each cell: median (min-max) over the repetitions (up to {reps}). LS latencies are fio's completion "
        f"latency (clat) of its 4 KiB reads. p99 / ls-alone: each run's p99 over {LS_ALONE}'s median p99. "
        f"BE / none: BE's MB/s over {NONE}'s median (BE unlimited). LS io.pressure: the share of the "
        "measured window some LS task waited for IO (what koordd's dynamic mode follows). BE wbps limit: "
        "the limit BE had on the disk, averaged over the window (sampled every "
        f"{SAMPLE_EVERY:g} s); - where it had none."], notes)


# --- the host: prerequisites, the disk, io at the v2 root ---------------------------------------------

class Refusal(Exception):
    """The benchmark cannot run here: one line for the operator."""


@dataclass(frozen=True)
class Host:
    mode: str                   # "hybrid" (v1 blkio throttle) or "v2"
    controllers: tuple[str, ...]
    iocost: bool


def check_host(setups: Sequence[str], cgroup: Path = CGROUP) -> Host:
    if os.geteuid() != 0:
        raise Refusal("needs root: it makes a loop device and cgroups and writes their IO limits")
    for tool, package in (("fio", "fio"), ("losetup", "util-linux")):
        if shutil.which(tool) is None:
            raise Refusal(f"no {tool} on PATH (apt-get install {package})")
    if (cgroup / "cgroup.controllers").is_file():
        if "io" not in (cgroup / "cgroup.controllers").read_text().split():
            raise Refusal(f"cgroup v2 without the io controller ({cgroup}/cgroup.controllers)")
        iocost = (cgroup / "io.cost.qos").is_file()
        if IOCOST in setups and not iocost:
            raise Refusal(f"setup {IOCOST}: no {cgroup}/io.cost.qos (kernel without CONFIG_BLK_CGROUP_IOCOST)")
        return Host("v2", ("cpu", "io"), iocost)
    if not (cgroup / "blkio" / "blkio.throttle.write_bps_device").is_file():
        raise Refusal(f"cgroup v1 without the blkio throttle ({cgroup}/blkio/blkio.throttle.write_bps_device; "
                      "CONFIG_BLK_DEV_THROTTLING)")
    if not (cgroup / "unified" / "cgroup.procs").is_file():
        raise Refusal(f"a v1 host without the unified tree ({cgroup}/unified): no io.pressure for LS")
    if IOCOST in setups:
        raise Refusal(f"setup {IOCOST} needs cgroup v2 (iocost's io.cost.qos lives in the v2 root); this host "
                      "is hybrid")
    return Host("hybrid", ("cpu", "cpuacct", "blkio"), False)


def disk_of(device: str) -> tuple[str, str]:
    """(MAJ:MIN of the whole disk, its name) for a block device path; a partition gives its disk (the
    kernel limits and iocost-controls disks)."""
    st = os.stat(device)
    if not stat.S_ISBLK(st.st_mode):
        raise Refusal(f"{device} is not a block device")
    sysfs = Path(f"/sys/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}").resolve()
    if (sysfs / "partition").is_file():
        sysfs = sysfs.parent
    return (sysfs / "dev").read_text().strip(), sysfs.name


def mounted_from(name: str) -> list[str]:
    """Mount points of a disk or any of its partitions (/proc/self/mountinfo's sources), and its holders."""
    names = {name} | {p.name for p in Path(f"/sys/block/{name}").glob(f"{name}*")}
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        source = right.split()[1] if len(right.split()) > 1 else ""
        if source.startswith("/dev/") and Path(source).name in names:
            out.append(left.split()[4])
    holders = Path(f"/sys/block/{name}/holders")
    if holders.is_dir():
        out += [f"held by {h.name}" for h in holders.iterdir()]
    return out


class ScratchDisk:
    """A loop device over a file in `directory`, written in full first, attached with direct IO.

    Why a loop device with --direct-io=on over a file that is really written: its reads and writes go
    through to the disk under the filesystem (no page cache between), so a writer's queue on that disk
    is what LS's reads wait behind, as on a real disk; a file left sparse or only fallocate()d reads
    back zeros without any IO. Raw (no filesystem on it): LS's and BE's IO reach the device as fio
    issues them, without a journal or allocator of the benchmark's own in between. The throttle and
    iocost act on the loop device's own queue, which the script owns, so no real disk's limits are
    touched."""

    def __init__(self, directory: Path, size: int):
        self.directory, self.size = directory, size
        self.file: Path | None = None
        self.device: str | None = None

    def __enter__(self) -> "ScratchDisk":
        fstype = subprocess.run(["stat", "-f", "-c", "%T", str(self.directory)], capture_output=True,
                                text=True).stdout.strip()
        if fstype in ("tmpfs", "ramfs"):
            raise Refusal(f"{self.directory} is {fstype}: a loop device over RAM has no disk queue a writer could "
                          "fill; name a directory on a disk (--scratch-dir) or a --device")
        free = shutil.disk_usage(self.directory).free
        if free < self.size + (256 << 20):
            raise Refusal(f"{self.directory} has {free >> 20} MiB free; the scratch disk needs {self.size >> 20} "
                          "MiB and 256 MiB to spare (--size)")
        fd, name = tempfile.mkstemp(prefix="koordd-bench-io-", suffix=".img", dir=self.directory)
        os.close(fd)
        self.file = Path(name)
        try:
            subprocess.run(["dd", "if=/dev/zero", f"of={self.file}", "bs=1M", f"count={self.size >> 20}",
                            "oflag=direct", "status=none"], check=True)
            self.device = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", str(self.file)],
                                         check=True, capture_output=True, text=True).stdout.strip()
        except BaseException:
            self.__exit__()
            raise
        return self

    def direct_io(self) -> bool:
        try:
            return Path(f"/sys/block/{Path(self.device).name}/loop/dio").read_text().strip() == "1"
        except (OSError, TypeError):
            return False

    def __exit__(self, *exc) -> None:
        if self.device:
            subprocess.run(["losetup", "-d", self.device], check=False)
            self.device = None
        if self.file:
            self.file.unlink(missing_ok=True)
            self.file = None


class IoAtRoot:
    """On cgroup v2, the io controller passed to the root's children while the benchmark runs (nothing
    to do where it is already, or on hybrid hosts). With systemd as PID 1 the root is systemd's to
    change: a transient unit with IOAccounting=yes makes systemd enable io down to it, and stopping it
    lets systemd take io back. Without systemd: +io written, -io written back."""

    def __init__(self, host: Host, cgroup: Path = CGROUP):
        self.host, self.cgroup = host, cgroup
        self.unit: str | None = None
        self.wrote = False
        self.how = "already on"

    def enabled(self) -> bool:
        return "io" in (self.cgroup / "cgroup.subtree_control").read_text().split()

    def __enter__(self) -> "IoAtRoot":
        if self.host.mode != "v2" or self.enabled():
            return self
        if Path("/run/systemd/system").is_dir() and shutil.which("systemd-run"):
            self.unit = f"koordd-bench-io-{os.getpid()}"
            subprocess.run(["systemd-run", f"--unit={self.unit}", "--collect", "--quiet",
                            "--property=IOAccounting=yes", "sleep", "infinity"], check=True)
            deadline = time.monotonic() + 30
            while not self.enabled():
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise Refusal(f"systemd did not enable io in {self.cgroup}/cgroup.subtree_control for "
                                  f"{self.unit} (IOAccounting=yes) within 30 s")
                time.sleep(0.2)
            self.how = f"enabled by systemd for a transient unit {self.unit}.service (IOAccounting=yes)"
        else:
            (self.cgroup / "cgroup.subtree_control").write_text("+io")
            self.wrote = True
            self.how = f"+io written to {self.cgroup}/cgroup.subtree_control (taken back at the end)"
        return self

    def __exit__(self, *exc) -> None:
        if self.unit:
            subprocess.run(["systemctl", "stop", f"{self.unit}.service"], check=False, stderr=subprocess.DEVNULL)
            self.unit = None
        if self.wrote:
            try:
                (self.cgroup / "cgroup.subtree_control").write_text("-io")
            except OSError as e:
                print(f"bench-io: could not take io back from {self.cgroup}/cgroup.subtree_control: {e}",
                      file=sys.stderr)
            self.wrote = False


class Iocost:
    """iocost on one disk (the root's io.cost.qos line) while a run lasts; the line as it was afterwards.
    A line read back with ctrl=auto is restored as "enable=N ctrl=auto": naming its parameters would
    switch it to ctrl=user."""

    def __init__(self, disk: str, qos: str, cgroup: Path = CGROUP):
        self.file = cgroup / "io.cost.qos"
        self.disk, self.qos = disk, qos
        self.original: str | None = None

    def line(self) -> str | None:
        for line in self.file.read_text().splitlines():
            if line.split()[:1] == [self.disk]:
                return line.strip()
        return None

    def __enter__(self) -> "Iocost":
        self.original = self.line()
        self.file.write_text(f"{self.disk} {self.qos}")
        return self

    def __exit__(self, *exc) -> None:
        self.file.write_text(restore_iocost_line(self.disk, self.original))


def restore_iocost_line(disk: str, original: str | None) -> str:
    """What to write to io.cost.qos to put `original` (the disk's line before; None: none) back."""
    if original is None:
        return f"{disk} enable=0"
    fields = dict(item.partition("=")[::2] for item in original.split()[1:])
    if fields.get("ctrl", "auto") == "auto":
        return f"{disk} enable={fields.get('enable', '0')} ctrl=auto"
    return original


# --- one run ------------------------------------------------------------------------------------------

@dataclass
class Bench:
    tree: Any                   # koordtest.bench.cgroup_tree.CgroupTree
    fs: Any                     # koordd.kernel.cgroupfs.CgroupFS
    host: Host
    jobs: Jobs
    disk: str                   # MAJ:MIN
    static_wbps: int
    koordd_wbps: int
    koordd_options: dict[str, Any]
    koordd_command: list[str]
    iocost_qos: str
    iocost_be_weight: int
    workdir: Path

    def io_max(self, child: str) -> str:
        from koordd.backends.cgroup_knobs import KNOBS
        return KNOBS["io.max"].read(self.fs, self.tree.path(child))

    def ls_pressure_total(self) -> int | None:
        unified = CGROUP if self.host.mode == "v2" else CGROUP / "unified"
        try:
            return psi_some_total((unified / self.tree.path("ls") / "io.pressure").read_text())
        except (OSError, ValueError):
            return None


class Sampler(threading.Thread):
    """Every SAMPLE_EVERY s: (monotonic time, LS io.pressure some total, BE's wbps on the disk)."""

    def __init__(self, bench: Bench):
        super().__init__(daemon=True)
        self.bench, self.samples = bench, []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                wbps = wbps_of(self.bench.io_max("be"), self.bench.disk)
            except (OSError, ValueError):
                wbps = None
            self.samples.append((time.monotonic(), self.bench.ls_pressure_total(), wbps))
            self.stop_event.wait(SAMPLE_EVERY)

    def stop(self) -> list:
        self.stop_event.set()
        self.join(timeout=5)
        return self.samples


@contextlib.contextmanager
def be_limit(bench: Bench, value: str):
    """BE's io.max on our disk set to `value` through koordd's knob table (v1: blkio.throttle.*), and that
    disk's line put back afterwards; it must then read as before."""
    from koordd.backends.cgroup_knobs import KNOBS, validate
    from koordd.core import blkio
    knob, be = KNOBS["io.max"], bench.tree.path("be")
    before = knob.read(bench.fs, be)
    wanted = f"{bench.disk} {value}"
    knob.write(bench.fs, be, validate(bench.fs, be, "io.max", wanted))
    try:
        yield
    finally:
        knob.write(bench.fs, be, blkio.scope(before, knob.normalize(wanted)))
        if knob.read(bench.fs, be) != before:
            raise RuntimeError(f"BE io.max not restored: {knob.read(bench.fs, be)!r}, was {before!r}")


@contextlib.contextmanager
def iocost_on(bench: Bench):
    from koordd.backends.cgroup_knobs import KNOBS
    knob = KNOBS["io.weight"]
    ls, be = bench.tree.path("ls"), bench.tree.path("be")
    with Iocost(bench.disk, bench.iocost_qos):
        # Our own cgroups: their weights go with them when they are removed; put back all the same.
        before = {cg: knob.read(bench.fs, cg) for cg in (ls, be)}
        knob.write(bench.fs, ls, "default 1000")
        knob.write(bench.fs, be, f"default {bench.iocost_be_weight}")
        try:
            yield
        finally:
            for cg, value in before.items():
                knob.write(bench.fs, cg, value)


@contextlib.contextmanager
def koordd_running(bench: Bench, workdir: Path, record: dict):
    from koordtest.koordd_proc import KoorddProcess
    config = koordd_config(bench.tree.path("ls"), bench.tree.path("be"), workdir / "state", bench.disk,
                           bench.koordd_wbps, bench.koordd_options)
    proc = KoorddProcess(config, workdir, bench.koordd_command)
    proc.start()
    try:
        record["koordd_ready_s"] = round(proc.wait_ready(timeout=300), 1)
        yield proc
        proc.check_running()
    finally:
        code = proc.stop()
        decisions = [d for d in proc.decisions() if d.get("loop") == "io_qos"]
        record["koordd"] = summarise_decisions(decisions)
        record["koordd"]["exit"] = code
        if code != 0:
            raise RuntimeError(f"koordd exited {code}:\n{proc.log_tail()}")


def summarise_decisions(decisions: Sequence[dict]) -> dict:
    """What koordd's io_qos did in a run: its decisions by outcome, the steps it took (cut, raise, hold,
    at ceiling) and the LS io.pressure it saw (min, median, max)."""
    outcomes: dict[str, int] = {}
    steps: dict[str, int] = {}
    seen = []
    for d in decisions:
        outcomes[d.get("outcome", "?")] = outcomes.get(d.get("outcome", "?"), 0) + 1
        reason = d.get("reason") or {}
        if "step" in reason:
            steps[reason["step"]] = steps.get(reason["step"], 0) + 1
        if reason.get("ls_io_pressure") is not None:
            seen.append(reason["ls_io_pressure"])
    out: dict[str, Any] = {"decisions": outcomes, "steps": steps}
    if seen:
        out["ls_io_pressure_seen"] = [min(seen), statistics.median(seen), max(seen)]
    return out


def calibrate(bench: Bench, workdir: Path) -> float:
    """BE alone's write rate, bytes/s: its fio job for a few seconds, nothing limited and no LS."""
    workdir.mkdir(parents=True)
    short = replace(bench.jobs, warmup=min(2.0, bench.jobs.warmup), seconds=min(5.0, bench.jobs.seconds))
    with open(workdir / "be.err", "w") as err:
        p = bench.tree.spawn("be", fio_be_args(short, workdir / "be.json"), stdout=subprocess.DEVNULL, stderr=err)
        code = p.wait(timeout=short.warmup + short.seconds + 120)
    if code != 0:
        raise RuntimeError(f"calibration: fio exited {code}: {(workdir / 'be.err').read_text()[-2000:]}")
    return parse_fio((workdir / "be.json").read_text(), "write")["bytes_per_s"]


def run_one(bench: Bench, setup: str, seed: int, workdir: Path) -> dict:
    workdir.mkdir(parents=True)
    record: dict[str, Any] = {"setup": setup}
    before = {c: bench.io_max(c) for c in ("ls", "be")}
    with contextlib.ExitStack() as stack:
        if setup == STATIC:
            stack.enter_context(be_limit(bench, f"wbps={bench.static_wbps}"))
        elif setup == IOCOST:
            stack.enter_context(iocost_on(bench))
        elif setup == KOORDD:
            stack.enter_context(koordd_running(bench, workdir / "koordd", record))
        sampler = Sampler(bench)
        sampler.start()
        t0 = time.monotonic()
        procs = []
        if setup != LS_ALONE:
            procs.append(("be", bench.tree.spawn("be", fio_be_args(bench.jobs, workdir / "be.json"),
                                                 stdout=subprocess.DEVNULL, stderr=open(workdir / "be.err", "w"))))
        procs.append(("ls", bench.tree.spawn("ls", fio_ls_args(bench.jobs, seed, workdir / "ls.json"),
                                             stdout=subprocess.DEVNULL, stderr=open(workdir / "ls.err", "w"))))
        limit = bench.jobs.warmup + bench.jobs.seconds + 120
        for name, p in procs:
            code = p.wait(timeout=max(1.0, limit - (time.monotonic() - t0)))
            if code != 0:
                raise RuntimeError(f"{setup}: fio {name} exited {code}: "
                                   f"{(workdir / f'{name}.err').read_text()[-2000:]}")
        end = time.monotonic()
        samples = sampler.stop()
        # fio counts from warmup after its start; it stops at warmup + seconds (give or take its start-up)
        window = (t0 + bench.jobs.warmup, min(end, t0 + bench.jobs.warmup + bench.jobs.seconds + 1))
        record["ls"] = parse_fio((workdir / "ls.json").read_text(), "read")
        if setup != LS_ALONE:
            record["be"] = parse_fio((workdir / "be.json").read_text(), "write")
        record["ls_io_pressure"] = pressure_percent(samples, *window)
        record["be_limit"] = limit_stats(samples, *window)
    after = {c: bench.io_max(c) for c in ("ls", "be")}
    if after != before:
        raise RuntimeError(f"{setup}: io.max not as before the run: {after} (was {before})")
    return record


# --- the whole benchmark ------------------------------------------------------------------------------

def koordd_command_for(given: str | None) -> list[str]:
    """koordd to run: --koordd, else this Python's koordd (a venv's), else the one on PATH, else
    scripts/install's (/opt/koordd/bin/koordd), else this Python running the koordd it imports (the
    checkout's, where PYTHONPATH names it: koordd inherits it)."""
    from koordtest.koordd_proc import koordd_command
    if given:
        return koordd_command(given)
    sibling = Path(sys.executable).parent / "koordd"
    for candidate in (sibling, shutil.which("koordd"), "/opt/koordd/bin/koordd"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return koordd_command(str(candidate))
    return [sys.executable, "-m", "koordd.runtime.daemon"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = doc_parser(__doc__)
    p.add_argument("--setups", default=None,
                   help=f"comma-separated, from {', '.join(SETUPS)} (default: all this host can run)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every setup (default 3)")
    p.add_argument("--seconds", type=float, default=15.0, help="measured window of a run (default 15)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds before it (fio's ramp_time; default 5)")
    p.add_argument("--device", help="a block device to use instead of a scratch loop device: LS reads its "
                                    "first half, BE OVERWRITES its second (needs --destroy-data)")
    p.add_argument("--destroy-data", action="store_true", help="allow --device to be written")
    p.add_argument("--scratch-dir", type=Path, default=Path("/var/tmp"),
                   help="where the scratch disk's file goes (default /var/tmp; not tmpfs)")
    p.add_argument("--size", default="1G", help="bytes of the disk used, K/M/G suffixes (default 1G)")
    p.add_argument("--ls-iops", type=int, default=400, help="LS reads per second, all jobs together (default 400)")
    p.add_argument("--ls-jobs", type=int, default=2, help="LS's synchronous fio jobs (default 2)")
    p.add_argument("--be-iodepth", type=int, default=16, help="BE's writes in flight (default 16)")
    p.add_argument("--be-buffered", action="store_true",
                   help="BE writes through the page cache (v1 cannot throttle those: writeback is not charged)")
    p.add_argument("--static-wbps", default="50M",
                   help="setup static: BE's write limit, bytes/s or a percentage of BE alone's rate, which is then "
                        "measured first (\"10%%\"; default 50M)")
    p.add_argument("--koordd-wbps", default="1G", help="setup koordd: be_io_max's wbps, the ceiling dynamic mode "
                                                       "moves under, as --static-wbps (default 1G)")
    p.add_argument("--koordd-option", action="append", default=[], metavar="KEY=VALUE",
                   help="setup koordd: an io_qos option, e.g. io_pressure_target=20 or floor_percent=2 "
                        "(repeatable; defaults: interval 500ms, target 10, cut 50, step 10, floor 5)")
    p.add_argument("--koordd", help="the koordd executable (default: this venv's, PATH's or /opt/koordd's)")
    p.add_argument("--iocost-qos", default="enable=1 ctrl=auto", help="setup iocost: the disk's io.cost.qos "
                                                                     "(default \"enable=1 ctrl=auto\")")
    p.add_argument("--iocost-be-weight", type=int, default=10, help="setup iocost: BE io.weight (LS: 1000; "
                                                                    "default 10)")
    p.add_argument("--seed", type=int, default=1, help="run order and LS's offsets (default 1)")
    p.add_argument("--out", help="directory for report.md and results.json (default ./bench-io-<time>)")
    args = p.parse_args(argv)
    try:
        args.size = parse_amount(args.size, "rbps")
        args.static_rate = parse_rate(args.static_wbps)
        args.koordd_rate = parse_rate(args.koordd_wbps)
        args.koordd_options = dict(parse_option(o) for o in args.koordd_option)
    except ValueError as e:
        p.error(str(e))
    if not args.size or args.size < (64 << 20):
        p.error("--size: at least 64M")
    if args.reps < 1 or args.seconds <= 0 or args.warmup < 0 or args.ls_iops < 1 or args.ls_jobs < 1:
        p.error("--reps, --seconds, --ls-iops and --ls-jobs must be positive")
    if args.warmup > args.seconds:
        # fio 3.33 with a rate limit and ramp_time over runtime reports no latency percentiles (or no IO)
        p.error("--warmup longer than --seconds: fio then reports no latency percentiles; measure longer")
    if args.device and not args.destroy_data:
        p.error(f"--device {args.device}: BE overwrites the device's second half; add --destroy-data if that "
                "is meant")
    if args.setups is not None:
        args.setups = [s for s in args.setups.split(",") if s]
        unknown = [s for s in args.setups if s not in SETUPS]
        if unknown:
            p.error(f"unknown setups {unknown}; known: {', '.join(SETUPS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        host = check_host(args.setups or ())
    except Refusal as e:
        print(f"bench-io: {e}", file=sys.stderr)
        return 2
    if args.setups is None:
        args.setups = [s for s in SETUPS if s != IOCOST or host.iocost]
    out = Path(args.out or f"bench-io-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, interrupted)
    workdir = Path(tempfile.mkdtemp(prefix="bench-io-"))
    keep = False
    try:
        run_benchmark(args, host, workdir, out)
    except Refusal as e:
        print(f"bench-io: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench-io: interrupted; cleaned up", file=sys.stderr)
        return 130
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"bench-io: the runs' logs are kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def run_benchmark(args, host: Host, workdir: Path, out: Path) -> None:
    from koordd.kernel.cgroupfs import CgroupFS, detect_layout
    from koordtest.bench.cgroup_tree import CgroupTree
    with contextlib.ExitStack() as stack:
        if args.device:
            disk, name = disk_of(args.device)
            busy = mounted_from(name)
            if busy:
                raise Refusal(f"{args.device}: in use ({', '.join(busy)}); it would be overwritten")
            device, how = args.device, f"{args.device} (named by --device)"
            size = min(args.size, int(Path(f"/sys/block/{name}/size").read_text()) * 512)
        else:
            scratch = stack.enter_context(ScratchDisk(args.scratch_dir, args.size))
            device, size = scratch.device, args.size
            disk, _ = disk_of(device)
            how = (f"{device}, a loop device over a {size >> 20} MiB file in {args.scratch_dir} "
                   f"({'direct IO' if scratch.direct_io() else 'NOT direct IO: through the page cache'}, raw)")
        io_root = stack.enter_context(IoAtRoot(host))
        layout = detect_layout()
        tree = stack.enter_context(CgroupTree(f"koordd-io-{os.getpid()}", host.controllers))
        try:
            tree.create(["ls", "be"])
        except FileExistsError as e:
            raise Refusal(f"{e.filename} exists already (left by a killed run? remove it)") from None
        bench = Bench(tree=tree, fs=CgroupFS(layout), host=host,
                      jobs=Jobs(device, size, args.ls_jobs, args.ls_iops, args.be_iodepth, args.be_buffered,
                                args.warmup, args.seconds),
                      disk=disk, static_wbps=0, koordd_wbps=0,
                      koordd_options=args.koordd_options, koordd_command=koordd_command_for(args.koordd),
                      iocost_qos=args.iocost_qos, iocost_be_weight=args.iocost_be_weight, workdir=workdir)
        be_alone = None
        if (STATIC in args.setups and args.static_rate[1]) or (KOORDD in args.setups and args.koordd_rate[1]):
            be_alone = calibrate(bench, workdir / "calibration")
            print(f"[calibration] BE alone writes {be_alone / 1e6:.1f} MB/s", file=sys.stderr, flush=True)
        bench.static_wbps = resolve_rate(args.static_rate, be_alone)
        bench.koordd_wbps = resolve_rate(args.koordd_rate, be_alone)
        if KOORDD in args.setups:   # a config koordd would refuse fails here, not after the other runs
            check_koordd_config(bench)
        runs = []
        order = run_order(args.setups, args.reps, args.seed)
        for i, (rep, setup) in enumerate(order):
            # The same LS offsets for every setup of one repetition: differences are the setup's.
            record = run_one(bench, setup, args.seed * 1000 + rep, workdir / f"run{i}")
            record["rep"] = rep
            runs.append(record)
            (out / "results.json").write_text(json.dumps(
                {"args": jsonable(vars(args)), "be_alone_bytes_per_s": be_alone, "static_wbps": bench.static_wbps,
                 "koordd_wbps": bench.koordd_wbps, "runs": runs}, indent=1))
            print(progress_line(i, len(order), record), file=sys.stderr, flush=True)
        write_report(args, host, bench, how, io_root.how, be_alone, runs, out)


def check_koordd_config(bench: Bench) -> None:
    try:
        from koordd.core.config import ConfigError, parse_config
        from koordd.runtime.docs import shipped_loops
    except ImportError:
        return
    text = koordd_config(bench.tree.path("ls"), bench.tree.path("be"), bench.workdir / "state", bench.disk,
                         bench.koordd_wbps, bench.koordd_options)
    try:
        parse_config(text, "bench-io.toml", shipped_loops())
    except ConfigError as e:
        raise Refusal(f"koordd refuses the koordd setup's config: {e}") from None


def jsonable(d: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def progress_line(i: int, n: int, r: dict) -> str:
    ls, be = r["ls"], r.get("be")
    def ms(key: str, width: int, digits: int) -> str:     # fio leaves percentiles out now and then
        return f"{ls[key] * 1e3:{width}.{digits}f}" if ls.get(key) is not None else f"{'-':>{width}}"
    s = (f"[{i + 1}/{n}] rep {r['rep'] + 1} {r['setup']:9} LS p50 {ms('p50', 6, 3)} p99 {ms('p99', 7, 2)} "
         f"p99.9 {ms('p999', 7, 2)} ms, {ls['iops']:.0f} IOPS")
    if be:
        s += f"  BE {be['bytes_per_s'] / 1e6:7.1f} MB/s"
    if r.get("ls_io_pressure") is not None:
        s += f"  LS io.pressure {r['ls_io_pressure']:.1f}%"
    limit = r.get("be_limit") or {}
    if limit.get("mean") is not None:
        s += f"  BE wbps {limit['mean'] / 1e6:.0f} MB/s ({limit['min'] / 1e6:.0f}-{limit['max'] / 1e6:.0f})"
    if r.get("koordd"):
        s += f"  koordd steps {r['koordd']['steps']}"
    return s


def write_report(args, host: Host, bench: Bench, how: str, io_root: str, be_alone: float | None, runs: list[dict],
                 out: Path) -> None:
    rows = summarise(runs, SETUPS)
    command = command_line()
    jobs = bench.jobs
    about = [
        f"host: {os.cpu_count()} CPUs ({cpu_model()}), Linux {platform.release()}, cgroups "
        f"{'hybrid (v1 blkio throttle, io.pressure from the unified tree)' if host.mode == 'hybrid' else 'v2'}"
        + (f"; io at the v2 root: {io_root}" if host.mode == "v2" else "") + f"; koordd {git_describe()}",
        f"disk: {how}, {bench.disk}; LS reads the first {jobs.half >> 20} MiB, BE writes the next "
        f"{jobs.half >> 20} MiB",
        f"LS: fio randread 4 KiB, direct, psync, {jobs.ls_jobs} jobs at {jobs.ls_iops} IOPS together (Poisson)",
        "BE: fio sequential write 1 MiB, " + ("buffered (psync)" if jobs.be_buffered else
                                              f"direct, libaio, iodepth {jobs.be_iodepth}"),
        f"setups: static = BE wbps {bench.static_wbps / 1e6:.1f} MB/s; koordd = io_qos dynamic, ceiling "
        f"{bench.koordd_wbps / 1e6:.1f} MB/s, options {json.dumps(effective_koordd_options(args.koordd_options))}"
        + (f"; iocost = io.cost.qos \"{args.iocost_qos}\", io.weight LS 1000 / BE {args.iocost_be_weight}"
           if IOCOST in args.setups else ""),
        f"runs: {jobs.seconds:g} s measured after {jobs.warmup:g} s of warm-up, {args.reps} repetitions, setups in "
        f"a random order per repetition (seed {args.seed}); every setup of a repetition reads the same offsets",
    ]
    if be_alone is not None:
        about.append(f"BE alone, measured first (a few seconds, no LS, nothing limited): {be_alone / 1e6:.1f} MB/s; "
                     f"--static-wbps {args.static_wbps}, --koordd-wbps {args.koordd_wbps}")
    report = markdown(rows, command, about, notes(host, args, runs))
    (out / "report.md").write_text(report)
    print(report)
    print(f"written: {out / 'report.md'}, {out / 'results.json'}")


def effective_koordd_options(options: dict) -> dict:
    """io_qos's settings as koordd reads the config koordd_config writes, for the report (defaults included)."""
    from koordd.core.config import parse_config
    from koordd.runtime.docs import shipped_loops
    text = koordd_config("ls", "be", Path("/var/lib/koordd-bench-io"), "0:0", 1, options)
    settings = parse_config(text, "bench-io.toml", shipped_loops()).loops["io_qos"]
    return {k: v for k, v in settings.as_dict().items() if k not in ("enabled", "devices", "be_io_max")}


def notes(host: Host, args, runs: Sequence[dict]) -> list[str]:
    out = []
    if host.mode == "hybrid" and args.be_buffered:
        out.append("BE wrote buffered on cgroup v1: writeback is not charged to BE's cgroup, so neither static "
                   "nor koordd could limit it")
    for r in runs:
        if r["ls"].get("errors") or (r.get("be") or {}).get("errors"):
            out.append(f"run {r['setup']} rep {r['rep'] + 1}: fio reported errors")
    short = [r for r in runs if r["ls"]["iops"] < 0.9 * args.ls_iops]
    if short:
        out.append("LS fell behind its rate (under 90% of --ls-iops) in: " + ", ".join(
            f"{r['setup']} rep {r['rep'] + 1} ({r['ls']['iops']:.0f})" for r in short)
                   + "; its clat then misses the time its reads waited to be issued")
    k = [r["koordd"] for r in runs if r.get("koordd")]
    if k:
        steps: dict[str, int] = {}
        for rec in k:
            for s, n in rec["steps"].items():
                steps[s] = steps.get(s, 0) + n
        out.append("koordd io_qos steps over all its runs (applied decisions, warm-up included): "
                   + (", ".join(f"{s}: {n}" for s, n in sorted(steps.items())) or "none"))
        seen = [rec["ls_io_pressure_seen"] for rec in k if rec.get("ls_io_pressure_seen")]
        if seen:
            out.append("LS io.pressure koordd saw (min / median / max per run): " + "; ".join(
                " / ".join(f"{v:.1f}" for v in s) for s in seen))
        ready = [r.get("koordd_ready_s") for r in runs if r.get("koordd_ready_s") is not None]
        if ready:
            out.append(f"koordd took {min(ready):.1f}-{max(ready):.1f} s to be ready (before the run started)")
    alone = median_spread(r.get("ls_io_pressure") for r in runs if r["setup"] == LS_ALONE)
    if alone:
        out.append(f"LS alone's io.pressure: {cell(alone, 1)}% (koordd's target: "
                   f"{effective_koordd_options(args.koordd_options)['io_pressure_target']}%)")
    load = Path("/proc/loadavg").read_text().split()[:3]
    out.append(f"load average at the end: {' '.join(load)} (other work on the host shows in every setup alike)")
    return out
