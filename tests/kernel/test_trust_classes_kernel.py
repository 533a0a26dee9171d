"""End to end on the real kernel (issue 25, defect 1): an LS cgroup nested in a BE root is never capped,
frozen or killed, and neither is the BE root that holds it, while be_suppress and memory_evict act on
the BE work beside it.

The test's own cgroups, in every hierarchy (hybrid: v1 cpu, cpuacct, memory, freezer and the unified
tree; pure v2: the v2 tree):
    koordd-test-<pid>-n<k>           BE root, 256 MiB memory limit (set before anything joins)
        ls                           LS root (the config's nested pattern): a CPU hog holding 64 MiB
        be                           a BE job: a CPU hog holding 64 MiB
    koordd-test-<pid>-f<k>           another BE root, with nothing of another class in it
        job                          a CPU hog
koordd runs a few rounds with be_suppress (threshold rule: it caps every BE root it may) and
memory_evict (scope the nested root, threshold 20% = 51 MiB: LS alone stays above it, so memory_evict
wants victims every round). It must kill `be` and cap the free root, and never touch the nested root
or `ls`: their quota stays unlimited and `ls` keeps running, thawed, the whole time. Needs root.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from koordtest.kernel import HOG, FreezableEnv, Koordd, created, stop_all, unique_name, wait_for
from .test_memory_evict_kernel import detect

pytestmark = pytest.mark.kernel

MiB = 1 << 20
LIMIT = 256 * MiB
HOLD_MIB = 64
HOG_CODE = f"""
import sys
blob = b"\\x01" * ({HOLD_MIB} << 20)       # written, so every page is resident
print("ready", flush=True)
while True:
    pass
"""
WATCH = 6.0         # seconds of rounds watched after koordd's first ones


@dataclass
class Tree(FreezableEnv):
    """One of the test's top cgroups with its children, in every hierarchy of `roles`."""
    limit: int | None = None
    by_child: dict = field(default_factory=dict)

    def create(self) -> None:
        for root in self.roots:
            (root / self.name).mkdir()
        if self.mode == "v2":
            (self.dir("v2") / "cgroup.subtree_control").write_text("+cpu +memory")
        if self.limit is not None:        # before anything joins: nothing here can use more
            (self.dir("memory") / ("memory.max" if self.mode == "v2" else "memory.limit_in_bytes")) \
                .write_text(str(self.limit))
        for root in self.roots:
            for child in self.children:
                (root / self.name / child).mkdir()

    def start(self, child: str, code: str = HOG_CODE):
        p = self.spawn(child, [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready", f"{child} did not come up (exit {p.poll()})"
        self.by_child[child] = p
        return p

    def quota(self, child: str | None = None) -> str:
        """v1 cpu.cfs_quota_us ("-1": none), v2 cpu.max's first field ("max": none)."""
        if self.mode == "v2":
            return (self.dir("v2", child) / "cpu.max").read_text().split()[0]
        return (self.dir("cpu", child) / "cpu.cfs_quota_us").read_text().strip()

    def frozen(self, child: str) -> bool:
        if self.mode == "v2":
            return "frozen 1" in (self.dir("v2", child) / "cgroup.events").read_text()
        return (self.dir("freezer", child) / "freezer.state").read_text().strip() != "THAWED"


@pytest.fixture
def nest():
    mode, roles = detect()
    yield from created(Tree(mode, roles, unique_name("n"), children=("ls", "be"), limit=LIMIT))


@pytest.fixture
def free():
    mode, roles = detect()
    yield from created(Tree(mode, roles, unique_name("f"), children=("job",)))


@pytest.fixture
def koordd(tmp_path, nest, free):
    k = Koordd(tmp_path, nest)
    yield k
    stop_all(k)


def write_config(koordd: Koordd, nest: Tree, free: Tree) -> Path:
    return koordd.config_file(f"""
[[classes]]
name = "BE"
cgroups = [{json.dumps(nest.name)}, {json.dumps(free.name)}]

[[classes]]
name = "LS"
cgroups = [{json.dumps(nest.name + "/ls")}]

[loops.be_suppress]
enabled = true
interval = "200ms"
rule = "threshold"
threshold_percent = 65

[loops.memory_evict]
enabled = true
interval = "200ms"
scope = {json.dumps(nest.name)}
threshold_percent = 20
cooldown = "0s"
pressure_full_percent = 0
reclaim = false
""")


def test_an_ls_root_inside_a_be_root_is_never_capped_frozen_or_killed(nest, free, koordd, capsys):
    unlimited = "max" if nest.mode == "v2" else "-1"
    ls, be = nest.start("ls"), nest.start("be")
    free.spawn("job", HOG)
    proc = koordd.start(write_config(koordd, nest, free))

    def acted():
        d = koordd.decisions()
        return any(x["cgroup"] == free.name and x["outcome"] == "applied" for x in d) \
            and any(x["cgroup"] == nest.name + "/be" and x["outcome"] == "applied" for x in d)

    seen = []                   # (quota of the nested root, of ls, ls frozen, ls alive), sampled all along

    def sample():
        seen.append((nest.quota(), nest.quota("ls"), nest.frozen("ls"), ls.poll() is None))
        return False

    wait_for(lambda: sample() or acted(), timeout=30, step=0.05)
    end = time.monotonic() + WATCH
    while time.monotonic() < end:
        sample()
        time.sleep(0.05)
    decisions = koordd.decisions()
    ours = [d for d in decisions if d["cgroup"] in (nest.name, nest.name + "/ls")]
    with capsys.disabled():
        print(f"\n[kernel] {nest.mode}: {len(seen)} samples; decisions on the nested root and ls: "
              f"{[(d['cgroup'], d['knob'], d['outcome']) for d in ours]}; be alive {be.poll() is None}; "
              f"free root quota {free.quota()}")
    assert proc.poll() is None, f"koordd exited {proc.returncode}\n{koordd.log_text()}"
    assert acted(), f"be_suppress or memory_evict did not act: {decisions}\n{koordd.log_text()}"
    assert be.wait(timeout=10) == -signal.SIGKILL               # memory_evict's victim: the BE job beside ls
    assert free.quota() != unlimited                            # be_suppress capped the free BE root
    assert set(seen) == {(unlimited, unlimited, False, True)}, sorted(set(seen))
    assert not [d for d in ours if d["outcome"] in ("applied", "dry-run")], ours

    assert koordd.stop(proc) == 0, koordd.log_text()
    assert free.quota() == unlimited and koordd.held() == []
    assert ls.poll() is None
