"""Does oom_shaping change whom the kernel's OOM killer takes? Issue 29's proof, run inside scripts/vmtest's VM
(pure cgroup v2, systemd PID 1, 2 GiB, no swap):

    scripts/vmtest --cmd 'python3 scripts/bench-oom [--arms off,koordd] [--ls-mib 900] [--be-mib 150]'

Every arm sets up the same node, then drives it into the GLOBAL OOM killer (no cgroup has a memory limit):

    oomls.service   in ls.slice: one python holding --ls-mib of anonymous memory (the node's largest process)
    oombe.service   in be.slice: a python and a child it forks, each holding --be-mib (one BE "pod" of two
                    processes)
    oomhog.service  in system.slice (no class: an unclassified leak): a python growing by --step-mib every
                    --step-s until the kernel kills it

All three with OOMPolicy=continue, so that systemd stops nothing after a kill: who dies is the kernel's doing
alone (systemd's default, OOMPolicy=stop, would stop the rest of a unit whose process was killed, and
OOMPolicy=kill would set memory.oom.group itself).

Arms:
    off      no koordd: every process at oom_score_adj 0, memory.oom.group 0. The kernel kills the process
             with the largest RSS: LS, then the hog.
    koordd   koordd under systemd with only oom_shaping (be_oom_score_adj 1000, ls_oom_score_adj -900,
             be_oom_group true); the hog starts once koordd has shaped every process and oombe's group.

The arm ends when the hog has been killed (or --timeout). Who was killed comes from the kernel log after a
marker this script writes to /dev/kmsg at the arm's start: each "Out of memory: Killed process PID (COMM)
... anon-rss:..kB ... oom_score_adj:N" line, with the "oom-kill:...,task_memcg=..." line before it, and
"Tasks in CGROUP are going to be killed due to memory.oom.group set". Processes are named by the unit they
were in (recorded before the hog starts). vm.oom_dump_tasks is set to 0 meanwhile (shorter kernel log) and
put back; koordd's config is put back and koordd left stopped.

Prints a report (markdown) and, with --out FILE, writes the runs as JSON. Needs root and systemd as PID 1.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from koordtest.bench.common import wait_for
from koordtest.koordd_proc import to_toml

CGROUP = Path("/sys/fs/cgroup")
CONFIG = Path("/etc/koordd/koordd.toml")
STATE_DIR = "/var/lib/koordd"
LS_SLICE, BE_SLICE = "ls.slice", "be.slice"
UNITS = {"oomls": LS_SLICE, "oombe": BE_SLICE, "oomhog": "system.slice"}
DUMP_TASKS = Path("/proc/sys/vm/oom_dump_tasks")

KOORDD_CONFIG = to_toml({
    "daemon": {"cgroup_root": "", "state_dir": STATE_DIR, "log_level": "info"},
    "classes": [{"name": "BE", "cgroups": [BE_SLICE]}, {"name": "LS", "cgroups": [LS_SLICE]}],
    "loops": {"be_suppress": {"enabled": False}, "qos_baseline": {"enabled": False},
              "oom_shaping": {"enabled": True, "interval": "1s", "be_oom_score_adj": 1000, "ls_oom_score_adj": -900,
                              "be_oom_group": True}},
})

HOLD = """
import sys, time
blob = b"\\x01" * ({mib} << 20)
print("holding", {mib}, "MiB", flush=True)
while True:
    time.sleep(60)
"""
POD = """
import os, sys, time
if os.fork() == 0:
    pass
blob = b"\\x01" * ({mib} << 20)
print(os.getpid(), "holding", {mib}, "MiB", flush=True)
while True:
    time.sleep(60)
"""
HOG = """
import time
chunks = []
while True:
    chunks.append(b"\\x01" * ({step} << 20))
    time.sleep({step_s})
"""

# --- the kernel log (pure: tests/unit/koordtest/test_bench_oom.py) -----------------------------------------------------

KILLED = re.compile(r"(?P<why>Out of memory|Memory cgroup out of memory): Killed process (?P<pid>\d+) "
                    r"\((?P<comm>[^)]*)\).*?anon-rss:(?P<anon>\d+)kB.*?oom_score_adj:(?P<adj>-?\d+)")
OOM_KILL = re.compile(r"oom-kill:constraint=(?P<constraint>[A-Z_]+),.*?task_memcg=(?P<memcg>[^,]*),task=(?P<comm>[^,]*),"
                      r"pid=(?P<pid>\d+)")
GROUP = re.compile(r"Tasks in (?P<cgroup>\S+) are going to be killed due to memory\.oom\.group set")


@dataclass
class Kill:
    pid: int
    comm: str
    oom_score_adj: int
    anon_rss_mib: float
    memcg: str = ""             # the victim's cgroup, from the oom-kill line (the chosen victim only)
    chosen: bool = True         # False: killed as a member of a memory.oom.group cgroup, not chosen
    group: str = ""             # the memory.oom.group cgroup this kill belongs to, if any
    unit: str = ""              # filled in from the pids this script recorded


def after_marker(log: str, marker: str) -> str:
    """The part of the kernel log after the last line holding `marker` ("" when there is none)."""
    at = log.rfind(marker)
    if at < 0:
        return ""
    nl = log.find("\n", at)
    return "" if nl < 0 else log[nl + 1:]


def parse_kills(log: str) -> list[Kill]:
    """The OOM kills in `log` (kernel log text, any prefix per line), in order. A kill after a "Tasks in
    ... memory.oom.group" line belongs to that group; the first of them is the victim the kernel chose (the
    oom-kill line names it), the others were killed for being in its group."""
    kills: list[Kill] = []
    chosen: dict[str, str] | None = None
    group = ""
    for line in log.splitlines():
        if m := OOM_KILL.search(line):
            chosen, group = m.groupdict(), ""
            continue
        if m := GROUP.search(line):
            group = m["cgroup"]
            continue
        if m := KILLED.search(line):
            pid = int(m["pid"])
            is_chosen = chosen is not None and int(chosen["pid"]) == pid
            kills.append(Kill(pid, m["comm"], int(m["adj"]), round(int(m["anon"]) / 1024, 1),
                              memcg=chosen["memcg"] if is_chosen else "", chosen=is_chosen, group=group))
            if is_chosen:
                chosen = None
    return kills


def name_units(kills: list[Kill], pids: dict[int, str]) -> list[Kill]:
    for k in kills:
        k.unit = pids.get(k.pid, "") or (k.memcg.rsplit("/", 1)[-1].removesuffix(".service") if k.memcg else "?")
    return kills


@dataclass
class Arm:
    name: str
    scores: dict[str, list[int]] = field(default_factory=dict)     # unit -> oom_score_adj of its processes
    oom_group: dict[str, str] = field(default_factory=dict)        # unit -> memory.oom.group before the hog
    rss_mib: dict[str, float] = field(default_factory=dict)        # unit -> memory.current before the hog
    kills: list[Kill] = field(default_factory=list)
    survivors: list[str] = field(default_factory=list)             # units with processes left at the end
    seconds: float = 0.0
    note: str = ""


def summary(arm: Arm) -> str:
    """One line: who died, in order, with their score; whether the BE pod died whole."""
    parts = []
    for k in arm.kills:
        how = f"group {k.group}" if k.group and not k.chosen else "chosen"
        parts.append(f"{k.unit}:{k.pid}({k.comm}, adj {k.oom_score_adj}, {k.anon_rss_mib:.0f} MiB, {how})")
    be = {k.pid for k in arm.kills if k.unit == "oombe"}     # a group kill logs the chosen victim twice
    whole = "whole BE pod killed" if len(be) >= 2 else ("half the BE pod killed" if len(be) == 1 else "BE untouched")
    return f"{arm.name}: " + (" -> ".join(parts) or "no OOM kill") + f"; {whole}"


def report(arms: list[Arm], argv: list[str]) -> str:
    lines = ["# bench-oom", "", f"`{' '.join(argv)}` on {os.uname().release}, "
             f"{mem_total_mib():.0f} MiB, swap {swap_total_mib():.0f} MiB", ""]
    for arm in arms:
        lines += [f"## {arm.name}", "",
                  f"before the hog: oom_score_adj {arm.scores}, memory.oom.group {arm.oom_group}, "
                  f"memory.current MiB {arm.rss_mib}", "",
                  "| # | unit | pid | comm | oom_score_adj | anon-rss MiB | chosen / group | victim's cgroup |",
                  "|---|---|---|---|---|---|---|---|"]
        for i, k in enumerate(arm.kills, 1):
            lines.append(f"| {i} | {k.unit} | {k.pid} | {k.comm} | {k.oom_score_adj} | {k.anon_rss_mib:.0f} | "
                         f"{'chosen' if k.chosen else 'group ' + k.group} | {k.memcg} |")
        lines += ["", f"survivors: {', '.join(arm.survivors) or 'none'}; {arm.seconds:.0f} s"
                  + (f"; {arm.note}" if arm.note else ""), ""]
    lines += ["## Summary", ""] + [f"- {summary(a)}" for a in arms]
    return "\n".join(lines) + "\n"


# --- the node (root, systemd) ----------------------------------------------------------------------------

def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=180)
    if check and p.returncode:
        raise SystemExit(f"{' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
    return p


def meminfo(key: str) -> float:
    for line in open("/proc/meminfo"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def mem_total_mib() -> float:
    return meminfo("MemTotal")


def swap_total_mib() -> float:
    return meminfo("SwapTotal")


def cgroup_of(unit: str) -> Path:
    return CGROUP / UNITS[unit] / f"{unit}.service"


def procs(unit: str) -> list[int]:
    try:
        return [int(p) for p in (cgroup_of(unit) / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def stop_all() -> None:
    for unit in UNITS:
        sh("systemctl", "stop", f"{unit}.service", check=False)
        sh("systemctl", "reset-failed", f"{unit}.service", check=False)


def run_unit(unit: str, code: str) -> None:
    sh("systemd-run", f"--unit={unit}", f"--slice={UNITS[unit]}", "--property=OOMPolicy=continue",
       "/usr/bin/python3", "-c", code)


def scores(unit: str) -> list[int]:
    return sorted(int(read(Path(f"/proc/{pid}/oom_score_adj")) or 0) for pid in procs(unit))


def kmsg(text: str) -> None:
    with open("/dev/kmsg", "w") as f:
        f.write(text + "\n")


def run_arm(name: str, args) -> Arm:
    arm = Arm(name)
    stop_all()
    if name == "koordd":
        CONFIG.write_text(KOORDD_CONFIG)
    t0 = time.monotonic()
    run_unit("oomls", HOLD.format(mib=args.ls_mib))
    run_unit("oombe", POD.format(mib=args.be_mib))
    full = wait_for(lambda: int(read(cgroup_of("oomls") / "memory.current") or 0) >= args.ls_mib << 20 and
                    len(procs("oombe")) == 2 and int(read(cgroup_of("oombe") / "memory.current") or 0)
                    >= 2 * args.be_mib << 20, 300, 0.5)
    if not full:
        raise SystemExit(f"{name}: LS and BE did not reach their sizes: {read(cgroup_of('oomls') / 'memory.current')}, "
                         f"{read(cgroup_of('oombe') / 'memory.current')}")
    if name == "koordd":
        sh("systemctl", "start", "koordd")
        shaped = wait_for(lambda: set(scores("oombe")) == {1000} and set(scores("oomls")) == {-900} and
                          read(cgroup_of("oombe") / "memory.oom.group") == "1", 120, 0.5)
        if not shaped:
            arm.note = "koordd did not shape in 120 s"
    arm.scores = {u: scores(u) for u in ("oomls", "oombe")}
    arm.oom_group = {u: read(cgroup_of(u) / "memory.oom.group") for u in ("oomls", "oombe")}
    arm.rss_mib = {u: round(int(read(cgroup_of(u) / "memory.current") or 0) / 2**20) for u in ("oomls", "oombe")}
    pids = {pid: u for u in ("oomls", "oombe") for pid in procs(u)}
    marker = f"bench-oom: arm {name} start {time.time_ns()}"
    kmsg(marker)
    run_unit("oomhog", HOG.format(step=args.step_mib, step_s=args.step_s))
    wait_for(lambda: procs("oomhog"), 30, 0.1)
    pids.update({pid: "oomhog" for pid in procs("oomhog")})
    done = wait_for(lambda: not procs("oomhog"), args.timeout, 1.0)
    arm.seconds = time.monotonic() - t0
    if not done:
        arm.note += " the hog was not killed within the timeout"
    time.sleep(2)
    arm.survivors = [u for u in ("oomls", "oombe") if procs(u)]
    arm.survivors = [f"{u} ({len(procs(u))} process{'es' if len(procs(u)) != 1 else ''})" for u in arm.survivors]
    log = after_marker(sh("dmesg").stdout, marker)
    arm.kills = name_units(parse_kills(log), pids)
    if name == "koordd":
        sh("systemctl", "stop", "koordd", check=False)
    stop_all()
    return arm


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default="off,koordd")
    p.add_argument("--ls-mib", type=int, default=900)
    p.add_argument("--be-mib", type=int, default=150, help="each of the BE pod's two processes")
    p.add_argument("--step-mib", type=int, default=16)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--out")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    if os.geteuid() != 0 or not os.path.isdir("/run/systemd/system"):
        raise SystemExit("bench-oom needs root and systemd as PID 1 (scripts/vmtest --cmd)")
    if sh("systemctl", "is-active", "koordd", check=False).stdout.strip() == "active":
        raise SystemExit("koordd is running: `systemctl stop koordd` first")
    saved_config = CONFIG.read_text() if CONFIG.exists() else None
    saved_dump = read(DUMP_TASKS)
    arms = []
    try:
        DUMP_TASKS.write_text("0")
        for name in args.arms.split(","):
            arm = run_arm(name, args)
            print(summary(arm), flush=True)
            arms.append(arm)
    finally:
        sh("systemctl", "stop", "koordd", check=False)
        stop_all()
        if saved_config is not None:
            CONFIG.write_text(saved_config)
        if saved_dump:
            DUMP_TASKS.write_text(saved_dump)
    text = report(arms, ["scripts/bench-oom", *argv])
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(a) for a in arms], indent=2))
    return 0
