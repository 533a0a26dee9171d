"""tc backend values, without netlink (the real-kernel test is tests/kernel/test_tc_backend_kernel.py)."""
from __future__ import annotations

import pytest

from koordtest.fakes.netlink import Msg
from koordd.backends.tc import TcBackend
from koordd.core.backend import InvalidValue
from koordd.core.units import parse_rate


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

    from koordd.kernel.netlink import kernel_has_qdisc
    assert kernel_has_qdisc("sch_fq", "6.1", tmp_path) is None                  # nothing says
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/config.gz").write_bytes(gzip.compress(b"CONFIG_NET_SCH_HTB=y\n# CONFIG_NET_SCH_FQ is not set\n"))
    assert (kernel_has_qdisc("sch_fq", "6.1", tmp_path), kernel_has_qdisc("sch_htb", "6.1", tmp_path)) == (False, True)
    mods = tmp_path / "lib/modules/6.1"
    mods.mkdir(parents=True)
    (mods / "modules.dep").write_text("kernel/net/sched/sch_fq.ko.xz:\n")
    assert kernel_has_qdisc("sch_fq", "6.1", tmp_path) is True
    assert kernel_has_qdisc("sch_fq_codel", "6.1", tmp_path) is False


# --- edt through a fake netlink: what koordd asks the kernel for -------------------------------------

class FakeIPRoute:
    """Root qdiscs of one device (index 1) and the tc calls made, as the kernel would keep them."""

    def __init__(self, queues=1):
        self.queues, self.root, self.calls = queues, None, []         # root: (kind, handle)

    def link_lookup(self, ifname):
        return [1] if ifname == "eth0" else []

    def get_links(self, index):
        return [Msg({"IFLA_NUM_TX_QUEUES": self.queues})]

    def get_qdiscs(self, index):
        return [Msg({"TCA_KIND": self.root[0]}, handle=self.root[1], parent=0xFFFFFFFF)] if self.root else []

    def get_classes(self, index):
        return []

    def tc(self, command, kind, index, handle=0, **kw):
        self.calls.append((command, kind, handle, kw.get("parent")))
        if command == "add" and kw.get("parent") is None:
            self.root = (kind, handle)
        elif command == "del":
            assert self.root == (kind, handle)
            self.root = None


class FakePacer:
    def __init__(self):
        self.pace = {}

    def set_pace(self, index, classid, rate):
        if rate is None:
            self.pace.pop((index, classid), None)
        else:
            self.pace[(index, classid)] = rate

    def paces(self, index):
        return {c: r for (i, c), r in self.pace.items() if i == index}


class Shared:
    def __init__(self, pacer):
        self.pacer = pacer

    def get(self):
        return self.pacer

    def opened_classifier(self):
        return self.pacer


@pytest.fixture
def no_fq_check(monkeypatch):
    import koordd.backends.tc as tc
    monkeypatch.setattr(tc, "kernel_has_qdisc", lambda module, *a, **k: True)


def test_edt_is_an_fq_root_and_be_s_pace_in_the_classifier(no_fq_check):
    from koordd.kernel.netlink import BE_CLASS, EDT_ROOT
    ipr, pacer = FakeIPRoute(), FakePacer()
    b = TcBackend(Shared(pacer), ipr)
    assert b.read("eth0", "tc.shaping") == "none"
    b.write("eth0", "tc.shaping", b.validate("eth0", "tc.shaping", "edt"))
    assert ipr.calls == [("add", "fq", EDT_ROOT, None)] and b.read("eth0", "tc.shaping") == "edt"
    assert b.read("eth0", "tc.be_ceil") == "none"                              # not paced yet
    b.write("eth0", "tc.be_ceil", b.validate("eth0", "tc.be_ceil", "300mbit"))
    assert pacer.pace == {(1, BE_CLASS): 300_000_000} and b.read("eth0", "tc.be_ceil") == "300000000"
    # the kernel holds bytes/s: a ceiling is written as it will read back, so a restore knows its own value
    assert b.validate("eth0", "tc.be_ceil", "16418394") == "16418392"
    b.write("eth0", "tc.shaping", "none")                                     # restore: root and pace go
    assert ipr.root is None and pacer.pace == {}


def test_edt_on_a_multi_queue_device_is_mq_with_an_fq_per_queue(no_fq_check):
    from koordd.kernel.netlink import EDT_ROOT
    ipr = FakeIPRoute(queues=3)
    b = TcBackend(Shared(FakePacer()), ipr)
    b.write("eth0", "tc.shaping", "edt")
    assert ipr.calls == [("add", "mq", EDT_ROOT, None)] + [("replace", "fq", 0, EDT_ROOT | q) for q in (1, 2, 3)]
    assert b.read("eth0", "tc.shaping") == "edt"


def test_from_edt_to_htb_the_fq_root_goes_first(no_fq_check):
    from koordd.kernel.netlink import EDT_ROOT, ROOT
    ipr = FakeIPRoute()
    b = TcBackend(Shared(FakePacer()), ipr)
    b.write("eth0", "tc.shaping", "edt")
    ipr.calls.clear()
    b.write("eth0", "tc.shaping", "htb 1000000000")
    assert ipr.calls[:2] == [("del", "fq", EDT_ROOT, None), ("add", "htb", ROOT, None)]


def test_edt_is_refused_where_the_kernel_has_no_fq(monkeypatch):
    import koordd.backends.tc as tc
    from koordd.core.backend import Unsupported
    monkeypatch.setattr(tc, "kernel_has_qdisc", lambda module, *a, **k: False)
    b = TcBackend(Shared(FakePacer()), FakeIPRoute())
    with pytest.raises(Unsupported, match="no fq qdisc"):
        b.validate("eth0", "tc.shaping", "edt")


# --- pyroute2's stray ACKs -----------------------------------------------------------------------------

def _stray_queue(ipr):
    queues = getattr(getattr(getattr(ipr, "asyncore", None), "msg_queue", None), "queues", None)
    return queues.get(0) if isinstance(queues, dict) else None


def test_single_link_requests_leave_no_ack_queued_in_pyroute2():
    """A link_lookup or get_links(index) left the kernel's ACK in a pyroute2 queue nothing reads, a page
    of memory each (scripts/soak: koordd's RSS grew 2.4 MiB a minute with net_shaping on)."""
    pyroute2 = pytest.importorskip("pyroute2")
    from koordd.kernel.netlink import device_index, device_links
    with pyroute2.IPRoute() as ipr:
        lo = ipr.link_lookup(ifname="lo")
        queue = _stray_queue(ipr)
        if not lo or queue is None or queue.empty():
            pytest.skip("this pyroute2 leaves no ACK of a single-link request behind")
        for _ in range(20):
            assert device_index(ipr, "lo") == lo[0] and device_links(ipr, lo[0])
            assert device_index(ipr, "no-such-device") is None
        assert queue.empty()


def test_stray_acks_are_dropped_only_where_pyroute2_keeps_them():
    from koordd.kernel.netlink import drop_stray_acks
    drop_stray_acks(FakeIPRoute())          # no such queue: nothing to do, nothing raised
