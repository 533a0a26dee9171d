"""`koordctl doctor --json` on the real kernel: cgroup v2 with every controller, PSI, sched_ext."""
from __future__ import annotations

import json
from pathlib import Path

from . import vm

pytestmark = vm.only_in_vm


def doctor() -> dict[str, dict]:
    out = vm.sh("koordctl", "doctor", "--json").stdout
    return {c["name"]: c for c in json.loads(out)}


def test_doctor_reports_v2_with_every_controller_psi_and_sched_ext():
    caps = doctor()
    kernel_controllers = set((vm.CGROUP / "cgroup.controllers").read_text().split())
    assert {"cpu", "cpuset", "io", "memory", "pids"} <= kernel_controllers, kernel_controllers

    cgroup = caps["cgroup"]
    assert cgroup["available"], cgroup
    assert "mode=v2" in cgroup["detail"], cgroup
    # The report lists the root's controllers: all of them, as the kernel offers them.
    listed = set(cgroup["detail"].split("(", 1)[1].split(")", 1)[0].split())
    assert listed == kernel_controllers, (cgroup, kernel_controllers)

    psi = caps["psi"]
    assert psi["available"], psi
    assert "cpu,memory,io readable" in psi["detail"] and "per-cgroup: yes" in psi["detail"], psi

    sched_ext = caps["sched_ext"]
    assert sched_ext["available"], sched_ext
    state = Path("/sys/kernel/sched_ext/state").read_text().strip()
    assert f"state={state}" in sched_ext["detail"], (sched_ext, state)

    for name in ("journald", "systemd"):
        assert caps[name]["available"], caps[name]
