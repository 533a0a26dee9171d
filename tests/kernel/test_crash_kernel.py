"""kill -9 at random moments while koordd acts, again and again on the real kernel: every knob a killed
run changed is in the restore journal with its true original, the next start restores it (its loop is
off now) or re-adopts it (its loop is on), and a clean stop at the end leaves every knob of the test's
cgroups and device as it was before the first start, with the journal empty.

The test's own tree, koordd-crash-<pid>, in the v1 cpu, cpuacct, memory and freezer hierarchies and the
unified tree (hybrid hosts), or in the v2 tree:
  ls       LS: a busy loop under a quota of half a CPU (cpu_burst sets its burst and moves its quota
           up and down), cpu.weight set by qos_baseline
  be       BE: two busy loops (be_suppress caps it as LS's use moves; qos_baseline makes it idle)
  mem      memory_evict's scope: the test moves its memory limit between 160 and 512 MiB every 0.8 s
  mem/be   BE: a process holding 100 MiB, frozen by memory_evict while the limit is low and thawed
           while it is high
and, where pyroute2 and libbpf are installed, a veth pair (kdc<pid> here, its peer in a network namespace
of the test's own) shaped by net_shaping.

Each run's config enables a random subset of the loops, so a restart re-adopts some knobs (their loop
is still on) and restores others (off now). A kill lands while a start's recovery runs (before its
first tick) or at a random moment after its first tick, while the loops act. The randomness is
seeded; the seed is printed, and KOORDD_CRASH_SEED replays a run (KOORDD_CRASH_KILLS sets how many).
After each kill, before the next start, every knob koordd can write on the test's targets is read:
one that differs from its value before the first start and is not in the journal, or is there with
another original, is an orphan. Needs root; skipped elsewhere.
"""
from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from koordd.act.journal import read_held
from koordd.backends.cgroup_knobs import CgroupBackend, KNOBS
from koordd.backends.threads import ThreadPolicyBackend
from koordd.core.backend import TargetGone, Unsupported
from koordd.kernel.cgroupfs import CgroupFS, detect_layout

from koordtest.kernel import CGROUP_ROOT, CgroupEnv, Koordd, created, detect_host, stop_all, wait_for
from .test_cpu_burst_kernel import set_quota

pytestmark = pytest.mark.kernel

KILLS = int(os.environ.get("KOORDD_CRASH_KILLS", "50"))
SEED = int(os.environ.get("KOORDD_CRASH_SEED") or random.SystemRandom().randrange(1 << 32))
MiB = 1 << 20
HOLD_MIB = 100
LIMIT_LOW, LIMIT_HIGH = 160 * MiB, 512 * MiB      # 100 MiB held: ~65% of the low limit, ~20% of the high
TOGGLE = 0.8                                      # seconds between moves of the scope's limit
CHILDREN = ("ls", "be", "mem", "mem/be")          # parents before their children
ACTING = 2.0          # a kill while acting lands up to this long after the run's first tick
RECOVERY_SHARE = 0.25  # of the kills land during a start's recovery
NET_SHARE = 0.3       # of the runs shape the veth (each such start compiles the classifier: seconds)
HOST, PEER = f"kdc{os.getpid() % 100000}", f"kdcp{os.getpid() % 100000}"    # of its own: test runs may overlap
NS = f"koordd-crash-{os.getpid()}"
LINK = "50mbit"
# Every file of a knob koordd may write on a cgroup, read raw (no koordd code) before and after.
RAW_FILES = ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.cfs_burst_us", "cpu.shares", "cpu.idle", "cpu.max",
             "cpu.max.burst", "cpu.weight", "freezer.state", "cgroup.freeze", "memory.limit_in_bytes",
             "memory.max", "memory.high", "memory.low", "memory.min", "cpuset.cpus")

HOLDER = f"""
import time
blob = b"\\x01" * ({HOLD_MIB} << 20)       # written, so every page is resident
print("ready", flush=True)
while True:
    time.sleep(60)
"""


# --- the test's cgroups ------------------------------------------------------------------------------

@dataclass
class CrashTree(CgroupEnv):
    """koordd-crash-<pid> with CHILDREN in every hierarchy of `roles`; the scope `mem` memory-limited
    before anything joins it."""
    children: tuple[str, ...] = CHILDREN

    def create(self) -> None:
        for root in self.roots:
            (root / self.name).mkdir()
            for child in self.children:
                (root / self.name / child).mkdir()
        if self.mode == "v2":
            for parent in ("", "mem"):
                (self.roles["cpu"] / self.name / parent / "cgroup.subtree_control").write_text("+cpu +memory")
        self.set_limit(LIMIT_HIGH)

    def _memory_file(self) -> Path:
        return self.roles["memory"] / self.name / "mem" / ("memory.max" if self.mode == "v2" else "memory.limit_in_bytes")

    def set_limit(self, limit: int) -> None:
        self._memory_file().write_text(str(limit))

    def thaw(self) -> None:
        try:
            if self.mode == "v2":
                (self.roles["cpu"] / self.name / "mem/be" / "cgroup.freeze").write_text("0")
            else:
                (self.roles["freezer"] / self.name / "mem/be" / "freezer.state").write_text("THAWED")
        except OSError:
            pass

    def dirs(self) -> list[Path]:
        return [root / self.name / child for root in self.roots for child in ("",) + self.children]

    def destroy(self) -> list[str]:
        self.thaw()                  # a frozen v1 task cannot die
        self.children = tuple(sorted(self.children, key=lambda c: -c.count("/")))     # children first
        return super().destroy()


def detect_crash_host() -> tuple[str, dict[str, Path]]:
    mode, roles = detect_host()
    if mode == "v2":
        if "memory" not in (CGROUP_ROOT / "cgroup.subtree_control").read_text().split():
            pytest.skip("needs the memory controller enabled in /sys/fs/cgroup/cgroup.subtree_control")
        return mode, {**roles, "memory": CGROUP_ROOT, "freezer": CGROUP_ROOT}
    extra = {r: CGROUP_ROOT / r for r in ("memory", "freezer")}
    if not (extra["memory"] / "memory.limit_in_bytes").is_file() or not (extra["freezer"] / "tasks").is_file():
        pytest.skip("needs the v1 memory and freezer hierarchies (hybrid host)")
    return mode, {**roles, **extra}


@pytest.fixture
def tree():
    mode, roles = detect_crash_host()
    yield from created(CrashTree(mode, roles, f"koordd-crash-{os.getpid()}"))


@pytest.fixture
def koordd(tmp_path, tree):
    k = Koordd(tmp_path, tree)
    yield k
    stop_all(k)


@pytest.fixture
def device():
    """HOST, a veth whose peer is in namespace NS; None where net_shaping cannot run (no pyroute2 or libbpf)."""
    from koordd.backends.netclass import SharedClassifier
    if SharedClassifier().missing() is not None:
        yield None
        return
    from pyroute2 import IPRoute, NetNS, netns
    ipr = IPRoute()
    netns.create(NS)
    try:
        ipr.link("add", ifname=HOST, kind="veth", peer={"ifname": PEER, "net_ns_fd": NS})
        index = ipr.link_lookup(ifname=HOST)[0]
        ipr.addr("add", index=index, address="10.78.0.1", prefixlen=24)
        ipr.link("set", index=index, state="up")
        with NetNS(NS) as ns:
            peer = ns.link_lookup(ifname=PEER)[0]
            ns.addr("add", index=peer, address="10.78.0.2", prefixlen=24)
            ns.link("set", index=peer, state="up")
        yield HOST
    finally:
        for found in ipr.link_lookup(ifname=HOST):
            ipr.link("del", index=found)
        netns.remove(NS)
        ipr.close()


class LimitMover(threading.Thread):
    """Moves the scope's memory limit between LIMIT_LOW and LIMIT_HIGH, so memory_evict keeps freezing
    and thawing; stop() leaves it at LIMIT_HIGH, its value before the first start."""

    def __init__(self, tree: CrashTree):
        super().__init__(daemon=True)
        self.tree, self.done = tree, threading.Event()

    def run(self) -> None:
        low = True
        while not self.done.wait(TOGGLE):
            self.tree.set_limit(LIMIT_LOW if low else LIMIT_HIGH)
            low = not low

    def stop(self) -> None:
        self.done.set()
        self.join()
        self.tree.set_limit(LIMIT_HIGH)


# --- what the kernel shows -----------------------------------------------------------------------------

Key = tuple[str, str, str]         # (kind, target, knob), as the restore journal names a knob


class KnobReader:
    """Every knob koordd could write on the test's targets, read through koordd's backends (the values
    in the journal's own form), and the classifier's place on the device read from netlink."""

    def __init__(self, tree: CrashTree, device: str | None):
        self.fs = CgroupFS(detect_layout(CGROUP_ROOT))
        self.cgroup, self.threads = CgroupBackend(self.fs), ThreadPolicyBackend(self.fs)
        self.targets = [tree.name] + [f"{tree.name}/{c}" for c in CHILDREN]
        self.driven = {("cgroup", f"{tree.name}/mem", "memory.max")}     # the test moves it, not koordd
        self.device = device
        self.tc = self.ipr = None
        if device is not None:
            from pyroute2 import IPRoute
            from koordd.backends.tc import TcBackend
            self.ipr = IPRoute()
            self.tc = TcBackend(ipr=self.ipr)

    def read(self) -> dict[Key, str | None]:
        out: dict[Key, str | None] = {}
        for target in self.targets:
            for name, knob in KNOBS.items():
                if knob.oneshot or ("cgroup", target, name) in self.driven:
                    continue
                try:
                    out[("cgroup", target, name)] = self.cgroup.read(target, name)
                except (Unsupported, TargetGone, FileNotFoundError):
                    continue            # not on this host, or not in a hierarchy the tree is in
            out[("threads", target, "sched_policy")] = self.threads.read(target, "sched_policy")
        if self.device is not None:
            out[("tc", self.device, "tc.shaping")] = self.tc.read(self.device, "tc.shaping")
            out[("tc_filter", self.device, "tc.classifier")] = self._classifier()
        return out

    def _classifier(self) -> str:
        """What a koordd that never attached it reads (a killed run's filter counts as "detached")."""
        from koordd.kernel.netclass import EGRESS, FILTER_PRIO
        index = self.ipr.link_lookup(ifname=self.device)[0]
        if not any(m.get_attr("TCA_KIND") == "clsact" for m in self.ipr.get_qdiscs(index)):
            return "none"
        ours = any(m["info"] >> 16 == FILTER_PRIO for m in self.ipr.get_filters(index, parent=EGRESS))
        return "detached (koordd's filter on)" if ours else "detached"

    def close(self) -> None:
        if self.ipr is not None:
            self.ipr.close()
        self.fs.close()


def raw_state(tree: CrashTree, device: str | None) -> dict[str, str]:
    """The kernel's own text of every knob file of the tree, the policy of every thread in it, and the
    device's qdiscs and egress filters: read without koordd's code."""
    out = {}
    for d in tree.dirs():
        for name in RAW_FILES:
            try:
                out[f"{d}/{name}"] = (d / name).read_text().strip()
            except OSError:
                continue
    for d in tree.dirs():
        for listing in ("cgroup.threads", "tasks"):
            try:
                tids = (d / listing).read_text().split()
            except OSError:
                continue
            for tid in tids:
                try:
                    out[f"thread {tid}"] = str(os.sched_getscheduler(int(tid)))
                except OSError:
                    pass
    if device is not None:
        from pyroute2 import IPRoute
        from koordd.kernel.netclass import EGRESS
        with IPRoute() as ipr:
            index = ipr.link_lookup(ifname=device)[0]
            out["qdiscs"] = " ".join(sorted(f"{m.get_attr('TCA_KIND')}:{m['handle']:x}" for m in ipr.get_qdiscs(index)))
            out["egress filters"] = " ".join(sorted(f"{m['info'] >> 16:x}" for m in ipr.get_filters(index, parent=EGRESS)))
    return out


def held(state_dir: Path) -> dict[Key, str]:
    """The restore journal as (kind, target, knob) -> original; JournalUnreadable fails the test."""
    got = read_held(state_dir)
    return {} if got is None else {(h["kind"], h["target"], h["knob"]): h["original"] for h in got[0]}


@dataclass
class AfterKill:
    """What one kill left: knobs changed but not journaled (or with another original), and held knobs
    still at their original (the kill fell between a journal line and its knob write or restore)."""
    orphans: list[str] = field(default_factory=list)
    strays: list[str] = field(default_factory=list)
    at_original: list[Key] = field(default_factory=list)
    changed: int = 0


def compare(baseline: dict[Key, str | None], now: dict[Key, str | None], journal: dict[Key, str],
            ours: set[str]) -> AfterKill:
    out = AfterKill()
    for key, before in baseline.items():
        current = now.get(key)
        if current == before:
            if key in journal and journal[key] == before:
                out.at_original.append(key)
            continue
        out.changed += 1
        if key not in journal:
            out.orphans.append(f"{key}: {before!r} -> {current!r}, not in the journal")
        elif journal[key] != before:
            out.orphans.append(f"{key}: {before!r} -> {current!r}, journaled with original {journal[key]!r}")
    for key in journal:
        if key[1] not in ours:
            out.strays.append(f"{key}: journaled, yet not a target of the test")
    return out


# --- koordd's runs -------------------------------------------------------------------------------------

def config_text(koordd: Koordd, tree: CrashTree, loops: frozenset[str], device: str | None) -> str:
    name = tree.name
    sections = {
        # No usage window: BE's cap follows LS's use tick by tick.
        "be_suppress": 'rule = "threshold"\nthreshold_percent = 65\npolicy = "cfs_quota"\nusage_window = "0s"\n',
        # LS always wants more than its quota: its quota rises while the pool is idle, shrinks when LS
        # itself makes it busy, and falls back when its token bucket (a second at the top) is empty.
        "cpu_burst": 'burst_percent = 1000\ndynamic_quota = true\npool_ignores_be = true\n'
                     'pool_overload_percent = 40\nquota_burst_period = "1s"\n',
        "qos_baseline": "be_cpu_idle = true\nls_cpu_weight = 200\n",
        "memory_evict": f'scope = "{name}/mem"\nthreshold_percent = 60\naction = "freeze"\ncooldown = "0s"\n'
                        'thaw_delay = "300ms"\npressure_full_percent = 0\nreclaim = false\n',
        "net_shaping": f'devices = ["{device}:{LINK}"]\nfollow_health = false\n',
    }
    text = koordd.daemon_toml() + f"""
[[classes]]
name = "LS"
cgroups = ["{name}/ls"]

[[classes]]
name = "BE"
cgroups = ["{name}/be", "{name}/mem/be"]
"""
    for loop, options in sections.items():
        text += f'\n[loops.{loop}]\nenabled = {"true" if loop in loops else "false"}\ninterval = "100ms"\n'
        if loop in loops:
            text += options
    return text


def ticked(koordd: Koordd, proc: subprocess.Popen, loops: frozenset[str]) -> bool:
    status = koordd.status() or {}
    runs = status.get("loops", {})
    return status.get("pid") == proc.pid and all(runs.get(loop, {}).get("ticks", 0) >= 1 for loop in loops)


def last_log(koordd: Koordd) -> str:
    return koordd.logs[-1].read_text(errors="replace")[-5000:]


def writes_since(koordd: Koordd, since: float) -> list[dict]:
    return [d for d in koordd.decisions() if d.get("time", 0) >= since and d.get("outcome") in ("applied", "restored")]


def report(capsys, text: str) -> None:
    with capsys.disabled():
        print(f"[kernel] {text}")


def test_kill_9_at_random_moments_leaves_no_orphan(tree, koordd, device, capsys):
    rng = random.Random(SEED)
    with capsys.disabled():
        print()
    report(capsys, f"crash: seed {SEED} (KOORDD_CRASH_SEED={SEED} replays it), {KILLS} kills"
                   f"{'' if device else '; net_shaping left out: pyroute2 or libbpf missing'}"
                   "; llc_partition and sched_ext left out where the kernel has no resctrl or sched_ext")
    set_quota(tree, "ls", 50_000)
    tree.spawn_hog("ls")
    for _ in range(2):
        tree.spawn_hog("be")
    holder = tree.spawn("mem/be", [sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "ready", f"the memory holder did not start ({holder.poll()})"

    reader = KnobReader(tree, device)
    baseline = reader.read()
    raw_before = raw_state(tree, device)
    ours = set(reader.targets) | ({device} if device else set())
    loops = ("be_suppress", "cpu_burst", "qos_baseline", "memory_evict")
    configs: dict[frozenset[str], Path] = {}

    def config(enabled: frozenset[str]) -> Path:
        if enabled not in configs:
            path = koordd.tmp / "etc" / f"koordd-{len(configs)}.toml"
            path.parent.mkdir(exist_ok=True)
            path.write_text(config_text(koordd, tree, enabled, device))
            configs[enabled] = path
        return configs[enabled]

    mover = LimitMover(tree)
    mover.start()
    orphans: list[str] = []
    strays: list[str] = []
    recovery_s: list[float] = []
    kills = {"recovery": 0, "acting": 0, "journal ahead of the kernel": 0, "after a write in the last 0.5 s": 0}
    knobs_changed, writes = [], 0
    try:
        for n in range(KILLS):
            enabled = frozenset(loop for loop in loops if rng.random() < 0.75) or frozenset({"be_suppress"})
            if device and rng.random() < NET_SHARE:
                enabled |= {"net_shaping"}
            since = time.time()
            started = time.monotonic()
            proc = koordd.start(config(enabled))
            if recovery_s and rng.random() < RECOVERY_SHARE:
                time.sleep(rng.uniform(0.2, 1.0) * statistics.median(recovery_s))
                kills["acting" if ticked(koordd, proc, enabled) else "recovery"] += 1
            else:
                assert wait_for(lambda: ticked(koordd, proc, enabled) or proc.poll() is not None, 60), \
                    f"run {n}: koordd did not tick within 60 s\n{koordd.log_text()}"
                recovery_s.append(time.monotonic() - started)
                time.sleep(rng.uniform(0.0, ACTING))
                kills["acting"] += 1
            assert proc.poll() is None, f"run {n}: koordd exited {proc.returncode}\n{last_log(koordd)}"
            proc.kill()
            killed_at = time.time()
            proc.wait(timeout=10)
            journal = held(koordd.state_dir)
            after = compare(baseline, reader.read(), journal, ours)
            orphans += [f"kill {n}: {o}" for o in after.orphans]
            strays += [f"kill {n}: {s}" for s in after.strays]
            kills["journal ahead of the kernel"] += bool(after.at_original)
            run_writes = writes_since(koordd, since)
            writes += len(run_writes)
            kills["after a write in the last 0.5 s"] += any(d["time"] >= killed_at - 0.5 for d in run_writes)
            knobs_changed.append(after.changed)
        mover.stop()
        # The last start re-adopts or restores what the last kill left; SIGTERM then restores the rest.
        everything = frozenset(loops) | ({"net_shaping"} if device else frozenset())
        proc = koordd.start(config(everything))
        assert wait_for(lambda: ticked(koordd, proc, everything) or proc.poll() is not None, 60), koordd.log_text()
        assert koordd.stop(proc) == 0, koordd.log_text()
    finally:
        mover.stop()
        reader.close()

    raw_after = raw_state(tree, device)
    differ = {k: (raw_before.get(k), raw_after.get(k)) for k in raw_before.keys() | raw_after.keys()
              if raw_before.get(k) != raw_after.get(k)}
    left = held(koordd.state_dir)
    report(capsys, f"crash: {KILLS} kills ({kills['recovery']} during a start's recovery, {kills['acting']} while the "
                   f"loops acted; {kills['after a write in the last 0.5 s']} within 0.5 s of a knob write, "
                   f"{kills['journal ahead of the kernel']} with a journal line whose knob still read its original); "
                   f"{writes} knob writes and restores by the killed runs; knobs changed at a kill "
                   f"{min(knobs_changed)}..{max(knobs_changed)}; orphans {len(orphans)}, stray journal entries "
                   f"{len(strays)}")
    report(capsys, f"crash: start to first tick {min(recovery_s):.2f}..{statistics.median(recovery_s):.2f}.."
                   f"{max(recovery_s):.2f} s (min..median..max of {len(recovery_s)} starts); after the final "
                   f"SIGTERM: {len(differ)} knob files differ from before the first start, journal holds {len(left)}")
    assert not orphans, "knobs changed but not journaled (or with another original):\n" + "\n".join(orphans[:20])
    assert not strays, "\n".join(strays[:20])
    assert not differ, f"not as before the first start: {differ}\n{koordd.log_text()}"
    assert left == {}, f"the restore journal still holds {left}"
    assert writes > KILLS, f"the killed runs wrote only {writes} knobs: the loops did not act"


def test_an_htb_tree_cut_short_by_a_kill_is_koordds_to_take_down_or_finish(device):
    """koordd builds its HTB tree in five netlink calls: a kill between them leaves the root and some of
    its classes. The next start must take that down (restore) or finish it (loop on), not call it
    someone else's and leave it (the crash test caught a restore that "restored" it and left it there)."""
    if device is None:
        pytest.skip("needs pyroute2 and libbpf")
    from pyroute2 import IPRoute
    from koordd.kernel.netlink import LINK, OTHER_CLASS, ROOT
    from koordd.backends.tc import PARTIAL, TcBackend
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=device)[0]
        tc = TcBackend(ipr=ipr)

        def cut_short(default: int = OTHER_CLASS) -> None:
            ipr.tc("add", "htb", index, ROOT, default=default & 0xFFFF)
            ipr.tc("add-class", "htb", index, LINK, parent=ROOT, rate="50mbit", ceil="50mbit")

        cut_short()
        assert tc.read(device, "tc.shaping") == PARTIAL
        tc.write(device, "tc.shaping", "none")                    # the next start's restore, its loop off
        assert tc.read(device, "tc.shaping") == "none"
        assert not [m for m in ipr.get_qdiscs(index) if m.get_attr("TCA_KIND") == "htb"]

        cut_short()
        tc.write(device, "tc.shaping", tc.validate(device, "tc.shaping", "htb 50mbit"))   # its loop on
        assert tc.read(device, "tc.shaping") == "htb 50000000" and tc.read(device, "tc.be_ceil") == "50000000"
        tc.write(device, "tc.shaping", "none")

        cut_short(default=LINK)                                   # another default class: not koordd's
        try:
            assert tc.read(device, "tc.shaping") == "foreign htb 1:"
        finally:
            ipr.tc("del", "htb", index, ROOT)
