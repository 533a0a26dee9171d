"""Core scheduling: the `core_sched` backend on fake trees with a fake prctl (one cookie per label shared
by every cgroup written with it, new threads brought in line, restore clears, nested class roots kept
apart), the doctor probe, and the loop's decisions. The real kernel: tests/kernel/test_core_sched_kernel.py."""
from __future__ import annotations

import errno
import threading

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.backends.cgroup_knobs import CgroupBackend
from koordd.backends.core_sched import CoreSchedBackend, probe_core_sched
from koordd.core.backend import Backends, InvalidValue, PartialWrite
from koordd.core.config import loop_options, make_settings
from koordd.core.decisions import APPLIED, REFUSED, RESTORED
from koordd.core.loop import Action
from koordd.core.snapshot import CgroupSample, NodeSample, Snapshot
from koordd.kernel.core_sched import Prctl, probe, smt
from koordd.kernel.host_probe import Host
from koordd_plugins.core_sched import CoreSched


class FakePrctl:
    """Cookies by tid (0: none). `run_as_carrier` runs fn as a fresh thread would: with the cookie of
    koordd's own thread (`own`, 0 unless a test says), and whatever it pulls is dropped at its end."""

    def __init__(self, tids, error: int | None = None):
        self.cookies = {t: 0 for t in tids}
        self.own = 0
        self.carrier: int | None = None        # the carrier thread's cookie while one runs
        self.next = 0xc00c1e
        self.gone: set[int] = set()
        self.refuse: set[int] = set()
        self.error = error                     # every call fails with it (EINVAL: no CONFIG_SCHED_CORE)
        self.created = 0

    def _check(self, tid):
        if self.error:
            raise OSError(self.error, "fake")
        if tid in self.gone or (tid and tid not in self.cookies):
            raise OSError(errno.ESRCH, "No such process")
        if tid in self.refuse:
            raise OSError(errno.EPERM, "Operation not permitted")

    def get(self, tid):
        self._check(tid)
        if tid == 0:
            return self.own if self.carrier is None else self.carrier
        return self.cookies[tid]

    def create(self, tid):
        self._check(tid)
        self.created += 1
        self.next += 1
        self.cookies[tid] = self.next

    def share_to(self, tid):
        assert self.carrier is not None, "SHARE_TO outside a carrier thread would push koordd's own cookie"
        self._check(tid)
        self.cookies[tid] = self.carrier

    def share_from(self, tid):
        assert self.carrier is not None, "SHARE_FROM outside a carrier thread would tag koordd itself"
        self._check(tid)
        self.carrier = self.cookies[tid]

    def run_as_carrier(self, fn):
        self.carrier = self.own
        try:
            return fn()
        finally:
            self.carrier = None


def put_threads(tree: FakeCgroups, cgroup: str, tids) -> None:
    controller, name = ("cpu", "tasks") if tree.v1 else (None, "cgroup.threads")
    tree.set(cgroup, controller, name, "".join(f"{t}\n" for t in tids))


@pytest.fixture(params=["v2", "hybrid"])
def rig(request, tmp_path):
    tree = FakeCgroups(tmp_path, request.param)
    layout = {"be": [11], "be/pod1": [12, 13], "be/pod1/c1": [14], "be2": [15], "ls": [21, 22], "be/lsjob": [31]}
    for cg, tids in layout.items():
        tree.add(cg)
    for cg, tids in layout.items():
        put_threads(tree, cg, tids)
    prctl = FakePrctl([t for tids in layout.values() for t in tids])
    return tree, prctl, CoreSchedBackend(tree.fs, prctl=prctl)


def cookies(prctl, *tids):
    return {prctl.cookies[t] for t in tids}


def test_one_cookie_per_label_shared_by_every_cgroup_written_with_it(rig):
    tree, prctl, b = rig
    b.write("be", "core_sched", "BE")
    [be] = cookies(prctl, 11, 12, 13, 14, 31)
    assert be != 0 and prctl.created == 1
    b.write("be2", "core_sched", "BE")
    assert cookies(prctl, 15) == {be} and prctl.created == 1
    b.write("ls", "core_sched", "LS")
    [ls] = cookies(prctl, 21, 22)
    assert ls not in (0, be) and prctl.created == 2
    assert (b.read("be", "core_sched"), b.read("be2", "core_sched"), b.read("ls", "core_sched")) == ("BE", "BE", "LS")


def test_reads_none_empty_and_mixed(rig):
    tree, prctl, b = rig
    assert b.read("be", "core_sched") == "none"
    put_threads(tree, "be2", [])
    assert b.read("be2", "core_sched") == "empty" and b.same("empty", "BE")
    b.write("be", "core_sched", "BE")
    put_threads(tree, "be/pod1", [12, 13, 16])          # a thread that came without the cookie
    prctl.cookies[16] = 0
    assert b.read("be", "core_sched") == "mixed"
    prctl.cookies[16] = 0xf00                            # or with a cookie another program made
    assert b.read("be", "core_sched") == "mixed"
    for bad in ("", "a b", "9lives", "x" * 40, "mixed", "empty"):
        with pytest.raises(InvalidValue):
            b.validate("be", "core_sched", bad)
    assert b.validate("be", "core_sched", " NONE ") == "none"


def test_the_cookie_survives_its_first_thread_and_a_new_one_is_made_when_all_are_gone(rig):
    tree, prctl, b = rig
    b.write("be", "core_sched", "BE")
    [be] = cookies(prctl, 11)
    prctl.gone.add(b.carriers["BE"])                     # the thread it was made on exits
    b.write("be2", "core_sched", "BE")
    assert cookies(prctl, 15) == {be} and prctl.created == 1
    # Every thread that had it is gone: the next write makes a new cookie, and the class converges on it.
    prctl.gone |= {11, 12, 13, 14, 15, 31}
    put_threads(tree, "be2", [17])
    prctl.cookies[17] = 0
    b.write("be2", "core_sched", "BE")
    assert prctl.created == 2 and prctl.cookies[17] not in (0, be)
    assert b.read("be2", "core_sched") == "BE"


def test_clearing_needs_a_cookieless_thread_of_koordds(rig):
    tree, prctl, b = rig
    b.write("be", "core_sched", "BE")
    prctl.own = 0xbad                                   # koordd's own threads carry a cookie: a carrier would too
    with pytest.raises(OSError) as e:
        b.write("be", "core_sched", "none")
    assert e.value.errno == errno.EBUSY
    prctl.own = 0
    b.write("be", "core_sched", "none")
    assert cookies(prctl, 11, 12, 13, 14, 31) == {0}


def test_exited_threads_are_skipped_and_a_refusal_names_the_thread(rig):
    tree, prctl, b = rig
    b.write("be", "core_sched", "BE")
    put_threads(tree, "be2", [15, 18])
    prctl.cookies[18] = 0
    prctl.refuse.add(18)
    with pytest.raises(OSError) as e:                   # 15 is the only other: it moved, so a partial write
        b.write("be2", "core_sched", "BE")
    assert isinstance(e.value, PartialWrite) and "thread 18" in str(e.value)
    prctl.refuse.clear()
    prctl.gone.add(18)
    b.write("be2", "core_sched", "BE")                  # 18 exited meanwhile: not an error


def actuator(tmp_path, tree, backend, unsupported=None):
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    return Actuator(Backends([CgroupBackend(tree.fs), backend]), journal,
                    DecisionLog(state, send=lambda message, **fields: None), unsupported=unsupported), journal


def test_through_the_actuator_new_threads_brought_in_line_and_restore_clears(rig, tmp_path):
    tree, prctl, b = rig
    act, journal = actuator(tmp_path, tree, b)
    want = [Action("be", "core_sched", "BE", {"class": "BE"}, "BE cookie"),
            Action("be2", "core_sched", "BE", {"class": "BE"}, "BE cookie")]
    ds = act.apply("core_sched", want)
    assert [(d.target, d.old, d.new, d.outcome) for d in ds] == [("be", "none", "BE", APPLIED),
                                                                 ("be2", "none", "BE", APPLIED)]
    assert act.apply("core_sched", want) == []           # in place: nothing to do
    put_threads(tree, "be/pod1/c1", [14, 19])
    prctl.cookies[19] = 0
    [d] = act.apply("core_sched", want)
    assert (d.target, d.old, d.new) == ("be", "mixed", "BE") and prctl.cookies[19] == prctl.cookies[11]
    restored = act.restore_all("stopping")
    assert {(d.target, d.new, d.outcome) for d in restored} == {("be", "none", RESTORED), ("be2", "none", RESTORED)}
    assert cookies(prctl, 11, 12, 13, 14, 15, 19, 31) == {0} and journal.entries() == []


def test_a_restart_reads_mixed_and_its_restore_clears_the_cookies_left_behind(rig, tmp_path):
    tree, prctl, b = rig
    act, journal = actuator(tmp_path, tree, b)
    act.apply("core_sched", [Action("be", "core_sched", "BE", {}, "")])
    # kill -9: a new koordd, a new backend that never made the cookie; the journal is on disk.
    b2 = CoreSchedBackend(tree.fs, prctl=prctl)
    act2, journal2 = actuator(tmp_path, tree, b2)
    assert b2.read("be", "core_sched") == "mixed"
    [d] = act2.restore_all("stopping")
    assert d.outcome == RESTORED and cookies(prctl, 11, 12, 13, 14, 31) == {0}


def test_a_nested_root_with_a_label_of_its_own_is_left_out_of_the_outer_write(rig, tmp_path):
    tree, prctl, b = rig
    act, journal = actuator(tmp_path, tree, b)
    want = [Action("be", "core_sched", "BE", {}, ""), Action("be/lsjob", "core_sched", "LS", {}, "")]
    assert [d.outcome for d in act.apply("core_sched", want)] == [APPLIED, APPLIED]
    be, ls = prctl.cookies[11], prctl.cookies[31]
    assert be != ls and cookies(prctl, 12, 13, 14) == {be}
    assert act.apply("core_sched", want) == []          # no tug of war between the two writes
    assert prctl.cookies[31] == ls and b.read("be", "core_sched") == "BE"


def test_unsupported_kernel_refused_once_with_the_reason(rig, tmp_path):
    tree, _, _ = rig
    prctl = FakePrctl([11], error=errno.EINVAL)
    b = CoreSchedBackend(tree.fs, prctl=prctl)
    unsupported = b.probe()
    assert "CONFIG_SCHED_CORE" in unsupported["core_sched"]
    act, journal = actuator(tmp_path, tree, b, unsupported=unsupported)
    [d] = act.apply("core_sched", [Action("be", "core_sched", "BE", {}, "")])
    assert d.outcome == REFUSED and "CONFIG_SCHED_CORE" in d.error
    assert act.apply("core_sched", [Action("be", "core_sched", "BE", {}, "")]) == []


def test_probe_and_doctor_row(tmp_path):
    assert probe(FakePrctl([])) == (True, "prctl(PR_SCHED_CORE) works (CONFIG_SCHED_CORE)")
    assert "CONFIG_SCHED_CORE" in probe(FakePrctl([], error=errno.EINVAL))[1]
    assert "no SMT" in probe(FakePrctl([], error=errno.ENODEV))[1]
    smtdir = tmp_path / "sys/devices/system/cpu/smt"
    assert smt(tmp_path / "sys")[0] is None
    smtdir.mkdir(parents=True)
    (smtdir / "active").write_text("1\n")
    (smtdir / "control").write_text("on\n")
    assert smt(tmp_path / "sys") == (True, "SMT active: yes (control on)")
    (smtdir / "active").write_text("0\n")
    ok, detail = probe_core_sched(Host(sys=tmp_path / "sys"))
    assert "SMT active: no" in detail and ("CONFIG_SCHED_CORE" in detail)


def test_the_carrier_is_a_thread_of_its_own():
    main = threading.get_ident()
    assert Prctl.run_as_carrier(None, lambda: threading.get_ident()) != main
    with pytest.raises(OSError):
        Prctl.run_as_carrier(None, lambda: (_ for _ in ()).throw(OSError(errno.EPERM, "no")))


# --- the loop --------------------------------------------------------------------------------------

def loop_settings(**kw):
    return make_settings(loop_options(CoreSched), {"enabled": True, **kw})


def test_loop_gives_each_chosen_class_root_its_class_and_nested_roots_their_own():
    s = loop_settings(classes=["BE"])
    snap = Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.0), cgroups={
        "be.slice": CgroupSample("be.slice", "BE"), "be2.slice": CgroupSample("be2.slice", "BE"),
        "be.slice/lsjob": CgroupSample("be.slice/lsjob", "LS"), "ls.slice": CgroupSample("ls.slice", "LS")})
    got = {(a.target, a.value) for a in CoreSched.decide(snap, s, None)}
    assert got == {("be.slice", "BE"), ("be2.slice", "BE"), ("be.slice/lsjob", "LS")}
    assert ("LS", "core_sched") in CoreSched.writes(s)
    off = make_settings(loop_options(CoreSched), {})
    assert not off.enabled and off.classes == () and CoreSched.writes(off) == frozenset()
    assert CoreSched.decide(snap, loop_settings(), None) == []


def test_a_class_that_leaves_classes_gets_its_cookies_cleared():
    snap = Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=0.0), cgroups={
        "be.slice": CgroupSample("be.slice", "BE"), "ls.slice": CgroupSample("ls.slice", "LS")},
        held={("ls.slice", "core_sched"): "none", ("be.slice", "core_sched"): "none"})
    got = [(a.target, a.value) for a in CoreSched.decide(snap, loop_settings(classes=["BE"]), None)]
    assert got == [("be.slice", "BE"), ("ls.slice", None)]
