"""oom_shaping under systemd on pure cgroup v2 (scripts/vmtest's VM): every process of be.slice gets
oom_score_adj 1000 and of ls.slice -900 (the unit keeps CAP_SYS_RESOURCE, which a score below 0 needs),
each BE service (a child of be.slice: a "pod") gets memory.oom.group = 1, vm.watermark_scale_factor
is raised; `systemctl stop koordd` puts every process's score, each memory.oom.group and the sysctl
back. The hybrid host's kernel test (tests/kernel/test_oom_shaping_kernel.py) covers what v1 allows;
this one the v2-only memory.oom.group and the unit's capabilities.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from . import vm

pytestmark = vm.only_in_vm

UNITS = {"oomls": (vm.LS, 1), "oombe1": (vm.BE, 1), "oombe2": (vm.BE, 1)}
WSF = Path("/proc/sys/vm/watermark_scale_factor")


def config(wsf: int) -> str:
    return vm.SLICES_CONFIG + f"""\
[loops.be_suppress]
enabled = false

[loops.qos_baseline]
enabled = false

[loops.oom_shaping]
enabled = true
interval = "1s"
be_oom_score_adj = 1000
ls_oom_score_adj = -900
be_oom_group = true
watermark_scale_factor = {wsf}
"""


def pids(cgroup: str) -> list[int]:
    out = []
    for d in [vm.CGROUP / cgroup, *(p for p in (vm.CGROUP / cgroup).rglob("*") if p.is_dir())]:
        out += [int(p) for p in (d / "cgroup.procs").read_text().split()]
    return out


def scores(cgroup: str) -> set[int]:
    out = set()
    for pid in pids(cgroup):
        try:
            out.add(int(Path(f"/proc/{pid}/oom_score_adj").read_text()))
        except FileNotFoundError:
            pass
    return out


@pytest.fixture
def services(koordd_stopped):
    original = WSF.read_text().strip()
    vm.stop_units(*UNITS)
    for unit, (slice_, n) in UNITS.items():
        # Not stress-ng: it sets its own processes' oom_score_adj. A sleeper keeps the score it started with (0).
        vm.sh("systemd-run", f"--slice={slice_}", f"--unit={unit}", "sleep", "600")
        vm.wait_tasks(f"{slice_}/{unit}.service", n)
    yield int(original)
    vm.stop_units(*UNITS)
    WSF.write_text(original)


def test_scores_groups_and_watermarks_set_and_restored_on_stop(services):
    original_wsf = services
    be_units = [f"{vm.BE}/{u}.service" for u, (s, _) in UNITS.items() if s == vm.BE]
    before = {"be": scores(vm.BE), "ls": scores(vm.LS),
              "group": {u: vm.knob(u, "memory.oom.group") for u in be_units}}
    assert before["be"] == {0} and before["ls"] == {0} and set(before["group"].values()) == {"0"}, before
    wsf = min(original_wsf + 20, 3000)

    vm.write_config(config(wsf))
    vm.systemctl("start", vm.UNIT)
    assert vm.wait_for(lambda: scores(vm.BE) == {1000} and scores(vm.LS) == {-900} and
                       all(vm.knob(u, "memory.oom.group") == "1" for u in be_units) and
                       int(WSF.read_text()) == wsf, 60), \
        (scores(vm.BE), scores(vm.LS), {u: vm.knob(u, "memory.oom.group") for u in be_units}, WSF.read_text(),
         vm.journal_text()[-4000:])
    assert vm.knob(vm.BE, "memory.oom.group") == "0"     # never the root of every BE pod

    vm.systemctl("stop", vm.UNIT)
    assert scores(vm.BE) == {0} and scores(vm.LS) == {0}
    assert {u: vm.knob(u, "memory.oom.group") for u in be_units} == before["group"]
    assert int(WSF.read_text()) == original_wsf
    assert vm.held() == []
