"""End to end on the real kernel: koordd's cpu_burst gives a bursty LS cgroup with a CPU quota fewer
throttled periods, takes a raised quota back to its base when the node gets loaded, and puts the
quota and the burst back on SIGTERM.

Needs root, a hybrid (v1 cpu + cpuacct + unified tree) or a cgroup v2 host, and CFS burst
(`cpu.cfs_burst_us` / `cpu.max.burst`, kernel 5.14+); skipped otherwise.

The LS cgroup gets a quota of half a CPU (50000/100000 µs). The bursty load is one thread that
needs 30-80 ms of CPU, then sleeps 70-100 ms, in a fixed sequence: about 0.35 CPU on average, so the
quota is enough on average but a burst of more than 50 ms of CPU in one 100 ms period is throttled.
With the burst (= the quota: koordlet's 1000% clamped) the unused quota of the sleeps is banked and
spent on the next burst; with dynamic quota a cgroup still throttled on an idle node gets more quota.
Both phases (koordd off, then on) run the same load for the same time in the same cgroup.
"""
from __future__ import annotations

import sys
import time

import pytest

from koordtest.kernel import NCPU, proc_stat_busy as _proc_stat_busy, calm_window, wait_for

pytestmark = pytest.mark.kernel

LOOP = "cpu_burst"
PERIOD = 100_000
BASE = 50_000
WINDOW = 12.0          # seconds of each throttling measurement
SETTLE = 3.0           # seconds after koordd's first burst before measuring
# CPUs busy outside the test's cgroups (koordd included) for a window to count: a burst needs up to
# 0.8 of a CPU within one period: the rest of the node must leave LS at least one whole CPU.
MAX_OTHER = NCPU - 1.0

BURSTY = """\
import time
i = 0
while True:
    need = (30 + (i * 37) % 51) / 1000      # 30..80 ms of CPU
    nap = (70 + (i * 53) % 31) / 1000       # 70..100 ms asleep
    end = time.thread_time() + need
    while time.thread_time() < end:
        pass
    time.sleep(nap)
    i += 1
"""


# --- helpers on the test's own cgroups ------------------------------------------------------------

def require_burst(cgroups) -> None:
    if NCPU < 2:
        pytest.skip("needs at least 2 CPUs")
    name = "cpu.cfs_burst_us" if cgroups.mode == "hybrid" else "cpu.max.burst"
    if not (cgroups.dir("cpu", "ls") / name).exists():
        pytest.skip(f"kernel has no CFS burst ({name}, Linux 5.14+)")


def set_quota(cgroups, child: str, quota: int, period: int = PERIOD) -> None:
    d = cgroups.dir("cpu", child)
    if cgroups.mode == "hybrid":
        (d / "cpu.cfs_period_us").write_text(str(period))
        (d / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        (d / "cpu.max").write_text(f"{quota} {period}")


def quota(cgroups, child: str = "ls") -> int | None:
    q = cgroups.cpu_max(child).split()[0]
    return None if q == "max" else int(q)


def burst(cgroups, child: str = "ls") -> int:
    d = cgroups.dir("cpu", child)
    return int((d / ("cpu.cfs_burst_us" if cgroups.mode == "hybrid" else "cpu.max.burst")).read_text())


def raw_burst_file(cgroups, child: str = "ls") -> str:
    d = cgroups.dir("cpu", child)
    return (d / ("cpu.cfs_burst_us" if cgroups.mode == "hybrid" else "cpu.max.burst")).read_text().strip()


def cpu_stat(cgroups, child: str = "ls") -> dict[str, int]:
    out = {}
    for line in (cgroups.dir("cpu", child) / "cpu.stat").read_text().splitlines():
        k, _, v = line.partition(" ")
        out[k] = int(v)
    return out


def throttling(cgroups, seconds: float) -> dict:
    """Δnr_periods, Δnr_throttled and CPU use of ls over a window in which the rest of the node left
    LS room to burst (see calm_window)."""
    def window() -> dict:
        s0, u0, n0, t0 = cpu_stat(cgroups), cgroups.usage_ns("ls"), _proc_stat_busy(), time.monotonic()
        b0 = cgroups.usage_ns("be")
        time.sleep(seconds)
        s1, u1, n1, dt = cpu_stat(cgroups), cgroups.usage_ns("ls"), _proc_stat_busy(), time.monotonic() - t0
        b1 = cgroups.usage_ns("be")
        ls_cores, be_cores = (u1 - u0) / 1e9 / dt, (b1 - b0) / 1e9 / dt
        node = NCPU * (n1[0] - n0[0]) / max(n1[1] - n0[1], 1)
        return {"periods": s1["nr_periods"] - s0["nr_periods"], "throttled": s1["nr_throttled"] - s0["nr_throttled"],
                "ls": ls_cores, "other": max(node - ls_cores - be_cores, 0.0)}
    return calm_window(window, MAX_OTHER, "LS throttling")


def config(koordd, **options) -> object:
    opts = {"enabled": "true", "interval": '"500ms"', **options}
    extra = "\n[loops.cpu_burst]\n" + "".join(f"{k} = {v}\n" for k, v in opts.items())
    return koordd.write_config(enabled=False, interval="500ms", extra=extra)     # be_suppress off


def records(koordd, knob: str | None = None, outcome: str | None = None) -> list[dict]:
    return [d for d in koordd.decisions() if d.get("loop") == LOOP and d.get("cgroup").endswith("/ls")
            and (knob is None or d.get("knob") == knob) and (outcome is None or d.get("outcome") == outcome)]


def stop_and_check_restored(koordd, cgroups, proc) -> None:
    rc = koordd.stop(proc)
    assert rc == 0, f"koordd exited {rc} on SIGTERM\n{koordd.log_text()}"
    raw_quota = (cgroups.dir("cpu", "ls") / ("cpu.cfs_quota_us" if cgroups.mode == "hybrid" else "cpu.max")) \
        .read_text().split()[0]
    assert raw_quota == str(BASE), f"quota not restored: {raw_quota}"
    assert raw_burst_file(cgroups) == "0", f"burst not restored: {raw_burst_file(cgroups)}"
    assert koordd.held() == [], f"the restore journal still holds {koordd.held()}"
    assert not [d for d in koordd.decisions() if d.get("outcome") == "refused"], koordd.decisions()


# --- tests ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dynamic_quota", [False, True], ids=["burst-only", "burst-and-dynamic-quota"])
def test_bursty_ls_is_throttled_less_with_cpu_burst(cgroups, koordd, capsys, dynamic_quota):
    require_burst(cgroups)
    set_quota(cgroups, "ls", BASE)
    assert burst(cgroups) == 0
    cgroups.spawn("ls", [sys.executable, "-c", BURSTY])
    time.sleep(1.0)
    off = throttling(cgroups, WINDOW)

    proc = koordd.start(config(koordd, dynamic_quota="true" if dynamic_quota else "false"))
    assert wait_for(lambda: burst(cgroups) == BASE, timeout=20), \
        f"koordd set no burst within 20s: burst {burst(cgroups)}\n{koordd.log_text()}"
    time.sleep(SETTLE)
    assert proc.poll() is None, f"koordd exited early with {proc.returncode}\n{koordd.log_text()}"
    q0 = quota(cgroups)
    on = throttling(cgroups, WINDOW)
    q1 = quota(cgroups)

    numbers = (f"{'burst + dynamic quota' if dynamic_quota else 'burst only'}: over {WINDOW:g}s, koordd off: "
               f"{off['throttled']} of {off['periods']} periods throttled, LS {off['ls']:.2f} cores; "
               f"koordd on: {on['throttled']} of {on['periods']} throttled, LS {on['ls']:.2f} cores; "
               f"burst {burst(cgroups)} µs, quota {q0}..{q1} µs; other {off['other']:.2f}/{on['other']:.2f} cores")
    with capsys.disabled():
        print(f"\n[kernel] {numbers}")
    # Without koordd the load really is throttled (else the comparison shows nothing) ...
    assert off["throttled"] >= 0.15 * off["periods"] and off["throttled"] >= 15, numbers
    # ... and with it, much less: the same load, the same time.
    assert on["throttled"] <= 0.5 * off["throttled"], numbers
    # The work is the same: the load keeps its pace (it needs ~0.35 CPU whatever happens).
    assert on["ls"] >= 0.8 * off["ls"], numbers
    if not dynamic_quota:
        assert quota(cgroups) == BASE and not records(koordd, "cpu.max"), records(koordd)
    bursts = records(koordd, "cpu.max.burst", "applied")
    assert bursts and bursts[0]["old"] == "0" and bursts[0]["new"] == str(BASE), bursts
    assert bursts[0]["reason"]["base_quota_us"] == BASE, bursts[0]

    stop_and_check_restored(koordd, cgroups, proc)


def test_raised_quota_goes_back_to_base_under_load_and_sigterm_restores(cgroups, koordd, capsys):
    require_burst(cgroups)
    set_quota(cgroups, "ls", BASE)
    cgroups.spawn("ls", [sys.executable, "-c", "while True: pass"])   # always throttled at its quota
    # Overload at 85%: other work on the node (up to MAX_OTHER) plus LS's raised quota stays below
    # the idle line (0.9 x 85%), and NCPU busy BE loops go above it.
    proc = koordd.start(config(koordd, pool_overload_percent=85))

    # Idle pool (LS alone uses half a CPU of 2): throttled every period, so the quota is raised.
    seen = []

    def raised():
        q = quota(cgroups)
        seen.append(q)
        return q is not None and q >= 1.2 * BASE

    if not wait_for(raised, timeout=30):
        other = throttling(cgroups, 3.0)["other"]     # fails by itself when the node is too busy
        pytest.fail(f"quota never raised on an idle pool (other work {other:.2f} cores): {sorted(set(seen))}\n"
                    f"{koordd.log_text()}")
    time.sleep(3.0)
    seen.append(quota(cgroups))
    peak = max(q for q in seen if q is not None)
    assert peak <= 3 * BASE, seen
    ups = records(koordd, "cpu.max", "applied")
    assert ups and ups[0]["old"] == f"{BASE} {PERIOD}" and ups[0]["reason"]["pool_state"] == "idle", ups
    assert ups[0]["reason"]["throttled"] > 0 and ups[0]["new"] == f"{int(BASE * 1.2)} {PERIOD}", ups[0]
    held = {(h["knob"]): h["original"] for h in koordd.held() or []}
    assert held == {"cpu.max": f"{BASE} {PERIOD}", "cpu.max.burst": "0"}, held

    # Load the node: hogs in BE (be_suppress is off, so they keep their CPU) push the pool over 85%.
    since = time.time()
    be = [cgroups.spawn_hog("be") for _ in range(NCPU)]

    def back_at_base() -> list[dict] | None:
        # The kernel file changes a moment before koordd records the decision: wait for both.
        downs = [d for d in records(koordd, "cpu.max") if d["time"] >= since]
        return downs if quota(cgroups) == BASE and downs and downs[-1]["outcome"] == "restored" else None

    downs = wait_for(back_at_base, timeout=30)
    assert downs, (f"quota not back at base under load: {quota(cgroups)}; since the load: "
                   f"{[(d['outcome'], d['new']) for d in records(koordd, 'cpu.max') if d['time'] >= since]}")
    assert downs[-1]["new"] == f"{BASE} {PERIOD}", downs[-1]
    assert downs[-1]["reason"]["pool_state"] == "overload", downs[-1]
    # It stays at base while the node is loaded, and the knob is released (only the burst is held).
    staying = []
    for _ in range(20):
        staying.append(quota(cgroups))
        time.sleep(0.15)
    assert set(staying) == {BASE}, staying
    assert [h["knob"] for h in koordd.held()] == ["cpu.max.burst"], koordd.held()

    # The load goes away: raised again, and SIGTERM while raised puts everything back.
    for p in be:
        p.kill()
        p.wait(timeout=10)
    assert wait_for(lambda: (quota(cgroups) or 0) >= 1.2 * BASE, timeout=30), \
        f"quota not raised again after the load: {quota(cgroups)}\n{records(koordd, 'cpu.max')}"
    with capsys.disabled():
        print(f"\n[kernel] quota raised to {peak} µs on an idle node (base {BASE}), back to {BASE} under load "
              f"in {len(downs)} step(s), raised again to {quota(cgroups)} µs when the load left")
    stop_and_check_restored(koordd, cgroups, proc)
