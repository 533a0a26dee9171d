"""The tc backend on the real kernel: koordd's HTB tree on a veth pair of the test's own, BE's ceil,
re-rating, a root qdisc someone else made, restore through the actuator, a device that goes away.
Needs root and pyroute2; skipped otherwise."""
from __future__ import annotations

import os

import pytest

from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.tc import TcBackend
from koordd.core.backend import Backends, InvalidValue, TargetGone, Unsupported
from koordd.core.decisions import APPLIED, RESTORED
from koordd.core.loop import Action

pytestmark = pytest.mark.kernel
pytest.importorskip("pyroute2")
DEV = f"kdtc{os.getpid() % 10000}"


@pytest.fixture
def veth():
    if os.geteuid() != 0:
        pytest.skip("needs root (tc)")
    from pyroute2 import IPRoute
    ipr = IPRoute()
    ipr.link("add", ifname=DEV, kind="veth", peer={"ifname": DEV + "p"})
    backend = TcBackend()
    try:
        yield ipr, ipr.link_lookup(ifname=DEV)[0], backend
    finally:
        backend.close()
        for index in ipr.link_lookup(ifname=DEV):
            ipr.link("del", index=index)
        ipr.close()


def test_the_tree_is_made_re_rated_and_removed(veth):
    ipr, index, b = veth
    assert b.probe() == {}
    assert b.read(DEV, "tc.shaping") == "none"
    with pytest.raises(Unsupported, match="no koordd shaping"):
        b.read(DEV, "tc.be_ceil")
    assert b.validate(DEV, "tc.shaping", "htb 1gbit") == "htb 1000000000"
    b.write(DEV, "tc.shaping", "htb 1000000000")
    assert b.read(DEV, "tc.shaping") == "htb 1000000000" and b.read(DEV, "tc.be_ceil") == "1000000000"
    odd = b.validate(DEV, "tc.be_ceil", "16418394")          # the kernel holds bytes/s: written as it reads back
    b.write(DEV, "tc.be_ceil", odd)
    assert b.read(DEV, "tc.be_ceil") == odd == "16418392"
    b.write(DEV, "tc.be_ceil", b.validate(DEV, "tc.be_ceil", "50mbit"))
    assert b.read(DEV, "tc.be_ceil") == "50000000"
    assert b.validate(DEV, "tc.be_ceil", "none") == "1000000000"           # no ceiling: the link rate
    with pytest.raises(InvalidValue, match="above kdtc.* link rate 1000000000"):
        b.validate(DEV, "tc.be_ceil", "2gbit")
    # A new link rate keeps BE's ceil, within the new rate.
    b.write(DEV, "tc.shaping", "htb 500000000")
    assert b.read(DEV, "tc.shaping") == "htb 500000000" and b.read(DEV, "tc.be_ceil") == "50000000"
    b.write(DEV, "tc.shaping", "htb 20000000")
    assert b.read(DEV, "tc.be_ceil") == "20000000"
    b.write(DEV, "tc.shaping", "none")
    assert b.read(DEV, "tc.shaping") == "none"
    assert [m for m in ipr.get_qdiscs(index) if m["parent"] == 0xFFFFFFFF and m["handle"]] == []


def test_a_root_qdisc_someone_else_made_is_left_alone(veth):
    ipr, index, b = veth
    ipr.tc("add", "htb", index, 0x50000, default=1)
    assert b.read(DEV, "tc.shaping") == "foreign htb 5:"
    with pytest.raises(InvalidValue, match="root qdisc \\(htb 5:\\) is not koordd's"):
        b.validate(DEV, "tc.shaping", "htb 1gbit")


def test_take_over_deletes_the_foreign_root_and_stop_leaves_the_kernels_default(veth, tmp_path):
    ipr, index, b = veth
    ipr.tc("add", "htb", index, 0x50000, default=1)
    act = Actuator(Backends([b]), RestoreJournal(tmp_path), DecisionLog(tmp_path, send=lambda message, **fields: None))
    with pytest.raises(InvalidValue, match="not someone else's sfq 5:"):
        b.validate(DEV, "tc.replace_root", "sfq 5:")                      # not what is there: nothing deleted
    decisions = act.apply("net_shaping", [Action(DEV, "tc.replace_root", "htb 5:", {}, "take over"),
                                          Action(DEV, "tc.shaping", "htb 1gbit", {}, "shape")])
    assert [(d.knob, d.old, d.new, d.outcome) for d in decisions] == [
        ("tc.replace_root", None, "htb 5:", APPLIED), ("tc.shaping", "none", "htb 1000000000", APPLIED)]
    act.restore_all("stopping")
    assert b.read(DEV, "tc.shaping") == "none"


def test_through_the_actuator_and_back(veth, tmp_path):
    ipr, index, b = veth
    journal = RestoreJournal(tmp_path)
    act = Actuator(Backends([b]), journal, DecisionLog(tmp_path, send=lambda message, **fields: None))
    decisions = act.apply("net_shaping", [Action(DEV, "tc.shaping", "htb 1gbit", {}, "shape"),
                                          Action(DEV, "tc.be_ceil", "100mbit", {}, "BE ceil")])
    assert [(d.knob, d.old, d.new, d.outcome) for d in decisions] == [
        ("tc.shaping", "none", "htb 1000000000", APPLIED), ("tc.be_ceil", "1000000000", "100000000", APPLIED)]
    assert [d.outcome for d in act.restore_all("stopping")] == [RESTORED, RESTORED]
    assert b.read(DEV, "tc.shaping") == "none" and journal.entries() == []
    ipr.link("del", index=index)
    with pytest.raises(TargetGone):
        b.read(DEV, "tc.shaping")
