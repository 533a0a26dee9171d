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
    assert spec["tc.be_ceil"].normalize("20mbit") == "20000000"
    with pytest.raises(InvalidValue, match="htb <rate>"):
        spec["tc.shaping"].normalize("fq 1gbit")


def test_without_pyroute2_every_knob_says_why(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_pyroute2(name, *args, **kw):
        if name == "pyroute2":
            raise ImportError(name)
        return real(name, *args, **kw)
    monkeypatch.setattr(builtins, "__import__", no_pyroute2)
    assert TcBackend().probe() == {k: "no netlink: pyroute2 is not installed" for k in TcBackend.knobs}
