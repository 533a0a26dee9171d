"""resctrl arithmetic and parsing, against a fake tree that refuses what the kernel refuses.
Verified on a fake tree only: no machine here has resctrl."""
from __future__ import annotations

import errno

import pytest

from koordtest.fakes.resctrl import FakeResctrl
from koordd.core.schemata import AMD_MB_MAX, L3Info, MBInfo, l3_line, l3_mask, mb_line, mb_value
from koordd.kernel.resctrl import ResctrlError, cpu_vendor, parse_schemata, read_info, refused


@pytest.fixture
def tree(tmp_path):
    return FakeResctrl(tmp_path / "resctrl", cbm_mask=0x7FF, min_cbm_bits=2, num_closids=4, cache_ids=(0, 1),
                       alive={100, 101, 102})


def test_info_is_read_from_the_tree(tree):
    info = read_info(tree, "intel")
    assert info.l3 == L3Info(cbm_mask=0x7FF, min_cbm_bits=2, num_closids=4, shareable_bits=0, cache_ids=(0, 1))
    assert info.l3.ways == 11
    assert info.mb == MBInfo(min_bandwidth=10, bandwidth_gran=10, num_closids=4, domain_ids=(0, 1), vendor="intel")
    assert info.num_closids == 4 and info.vendor == "intel"


def test_a_host_without_mba_has_no_mb_info(tmp_path):
    info = read_info(FakeResctrl(tmp_path, mb=False), "intel")
    assert info.l3 is not None and info.mb is None


def test_garbled_info_names_the_file(tree):
    (tree.root / "info/L3/cbm_mask").write_text("zz\n")
    with pytest.raises(ResctrlError, match="info/L3/cbm_mask: expected a hex number, got 'zz'"):
        read_info(tree, "intel")


def test_schemata_as_the_kernel_shows_it_padded_and_zero_filled(tree):
    text = (tree.root / "schemata").read_text()
    assert text == "  L3:0=7ff;1=7ff\n  MB:0=100;1=100\n"
    assert parse_schemata(text) == {"L3": {0: "7ff", 1: "7ff"}, "MB": {0: "100", 1: "100"}}
    with pytest.raises(ResctrlError, match="line 1"):
        parse_schemata("L3 0=ff\n")
    with pytest.raises(ResctrlError, match="not <domain id>=<value>"):
        parse_schemata("L3:x=ff\n")


@pytest.mark.parametrize("start, end, min_bits, mask", [
    (0, 100, 1, 0x7FF),          # every way
    (0, 30, 1, 0xF),             # koordlet's BE default on 11 ways: ways 0..ceil(3.3)
    (0, 5, 2, 0x3),              # one way by the percentages, widened to min_cbm_bits
    (95, 100, 2, 0x600),         # at the top: widened downwards, still inside the mask
    (50, 100, 1, 0x7C0),         # ways ceil(5.5)=6..11
])
def test_masks_from_percent_ranges_are_contiguous_and_long_enough(start, end, min_bits, mask):
    info = L3Info(0x7FF, min_bits, 16, 0, (0,))
    assert l3_mask(info, start, end) == mask


def test_masks_start_at_the_lowest_way_the_cpu_has():
    assert l3_mask(L3Info(0xFF0, 1, 16, 0, (0,)), 0, 50) == 0xF0        # ways 4..7: half of 8


def test_the_fake_tree_takes_what_the_kernel_takes(tree):
    info = read_info(tree, "intel")
    tree.mkdir("koordd-BE")
    tree.write("koordd-BE/schemata", f"L3:{l3_line(info.l3, l3_mask(info.l3, 0, 30))}\n")
    tree.write("koordd-BE/schemata", f"MB:{mb_line(info.mb, mb_value(info.mb, 25))}\n")
    assert parse_schemata(tree.read("koordd-BE/schemata")) == {"L3": {0: "00f", 1: "00f"},
                                                                "MB": {0: "30", 1: "30"}}
    assert tree.last_cmd_status() == "ok"
    tree.write("koordd-BE/tasks", "101\n")
    assert tree.tasks_of("koordd-BE") == [101] and tree.tasks_of() == [100, 102]
    tree.rmdir("koordd-BE")
    assert tree.groups() == [] and sorted(tree.tasks_of()) == [100, 101, 102]


@pytest.mark.parametrize("text, code, status", [
    ("L3:0=5\n", errno.EINVAL, "The mask 5 has non-consecutive 1-bits"),
    ("L3:0=4\n", errno.EINVAL, "Need at least 2 bits in the mask"),
    ("L3:0=fff\n", errno.EINVAL, "Mask out of range"),
    ("L3:0=xyz\n", errno.EINVAL, "Non-hex character in the mask xyz"),
    ("L3:7=ff\n", errno.EINVAL, "ok"),                     # unknown cache id: EINVAL, and no reason
    ("L2:0=ff\n", errno.EINVAL, "Unknown or unsupported resource name 'L2'"),
    ("L3:0=ff", errno.EINVAL, "ok"),                       # no trailing newline
    ("MB:0=5\n", errno.EINVAL, "MB value 5 out of range [10,100]"),
])
def test_the_fake_tree_refuses_what_the_kernel_refuses(tree, text, code, status):
    tree.mkdir("g")
    before = tree.read("g/schemata")
    with pytest.raises(OSError) as e:
        tree.write("g/schemata", text)
    assert e.value.errno == code and tree.last_cmd_status() == status
    assert tree.read("g/schemata") == before
    reason = refused(tree, e.value).strerror
    assert reason == ("Invalid argument" + (f" ({status})" if status != "ok" else ""))


def test_tasks_take_one_live_id_per_write_and_closids_run_out(tree):
    tree.mkdir("a")
    with pytest.raises(OSError) as e:
        tree.write("a/tasks", "999\n")
    assert e.value.errno == errno.ESRCH and tree.last_cmd_status() == "No task 999"
    assert refused(tree, e.value).strerror == "No such process (No task 999)"
    tree.mkdir("b")
    tree.mkdir("c")
    with pytest.raises(OSError) as e:
        tree.mkdir("d")                                    # 4 CLOSIDs: the default group and three
    assert e.value.errno == errno.ENOSPC and tree.last_cmd_status() == "Out of CLOSIDs"


def test_bandwidth_in_the_vendors_unit():
    intel = MBInfo(10, 10, 8, (0,), "intel")
    assert [mb_value(intel, p) for p in (100, 25, 5, 0)] == [100, 30, 10, 10]
    amd = MBInfo(0, 1, 16, (0, 1), "amd")
    assert [mb_value(amd, p) for p in (100, 50, 0)] == [AMD_MB_MAX, 1024, 1] and amd.max_value == 2048
    assert mb_line(amd, 1024) == "0=1024;1=1024"


def test_vendor_from_cpuinfo():
    assert cpu_vendor("processor\t: 0\nvendor_id\t: GenuineIntel\n") == "intel"
    assert cpu_vendor("vendor_id\t: AuthenticAMD\n") == "amd"
    assert cpu_vendor("vendor_id\t: CentaurHauls\n") == "" and cpu_vendor("") == ""
