"""HTB against EDT, the two ways koordd can hold BE's egress under a ceiling, on this host's kernel.

    sudo .venv/bin/python scripts/bench-net [--link 20mbit] [--ls 8mbit] [--fast 1gbit] [--seconds 10]
                                            [--modes none,htb,edt] [--json FILE]

A veth pair into a network namespace of the benchmark's own, iperf3 servers and a UDP echo server
there, senders in cgroups of its own (BE, LS). koordd's backends (through its actuator, put back at
the end) set the enforcement and a fixed BE ceiling; no loop runs, so only the mechanism is measured:

- shaping: link --link, LS sends UDP at --ls, BE TCP as fast as it may under the ceiling Heracles'
  rule gives (link - LS - max(5% of link, 10% of LS)); BE's and LS's rates (iperf3's payload, over
  the last --seconds after 5 s of ramp-up) and LS's round trip (100 small UDP echoes a second from
  the LS cgroup: p50, p99, max) while both send;
- cost: BE alone under a ceiling of --fast, CPU time of the whole host (user, system, irq, softirq
  from /proc/stat) per Gbit BE sent.

"none" is the device unshaped (BE unlimited: the veth is only as fast as the CPUs). "edt" needs an
fq qdisc in the kernel (skipped where CONFIG_NET_SCH_FQ is off). Needs root, libbpf1, pyroute2, iperf3.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from koordtest.bench.cgroup_tree import CgroupTree
from koordtest.bench.procstat import node_cpu_ticks

from koordd.act.actuator import Actuator
from koordd.core.backend import Backends
from koordd.kernel.cgroupfs import CgroupFS, detect_layout
from koordd.core.decisions import REFUSED
from koordd.act.decision_log import DecisionLog
from koordd.core.loop import Action
from koordd.backends.netclass import ClassifierBackend, NetClassBackend, SharedClassifier
from koordd.act.journal import RestoreJournal
from koordd.backends.tc import TcBackend
from koordd.kernel.netlink import kernel_has_qdisc
from koordd.core.units import parse_rate

NS, HOST, PEER = f"kdbench{os.getpid()}", "kdb0", "kdb1"
HOST_IP, PEER_IP = "10.79.0.1", "10.79.0.2"
ECHO_PORT, BE_PORT, LS_PORT = 7007, 5201, 5202
ECHO_SERVER = ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
               f"s.bind(('{PEER_IP}', {ECHO_PORT}))\n"
               "while True:\n    data, peer = s.recvfrom(2048)\n    s.sendto(data, peer)\n")


def sh(*args: str) -> None:
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


class Link:
    """The veth pair and the namespace's servers; removed on exit."""

    def __enter__(self) -> "Link":
        sh("ip", "netns", "add", NS)
        sh("ip", "link", "add", HOST, "type", "veth", "peer", "name", PEER, "netns", NS)
        sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", HOST)
        sh("ip", "link", "set", HOST, "up")
        sh("ip", "-n", NS, "addr", "add", f"{PEER_IP}/24", "dev", PEER)
        sh("ip", "-n", NS, "link", "set", PEER, "up")
        self.servers = [subprocess.Popen(["ip", "netns", "exec", NS, "iperf3", "-s", "-p", str(port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        for port in (BE_PORT, LS_PORT)]
        self.servers.append(subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, "-c", ECHO_SERVER]))
        time.sleep(1.0)
        return self

    def __exit__(self, *exc) -> None:
        for p in self.servers:
            p.kill()
            p.wait()
        subprocess.run(["ip", "link", "del", HOST], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", NS], stderr=subprocess.DEVNULL)


class Shaper:
    """koordd's tc, classifier and class knobs on HOST, through its actuator (journal in a temp dir)."""

    def __init__(self, tree: CgroupTree, state: Path):
        self.fs = CgroupFS(detect_layout())
        shared = SharedClassifier()
        self.backends = Backends([TcBackend(shared), ClassifierBackend(shared), NetClassBackend(self.fs, shared)])
        self.actuator = Actuator(self.backends, RestoreJournal(state), DecisionLog(state, send=lambda m, **f: None))
        self.tree = tree

    def set(self, mode: str, link: int, ceil: int) -> None:
        self.actuator.restore_all("next mode")
        if mode == "none":
            return
        actions = [Action(HOST, "tc.shaping", "edt" if mode == "edt" else f"htb {link}", {}, mode),
                   Action(HOST, "tc.classifier", "attached", {}, "classify"),
                   Action(self.tree.path("ls"), "net_class", "ls", {}, "LS"),
                   Action(self.tree.path("be"), "net_class", "be", {}, "BE"),
                   Action(HOST, "tc.be_ceil", str(ceil), {}, "BE's ceiling")]
        refused = [d for d in self.actuator.apply("bench", actions) if d.outcome == REFUSED]
        if refused:
            raise SystemExit(f"{mode}: {refused[0].knob} refused: {refused[0].error}")

    def close(self) -> None:
        self.actuator.restore_all("done")
        self.backends.close()


def iperf3(tree: CgroupTree, child: str, port: int, seconds: int, *extra: str) -> subprocess.Popen:
    return tree.spawn(child, ["iperf3", "-c", PEER_IP, "-p", str(port), "-t", str(seconds), "-O", "5", "-J",
                              *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def sent_bps(p: subprocess.Popen) -> float:
    out, _ = p.communicate(timeout=120)
    end = json.loads(out)["end"]
    return (end.get("sum_sent") or end["sum"])["bits_per_second"]


def echo_rtts(tree: CgroupTree, seconds: float) -> list[float]:
    """Round trips in µs of 100 small UDP echoes a second, sent from the LS cgroup."""
    code = ("import socket, time, json, sys\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.0)\n"
            f"out = []; end = time.monotonic() + {seconds}\n"
            "while time.monotonic() < end:\n"
            "    t = time.monotonic_ns()\n"
            f"    s.sendto(b'x' * 64, ('{PEER_IP}', {ECHO_PORT}))\n"
            "    try:\n        s.recvfrom(2048); out.append((time.monotonic_ns() - t) / 1000)\n"
            "    except OSError:\n        out.append(1e6)\n"
            "    time.sleep(0.01)\n"
            "json.dump(out, sys.stdout)\n")
    p = tree.spawn("ls", [sys.executable, "-c", code], stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=seconds + 60)
    return json.loads(out)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def shaping_run(tree: CgroupTree, shaper: Shaper, mode: str, link: int, ls_rate: int, seconds: int) -> dict:
    ceil = int(link - ls_rate - max(0.05 * link, 0.10 * ls_rate))
    shaper.set(mode, link, ceil)
    be = iperf3(tree, "be", BE_PORT, seconds)
    ls = iperf3(tree, "ls", LS_PORT, seconds, "-u", "-b", str(ls_rate))
    time.sleep(5)
    rtts = echo_rtts(tree, seconds - 1)
    be_bps, ls_bps = sent_bps(be), sent_bps(ls)
    return {"mode": mode, "link_bps": link, "be_ceil_bps": ceil if mode != "none" else None, "be_bps": be_bps,
            "ls_bps": ls_bps, "rtt_p50_us": quantile(rtts, 0.5), "rtt_p99_us": quantile(rtts, 0.99),
            "rtt_max_us": max(rtts), "echoes": len(rtts)}


def cost_run(tree: CgroupTree, shaper: Shaper, mode: str, fast: int, seconds: int) -> dict:
    shaper.set(mode, fast, fast)
    be = iperf3(tree, "be", BE_PORT, seconds)
    time.sleep(5)                                       # iperf3's omitted seconds
    before, t0 = node_cpu_ticks()[0], time.monotonic()
    be_bps = sent_bps(be)
    cpu_s = (node_cpu_ticks()[0] - before) / os.sysconf("SC_CLK_TCK")
    wall = time.monotonic() - t0
    return {"mode": mode, "be_ceil_bps": fast if mode != "none" else None, "be_bps": be_bps,
            "cpu_s_per_gbit": cpu_s / (be_bps * wall / 1e9), "cpus_busy": cpu_s / wall}


def mbit(v) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--link", default="20mbit")
    p.add_argument("--ls", default="8mbit")
    p.add_argument("--fast", default="1gbit")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--modes", default="none,htb,edt")
    p.add_argument("--json")
    args = p.parse_args(argv)
    link, ls_rate, fast = parse_rate(args.link), parse_rate(args.ls), parse_rate(args.fast)
    modes = args.modes.split(",")
    if "edt" in modes and kernel_has_qdisc("sch_fq") is False:
        print("edt: skipped, this kernel has no fq qdisc (CONFIG_NET_SCH_FQ)")
        modes.remove("edt")
    results = {"host": os.uname().release, "cpus": os.cpu_count(), "shaping": [], "cost": []}
    with tempfile.TemporaryDirectory() as state, Link(), CgroupTree(f"koordd-net-{os.getpid()}", ()) as tree:
        tree.create(["be", "ls"])
        shaper = Shaper(tree, Path(state))
        try:
            for mode in modes:
                results["shaping"].append(shaping_run(tree, shaper, mode, link, ls_rate, args.seconds))
                results["cost"].append(cost_run(tree, shaper, mode, fast, args.seconds))
        finally:
            shaper.close()
    print_report(results, link, ls_rate, fast)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def print_report(results: dict, link: int, ls_rate: int, fast: int) -> None:
    print(f"kernel {results['host']}, {results['cpus']} CPUs; link {mbit(link)} Mbit/s, LS {mbit(ls_rate)} Mbit/s UDP")
    print("| mode | BE ceiling | BE | BE/ceiling | LS | LS echo p50 / p99 / max (µs) |")
    print("|---|---|---|---|---|---|")
    for r in results["shaping"]:
        share = f"{r['be_bps'] / r['be_ceil_bps']:.0%}" if r["be_ceil_bps"] else "-"
        print(f"| {r['mode']} | {mbit(r['be_ceil_bps'])} | {mbit(r['be_bps'])} | {share} | {mbit(r['ls_bps'])} | "
              f"{r['rtt_p50_us']:.0f} / {r['rtt_p99_us']:.0f} / {r['rtt_max_us']:.0f} |")
    print(f"\nBE alone under {mbit(fast)} Mbit/s (Mbit/s payload; CPU seconds of the host per Gbit sent)")
    print("| mode | BE | CPU s per Gbit | CPUs busy |")
    print("|---|---|---|---|")
    for r in results["cost"]:
        print(f"| {r['mode']} | {mbit(r['be_bps'])} | {r['cpu_s_per_gbit']:.2f} | {r['cpus_busy']:.2f} |")
