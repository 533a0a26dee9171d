"""avx_weight on the real kernel, in the test's own cgroups: the compensated weight lands through the actuator
in the cgroup's weight file (v1's cpu.shares on a hybrid host, converted by the knob table), rounds do not
compound, and restore_all puts the original back. Then detection end to end where the host has AVX-512
and arch_status: a numpy matmul (AVX-512 kernels) in BE and a scalar busy loop in LS share one CPU; the
avx sensor sees BE's recent AVX-512 use and LS's thread on that CPU, and the loop raises LS's weight,
then gives it back `hold` after the matmul stops.

The scalar loop is a static binary with no libc (built with the host's cc): a libc program's threads
keep AVX-512 register state from glibc's EVEX string functions and would look like AVX users
themselves. Needs root, a hybrid or v2 host; the detection part also cc and numpy, else skipped.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog, read_decisions
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import CgroupBackend, KNOBS, weight_to_shares
from koordd.core.avx import compensated_weight
from koordd.core.backend import Backends
from koordd.core.config import parse_config
from koordd.core.decisions import APPLIED
from koordd.core.snapshot import AVX, NodeSample, Snapshot
from koordd.kernel.cgroupfs import CgroupFS, detect_layout
from koordd_plugins.avx_weight import AvxWeight
from koordd.runtime.runner import Runner
from koordd.sensors.avx import AvxSection, AvxSensor, AvxUse
from koordd.sensors.cgroup_stats import CgroupSensor
from koordd.sensors.contract import SensorContext, SensorUnavailable

from koordtest.kernel import CGROUP_ROOT, wait_for

pytestmark = pytest.mark.kernel

FACTOR = 3200 / 2958
MATMUL = ("import numpy as np\n"
          "a = np.random.rand(256, 256).astype(np.float32)\n"
          "while True:\n    a @ a\n")


class Rig:
    """koordd's pieces in this process: cgroup sensor, avx_weight run by the runner, the real actuator."""

    def __init__(self, cgroups, tmp_path, hold: str = "10s"):
        self.cgroups = cgroups
        self.fs = CgroupFS(detect_layout(CGROUP_ROOT))
        self.state = tmp_path / "state"
        self.journal = RestoreJournal(self.state)
        self.actuator = Actuator(Backends([CgroupBackend(self.fs)]), self.journal,
                                 DecisionLog(self.state, send=lambda message, **f: None))
        self.runner = Runner({"avx_weight": AvxWeight}, self.actuator, sensors=(AVX,))
        config = (f'[[classes]]\nname = "LS"\ncgroups = ["{cgroups.cgroup("ls")}"]\n'
                  f'[[classes]]\nname = "BE"\ncgroups = ["{cgroups.cgroup("be")}"]\n'
                  f'[loops.avx_weight]\nenabled = true\nhold = "{hold}"\n')
        self.runner.configure(parse_config(config, "koordd.toml", {"avx_weight": AvxWeight}), now=0.0)
        self.sensor = CgroupSensor(self.fs)
        self.classes = {cgroups.cgroup("ls"): "LS", cgroups.cgroup("be"): "BE"}
        assert KNOBS["cpu.weight"].supported(self.fs)

    def tick(self, avx: AvxSection) -> None:
        now = time.monotonic()
        samples = {p: self.sensor.sample(p, c, now, frozenset({"cpu_weight"})) for p, c in self.classes.items()}
        held = {(h.target, h.knob): h.original for h in self.journal.entries()}
        self.runner.tick(list(self.runner.runs.values()), Snapshot(
            time=now, wall=time.time(), node=NodeSample(cpu_count=os.cpu_count() or 1, cpu_used=None),
            cgroups=samples, sections={AVX: avx}, held=held, supported=frozenset({"cpu.weight"})))

    def decisions(self) -> list[dict]:
        return list(read_decisions(self.state))

    def weight_raw(self, child: str) -> str:
        return (self.cgroups.dir("cpu", child) / self.weight_file).read_text().strip()

    def set_weight_raw(self, child: str, value: str) -> None:
        with open(self.cgroups.dir("cpu", child) / self.weight_file, "w") as f:
            f.write(value)

    @property
    def weight_file(self) -> str:
        return "cpu.shares" if self.cgroups.mode == "hybrid" else "cpu.weight"

    def raw_of(self, weight: int) -> str:
        return str(weight_to_shares(weight)) if self.cgroups.mode == "hybrid" else str(weight)


def test_the_weight_lands_in_the_kernel_through_the_actuator_and_is_restored(cgroups, tmp_path):
    rig = Rig(cgroups, tmp_path)
    rig.set_weight_raw("ls", rig.raw_of(200))                 # LS's own weight before koordd: 200 (shares 2048)
    original = rig.weight_raw("ls")
    ls, be = cgroups.cgroup("ls"), cgroups.cgroup("be")
    avx = AvxSection({be: AvxUse(1, 1, 2, frozenset({0}), frozenset({0})), ls: AvxUse(1, 0, None, frozenset(),
                                                                                       frozenset({0}))})
    rig.tick(avx)
    raised = rig.raw_of(compensated_weight(200, FACTOR))      # 216 (shares 2212)
    assert rig.weight_raw("ls") == raised and rig.weight_raw("be") == rig.raw_of(100)
    [held] = rig.journal.entries()
    assert (held.target, held.knob, held.original, held.owner) == (ls, "cpu.weight", "200", "avx_weight")
    [d] = rig.decisions()
    assert (d["outcome"], d["old"], d["new"]) == (APPLIED, "200", "216")
    assert (d["reason"]["avx_cgroups"], d["reason"]["shared_cpus"], d["reason"]["base_weight"]) == \
        ({be: {"evidence": "arch_status", "avx512_threads": 1, "avx512_ms_ago": 2}}, "0", 200)
    rig.tick(avx)                                             # from the journaled 200 again, not from 216
    assert rig.weight_raw("ls") == raised
    decisions = rig.actuator.restore_all("koordd stopping")
    assert [(d.target, d.knob, d.new) for d in decisions] == [(ls, "cpu.weight", "200")]
    assert rig.weight_raw("ls") == original and rig.journal.entries() == []


def scalar_spin(tmp_path) -> str:
    """A busy loop without libc (so without its AVX-512 string functions), or skip without a compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a busy loop without libc")
    src, binary = tmp_path / "spin.c", tmp_path / "spin"
    src.write_text("void _start(void) { for (;;) ; }\n")
    built = subprocess.run([cc, "-O0", "-nostdlib", "-static", "-o", str(binary), str(src)], capture_output=True)
    if built.returncode != 0:
        pytest.skip(f"cannot build a static busy loop: {built.stderr.decode(errors='replace')[-200:]}")
    return str(binary)


def spawn_pinned(cgroups, child: str, argv: list[str], cpu: int) -> subprocess.Popen:
    """`argv` bound to `cpu` (taskset), in `child` from its first instruction; killed at teardown."""
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.skip("no taskset to pin the two processes to one CPU")
    return cgroups.spawn(child, [taskset, "-c", str(cpu), *argv], env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})


def test_a_matmul_next_to_a_scalar_loop_raises_the_scalar_cgroups_weight_then_gives_it_back(cgroups, tmp_path):
    if subprocess.run([sys.executable, "-c", "import numpy"], capture_output=True).returncode != 0:
        pytest.skip("numpy is not installed")
    sensor = AvxSensor(CGROUP_ROOT)
    try:
        sensor.start()
    except SensorUnavailable as e:
        pytest.skip(f"avx sensor unavailable here: {e}")
    rig = Rig(cgroups, tmp_path, hold="1s")
    ls, be = cgroups.cgroup("ls"), cgroups.cgroup("be")
    cpu = max(os.sched_getaffinity(0))
    spawn_pinned(cgroups, "ls", [scalar_spin(tmp_path)], cpu)
    matmul = spawn_pinned(cgroups, "be", [sys.executable, "-c", MATMUL], cpu)
    seen: list[AvxSection] = []

    def round_() -> AvxSection:
        section = sensor.sample(SensorContext(time.monotonic(), rig.classes))
        seen.append(section)
        rig.tick(section)
        return section

    try:
        # Where the PMU counts licences its verdict decides the level (a float32 matmul may hold licence 1 or
        # 2); elsewhere arch_status's AVX-512.
        assert wait_for(lambda: round_() and int(rig.weight_raw("ls")) > int(rig.raw_of(100)), timeout=20,
                        step=0.5), f"LS never raised; last sections: {seen[-3:]}"
        last = seen[-1]
        # LS's spin may show for its first ~100 ms the AVX-512 state its launcher (taskset, with libc) left:
        # no matter, a root's own AVX state does not keep it from being a victim.
        assert last.cgroups[be].avx512_threads >= 1 and last.cgroups[ls].ran_cpus == frozenset({cpu})
        evidence = rig.decisions()[-1]["reason"]["avx_cgroups"][be]["evidence"]
        assert evidence == ("arch_status" if last.cgroups[be].licence is None else "pmu")
        if evidence == "arch_status":
            assert rig.weight_raw("ls") == rig.raw_of(compensated_weight(100, FACTOR))
        [held] = rig.journal.entries()
        assert (held.target, held.original) == (ls, "100")
        matmul.kill()
        matmul.wait(timeout=10)
        assert wait_for(lambda: round_() is not None and rig.weight_raw("ls") == rig.raw_of(100), timeout=15,
                        step=0.5), f"LS's weight not given back; last sections: {seen[-3:]}"
        assert rig.journal.entries() == []
    finally:
        rig.actuator.restore_all("test done")
        sensor.stop()
