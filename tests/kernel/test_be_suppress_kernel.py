"""End to end on the real kernel: koordd's be_suppress throttles a busy BE cgroup so an LS cgroup
keeps its CPU, restores the quota when it stops, and after a crash either restores the quota (loop
now disabled) or re-adopts it (loop still enabled).

Needs root and a hybrid (v1 cpu + cpuacct + unified tree) or a cgroup v2 host; skipped otherwise.
On the 2-CPU machines this runs on: one LS busy loop and two BE busy loops. Uncontrolled, the two
groups share the node about equally (BE ~1.0 core, LS ~1.0). With threshold 65%, LS + system + BE
may use 1.3 cores, so BE's allowance is about 0.3 core. On n CPUs the test scales: n/2 LS loops,
n BE loops, BE allowance about 0.15 n. Bounds are loose on purpose. Other work on the node (up to
half of it) shrinks BE's allowance further, as it should: the checks compare BE's share of the
test's CPU with and without koordd, and give LS what the other work and BE left.
"""
from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from koordtest.kernel import NCPU, calm_window, wait_for

pytestmark = pytest.mark.kernel

LOOP = "be_suppress"
SETTLE = 2.0          # seconds after the first quota before measuring
MEASURE = 4.0         # seconds of measurement
MAX_OTHER = 0.5 * NCPU     # CPUs busy outside the test's cgroups (koordd included) for a window to count
N_LS = max(1, NCPU // 2)
N_BE = max(2, NCPU)


def start_hogs(cgroups) -> None:
    if NCPU < 2:
        pytest.skip("needs at least 2 CPUs")
    for _ in range(N_LS):
        cgroups.spawn_hog("ls")
    for _ in range(N_BE):
        cgroups.spawn_hog("be")


def calm_measure(cgroups, seconds: float) -> dict:
    return calm_window(lambda: cgroups.measure(seconds), MAX_OTHER, "LS and BE's CPU use")


def be_share(m: dict) -> float:
    """BE's part of the CPU the test's two groups used: other work on the node leaves it unchanged."""
    return m["be"] / max(m["be"] + m["ls"], 1e-6)


def applied(koordd, cgroup: str, after: float = 0.0) -> list[dict]:
    return [d for d in koordd.decisions() if d.get("outcome") == "applied" and d.get("loop") == LOOP
            and d.get("cgroup") == cgroup and d.get("knob") == "cpu.max" and d.get("time", 0) >= after]


def wait_for_quota(koordd, cgroups, timeout: float = 20.0) -> list[dict]:
    be = cgroups.cgroup("be")
    found = wait_for(lambda: applied(koordd, be) and cgroups.quota_cores("be") is not None, timeout)
    assert found, (f"koordd wrote no quota on {be} within {timeout}s; decisions: {koordd.decisions()}\n"
                   f"{koordd.log_text()}")
    return applied(koordd, be)


def baseline(cgroups) -> dict:
    time.sleep(1.0)                      # let the hogs spread over the CPUs
    base = calm_measure(cgroups, 3.0)
    assert cgroups.quota_cores("be") is None
    # Sanity: without koordd BE takes about half of what the two groups get (its group's fair share).
    assert be_share(base) > 0.35, \
        f"uncontrolled BE used only {base['be']:.2f} cores (LS {base['ls']:.2f}, other {base['other']:.2f})"
    return base


def test_be_suppress_throttles_be_and_restores_on_sigterm(cgroups, koordd, capsys):
    be = cgroups.cgroup("be")
    original = cgroups.cpu_max("be")
    assert original.startswith("max "), f"fresh cgroup should be unlimited, reads {original!r}"
    start_hogs(cgroups)
    base = baseline(cgroups)

    config = koordd.write_config(enabled=True, interval="500ms")
    started = time.time()
    proc = koordd.start(config)
    wait_for_quota(koordd, cgroups)
    time.sleep(SETTLE)
    assert proc.poll() is None, f"koordd exited early with {proc.returncode}\n{koordd.log_text()}"
    run = calm_measure(cgroups, MEASURE)
    quotas = [q for q in run["quotas"] if q is not None]
    numbers = (f"{NCPU} CPUs; baseline BE {base['be']:.2f} LS {base['ls']:.2f} other {base['other']:.2f} cores; "
               f"with koordd BE {run['be']:.2f} LS {run['ls']:.2f} other {run['other']:.2f} cores; "
               f"BE quota {min(quotas, default=0):.3f}..{max(quotas, default=0):.3f} cores")
    with capsys.disabled():
        print(f"\n[kernel] {numbers}")

    assert cgroups.raw_quota("be") != "-1" and len(quotas) == len(run["quotas"]), \
        f"BE quota not held during the measurement ({run['quotas']}); {numbers}"
    free = (NCPU - run["other"]) / NCPU          # the part of the node other work left to the test
    assert run["be"] < 0.3 * NCPU, f"BE not suppressed: {numbers}"
    assert be_share(run) < 0.6 * be_share(base), f"BE not well below its uncontrolled share: {numbers}"
    assert run["be"] <= max(quotas) * 1.15 + 0.05, f"BE above its quota: {numbers}"
    assert run["be"] >= 0.5 * min(quotas) * free - 0.02, f"BE far below its quota (starved?): {numbers}"
    assert run["ls"] >= 0.8 * min(N_LS, NCPU - run["other"] - run["be"]), f"LS lost CPU: {numbers}"

    rc = koordd.stop(proc)
    assert rc == 0, f"koordd exited {rc} on SIGTERM\n{koordd.log_text()}"
    assert cgroups.raw_quota("be") == ("-1" if cgroups.mode == "hybrid" else "max")
    assert cgroups.cpu_max("be") == original
    assert koordd.held() == [], f"the restore journal still holds {koordd.held()}"

    records = [d for d in koordd.decisions() if d.get("time", 0) >= started]
    writes = applied(koordd, be, after=started)
    assert writes, records
    for d in writes:
        assert re.fullmatch(r"\d+ \d+", d["new"]), d
        quota, period = map(int, d["new"].split())
        assert 2000 <= quota <= 0.5 * NCPU * period, d     # koordd's floor .. half the node at most
        assert "allowance" in d["reason"] and d["reason"]["quota_us"] == quota, d
        assert d["error"] is None, d
    first = writes[0]
    assert first["old"] == original, first
    assert first["new"].endswith(f" {original.split()[1]}"), first    # the period is kept
    # 2 CPUs at 65% with a 1-core LS hog: the allowance is about 0.3 cores, never more than 0.6.
    assert 0 <= first["reason"]["allowance"] <= 0.3 * NCPU, first
    assert records[-1]["outcome"] == "restored" and records[-1]["cgroup"] == be, records[-1]
    assert records[-1]["knob"] == "cpu.max" and records[-1]["new"] == original, records[-1]
    assert not [d for d in records if d["outcome"] == "refused"], records
    with capsys.disabled():
        print(f"[kernel] quotas written (µs per period): {[d['new'] for d in writes]}; "
              f"first allowance {first['reason']['allowance']} cores")


def crash_koordd(cgroups, koordd) -> tuple[str, object]:
    """Start koordd, let it cap BE, SIGKILL it. Returns (original cpu.max, config)."""
    original = cgroups.cpu_max("be")
    start_hogs(cgroups)
    config = koordd.write_config(enabled=True, interval="500ms")
    proc = koordd.start(config)
    wait_for_quota(koordd, cgroups)
    time.sleep(1.0)
    assert koordd.stop(proc, signal.SIGKILL) == -signal.SIGKILL
    # Nothing restored it: the quota stays, and the journal still knows the original.
    assert cgroups.quota_cores("be") is not None, "quota gone after SIGKILL?"
    held = koordd.held()
    assert held is not None and len(held) == 1, held
    assert held[0]["target"] == cgroups.cgroup("be") and held[0]["knob"] == "cpu.max", held
    assert held[0]["original"] == original and held[0]["owner"] == LOOP, held
    return original, config


def test_crash_then_start_with_loop_disabled_restores(cgroups, koordd):
    original, _ = crash_koordd(cgroups, koordd)
    capped = cgroups.cpu_max("be")
    disabled = koordd.write_config(enabled=False, name="disabled.toml")
    since = time.time()
    result = koordd.run_once(disabled)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert cgroups.cpu_max("be") == original, f"quota not restored by --once: {cgroups.cpu_max('be')}\n{out}"
    assert koordd.held() == [], koordd.held()
    restored = [d for d in koordd.decisions() if d.get("time", 0) >= since and d["outcome"] == "restored"]
    assert len(restored) == 1, koordd.decisions()
    r = restored[0]
    assert (r["loop"], r["cgroup"], r["knob"], r["old"], r["new"]) == \
        (LOOP, cgroups.cgroup("be"), "cpu.max", capped, original), r
    assert "not enabled" in r["message"], r


def test_crash_then_restart_with_loop_enabled_readopts(cgroups, koordd):
    original, config = crash_koordd(cgroups, koordd)
    be = cgroups.cgroup("be")
    since = time.time()
    proc = koordd.start(config)
    # It keeps managing the quota: never back to unlimited while it runs (sampled from the restart
    # on), and the journal keeps the true original, not the value the crashed run left.
    seen = []

    def ticked():
        seen.append(cgroups.quota_cores("be"))
        status = koordd.status() or {}
        return status.get("pid") == proc.pid and status.get("loops", {}).get(LOOP, {}).get("ticks", 0) >= 3

    assert wait_for(ticked, timeout=20, step=0.05), koordd.log_text()
    run = cgroups.measure(3.0)
    seen += run["quotas"]
    assert proc.poll() is None, koordd.log_text()
    assert all(q is not None for q in seen), f"quota dropped after restart: {seen}"
    assert run["be"] < 0.3 * NCPU and run["be"] <= max(seen) * 1.15 + 0.05, \
        f"BE not suppressed after restart: BE {run['be']:.2f} cores, quota {min(seen):.3f}..{max(seen):.3f}"
    held = koordd.held()
    assert held and held[0]["original"] == original and held[0]["owner"] == LOOP, held
    assert not [d for d in koordd.decisions() if d.get("time", 0) >= since and d["outcome"] == "restored"], \
        koordd.decisions()
    if not os.path.exists("/run/systemd/journal/socket"):       # else the log went to journald
        assert f"re-adopting {be} cpu.max" in koordd.log_text(), koordd.log_text()
    rc = koordd.stop(proc)
    assert rc == 0, koordd.log_text()
    assert cgroups.cpu_max("be") == original
    assert koordd.held() == []
    last = koordd.decisions()[-1]
    assert (last["outcome"], last["cgroup"], last["new"]) == ("restored", be, original), last


def test_rule_slack_holds_be_at_its_floor_while_ls_waits_and_lets_it_grow_when_ls_is_done(koordd, cgroups):
    """Heracles' rule on the real kernel: with LS's threads waiting behind BE's (run-queue latency far
    over 2 ms), BE drops to its floor; once LS is gone and its pressure has faded, BE grows again."""
    if NCPU < 2:
        pytest.skip("needs at least 2 CPUs")
    ls_hogs = [cgroups.spawn_hog("ls") for _ in range(N_LS)]
    for _ in range(N_BE):
        cgroups.spawn_hog("be")
    p = koordd.start(koordd.write_config(extra='rule = "slack"\n'))
    be = cgroups.cgroup("be")

    def floored():
        return [d for d in applied(koordd, be) if d["reason"].get("rule") == "slack"
                and d["reason"].get("step") == "floor"]
    assert wait_for(floored, 30), f"BE never went to its floor: {koordd.decisions()}\n{koordd.log_text()}"
    first = floored()[0]
    worst = first["reason"]["worst"]
    assert worst["cgroup"] == cgroups.cgroup("ls") and first["reason"]["slack"] < 0, first
    assert cgroups.raw_quota("be") == "2000", cgroups.raw_quota("be")
    print(f"\n[kernel] rule slack: BE to its floor on {worst['signal']} {worst['value']} (target {worst['target']}), "
          f"slack {first['reason']['slack']}")

    for h in ls_hogs:
        h.kill()
    # Grown back: a quota of 0.3 CPUs or more, or none at all (the floor undone: on a host whose other work
    # delays LS as much as BE did, the floor buys nothing and BE gets back what it had).
    grown = wait_for(lambda: (q := cgroups.quota_cores("be")) is None and "none" or q >= 0.3 and q, 90)
    assert grown, f"BE did not grow back after LS left: {koordd.decisions()[-5:]}\n{koordd.log_text()}"
    steps = [d["reason"].get("step") for d in applied(koordd, be)]
    print(f"[kernel] rule slack: after LS left, BE grew back to {grown} CPUs; steps {steps}")
    assert koordd.stop(p) == 0


class LateService:
    """A real HTTP server (a thread of the test, in no test cgroup) exposing a Prometheus histogram whose
    counts grow with time, every request in the (50 ms, 100 ms] bucket: the p99 of any round's requests
    is 99.5 ms (interpolated in that bucket), whatever BE gets. A signal BE cannot move."""
    METRIC = f"ktest_{os.getpid()}_request_duration_seconds"

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        began = time.monotonic()
        metric = self.METRIC

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):           # noqa: N802 - http.server's name
                n = int((time.monotonic() - began) * 1000)          # 1000 requests a second, all late
                body = "".join(f'{metric}_bucket{{le="{le}"}} {c}\n' for le, c in
                               (("0.005", 0), ("0.01", 0), ("0.05", 0), ("0.1", n), ("+Inf", n)))
                body += f"{metric}_count {n}\n{metric}_sum {n * 0.075}\n"
                data = body.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def slo_toml(self) -> str:
        """LS's [classes.slo] on this service: a p99 under 5 ms, from its histogram."""
        return (f'[classes.slo]\nlatency_p99 = "5ms"\nsource = "prometheus"\nurl = "{self.url}"\n'
                f'metric = "{self.METRIC}"\n')

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_rule_slack_undoes_a_cut_that_bought_a_missed_slo_nothing_and_the_lever_rests(koordd, cgroups):
    """Every cut is an experiment, on the real kernel: LS's SLO (p99 under 5 ms, from its own Prometheus
    histogram) is missed by every request (50-100 ms) whatever BE gets, and BE is one real busy loop. koordd
    cuts BE once the SLO has been missed for half the window (to its floor), sees the cut buy nothing (the p99
    stays 99.5 ms), gives BE back the cpu.max it had before the first cut, lets the be_cap lever rest (60 s) and, every cut resting, leaves BE alone.
    LS's cgroup stays empty: no run-queue or pressure signal of its own to move."""
    cgroups.spawn_hog("be")
    original = cgroups.cpu_max("be")
    service = LateService()
    try:
        config = koordd.write_config(extra='rule = "slack"\nexperiment_window = "4s"\nlever_rest = "60s"\n',
                                     ls_extra=service.slo_toml())
        ls = cgroups.cgroup("ls")
        p = koordd.start(config)
        be = cgroups.cgroup("be")

        def undone():
            return [d for d in koordd.decisions() if d.get("loop") == LOOP and d.get("cgroup") == be
                    and str((d.get("reason") or {}).get("step", "")).startswith("undo: cut bought nothing")]
        found = wait_for(undone, 60)
        assert found, (f"no cut undone: {[(d['reason'].get('step'), d['new']) for d in applied(koordd, be)]}\n"
                       f"{koordd.log_text()}")
        d = found[0]
        cuts = [a for a in applied(koordd, be) if a["time"] < d["time"]]
        steps = [a["reason"].get("step") for a in cuts]
        # the first cut once the SLO has been missed for half the window (2 s): below zero twice, so the floor
        assert steps and all(s.startswith(("shrink", "floor")) for s in steps), (steps, cuts)
        assert cuts[0]["old"] == original, (cuts[0], original)
        for a in cuts:
            worst = a["reason"]["worst"]
            assert (worst["cgroup"], worst["signal"], worst["target"]) == (ls, "app_p99_us", 5000), a
            assert worst["value"] >= 50000, a
        e = d["reason"]["experiment"]
        assert e["verdict"] == "bought nothing" and e["lever"] == "be_cap" and e["signal"] == "app_p99_us", d
        assert e["after"] >= e["before"] - e["margin"], d
        assert d["outcome"] == "applied" and d["new"] == original, (d, original)   # BE got back what it had
        assert wait_for(lambda: cgroups.cpu_max("be") == original, 5), cgroups.cpu_max("be")
        print(f"\n[kernel] cut bought nothing: steps {steps}; {e['signal']} {e['before']} -> {e['after']} "
              f"(noise {e['noise']}, margin {e['margin']}); BE back to {d['new']}")

        # The lever rests 60 s: no cut while it does, BE's cpu.max stays what it had, the loop leaves BE alone.
        time.sleep(6.0)
        later = [a for a in applied(koordd, be) if a["time"] > d["time"]]
        assert not later, f"the lever should rest 60 s, yet BE's cpu.max moved again: {later}"
        assert cgroups.cpu_max("be") == original, cgroups.cpu_max("be")
        # "leave" changes no knob, so it is in no decision record: status.json counts the rounds it was chosen.
        status = koordd.status()["loops"][LOOP]["report"]["levers"]
        print(f"[kernel] after the undo: levers {status}")
        print("[kernel] decisions:", [(round(x["time"] - d["time"], 1), x.get("outcome"), x["reason"].get("step"),
                                       x.get("new")) for x in koordd.decisions() if x.get("loop") == LOOP])
        assert status["be_cap"]["resting_s"].get("app_p99_us", 0) > 40, status
        assert status["be_cap"]["last"]["verdict"] == "bought nothing", status
        assert status.get("leave", {}).get("chosen", 0) >= 1, status
        assert koordd.stop(p) == 0
        assert cgroups.cpu_max("be") == original
    finally:
        service.close()


# A real service whose latency truly depends on BE's CPU: one process in LS's cgroup that does a fixed CPU
# burst (WORK_S of its own CPU time, calibrated with thread_time before BE starts) every PERIOD_S, and counts
# each burst's response time (from when it was due to its end: a late wake-up counts) in a Prometheus
# histogram it serves on 127.0.0.1 (port 0: its own). A burst takes WORK_S when the service has its CPU to
# itself and longer when BE's busy loops share it. Argv: work seconds, period seconds, metric name; it prints
# "<port>" once serving.
BURSTS = r'''
import sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
work, period, metric = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
bounds = (0.001, 0.002, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.012, 0.014, 0.016, 0.018, 0.02, 0.025,
          0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 1.0)
counts, total, lock = [0] * (len(bounds) + 1), [0.0], threading.Lock()

def spin(n):
    x = 0
    for i in range(n):
        x += i
    return x

n = 1000
while True:                       # n such that spin(n) costs `work` of CPU time
    t = time.thread_time()
    spin(n)
    took = time.thread_time() - t
    if took > 0.05:
        n = max(int(n * work / took), 1)
        break
    n *= 2

class Metrics(BaseHTTPRequestHandler):
    def do_GET(self):
        with lock:
            c, s = list(counts), total[0]
        lines, acc = [], 0
        for le, k in zip([*map(repr, bounds), "+Inf"], c):
            acc += k
            lines.append(f'{metric}_bucket{{le="{le}"}} {acc}')
        data = ("\n".join(lines + [f"{metric}_count {acc}", f"{metric}_sum {s}"]) + "\n").encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(server.server_address[1], flush=True)
due = time.monotonic()
while True:
    spin(n)
    took = time.monotonic() - due     # from when the burst was due: a late wake-up counts too
    i = 0
    while i < len(bounds) and took > bounds[i]:
        i += 1
    with lock:
        counts[i] += 1
        total[0] += took
    due += period
    now = time.monotonic()
    if due < now:                 # open loop: a late burst does not make the next ones come faster
        due = now + period
    time.sleep(due - now)
'''


class BurstService:
    """BURSTS running in the test's LS cgroup, and the test's own reading of its histogram."""
    WORK_S, PERIOD_S = 0.006, 0.010       # 0.6 CPU, 100 bursts a second: the SLO's p90 is over 10 s
    METRIC = f"ktest_{os.getpid()}_burst_seconds"

    def __init__(self, cgroups):
        self.proc = cgroups.spawn("ls", [sys.executable, "-c", BURSTS, str(self.WORK_S), str(self.PERIOD_S),
                                         self.METRIC], stdout=subprocess.PIPE)
        line = self.proc.stdout.readline().decode().strip()
        assert line.isdigit(), f"the burst service did not start (said {line!r}, exit {self.proc.poll()})"
        self.url = f"http://127.0.0.1:{int(line)}/metrics"

    def buckets(self) -> list[tuple[float, int]]:
        with urllib.request.urlopen(self.url, timeout=10) as r:
            text = r.read().decode()
        out = []
        for line in text.splitlines():
            if line.startswith(f"{self.METRIC}_bucket"):
                le = line.split('le="')[1].split('"')[0]
                out.append((math.inf if le == "+Inf" else float(le), int(line.split()[-1])))
        return out

    def quantiles_ms(self, seconds: float) -> tuple[float, float, int]:
        """(p90, p99) of the bursts' response times over the next `seconds`, in ms (each the upper bound of the
        bucket it falls in), and the bursts counted."""
        a = self.buckets()
        time.sleep(seconds)
        b = self.buckets()
        counts = [(le, y - x) for (le, x), (_, y) in zip(a, b)]
        n = counts[-1][1]
        p90, p99 = (next((le * 1000 for le, c in counts if c >= q * n), math.inf) for q in (0.9, 0.99))
        return p90, p99, n


# The SLO: 90% of the bursts within 15 ms (violation_target 10: the quantile held to latency_p99 is the p90).
# On the shared 2-CPU host, BE at 16 times LS's weight and uncapped, koordd read it at 61-108 ms; with BE at
# its floor at 7.8-15 ms (4 runs). The p99 of 1000 bursts is the other work's as much as BE's at the floor:
# its drop hardly exceeded its noise.
TARGET_MS = 15
# The p90 is taken over 10 s (1000 bursts at most 100 a second): a cut shows fully about 10 s after it.
# The after window starts 0.4 x this after the cut, so most of it lies past those 10 s.
WINDOW = "24s"
# LS's run-queue latency and pressure guard nothing here: on a shared host other work makes LS wait
# for a CPU whatever BE gets, and a guard's bounded cut (tested on its own) would interleave with the SLO's.
LOOSE_HEALTH = '[classes.health]\nrunq_p99 = "10s"\nrunq_mean = "10s"\ncpu_pressure = 100\n'


def test_rule_slack_keeps_a_cut_that_bought_a_missed_slo_its_latency_and_the_lever_is_credited(koordd, cgroups):
    """Every cut is an experiment, the other half, on the real kernel: a real service in LS (a 6 ms CPU burst
    every 10 ms, its response times in its own Prometheus histogram, the SLO's source) and more BE busy loops
    than CPUs at 16 times LS's cpu weight (no cpu.idle: qos_baseline is off), so BE truly takes CPU from it. With BE
    uncapped the responses' p90 is far over the SLO's 15 ms; koordd cuts BE on the SLO (app_p99_us) with its
    be_cap lever, the cut brings the p90 down by more than the signal's noise, and it is judged "helped": kept
    (never undone as "bought nothing"), the lever credited in status.json. Stop, while BE is still capped,
    gives BE back its cpu.max. The wake lever is off: it takes no CPU from BE and would be tried first,
    delaying the cut this is about. BE grows back slowly once LS is healthy (5% of the node a round), so it
    is still capped when the test stops koordd."""
    if NCPU < 2:
        pytest.skip("needs at least 2 CPUs")
    original = cgroups.cpu_max("be")
    # BE weighs 16 times LS, so the miss is deep wherever the test runs and koordd's cut is the floor, whose
    # gain no host's noise hides. At 4 times (BE's half of its weight on each CPU against LS's whole: LS got a
    # third, and more after each sleep) CI's quiet host read a p90 of 16.3 ms against the SLO's 15: a shallow
    # miss, so a shrink of 0.51 BE cores, which bought 1.1 ms against a 5.3 ms margin ("bought nothing").
    for group, shares, weight in (("be", "4096", "400"), ("ls", "256", "25")):
        cpu = cgroups.dir("cpu", group)
        knob = cpu / ("cpu.shares" if (cpu / "cpu.shares").exists() else "cpu.weight")
        knob.write_text(shares if knob.name == "cpu.shares" else weight)
    service = BurstService(cgroups)
    for _ in range(2 * NCPU):
        cgroups.spawn_hog("be")
    be, ls = cgroups.cgroup("be"), cgroups.cgroup("ls")
    time.sleep(1.0)
    p90, p99, n = service.quantiles_ms(4.0)
    print(f"\n[kernel] {NCPU} CPUs, {2 * NCPU} BE busy loops uncapped: the service's response time p90 <= {p90:g} ms, "
          f"p99 <= {p99:g} ms over {n} bursts of {BurstService.WORK_S * 1000:g} ms")
    config = koordd.write_config(extra=f'rule = "slack"\nexperiment_window = "{WINDOW}"\nwake_lever = false\n'
                                       'slack_grow_percent = 5\n',
                                 ls_extra=f'{LOOSE_HEALTH}[classes.slo]\nlatency_p99 = "{TARGET_MS}ms"\n'
                                          f'violation_target = 10\nsource = "prometheus"\nurl = "{service.url}"\n'
                                          f'metric = "{BurstService.METRIC}"\n')
    started = time.time()
    p = koordd.start(config)

    def ours() -> list[dict]:
        return [d for d in koordd.decisions() if d.get("loop") == LOOP and d.get("cgroup") == be
                and d.get("time", 0) >= started]

    def helped() -> list[dict]:
        return [d for d in ours() if ((d.get("reason") or {}).get("experiment") or {}).get("verdict") == "helped"]

    def steps() -> list:
        return [(round(d["time"] - started, 1), d["reason"].get("step"), d.get("new"),
                 ((d["reason"].get("experiment") or {}).get("verdict"))) for d in ours()]

    def levers() -> dict | None:
        return (((koordd.status() or {}).get("loops", {}).get(LOOP, {}).get("report")) or {}).get("levers")

    def first_cut() -> dict | None:      # the cut's start: its before, noise and drift, to read a failure by
        return next((d["reason"].get("experiment") for d in ours() if d["reason"].get("experiment")), None)

    found = wait_for(helped, 120)
    assert found, f"no cut judged helped: {steps()}\nfirst cut {first_cut()}\nlevers {levers()}\n{koordd.log_text()}"
    # status.json is written on its own beat: wait for it to count the verdict the decision shows
    record = wait_for(lambda: (lv := levers()) and lv["be_cap"]["by_signal"].get("app_p99_us", {}).get("helped")
                      and lv, 10) or levers()
    # A cut judged to help while LS is still unhealthy is first released for one window to make sure (A/B/A), and
    # put back once the release confirms it: the stop, whose restore is checked, comes when BE is capped again.
    # (Seen on a fresh clone: the verdict was the release itself, and the stop came inside the release window.)
    wait_for(lambda: not cgroups.cpu_max("be").startswith("max "), 3 * float(WINDOW.rstrip("s")) + 10)
    capped = cgroups.cpu_max("be")
    assert koordd.stop(p) == 0, koordd.log_text()
    restored = cgroups.cpu_max("be")
    d = found[0]
    e = d["reason"]["experiment"]
    cuts = [a for a in applied(koordd, be, after=started) if a["time"] <= d["time"]
            and str(a["reason"].get("step", "")).startswith(("shrink", "floor"))]
    assert cuts, steps()
    # The cut judged: the last one before the verdict, with any deeper step of the same experiment before it.
    experiment = cuts[-1]["reason"]["experiment"]
    first = next(a for a in cuts if a["reason"]["experiment"].get("started") == experiment.get("started"))
    worst = first["reason"]["worst"]
    assert (worst["cgroup"], worst["signal"], worst["target"]) == (ls, "app_p99_us", TARGET_MS * 1000), first
    # a cut comes once the SLO's slack is under 5% (core/experiment.py's confirmation)
    assert worst["value"] >= 0.95 * TARGET_MS * 1000 and experiment["lever"] == "be_cap", first
    assert (e["lever"], e["cgroup"], e["signal"]) == ("be_cap", ls, "app_p99_us"), d
    # bought more than the signal's noise: by its margin, or by ratio (core/experiment.py: a p99 that wandered
    # 60-120 ms uncapped has a noise of tens of ms; here 92.91 -> 14.66 ms against an 86.36 ms margin, x6.3)
    ratio = e["by_ratio"] or {}
    assert e["before"] - e["after"] > e["margin"] > 0 or ratio.get("factor", 0) > ratio.get("needed", math.inf), d
    # Kept: between the cut and its verdict nothing undid it, and the verdict's round is no undo. (An earlier
    # cut may have been judged "bought nothing" on a busy host: a 2-round median before it, the first
    # rounds of a fresh koordd; that is the other test's half.)
    undone = [a for a in ours() if first["time"] <= a["time"] <= d["time"]
              and str(a["reason"].get("step", "")).startswith("undo")]
    assert not undone, (undone, steps())
    assert not str(d["reason"].get("step", "")).startswith("undo"), d
    print(f"[kernel] cut on {worst['signal']} {worst['value'] / 1000:.2f} ms (target {worst['target'] / 1000:g} ms): "
          f"BE cpu.max {first['old']} -> {first['new']}; verdict {e['verdict']}: {e['signal']} "
          f"{e['before'] / 1000:.2f} -> {e['after'] / 1000:.2f} ms (noise {e['noise'] / 1000:.2f} ms, margin "
          f"{e['margin'] / 1000:.2f} ms, {e['n_before']}/{e['n_after']} rounds) for {e['be_given_up_cores']} BE "
          f"cores; then {d['reason'].get('step')} to {d['new']}")
    print(f"[kernel] be_cap: {record['be_cap']}")
    print("[kernel] decisions:", steps())
    print(f"[kernel] at stop BE's cpu.max {capped} -> {restored} (original {original})")
    credit = record["be_cap"]["by_signal"]["app_p99_us"]
    assert credit["helped"] >= 1 and credit["mean_gain"] > 0, record
    assert not capped.startswith("max "), f"BE grew back to no cap before the stop: {capped}; {steps()}"
    assert restored == original, (restored, original)
    last = koordd.decisions()[-1]
    assert (last["outcome"], last["cgroup"], last["knob"], last["new"]) == ("restored", be, "cpu.max", original), last
    assert koordd.held() == [], koordd.held()
