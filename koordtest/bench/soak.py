"""koordd over a long run under cgroup churn: do its RSS, open files, BPF map entries, restore journal
and decision log stay flat?

    sudo .venv/bin/python scripts/soak [--minutes 60] [--every 10] [--churn 300] [--warmup 120] [--out FILE]

koordd runs with every loop this host supports (llc_partition needs resctrl, sched_ext needs sched_ext,
net_shaping libbpf and pyroute2; the others run anywhere) and the run-queue sensor on eBPF (be_suppress
with rule "slack" and antagonists on run-queue latency), at a 500 ms interval, against a tree of its
own: koordd-soak-<pid> in every v1 hierarchy koordd uses and the unified tree (or the v2 tree), with
the class roots ls (a bursty thread under a quota: cpu_burst acts) and be (a busy loop: be_suppress
acts), memory_evict's scope being the tree itself. Meanwhile a churner creates pods below ls and be,
--churn per minute, each living 2 to 20 s, half of them with a process that works a little and then
sleeps; and, where net_shaping runs, a veth pair (kds<pid>, its peer in a network namespace of its own)
is shaped.

Every --every seconds it samples koordd's VmRSS and threads (/proc/PID/status), open file descriptors
(/proc/PID/fd), CPU time, the entries of every BPF map it holds (found through /proc/PID/fdinfo, counted
with the bpf(2) syscall: koordtest/bench/procstat.py), the restore journal's size and entries, and
the decision log's size (rotated files included). It also samples koordd without any pod, once before
the churn starts and once after it stopped and every pod is gone: what koordd keeps per pod (open
cgroup files, watched cgroups in the BPF maps) must be gone then. At the end: SIGTERM (koordd must exit
0 with its journal empty), the tree and the churn removed, and per metric its value at the end of
--warmup, at the end, its peak and its growth (end - start, and the least-squares slope per hour after
warm-up); the last line of stdout is the JSON summary (also written to --out, with every sample).
Exit status 1 when koordd did not exit 0, left a knob held, or the cleanup failed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from koordtest.bench.cgroup_tree import CgroupTree, die_with_parent, is_v2_host
from koordtest.koordd_proc import KoorddProcess, to_toml
from koordtest.bench.procstat import bpf_maps, cpu_seconds, open_fds, status
from koordd.act.decision_log import read_decisions

HOST, PEER = f"kds{os.getpid() % 100000}", f"kdsp{os.getpid() % 100000}"    # of its own: soaks may overlap
CONTROLLERS = ("cpu", "cpuacct", "memory", "freezer")
POD_LIFETIME = (2.0, 20.0)          # seconds
DRAIN = 5.0                         # seconds for koordd to settle without pods, before and after the churn
POD_WORK = ["/bin/sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 3600"]
BURSTY = """\
import time
i = 0
while True:
    end = time.thread_time() + (30 + (i * 37) % 51) / 1000      # 30..80 ms of CPU
    while time.thread_time() < end:
        pass
    time.sleep((70 + (i * 53) % 31) / 1000)                     # then 70..100 ms asleep
    i += 1
"""


# --- what runs -----------------------------------------------------------------------------------------

def supported_loops() -> tuple[list[str], dict[str, str]]:
    """The loops this host can run, and why each other one cannot."""
    from koordd.runtime.capabilities import probe_all
    caps = {c.name: c for c in probe_all(skip=("sensors",))}
    needs = {"llc_partition": ("resctrl",), "sched_ext": ("sched_ext",), "net_shaping": ("netlink", "bpf")}
    loops = ["be_suppress", "cpu_burst", "qos_baseline", "memory_evict", "avx_weight"]
    left_out = {}
    for loop, wanted in needs.items():
        missing = [caps[w].detail for w in wanted if w in caps and not caps[w].available]
        if missing:
            left_out[loop] = "; ".join(missing)
        else:
            loops.append(loop)
    return loops, left_out


def config_text(name: str, state_dir: Path, loops: list[str], device: str | None) -> str:
    options = {
        "be_suppress": {"rule": "slack", "antagonist_signal": "runq", "antagonist_window": "1m"},
        "cpu_burst": {"pool_ignores_be": True},
        "qos_baseline": {"be_cpu_idle": True},
        "memory_evict": {"scope": name, "action": "freeze"},
        "net_shaping": {"devices": [f"{device}:100mbit"]},
    }
    return to_toml({
        "daemon": {"cgroup_root": "", "state_dir": str(state_dir), "log_level": "warning"},
        "classes": [{"name": "LS", "cgroups": [f"{name}/ls"]}, {"name": "BE", "cgroups": [f"{name}/be"]}],
        "loops": {loop: {"enabled": True, "interval": "500ms", **options.get(loop, {})} for loop in loops},
    })


def set_ls_quota(tree: CgroupTree, quota: int = 50_000, period: int = 100_000) -> None:
    d = next(r for r in tree.roots if is_v2_host() or "cpu" in r.name.split(",")) / tree.path("ls")
    if is_v2_host():
        (d / "cpu.max").write_text(f"{quota} {period}")
    else:
        (d / "cpu.cfs_period_us").write_text(str(period))
        (d / "cpu.cfs_quota_us").write_text(str(quota))


class Veth:
    """HOST here, PEER in a network namespace of its own; removed by close()."""

    def __init__(self, ns: str):
        from pyroute2 import IPRoute, NetNS, netns
        self.ns, self.ipr = ns, IPRoute()
        netns.create(ns)
        self.ipr.link("add", ifname=HOST, kind="veth", peer={"ifname": PEER, "net_ns_fd": ns})
        index = self.ipr.link_lookup(ifname=HOST)[0]
        self.ipr.addr("add", index=index, address="10.79.0.1", prefixlen=24)
        self.ipr.link("set", index=index, state="up")
        with NetNS(ns) as peer_ns:
            peer = peer_ns.link_lookup(ifname=PEER)[0]
            peer_ns.addr("add", index=peer, address="10.79.0.2", prefixlen=24)
            peer_ns.link("set", index=peer, state="up")

    def close(self) -> None:
        from pyroute2 import netns
        for found in self.ipr.link_lookup(ifname=HOST):
            self.ipr.link("del", index=found)
        netns.remove(self.ns)
        self.ipr.close()


# --- the churn -----------------------------------------------------------------------------------------

class Churner(threading.Thread):
    """Pods below the class roots, `per_minute` made (and as many removed) a minute, each living a random
    2 to 20 s, half of them with a process in them."""

    def __init__(self, tree: CgroupTree, per_minute: float, seed: int):
        super().__init__(daemon=True)
        self.tree, self.gap = tree, 60.0 / per_minute
        self.rng = random.Random(seed)
        self.done = threading.Event()
        self.pods: dict[str, tuple[float, subprocess.Popen | None]] = {}    # path -> (when it goes, process)
        self.made = self.removed = 0
        self.errors: list[str] = []

    def run(self) -> None:
        serial, next_pod = 0, time.monotonic()
        while not self.done.is_set():
            now = time.monotonic()
            for path, (until, proc) in list(self.pods.items()):
                if until <= now:
                    self._remove(path, proc)
            if now >= next_pod:
                self._make(f"{('ls', 'be')[serial % 2]}/pod{serial}")
                serial += 1
                next_pod += self.gap
            self.done.wait(max(0.0, min(next_pod - time.monotonic(), 0.1)))
        for path, (_, proc) in list(self.pods.items()):
            self._remove(path, proc)

    def _dirs(self, path: str) -> list[Path]:
        return [root / self.tree.path(path) for root in self.tree.roots]

    def _make(self, path: str) -> None:
        try:
            for d in self._dirs(path):
                d.mkdir()
        except OSError as e:
            self.errors.append(f"mkdir {path}: {e}")
            return
        proc = None
        if self.rng.random() < 0.5:
            targets = [str(d / "cgroup.procs") for d in self._dirs(path)]

            def join():
                die_with_parent()
                for t in targets:
                    with open(t, "w") as f:
                        f.write(str(os.getpid()))
            proc = subprocess.Popen(POD_WORK, preexec_fn=join, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
        self.pods[path] = (time.monotonic() + self.rng.uniform(*POD_LIFETIME), proc)
        self.made += 1

    def _remove(self, path: str, proc: subprocess.Popen | None) -> None:
        del self.pods[path]
        for d in self._dirs(path):
            for name in ("freezer.state", "cgroup.freeze"):     # memory_evict may have frozen it
                if (d / name).exists():
                    try:
                        (d / name).write_text("THAWED" if name == "freezer.state" else "0")
                    except OSError:
                        pass
        if proc is not None:
            proc.kill()
            proc.wait()
        for d in self._dirs(path):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)          # busy for a moment after its last task died
            else:
                self.errors.append(f"cannot remove {d}")
        self.removed += 1

    def stop(self) -> None:
        self.done.set()
        self.join()


# --- the samples ---------------------------------------------------------------------------------------

def dir_bytes(state_dir: Path, prefix: str) -> int:
    return sum(p.stat().st_size for p in state_dir.glob(f"{prefix}*") if p.is_file())


def sample(pid: int, state_dir: Path, t0: float, churner: Churner) -> dict:
    st = status(pid)
    maps = bpf_maps(pid)
    journal = state_dir / "originals.jsonl"
    lines = journal.read_text().count("\n") if journal.exists() else 0
    try:
        held = len(json.loads((state_dir / "status.json").read_text()).get("held", []))
    except (OSError, ValueError):
        held = None
    return {"t": round(time.monotonic() - t0, 1), "rss_kib": st["VmRSS"], "hwm_kib": st["VmHWM"],
            "threads": st["Threads"], "fds": open_fds(pid), "cpu_s": round(cpu_seconds(pid), 2),
            "bpf_maps": len(maps), "bpf_entries": sum(m.entries or 0 for m in maps),
            "bpf_by_map": {m.name: m.entries for m in maps},
            "journal_bytes": journal.stat().st_size if journal.exists() else 0, "journal_lines": lines,
            "held": held, "decision_log_bytes": dir_bytes(state_dir, "decisions.jsonl"),
            "pods_live": len(churner.pods), "pods_made": churner.made}


METRICS = ("rss_kib", "fds", "threads", "bpf_maps", "bpf_entries", "journal_bytes", "journal_lines",
           "decision_log_bytes")


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    n = len(points)
    mt, mv = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return None if var == 0 else 3600 * sum((t - mt) * (v - mv) for t, v in points) / var


def summarize(samples: list[dict], warmup: float) -> dict:
    after = [s for s in samples if s["t"] >= warmup] or samples[-1:]
    out = {}
    for m in METRICS:
        start, end = after[0][m], after[-1][m]
        out[m] = {"at_start": samples[0][m], "after_warmup": start, "end": end, "peak": max(s[m] for s in samples),
                  "growth": end - start, "slope_per_hour": _round(slope_per_hour([(s["t"], s[m]) for s in after]))}
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


# --- the run -------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0, help="how long koordd runs under churn (default 60)")
    p.add_argument("--every", type=float, default=10.0, help="seconds between samples (default 10)")
    p.add_argument("--churn", type=float, default=300.0, help="pods made (and removed) per minute (default 300)")
    p.add_argument("--warmup", type=float, default=120.0,
                   help="seconds after koordd is ready before growth is counted (default 120)")
    p.add_argument("--seed", type=int, default=None, help="the churn's random seed (default: random, printed)")
    p.add_argument("--out", type=Path, help="also write the JSON summary (with every sample) here")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        p.error("needs root: it creates cgroups and a network namespace")
    return args


class Soak:
    """One soak's tree koordd-soak-<pid> (ls: a bursty thread under a quota, be: a busy loop), the veth
    where net_shaping runs, the churn and koordd; close() removes what was made. SIGTERM and SIGINT end
    the sampling early (on_signal), the summary is still made."""

    def __init__(self, args: argparse.Namespace, seed: int, loops: list[str], left_out: dict[str, str]):
        self.args, self.seed, self.loops, self.left_out = args, seed, loops, left_out
        self.name = f"koordd-soak-{os.getpid()}"
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        os.chmod(self.tmp, 0o755)            # koordd refuses a config in a directory others may write
        self.tree = CgroupTree(self.name, CONTROLLERS)
        self.veth: Veth | None = None
        self.churner: Churner | None = None
        self.stop_signal: int | None = None

    def on_signal(self, signum, frame) -> None:
        self.stop_signal = signum

    def set_up(self) -> None:
        tree = self.tree
        tree.create(["ls", "be"])
        if is_v2_host():
            for parent in ("ls", "be"):
                tree._pass_controllers(tree.roots[0], tree.roots[0] / tree.path(parent))
        set_ls_quota(tree)
        tree.spawn("ls", [sys.executable, "-c", BURSTY], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tree.spawn("be", ["/bin/sh", "-c", "while :; do :; done"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if "net_shaping" in self.loops:
            self.veth = Veth(self.name)

    def run(self) -> dict:
        """koordd under the churn until --minutes (or a signal), then without pods, then stopped: the
        summary."""
        args = self.args
        k = KoorddProcess(config_text(self.name, self.tmp / "state", self.loops, HOST if self.veth else None), self.tmp)
        k.start()
        ready_s = k.wait_ready()
        sensors = ", ".join(f"{n} {s.get('state')}" for n, s in k.status()["sensors"].items())
        print(f"soak: koordd {k.proc.pid} ready in {ready_s:.1f} s; sensors {sensors}", flush=True)
        churner = self.churner = Churner(self.tree, args.churn, self.seed)
        t0 = time.monotonic()
        time.sleep(DRAIN)
        before = sample(k.proc.pid, k.state_dir, t0, churner)       # no pod yet
        churner.start()
        samples = []
        while True:
            k.check_running()
            samples.append(sample(k.proc.pid, k.state_dir, t0, churner))
            print(sample_line(samples[-1]), flush=True)
            if self.stop_signal or samples[-1]["t"] >= args.minutes * 60:
                break
            time.sleep(max(0.0, min(args.every, args.minutes * 60 - (time.monotonic() - t0))))
        churner.stop()
        time.sleep(DRAIN)                       # every pod gone: what koordd kept for them must be gone too
        drained = sample(k.proc.pid, k.state_dir, t0, churner)
        last = k.status()
        rc = k.stop()
        decisions = Counter(f"{d.get('loop')} {d.get('knob')} {d.get('outcome')}" for d in read_decisions(k.state_dir))
        left = json.loads((k.state_dir / "status.json").read_text()).get("held", [])
        seconds = samples[-1]["t"]
        result = {"seed": self.seed, "minutes": round(seconds / 60, 2), "every_s": args.every, "warmup_s": args.warmup,
                  "loops": self.loops, "left_out": self.left_out, "ready_s": round(ready_s, 1),
                  "pods_made": churner.made, "pods_removed": churner.removed,
                  "pods_per_minute": round(churner.made / max(seconds / 60, 1e-9), 1), "churn_errors": churner.errors[:10],
                  "loop_failures": {n: r["failures"] for n, r in last["loops"].items() if r["failures"]},
                  "ticks": {n: r["ticks"] for n, r in last["loops"].items()},
                  "sensors": {n: s.get("state") for n, s in last.get("sensors", {}).items()},
                  "decisions": dict(decisions.most_common()), "exit_status": rc, "held_after_stop": len(left), "koordd_cpu_s": samples[-1]["cpu_s"],
                  "metrics": summarize(samples, args.warmup),
                  "without_pods": {m: {"before_churn": before[m], "after_churn": drained[m]}
                                   for m in ("rss_kib", "fds", "threads", "bpf_entries", "bpf_by_map")}, "bpf_by_map_end": samples[-1]["bpf_by_map"],
                  "bpf_by_map_after_warmup": next((s["bpf_by_map"] for s in samples if s["t"] >= args.warmup),
                                                  samples[-1]["bpf_by_map"]),
                  "samples": samples}
        if rc != 0:
            print(f"soak: koordd exited {rc}:\n{k.log_tail()}", file=sys.stderr)
        return result

    def close(self) -> list[str]:
        """The churn stopped, the tree, the veth and the temporary directory removed: what could not be."""
        if self.churner is not None and self.churner.is_alive():
            self.churner.stop()
        problems = self.tree.remove()
        if self.veth is not None:
            self.veth.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        if problems:
            print("soak: cleanup failed: " + "; ".join(problems), file=sys.stderr)
        return problems


def sample_line(s: dict) -> str:
    return (f"  t={s['t']:7.1f}s rss={s['rss_kib'] / 1024:6.1f} MiB fds={s['fds']:4d} threads={s['threads']:3d} "
            f"bpf={s['bpf_entries']:6d} ({s['bpf_maps']} maps) journal={s['journal_bytes']:6d} B/"
            f"{s['held']} held decisions={s['decision_log_bytes'] / 1024:8.1f} KiB pods={s['pods_live']:3d} "
            f"(made {s['pods_made']}) cpu={s['cpu_s']:.1f}s")


def print_summary(result: dict) -> None:
    print("\nwithout pods: " + ", ".join(f"{m} {v['before_churn']} before the churn, {v['after_churn']} after it"
                                      for m, v in result["without_pods"].items() if m != "bpf_by_map"))
    print("\nmetric              after warm-up        end       peak     growth   slope/h")
    for m, v in result["metrics"].items():
        print(f"{m:<18} {v['after_warmup']:>14} {v['end']:>10} {v['peak']:>10} {v['growth']:>10} "
              f"{v['slope_per_hour'] if v['slope_per_hour'] is not None else '-':>9}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    loops, left_out = supported_loops()
    soak = Soak(args, seed, loops, left_out)
    print(f"soak: {args.minutes:g} min, a sample every {args.every:g} s, {args.churn:g} pods a minute, seed {seed}; "
          f"loops {', '.join(loops)}" + "".join(f"; {loop} left out: {why}" for loop, why in left_out.items()),
          flush=True)
    signal.signal(signal.SIGTERM, soak.on_signal)
    signal.signal(signal.SIGINT, soak.on_signal)
    result: dict = {}
    try:
        soak.set_up()
        result = soak.run()
    finally:
        problems = soak.close()
    result["cleanup_problems"] = problems
    print_summary(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}))
    return 0 if result["exit_status"] == 0 and not result["held_after_stop"] and not problems else 1
