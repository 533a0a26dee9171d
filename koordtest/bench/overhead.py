"""koordd's own cost: CPU time per second and RSS of the daemon with every loop enabled, over a cgroup
tree of N pods (half under an LS root, half under a BE root).

    sudo .venv/bin/python scripts/bench-overhead [--counts 100,500,2000] [--seconds 20] [--tree real,fake]
                                               [--koordd OTHER/bin/koordd] [--profile DIR]
                                               [--metrics off,on] [--scrape-every 5]
                                               [--config every-loop|shipped] [--runq-source schedstat]

`real` creates the tree on this host's cgroup hierarchy (every v1 hierarchy and the unified tree on
hybrid/v1 hosts, the cgroup2 root on v2), as koordd-bench-<pid>/{ls,be}/pod<i>, and removes it
afterwards; nothing else is touched. `fake` is the same tree of plain files (koordtest/fakes/cgroup.py).
`--config shipped` runs config/koordd.toml as shipped instead (be_suppress on rule slack, which reads
the run-queue sensor: the eBPF program where it loads, schedstat otherwise), its LS and BE classes on
the tree's roots; `--runq-source schedstat` limits that sensor to its fallback (the host's
eBPF program left unloaded). By default every loop is on at a 1 s interval; none has reason to act beyond its first writes on the roots
(no task runs in the tree), so what is measured is the watching: sensors, decisions, skip-if-equal.
koordd's CPU time is utime + stime from /proc/<pid>/stat over the window, after a warm-up; RSS is
VmRSS at the end (VmHWM the peak). `--metrics on` serves the metrics endpoint on a free loopback port
and scrapes it every --scrape-every seconds from the start, as Prometheus would: its cost (the
collector and the HTTP thread run inside koordd) is in the same CPU figure; the scrape's wall time and
size are reported too. Results go to stdout as a markdown table.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from koordtest.bench.cgroup_tree import CgroupTree, is_v2_host
from koordtest.fakes.cgroup import FakeCgroups
from koordtest.bench.procstat import cpu_seconds, status
from koordtest.koordd_proc import KoorddProcess, koordd_command, shipped_config, to_toml
from koordtest.metricsnode import free_port


def config_for(name: str, root: str, state: Path, shipped: bool = False, metrics_port: int | None = None) -> str:
    """koordd's config over the tree `name` (below `root`; "": the host's hierarchy): every loop on at its
    default interval, memory_evict scoped to the tree, or (`shipped`) config/koordd.toml as shipped; LS
    and BE on the tree's roots; with `metrics_port`, the metrics endpoint on that loopback port."""
    metrics = {"enable": True, "listen": f"127.0.0.1:{metrics_port}"} if metrics_port is not None else None
    if shipped:
        changes = (("daemon.cgroup_root", root),) if root else ()
        changes += tuple((f"metrics.{key}", value) for key, value in (metrics or {}).items())
        return shipped_config({"LS": [f"{name}/ls"], "BE": [f"{name}/be"]}, state, changes=changes)
    config = {
        "daemon": {"cgroup_root": root, "state_dir": str(state), "log_level": "warning"},
        "classes": [{"name": "LS", "cgroups": [f"{name}/ls"]}, {"name": "BE", "cgroups": [f"{name}/be"]}],
        "loops": {"be_suppress": {"enabled": True}, "cpu_burst": {"enabled": True},
                  "qos_baseline": {"enabled": True},
                  "memory_evict": {"enabled": True, "action": "freeze", "scope": name}},
    }
    if metrics:
        config["metrics"] = metrics
    return to_toml(config)


# --- trees ----------------------------------------------------------------------------------------

def make_real(name: str, pods: int) -> CgroupTree:
    """The tree on the host's hierarchies: every one koordd reads or writes, and the unified tree."""
    tree = CgroupTree(name, ("cpu", "cpuacct", "cpuset", "memory", "freezer"))
    try:
        tree.create(["ls", "be"] + [f"{cls}/pod{i}" for cls in ("ls", "be") for i in range(pods // 2)])
    except BaseException:
        tree.remove()              # what was made before the error
        raise
    return tree


def make_fake(base: Path, name: str, pods: int):
    tree = FakeCgroups(base, "v2", cpus="0-15")
    for cls in ("ls", "be"):
        for i in range(pods // 2):
            tree.add(f"{name}/{cls}/pod{i}")
    return tree


# --- one measurement ------------------------------------------------------------------------------

class Scraper:
    """GETs /metrics every `every` seconds in a thread, as Prometheus does: wall time and size of each."""

    def __init__(self, port: int, every: float):
        self.url, self.every = f"http://127.0.0.1:{port}/metrics", every
        self.times: list[float] = []
        self.sizes: list[int] = []
        self.errors: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(self.every):
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    size = len(r.read())
            except OSError as e:           # koordd still starting: its port not open yet
                self.errors.append(str(e))
                continue
            self.times.append(time.perf_counter() - t0)
            self.sizes.append(size)


def measure(tree: str, pods: int, seconds: float, warmup: float, koordd: str | None = None,
            profile: Path | None = None, metrics: bool = False, scrape_every: float = 5.0,
            shipped: bool = False, runq_source: str | None = None) -> dict:
    name = f"koordd-bench-{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="koordd-bench-"))
    real: CgroupTree | None = None
    try:
        if tree == "real":
            real, root = make_real(name, pods), ""
        else:
            root = str(make_fake(tmp, name, pods).root)
        port = free_port() if metrics else None
        config = config_for(name, root, tmp / "state", shipped, port)
        scraper = Scraper(port, scrape_every) if port is not None else None
        with KoorddProcess(config, tmp, koordd_command(koordd, profile, runq_source)) as k:
            if scraper is not None:
                scraper.thread.start()
            time.sleep(warmup)
            k.check_running()
            c0, t0 = cpu_seconds(k.proc.pid), time.monotonic()
            time.sleep(seconds)
            c1, t1 = cpu_seconds(k.proc.pid), time.monotonic()
            mem = status(k.proc.pid)
            state = k.status()
            if scraper is not None:
                scraper.done.set()
                scraper.thread.join()
                if not scraper.times:
                    raise RuntimeError(f"no scrape succeeded: {scraper.errors[-1:]}\n{k.log_tail()}")
        failures = {n: r["failures"] for n, r in state["loops"].items() if r["failures"]}
        if failures:
            raise RuntimeError(f"loops failed during the run: {failures}\n{k.log_tail()}")
        runq = (state.get("sensors") or {}).get("runq_latency") or {}
        return {"tree": tree, "cgroups": pods + 3, "config": "shipped" if shipped else "every loop",
                "runq": runq.get("state", "off") + (f" ({runq_source} only)" if runq_source and runq else ""), "cpu_ms_per_s": 1000 * (c1 - c0) / (t1 - t0),
                "rss_mb": mem["VmRSS"] / 1024, "peak_rss_mb": mem["VmHWM"] / 1024,
                "ticks": {n: r["ticks"] for n, r in state["loops"].items()},
                "metrics": f"on, scrape every {scrape_every:g} s" if metrics else "off",
                "scrape_ms": 1000 * sum(scraper.times) / len(scraper.times) if scraper else None,
                "scrape_kb": sum(scraper.sizes) / len(scraper.sizes) / 1024 if scraper else None}
    finally:
        if real is not None:
            problems = real.remove()
            if problems:
                print("cleanup failed: " + "; ".join(problems), file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", default="100,500,2000", help="pods per tree (comma-separated)")
    p.add_argument("--seconds", type=float, default=20.0, help="measurement window per tree")
    p.add_argument("--warmup", type=float, default=4.0, help="seconds before the window (start-up, first writes)")
    p.add_argument("--tree", default="real,fake", help="real, fake or both")
    p.add_argument("--koordd", help="the koordd to run (default: this venv's), e.g. another checkout's to compare")
    p.add_argument("--profile", type=Path, help="directory for a cProfile file per run (<tree>-<cgroups>.prof)")
    p.add_argument("--metrics", default="off", help="off, on or both (off,on): the metrics endpoint, scraped")
    p.add_argument("--scrape-every", type=float, default=5.0, help="seconds between scrapes with --metrics on")
    p.add_argument("--config", default="every-loop", choices=("every-loop", "shipped"),
                   help="every loop on at 1 s (the default), or config/koordd.toml as shipped (rule slack: the "
                        "run-queue sensor) with its LS and BE classes on the tree")
    p.add_argument("--runq-source", choices=("schedstat",), help="the run-queue sensor on this source only")
    args = p.parse_args(argv)
    modes = [m == "on" for m in args.metrics.split(",")]
    trees = args.tree.split(",")
    if "real" in trees and os.geteuid() != 0:
        p.error("the real tree needs root (it creates cgroups); use --tree fake")
    what = "every loop on, 1 s interval" if args.config == "every-loop" else "config/koordd.toml as shipped"
    print(f"koordd overhead, {what}, {args.seconds:g} s window; {os.cpu_count()} CPUs, "
          f"{'cgroup v2' if is_v2_host() else 'cgroup v1/hybrid'} host")
    print("\n| tree | cgroups | metrics | run-queue sensor | koordd CPU (ms per s) | RSS (MB) | peak RSS (MB) | scrape (ms, KiB) |\n"
          "|---|---|---|---|---|---|---|---|")
    for tree in trees:
        for n in (int(x) for x in args.counts.split(",")):
            for metrics in modes:
                prof = None
                if args.profile:
                    args.profile.mkdir(parents=True, exist_ok=True)
                    prof = args.profile / f"{tree}-{n + 3}{'-metrics' if metrics else ''}.prof"
                r = measure(tree, n, args.seconds, args.warmup, args.koordd, prof, metrics, args.scrape_every,
                            args.config == "shipped", args.runq_source)
                scrape = f"{r['scrape_ms']:.1f}, {r['scrape_kb']:.0f}" if r["scrape_ms"] is not None else "-"
                print(f"| {r['tree']} | {r['cgroups']} | {r['metrics']} | {r['runq']} | {r['cpu_ms_per_s']:.1f} | {r['rss_mb']:.1f} | "
                      f"{r['peak_rss_mb']:.1f} | {scrape} |", flush=True)
    return 0
