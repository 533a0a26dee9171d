"""tc backend values, without netlink (the real-kernel test is tests/kernel/test_tc_backend_kernel.py)."""
from __future__ import annotations

import pytest

from koordd.backend import InvalidValue
from koordd.tc_backend import TcBackend, parse_rate


@pytest.mark.parametrize("text, bits", [("1gbit", 10**9), ("250mbit", 250 * 10**6), ("1.5kbit", 1500),
                                        ("1000000", 10**6), (8000, 8000), (" 10 MBIT ", 10**7)])
def test_rates_in_tcs_units(text, bits):
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["fast", "1gbps", "-5mbit", "4", True])
def test_bad_rates(text):
    with pytest.raises(InvalidValue):
        parse_rate(text)


def test_knob_values_are_canonical():
    spec = TcBackend.knobs
    assert spec["tc.shaping"].normalize(" htb 1gbit ") == "htb 1000000000"
    assert spec["tc.shaping"].normalize("none") == "none"
    assert spec["tc.shaping"].normalize(" edt") == "edt"
    assert spec["tc.be_ceil"].normalize("20mbit") == "20000000"
    assert spec["tc.be_ceil"].normalize("none") == "none"
    with pytest.raises(InvalidValue, match="htb <rate>"):
        spec["tc.shaping"].normalize("fq 1gbit")
    with pytest.raises(InvalidValue, match="htb <rate>"):
        spec["tc.shaping"].normalize("edt 1gbit")


def test_without_pyroute2_every_knob_says_why_and_with_it_nothing_is_imported_yet(monkeypatch):
    import importlib.util
    import sys
    monkeypatch.delitem(sys.modules, "pyroute2", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert TcBackend().probe() == {k: "no netlink: pyroute2 is not installed" for k in TcBackend.knobs}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert TcBackend().probe() == {} and "pyroute2" not in sys.modules


def test_whether_the_kernel_has_a_qdisc_comes_from_its_module_lists_then_its_config(tmp_path):
    import gzip

    from koordd.tc_backend import kernel_has_qdisc
    assert kernel_has_qdisc("sch_fq", "6.1", tmp_path) is None                  # nothing says
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/config.gz").write_bytes(gzip.compress(b"CONFIG_NET_SCH_HTB=y\n# CONFIG_NET_SCH_FQ is not set\n"))
    assert (kernel_has_qdisc("sch_fq", "6.1", tmp_path), kernel_has_qdisc("sch_htb", "6.1", tmp_path)) == (False, True)
    mods = tmp_path / "lib/modules/6.1"
    mods.mkdir(parents=True)
    (mods / "modules.dep").write_text("kernel/net/sched/sch_fq.ko.xz:\n")
    assert kernel_has_qdisc("sch_fq", "6.1", tmp_path) is True
    assert kernel_has_qdisc("sch_fq_codel", "6.1", tmp_path) is False
