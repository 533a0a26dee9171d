"""avx_weight under systemd on a pure cgroup-v2 kernel: the compensated weight lands in `cpu.weight`.

The VM's emulated CPU has no AVX-512 (qemu's TCG), so the evidence is the config's: be.slice is declared
AVX-heavy (`avx_cgroups`). While a busy loop runs there, ls.slice's cpu.weight goes from 100 to
100 x f_nominal / f_effective with the default frequency model (3200 / 2958 MHz: 108), each decision
naming the declared cgroup; `hold` after the loop stops, the original comes back; and `systemctl stop
koordd` restores it too. Detection from arch_status and the PMU is tested on the host
(tests/kernel/test_avx_weight_kernel.py) and on fake sources.
"""
from __future__ import annotations

import json

from koordd.core.avx import compensated_weight

from . import vm

pytestmark = vm.only_in_vm

CONFIG = vm.SLICES_CONFIG + f"""\
[loops.be_suppress]
enabled = false

[loops.qos_baseline]
enabled = false

[loops.avx_weight]
enabled = true
interval = "1s"
classes = ["LS"]
avx_cgroups = ["{vm.BE}"]
hold = "3s"
"""
RAISED = compensated_weight(100, 3200 / 2958)


def weight(cgroup: str) -> str | None:
    return vm.knob(cgroup, "cpu.weight")


def test_ls_weight_is_raised_while_declared_avx_work_runs_and_restored(cpu_controller, koordd_stopped):
    vm.stop_units("avxbe", "avxls")
    vm.pinned_busy_loop("avxls", vm.LS, 0)        # LS has work of its own on the CPU BE shares
    assert weight(vm.LS) == "100", weight(vm.LS)
    vm.write_config(CONFIG)
    cursor = vm.journal_cursor()
    vm.systemctl("start", vm.UNIT)
    try:
        vm.wait_ticks("avx_weight", 2)
        assert weight(vm.LS) == "100", "raised with nothing declared busy"

        vm.pinned_busy_loop("avxbe", vm.BE, 0)
        assert vm.wait_for(lambda: weight(vm.LS) == str(RAISED), 30), \
            f"ls.slice cpu.weight {weight(vm.LS)}, want {RAISED}\n{vm.journal_text(cursor)}"
        [raised] = vm.journal(cursor, "KOORDD_LOOP=avx_weight", "KOORDD_OUTCOME=applied")
        assert (raised["KOORDD_TARGET"], raised["KOORDD_KNOB"]) == (vm.LS, "cpu.weight")
        assert (raised["KOORDD_OLD"], raised["KOORDD_NEW"]) == ("100", str(RAISED))
        reason = json.loads(raised["KOORDD_REASON"])
        assert reason["avx_cgroups"][vm.BE]["declared"] == "AVX-512" and reason["shared_cpus"] == "any (declared)"
        assert weight(vm.BE) == "100"               # raise_victims: the AVX side is left as it is

        vm.stop_units("avxbe")                      # no evidence: back after hold (3 s)
        assert vm.wait_for(lambda: weight(vm.LS) == "100", 30), vm.journal_text(cursor)
        assert vm.held() == [], vm.held()

        vm.pinned_busy_loop("avxbe", vm.BE, 0)      # raised again, then stop restores it
        assert vm.wait_for(lambda: weight(vm.LS) == str(RAISED), 30), vm.journal_text(cursor)
        vm.systemctl("stop", vm.UNIT)
        assert weight(vm.LS) == "100"
    finally:
        vm.stop_units("avxbe", "avxls")
