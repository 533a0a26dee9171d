"""koordd.kernel.sched_ext_scheduler's safe switch against a fake /sys/kernel/sched_ext and a fake scheduler: the steps, and
the fall back to the kernel's scheduler whenever the kernel does not confirm ours. (Loading the real
object needs a sched_ext kernel: tests/system/test_sched_ext_scheduler.py, in the VM.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from koordd.kernel.sched_ext_scheduler import OBJECT, SchedExtError, switch_to


def write_status(sys_root: Path, state: str, ops: str = "", enable_seq: int = 3) -> None:
    base = sys_root / "kernel/sched_ext"
    (base / "root").mkdir(parents=True, exist_ok=True)
    (base / "state").write_text(f"{state}\n")
    (base / "enable_seq").write_text(f"{enable_seq}\n")
    ops_file = base / "root/ops"
    if ops:
        ops_file.write_text(f"{ops}\n")
    elif ops_file.exists():
        ops_file.unlink()


class FakeScheduler:
    """Records the calls; attaching makes the fake kernel say what `on_attach` says."""

    def __init__(self, sys_root: Path, on_attach=("enabled", "koordd", 4), fail: str = ""):
        self.sys_root, self.on_attach, self.fail = sys_root, on_attach, fail
        self.calls: list = []

    def __call__(self):
        if self.fail == "load":
            raise SchedExtError("verifier said no")
        self.calls.append("load")
        return self

    def set_classes(self, classes):
        self.calls.append(("classes", classes))

    def attach(self):
        if self.fail == "attach":
            raise SchedExtError("bpf_link_create: Device or resource busy")
        self.calls.append("attach")
        write_status(self.sys_root, *self.on_attach)

    def unload(self):
        self.calls.append("unload")
        seq = int((self.sys_root / "kernel/sched_ext/enable_seq").read_text())    # unloading keeps the count
        write_status(self.sys_root, "disabled", enable_seq=seq)


CLASSES = {101: "LS", 202: "BE"}


def test_switch_loads_fills_the_classes_first_and_confirms(tmp_path):
    write_status(tmp_path, "disabled")
    fake = FakeScheduler(tmp_path)
    result = switch_to(CLASSES, sys_root=tmp_path, timeout=0.2, load=fake)
    assert result.scheduler is fake
    assert fake.calls == ["load", ("classes", CLASSES), "attach"]
    assert result.status.ops == "koordd" and result.status.enable_seq == 4
    assert "koordd's scheduler runs" in result.reason


def test_switch_stops_our_old_scheduler_first(tmp_path):
    write_status(tmp_path, "enabled", "koordd", enable_seq=3)
    old = FakeScheduler(tmp_path, on_attach=("enabled", "koordd", 3))
    new = FakeScheduler(tmp_path, on_attach=("enabled", "koordd", 4))
    result = switch_to(CLASSES, old, sys_root=tmp_path, timeout=0.2, load=new)
    assert old.calls == ["unload"] and result.scheduler is new


@pytest.mark.parametrize("on_attach, problem", [
    (("enabled", "scx_simple", 4), "root/ops is 'scx_simple'"),
    (("enabled", "koordd", 3), "enable_seq 3 did not rise above 3"),
    (("disabled", "", 4), "state is disabled"),
])
def test_switch_unloads_what_the_kernel_does_not_confirm(tmp_path, on_attach, problem):
    write_status(tmp_path, "disabled")
    fake = FakeScheduler(tmp_path, on_attach)
    result = switch_to(CLASSES, sys_root=tmp_path, timeout=0.2, load=fake)
    assert result.scheduler is None and fake.calls[-1] == "unload"
    assert problem in result.reason and "the kernel's scheduler runs" in result.reason


@pytest.mark.parametrize("fail, calls", [("load", []), ("attach", ["load", ("classes", CLASSES), "unload"])])
def test_a_failed_load_or_attach_leaves_the_kernels_scheduler(tmp_path, fail, calls):
    write_status(tmp_path, "disabled")
    fake = FakeScheduler(tmp_path, fail=fail)
    result = switch_to(CLASSES, sys_root=tmp_path, timeout=0.2, load=fake)
    assert result.scheduler is None and fake.calls == calls
    assert result.reason.startswith("loading failed, the kernel's scheduler runs")


def test_another_programs_scheduler_is_not_stopped(tmp_path):
    write_status(tmp_path, "enabled", "scx_lavd")
    fake = FakeScheduler(tmp_path)
    result = switch_to(CLASSES, sys_root=tmp_path, timeout=0.2, load=fake)
    assert result.scheduler is None and fake.calls == []
    assert "another BPF scheduler is loaded" in result.reason and "scx_lavd" in result.reason


def test_an_old_scheduler_that_does_not_stop_is_reported(tmp_path):
    write_status(tmp_path, "enabled", "koordd")
    stuck = FakeScheduler(tmp_path)
    stuck.unload = lambda: write_status(tmp_path, "disabling", "koordd")
    fake = FakeScheduler(tmp_path)
    result = switch_to(CLASSES, stuck, sys_root=tmp_path, timeout=0.1, load=fake)
    assert result.scheduler is None and fake.calls == []
    assert "did not stop within 0.1s" in result.reason and "state=disabling" in result.reason


def test_without_sched_ext_nothing_is_loaded(tmp_path):
    fake = FakeScheduler(tmp_path)
    result = switch_to(CLASSES, sys_root=tmp_path, timeout=0.1, load=fake)
    assert result.scheduler is None and fake.calls == [] and "CONFIG_SCHED_CLASS_EXT" in result.reason


def test_the_object_is_shipped_with_its_struct_ops_and_maps():
    data = OBJECT.read_bytes()
    assert data[:4] == b"\x7fELF"
    for name in (b".struct_ops", b"koordd_ops", b"classes", b"runs_be", b".bss", b"koordd_dispatch"):
        assert name in data, name
