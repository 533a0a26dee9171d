"""koordd/kernel/avx.py: arch_status, stat and cpuinfo parsing from literal kernel text (broken text included), SMT
siblings, the frequency model's arithmetic, the APERF/MPERF reader over a fake msr file, and the PMU's licence
events: their encodings, the CPU models that have them, and the level their shares make."""
from __future__ import annotations

import pytest

from koordd.core.avx import (AVX256, AVX512, DEFAULT_MHZ, FrequencyModel, Licence, SCALAR, VectorUse,
    compensated_weight, licence_of, recent, with_siblings)
from koordd.kernel.avx import (CpuId, LICENCE_EVENTS, NEVER, TaskStat, licence_events_missing, measured_mhz,
    parse_arch_status, parse_cpuinfo, parse_stat, read_aperf_mperf, read_thread)
from koordd.kernel.perf import PERF_TYPE_RAW


def stat_line(tid: int, comm: str = "worker", state: str = "S", utime: int = 0, stime: int = 0, cpu: int = 0) -> str:
    """A /proc/<pid>/task/<tid>/stat line: pid (comm) then fields 3..52, as proc(5) numbers them."""
    rest = ["0"] * 50
    rest[3 - 3], rest[14 - 3], rest[15 - 3], rest[39 - 3] = state, str(utime), str(stime), str(cpu)
    return f"{tid} ({comm}) {' '.join(rest)}\n"


def write_thread(proc, tid: int, arch_status: str | None, stat: str | None) -> None:
    d = proc / str(tid) / "task" / str(tid)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in (("arch_status", arch_status), ("stat", stat)):
        if text is not None:
            (d / name).write_text(text)


@pytest.mark.parametrize("text, want", [
    ("AVX512_elapsed_ms:\t12\n", 12),
    ("AVX512_elapsed_ms:\t-1\n", NEVER),
    ("Other:\t1\nAVX512_elapsed_ms:\t0\n", 0),
    ("", None),                                 # a kernel or CPU without AVX-512 prints nothing
    ("AVX512_elapsed_ms:\tsoon\n", None),
    ("garbage", None),
])
def test_arch_status(text, want):
    assert parse_arch_status(text) == want


def test_recent_excludes_never():
    assert recent(0, 100) and recent(100, 100)
    assert not recent(101, 100) and not recent(NEVER, 100)


def test_stat_fields_are_counted_after_the_last_parenthesis():
    # comm is whatever the task named itself: here "a) (b c)", spaces and parentheses included
    assert parse_stat(stat_line(7, comm="a) (b c)", state="R", utime=5, stime=2, cpu=13)) == TaskStat("R", 7, 13)
    assert parse_stat(stat_line(7, comm=")", cpu=3)).cpu == 3


@pytest.mark.parametrize("text", ["", "7 worker S 0 0", "7 (worker) S 0 0\n",
                                  stat_line(7, cpu=5).replace(" 5 ", " x "),         # field 39 garbled
                                  "7 (worker" + stat_line(7).partition(")")[2]])     # no ")" at all
def test_truncated_or_garbled_stat_is_none(text):
    assert parse_stat(text) is None


def test_read_thread_reads_the_threads_own_files_and_skips_what_is_gone(tmp_path):
    proc = tmp_path / "proc"
    write_thread(proc, 10, "AVX512_elapsed_ms:\t3\n", stat_line(10, state="R", cpu=2))
    write_thread(proc, 11, "AVX512_elapsed_ms:\t3\n", None)         # exited between the two reads
    write_thread(proc, 12, "", stat_line(12))                       # no AVX-512 line
    got = read_thread(proc, 10)
    assert got.elapsed_ms == 3 and got.stat.cpu == 2 and got.stat.state == "R"
    assert read_thread(proc, 11) is None and read_thread(proc, 12) is None
    assert read_thread(proc, 99) is None                            # exited before


def test_with_siblings_adds_each_cpus_core_and_an_unknown_cpu_stands_for_itself():
    assert with_siblings({0, 5}, {0: frozenset({0, 2}), 2: frozenset({0, 2}), 1: frozenset({1})}) == {0, 2, 5}
    assert with_siblings({3}, {}) == {3}


# --- the model -------------------------------------------------------------------------------------------

M = FrequencyModel()


def test_defaults_are_the_papers_measurements():
    assert dict(M.mhz) == DEFAULT_MHZ == {"scalar": 3200, "avx128": 3188, "avx256": 3147, "avx512": 2958}
    assert M.nominal_mhz == 3200 and M.hold_ms == 2.0


def test_a_scalar_task_alone_runs_at_nominal():
    assert M.effective_mhz([VectorUse()]) == 3200
    assert M.factor(M.effective_mhz([VectorUse()])) == 1.0


def test_a_victim_next_to_avx512_on_its_smt_sibling_runs_at_avx512s_frequency():
    f = M.effective_mhz([VectorUse()], [VectorUse(AVX512)])
    assert f == 2958
    assert M.factor(f) == pytest.approx(3200 / 2958)                 # ≈ 1.082


def test_a_victim_next_to_avx2_loses_less():
    f = M.effective_mhz([VectorUse(SCALAR)], [VectorUse(AVX256)])
    assert f == 3147 and M.factor(f) == pytest.approx(3200 / 3147)   # ≈ 1.017


def test_the_drop_outlasts_the_last_avx_instruction_by_hold_ms():
    # the task before the victim on the same CPU used AVX-512 1 ms ago: still in force; 3 ms ago: gone
    assert M.effective_mhz([VectorUse(), VectorUse(AVX512, ago_ms=1)]) == 2958
    assert M.effective_mhz([VectorUse(), VectorUse(AVX512, ago_ms=3)]) == 3200
    # the deepest level in force wins
    assert M.effective_mhz([VectorUse(AVX256)], [VectorUse(AVX512, ago_ms=2)]) == 2958


def test_factor_never_charges_for_turbo_or_nonsense():
    assert M.factor(3500) == 1.0
    assert M.factor(0) == 1.0


def test_a_custom_table():
    m = FrequencyModel({SCALAR: 2000, "avx128": 2000, AVX256: 1800, AVX512: 1600}, hold_ms=0.5)
    assert m.factor(m.effective_mhz([VectorUse()], [VectorUse(AVX512)])) == 1.25


@pytest.mark.parametrize("base, factor, want", [
    (100, 3200 / 2958, 108), (100, 1.0, 100), (1, 1.5, 2), (1, 1.2, 1),
    (9500, 1.25, 10000),                       # capped at the kernel's maximum
    (0, 1.1, 1), (100, 0.0, 1),                # never below 1
])
def test_compensated_weight_stays_within_1_to_10000(base, factor, want):
    assert compensated_weight(base, factor) == want


# --- APERF / MPERF --------------------------------------------------------------------------------------

def test_aperf_mperf_from_an_msr_file(tmp_path):
    # The msr device reads MSR n at offset n; in a plain file the two 8-byte reads overlap by 7 bytes, so
    # two distinct bytes show both offsets and the byte order: MPERF = bytes E7..EE, APERF = bytes E8..EF.
    msr = bytearray(0x100)
    msr[0xE7], msr[0xE8] = 0x10, 0x20
    (tmp_path / "0").mkdir()
    (tmp_path / "0/msr").write_bytes(bytes(msr))
    (tmp_path / "1").mkdir()
    (tmp_path / "1/msr").write_bytes(b"\0" * 0xE9)                     # too short: no such MSR
    assert read_aperf_mperf(0, tmp_path) == (0x20, 0x2010)
    assert read_aperf_mperf(1, tmp_path) is None
    assert read_aperf_mperf(2, tmp_path) is None                       # no msr module, or not root


def test_measured_frequency_is_the_tsc_rate_scaled_by_aperf_over_mperf():
    assert measured_mhz((100, 100), (100 + 2958, 100 + 3200), tsc_mhz=3200) == pytest.approx(2958)
    assert measured_mhz((5, 5), (5, 5), tsc_mhz=3200) is None           # idle throughout


# --- the PMU's licence events ---------------------------------------------------------------------------

def test_the_licence_events_are_counted_with_cycles_in_perfs_encodings():
    # skylakex/other.json: EventCode 0x28, UMask 0x18 (LVL1) and 0x20 (LVL2); config = umask << 8 | event
    assert [(e.name, e.type, e.config) for e in LICENCE_EVENTS[1:]] == [
        ("core_power.lvl1_turbo_license", PERF_TYPE_RAW, 0x1828),
        ("core_power.lvl2_turbo_license", PERF_TYPE_RAW, 0x2028)]
    assert LICENCE_EVENTS[0].name == "cycles"


XEON = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n"
        "model name\t: Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz\nstepping\t: 7\n\n"
        "processor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 106\n\n")


@pytest.mark.parametrize("text, cpu", [
    (XEON, CpuId("GenuineIntel", 6, 85)),                        # the first CPU's; "model name" is not "model"
    ("vendor_id : AuthenticAMD\ncpu family : 25\nmodel : 17\n", CpuId("AuthenticAMD", 25, 17)),
    ("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n", None),   # arm64 says none of it
    ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: x\n", None),
    ("", None),
])
def test_parse_cpuinfo(text, cpu):
    assert parse_cpuinfo(text) == cpu


@pytest.mark.parametrize("cpu, has", [
    *((CpuId("GenuineIntel", 6, m), True) for m in (0x55, 0x6A, 0x6C, 0x7D, 0x7E)),
    (CpuId("GenuineIntel", 6, 0x8F), False),                     # Sapphire Rapids: no CORE_POWER events
    (CpuId("GenuineIntel", 6, 0xA7), False),                     # Rocket Lake: not in perf's lists
    (CpuId("AuthenticAMD", 25, 0x55), False),
    (CpuId("GenuineIntel", 15, 0x55), False),
])
def test_the_models_with_licence_events(cpu, has):
    assert (licence_events_missing(cpu) is None) == has
    if not has:
        assert licence_events_missing(cpu).startswith(f"{cpu} has no CORE_POWER licence events")
    assert licence_events_missing(None) == "CPU model unknown (no vendor_id, cpu family and model in cpuinfo)"


@pytest.mark.parametrize("lvl1, lvl2, seen, level", [
    (0, 0, True, SCALAR),                                         # ordinary code
    (0, 100, True, AVX512),                                       # a tenth of its cycles at licence 2
    (0, 99, True, SCALAR),
    (60, 50, True, AVX256),                                       # over a tenth at licence 1 or 2, under at 2
    (100, 0, False, AVX256),
    (0, 900, False, SCALAR),                                      # licence 2 without AVX-512 state: a neighbour's
    (200, 700, False, AVX256),
])
def test_the_level_from_the_shares_of_cycles_at_licence_1_and_2(lvl1, lvl2, seen, level):
    got = licence_of(1000, lvl1, lvl2, avx512_seen=seen)
    assert got == Licence(1000, lvl1 / 1000, lvl2 / 1000, level)


def test_licence_shares_are_of_cycles_clamped_and_zero_when_it_did_not_run():
    assert licence_of(1000, 0, 1500, True) == Licence(1000, 0.0, 1.0, AVX512)      # counting noise
    assert licence_of(0, 0, 0, True) == Licence(0, 0.0, 0.0, SCALAR)
    assert licence_of(1000, 0, 300, True, share=0.5).level == SCALAR               # the threshold is an argument
