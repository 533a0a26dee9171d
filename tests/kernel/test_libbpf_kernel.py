"""koordd's one BPF loader on the real kernel (koordd/kernel/libbpf.py): the shipped CO-RE objects load
and attach with no compiler or headers, report where they run and what they cost, leave nothing behind
when closed, and a failure says what failed in libbpf's and the kernel's words."""
from __future__ import annotations

import ctypes
import errno
import os
import time

import pytest

from koordd.kernel import libbpf
from koordd.kernel.libbpf import BpfError, BpfObject, has_tcx, tcx_egress_programs
from koordd.kernel.netclass import PROGRAM as NET_PROGRAM, DevClass
from koordd.sensors.runq import PROGRAM as RUNQ_PROGRAM
from koordtest.kernel import wait_for

pytestmark = pytest.mark.kernel


def loaded(path) -> BpfObject:
    try:
        return BpfObject(path)
    except BpfError as e:
        if os.environ.get("KOORDD_REQUIRE_EBPF"):
            pytest.fail(f"scripts/test set this host up for eBPF, yet: {e}")
        pytest.skip(str(e))


def prog_ids() -> set[int]:
    """Every BPF program id the kernel has now."""
    lib, out, cur = libbpf.libbpf(), set(), ctypes.c_uint32(0)
    fn = lib.bpf_prog_get_next_id
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]
    while fn(cur.value, ctypes.byref(cur)) == 0:
        out.add(cur.value)
    return out


def test_the_run_queue_object_attaches_reports_itself_and_goes_when_closed():
    before = prog_ids()
    obj = loaded(RUNQ_PROGRAM)
    try:
        obj.attach_all()
        d = obj.describe()
        assert d["object"] == "runq_latency.bpf.o"
        assert {p["name"]: p["attached"] for p in d["programs"]} == {
            "runq_switch": ["tp_btf/sched_switch"], "runq_wakeup": ["tp_btf/sched_wakeup"],
            "runq_wakeup_new": ["tp_btf/sched_wakeup_new"]}
        sizes = {m["name"]: (m["max_entries"], m["key_size"], m["value_size"]) for m in d["maps"]}
        assert sizes["waits"] == (16384, 8, 33 * 8) and sizes["queued"] == (0, 4, 16)   # task storage (no size of its own): struct stamp
        ours = {p["id"] for p in d["programs"]}
        assert ours <= prog_ids() - before
        assert d in libbpf.report()["objects"]
    finally:
        obj.close()
    # Nothing pinned, nothing left: the kernel frees them once no fd holds them (after an RCU grace period).
    assert wait_for(lambda: not ours & prog_ids(), 30), ours & prog_ids()
    assert obj not in libbpf._LOADED


def test_a_tcx_link_goes_with_its_fd():
    if not has_tcx():
        pytest.skip("the kernel has no tcx links (Linux 6.6+)")
    obj = loaded(NET_PROGRAM)
    try:
        fd = obj.attach_tcx_egress("classify", 1)           # loopback
        assert len(tcx_egress_programs(1)) == 1
        assert obj.describe()["programs"][0]["attached"] == ["tcx egress of device 1"]
        obj.detach(fd)
        assert tcx_egress_programs(1) == [] and obj.describe()["programs"][0]["attached"] == []
        with pytest.raises(BpfError) as e:
            obj.attach_tcx_egress("classify", 2 ** 31 - 1)  # no such device
        assert e.value.errno == errno.ENODEV and "attaching classify to device" in str(e.value)
    finally:
        obj.close()


def test_a_broken_object_fails_naming_the_step_and_libbpfs_reason(tmp_path):
    broken = tmp_path / "broken.bpf.o"
    broken.write_bytes(RUNQ_PROGRAM.read_bytes()[:4096])     # an ELF cut short
    with pytest.raises(BpfError, match=r"^opening .*broken\.bpf\.o: .*\(libbpf: .+\)$"):
        BpfObject(broken)


def test_a_libbpf_message_over_4_kib_is_kept_whole_to_its_reason(tmp_path):
    # A failed load's verifier log is one message, its reason at the end: it once came cut at 4 KiB.
    # A path of 5000 characters makes libbpf's own "failed to open PATH: REASON" message that long.
    path = tmp_path / ("x" * 200) / ("y" * 5000 + ".bpf.o")
    with pytest.raises(BpfError) as failed:
        BpfObject(path)
    assert str(failed.value).endswith(f"{path.name}: {os.strerror(errno.ENAMETOOLONG)})"), str(failed.value)[-200:]


def test_a_map_of_the_wrong_size_is_refused_before_the_kernel_writes_past_it():
    obj = loaded(RUNQ_PROGRAM)
    try:
        with pytest.raises(BpfError, match="map waits's value is 264 bytes, not 8"):
            obj.map("waits", ctypes.c_uint64, ctypes.c_uint64)
    finally:
        obj.close()


def test_items_come_in_batches_every_one_of_them_per_cpu_values_as_arrays():
    runq, net = loaded(RUNQ_PROGRAM), loaded(NET_PROGRAM)
    try:
        watched = runq.map("watched", ctypes.c_uint64, ctypes.c_uint8)
        for cid in range(1, 601):                   # more than a batch: resumed from the kernel's token
            watched.update(ctypes.c_uint64(cid), ctypes.c_uint8(cid % 7))
        batched = watched._batched()
        assert batched is not None, "the kernel refused BPF_MAP_LOOKUP_BATCH on a hash map"
        assert sorted((k.value, v.value) for k, v in batched) == [(c, c % 7) for c in range(1, 601)]
        watched.clear()
        assert watched.items() == []

        sent = net.map("sent", DevClass, ctypes.c_uint64)      # per-CPU: one value per possible CPU
        per_cpu = sent.value_type(*range(1, len(sent.value_type()) + 1))
        sent.update(DevClass(3, 0x10020), per_cpu)
        [(key, value)] = sent.items()
        assert (key.ifindex, key.classid, list(value)) == (3, 0x10020, list(per_cpu))
    finally:
        runq.close()
        net.close()


def test_a_benchmark_reads_a_programs_run_time_by_its_id_while_the_kernel_counts():
    """koordtest/bench/bpf_stats.py: bench-qos --bpf-stats reads koordd's programs by the ids in its status file."""
    from koordtest.bench import bpf_stats
    obj = loaded(RUNQ_PROGRAM)
    try:
        obj.attach_all()
        ids = {p["id"]: p["name"] for p in obj.describe()["programs"]}
        was = bpf_stats.STATS_SWITCH.read_text()
        with bpf_stats.counting():
            before = bpf_stats.read_counters(ids)
            for _ in range(50):
                time.sleep(0.001)       # each a switch out and, woken, a switch in
            after = bpf_stats.read_counters(list(ids) + [2**31 - 1])         # an id no program has: left out
        assert bpf_stats.STATS_SWITCH.read_text() == was
        assert set(after) == set(ids) == set(before)
        switch = next(i for i, name in ids.items() if name == "runq_switch")
        assert after[switch][1] > before[switch][1] and after[switch][0] > before[switch][0]
    finally:
        obj.close()
