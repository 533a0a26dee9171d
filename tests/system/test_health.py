"""Health signals under systemd: the run-queue latency sensor loads its BPF program inside koordd's
hardened unit when a loop needs it (be_suppress's antagonist detection), and stops when none does."""
from __future__ import annotations

from . import vm

pytestmark = vm.only_in_vm


def sensor_state(name: str) -> str | None:
    status = vm.koordd_status()
    if status.get("pid") not in vm.koordd_pids():
        return None
    return (status.get("sensors") or {}).get(name, {}).get("state")


def test_doctor_says_the_runq_sensor_starts_with_ebpf():
    import json
    caps = {c["name"]: c for c in json.loads(vm.sh("koordctl", "doctor", "--json").stdout)}
    assert "runq_latency: starts (ebpf)" in caps["sensors"]["detail"], caps["sensors"]
    # The application latency program (the SLOs' sensor) loads on this kernel too: its tracepoints, its
    # socket storage and the helpers it calls pass this kernel's verifier.
    assert "app_latency: starts" in caps["sensors"]["detail"], caps["sensors"]


def test_the_runq_sensor_runs_ebpf_under_the_unit_only_while_a_loop_needs_it(koordd_stopped):
    # The shipped rule slack reads the sensor; the threshold rule does not, unless antagonists are on.
    threshold = vm.threshold_config()
    assert 'antagonist_signal = "off"' in threshold
    vm.write_config(threshold.replace('antagonist_signal = "off"', 'antagonist_signal = "runq"'))
    cursor = vm.journal_cursor()
    vm.systemctl("start", vm.UNIT)
    assert vm.wait_for(lambda: sensor_state("runq_latency") == "running", 120), \
        f"{vm.koordd_status().get('sensors')}\n{vm.journal_text(cursor)}"
    log = vm.journal_text(cursor)
    assert "sensor runq_latency started" in log, log
    assert "from schedstat" not in log, log             # the VM has libbpf1 and BTF (and no headers)
    vm.wait_ticks("be_suppress", 2)

    vm.write_config(threshold)                           # no loop needs it any more: reload stops it
    assert vm.wait_for(lambda: sensor_state("runq_latency") == "stopped", 120), vm.koordd_status().get("sensors")
    assert vm.is_active() == "active"
