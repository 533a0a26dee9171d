"""oom_shaping and what it writes through: decision tables on hand-built snapshots; the oom_score_adj
backend on fake trees with a fake /proc (per-process originals, new processes brought in line,
restore only what koordd wrote); the guard and the kubelet rule; memory.oom.group on v1. The prekill
hook of memory_evict is tests/test_prekill.py's."""
from __future__ import annotations


import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.act.protect import harm
from koordd.backends.cgroup import KNOBS, CgroupBackend
from koordd.backends.oom import OomScoreBackend, format_reading, parse, probe_oom_group
from koordd.core.backend import Backends, InvalidValue, TargetGone
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.decisions import APPLIED, LEFT, REFUSED, RESTORED
from koordd.core.kubelet import KubeletRule
from koordd.core.loop import NODE, Action
from koordd.core.snapshot import CgroupSample, NodeSample, Snapshot
from koordd.kernel.host import Host
from koordd.loops.memory_evict import MemoryEvict
from koordd.loops.oom_shaping import OomShaping

SCORE = "oom_score_adj"
REGISTRY = {"oom_shaping": OomShaping, "memory_evict": MemoryEvict}


# --- the loop ---------------------------------------------------------------------------------------

def settings(**kw):
    return make_settings(loop_options(OomShaping), {"enabled": True, **kw})


def cg(path, cls=None):
    return CgroupSample(path=path, cls=cls)


def snap(*cgroups, members=None, supported=frozenset(KNOBS) | {SCORE}, held=()):
    return Snapshot(time=1.0, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=1.0, memory_total=8 << 30),
                    cgroups={c.path: c for c in cgroups}, members=members or {}, supported=supported,
                    held={key: "0" for key in held})


def decide(snapshot, **kw):
    s = settings(**kw)
    return [(a.target, a.knob, a.value) for a in OomShaping.decide(snapshot, s, OomShaping.initial_state(s))]


NODE_CGS = (cg("be.slice", "BE"), cg("ls.slice", "LS"), cg("lsr.slice", "LSR"), cg("system.slice", "SYSTEM"))
PODS = {"be.slice": (cg("be.slice/job1"), cg("be.slice/job2"))}


def test_defaults_be_first_ls_last_be_pods_killed_whole():
    assert decide(snap(*NODE_CGS, members=PODS)) == [
        ("be.slice", SCORE, "1000"),
        ("ls.slice", SCORE, "-900"), ("lsr.slice", SCORE, "-900"),
        ("be.slice/job1", "memory.oom.group", "1"), ("be.slice/job2", "memory.oom.group", "1"),
    ]


def test_zero_leaves_alone_and_gives_back_what_koordd_holds():
    held = {("be.slice", SCORE), ("node", "vm.watermark_scale_factor")}
    out = decide(snap(*NODE_CGS, held=held), be_oom_score_adj=0, ls_oom_score_adj=0, be_oom_group=False)
    assert out == [("node", "vm.watermark_scale_factor", None)]          # the sysctl: the loop lets it go
    assert OomShaping.writes(settings(be_oom_score_adj=0, ls_oom_score_adj=0, be_oom_group=False)) == frozenset()


def test_sysctls_only_when_set():
    out = decide(snap(), be_oom_score_adj=0, ls_oom_score_adj=0, be_oom_group=False,
                 min_free_kbytes=131072, watermark_scale_factor=200)
    assert out == [("node", "vm.min_free_kbytes", "131072"), ("node", "vm.watermark_scale_factor", "200")]
    assert OomShaping.writes(settings(min_free_kbytes=1, watermark_scale_factor=2)) >= \
        {(NODE, "vm.min_free_kbytes"), (NODE, "vm.watermark_scale_factor")}


def test_a_be_root_holding_ls_work_is_not_touched():
    cgs = (cg("be.slice", "BE"), cg("be.slice/lsjob", "LS"))
    out = decide(snap(*cgs, members={"be.slice": (cg("be.slice/lsjob", "LS"), cg("be.slice/j"))},
                      held={("be.slice", SCORE)}))
    assert ("be.slice", SCORE, None) in out                # ours, given back
    assert ("be.slice", SCORE, "1000") not in out
    assert ("be.slice/lsjob", SCORE, "-900") in out
    assert ("be.slice/lsjob", "memory.oom.group", "1") not in out and ("be.slice/j", "memory.oom.group", "1") in out


def test_an_ls_root_holding_another_protected_root_is_left_to_the_nested_one():
    cgs = (cg("ls.slice", "LS"), cg("ls.slice/lsr-job", "LSR"))
    out = decide(snap(*cgs, held={("ls.slice", SCORE)}), be_oom_group=False)
    assert out == [("ls.slice", SCORE, None), ("ls.slice/lsr-job", SCORE, "-900")]


def test_without_memory_oom_group_one_pod_asks_once():
    out = decide(snap(*NODE_CGS, members=PODS, supported=frozenset({SCORE})))
    assert [t for t in out if t[1] == "memory.oom.group"] == [("be.slice/job1", "memory.oom.group", "1")]


def test_never_the_be_root_of_pods_for_oom_group_but_a_childless_one():
    out = decide(snap(cg("be.slice", "BE")))
    assert ("be.slice", "memory.oom.group", "1") in out     # a job of its own


@pytest.mark.parametrize("kw, bad", [
    ({"ls_oom_score_adj": 1000, "be_oom_score_adj": 500}, "ls_oom_score_adj"),
    ({"be_oom_score_adj": 1001}, "be_oom_score_adj"),
    ({"watermark_scale_factor": 3001}, "watermark_scale_factor"),
])
def test_config_refuses_bad_values_naming_the_option(kw, bad):
    body = "\n".join(f"{k} = {v}" for k, v in kw.items())
    with pytest.raises(ConfigError, match=bad):
        parse_config(f"[loops.oom_shaping]\nenabled = true\n{body}\n", "k.toml", REGISTRY)


def test_minus_1000_only_when_configured():
    assert settings().ls_oom_score_adj == -900
    assert settings(ls_oom_score_adj=-1000).ls_oom_score_adj == -1000


# --- the oom_score_adj backend ----------------------------------------------------------------------

class FakeProc:
    """/proc/PID/{stat,oom_score_adj} for a few processes."""

    def __init__(self, root):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "self").mkdir(exist_ok=True)
        (root / "self" / "oom_score_adj").write_text("0\n")

    def add(self, pid, score=0, start=100, comm="sleep (x)", flags=0):
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        fields = ["S"] + ["0"] * 5 + [str(flags)] + ["0"] * 12 + [str(start)] + ["0"] * 10
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
        (d / "oom_score_adj").write_text(f"{score}\n")

    def exit(self, pid):
        for f in (self.root / str(pid)).iterdir():
            f.unlink()
        (self.root / str(pid)).rmdir()

    def score(self, pid):
        return int((self.root / str(pid) / "oom_score_adj").read_text())

    def set(self, pid, score):
        (self.root / str(pid) / "oom_score_adj").write_text(f"{score}\n")


def put_procs(tree, cgroup, pids):
    fs = tree.fs
    (fs.dir(fs.walk_controller(), cgroup) / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))


@pytest.fixture(params=["v2", "hybrid"])
def rig(request, tmp_path):
    tree = FakeCgroups(tmp_path, request.param).add("be").add("be/pod1").add("be/pod1/c1").add("ls")
    for c in ("be", "be/pod1", "be/pod1/c1", "ls"):
        put_procs(tree, c, [])
    put_procs(tree, "be/pod1", [11, 12])
    put_procs(tree, "be/pod1/c1", [13])
    put_procs(tree, "ls", [21])
    proc = FakeProc(tmp_path / "proc")
    for pid in (11, 12, 13, 21):
        proc.add(pid)
    return tree, proc, OomScoreBackend(tree.fs, proc.root)


def actuator(tmp_path, tree, *backends, kubelet=None):
    state = tmp_path / "state"
    journal = RestoreJournal(state)
    return Actuator(Backends([CgroupBackend(tree.fs), *backends]), journal,
                    DecisionLog(state, send=lambda message, **f: None), kubelet=kubelet), journal


def test_reading_forms_round_trip():
    assert format_reading({}) == "none"
    assert format_reading({(1, 5): 3, (2, 5): 3}) == "3"
    mixed = format_reading({(1, 5): 3, (2, 5): 3, (3, 9): -7})
    assert mixed == "mixed 3 3@9=-7" and parse(mixed) == (3, {(3, 9): -7})
    for bad in ("1001", "mixed", "mixed 3 x=1", "mixed 3 1@2=5000", "+-3", "1_0"):
        with pytest.raises(InvalidValue):
            parse(bad)


def test_reads_processes_of_the_cgroup_and_below(rig):
    tree, proc, b = rig
    assert b.pids("be") == [11, 12, 13] and b.read("be", SCORE) == "0"
    proc.add(13, score=-1000, flags=0x00200000)       # a kernel thread: not the OOM killer's, not koordd's
    assert b.read("be", SCORE) == "0"
    proc.add(13)
    proc.set(13, 500)
    assert b.read("be", SCORE) == "mixed 0 13@100=500"
    with pytest.raises(TargetGone):
        b.read("nope", SCORE)
    with pytest.raises(InvalidValue, match="not a value to set"):
        b.validate("be", SCORE, "mixed 0 13@100=500")
    with pytest.raises(InvalidValue, match="-1000..1000"):
        b.validate("be", SCORE, "1001")


def test_set_new_processes_brought_in_line_and_each_restored_to_its_own(rig, tmp_path):
    tree, proc, b = rig
    proc.set(13, -500)                          # one process had its own value
    act, journal = actuator(tmp_path, tree, b)
    want = Action("be", SCORE, "1000", {}, "BE first")
    [d] = act.apply("oom_shaping", [want])
    assert (d.kind, d.old, d.new, d.outcome) == ("oom_score", "mixed 0 13@100=-500", "1000", APPLIED)
    assert [proc.score(p) for p in (11, 12, 13)] == [1000, 1000, 1000] and proc.score(21) == 0
    assert act.apply("oom_shaping", [want]) == []
    # A new process (here one that did not inherit the value) is brought in line next round.
    proc.add(14, score=0, start=200)
    put_procs(tree, "be/pod1", [11, 12, 14])
    [d] = act.apply("oom_shaping", [want])
    assert d.old == "mixed 1000 14@200=0" and proc.score(14) == 1000
    [d] = act.restore_all("stopping")
    assert d.outcome == RESTORED
    # Each its own original; the one started since gets the common one.
    assert [proc.score(p) for p in (11, 12, 13, 14)] == [0, 0, -500, 0] and journal.entries() == []


def test_a_process_changed_behind_koordds_back_keeps_its_value(rig, tmp_path):
    tree, proc, b = rig
    act, journal = actuator(tmp_path, tree, b)
    act.apply("oom_shaping", [Action("be", SCORE, "1000", {}, "")])
    proc.set(12, 300)                           # someone else's
    [d] = act.restore_all("stopping")
    assert d.outcome == RESTORED
    assert [proc.score(p) for p in (11, 12, 13)] == [0, 300, 0]


def test_all_changed_behind_koordds_back_is_left_with_a_decision(rig, tmp_path):
    tree, proc, b = rig
    act, journal = actuator(tmp_path, tree, b)
    act.apply("oom_shaping", [Action("be", SCORE, "1000", {}, "")])
    for p in (11, 12, 13):
        proc.set(p, 200)
    [d] = act.restore_all("stopping")
    assert d.outcome == LEFT and "changed by someone else" in d.error
    assert [proc.score(p) for p in (11, 12, 13)] == [200, 200, 200] and journal.entries() == []


def test_a_reused_pid_is_not_the_process_that_had_the_value(rig, tmp_path):
    tree, proc, b = rig
    proc.set(13, -500)
    act, journal = actuator(tmp_path, tree, b)
    act.apply("oom_shaping", [Action("be", SCORE, "1000", {}, "")])
    proc.exit(13)
    proc.add(13, score=1000, start=999)         # another process, same pid
    act.restore_all("stopping")
    assert proc.score(13) == 0                  # the common original, not the old process's -500


def test_restore_after_a_crash_from_the_journal(rig, tmp_path):
    tree, proc, b = rig
    act, _ = actuator(tmp_path, tree, b)
    act.apply("oom_shaping", [Action("be", SCORE, "1000", {}, "")])
    act2, journal2 = actuator(tmp_path, tree, OomScoreBackend(tree.fs, proc.root))     # a new koordd
    [d] = act2.restore_all("restart")
    assert d.outcome == RESTORED and [proc.score(p) for p in (11, 12, 13)] == [0, 0, 0]


def test_the_guard_refuses_raising_an_ls_score_and_lets_lowering_and_its_restore_through(rig, tmp_path):
    tree, proc, b = rig
    act, journal = actuator(tmp_path, tree, b)
    act.protect({"ls": "LS", "be": "BE"})
    [d] = act.apply("oom_shaping", [Action("ls", SCORE, "1000", {}, "")])
    assert d.outcome == REFUSED and "raise the OOM score" in d.error and proc.score(21) == 0
    [d] = act.apply("oom_shaping", [Action("ls", SCORE, "-900", {}, "")])
    assert d.outcome == APPLIED and proc.score(21) == -900
    [d] = act.restore_all("stopping")
    assert d.outcome == RESTORED and proc.score(21) == 0
    assert harm(SCORE, "mixed 0 1@1=5", "0") and not harm(SCORE, "-5", "mixed 0 1@1=5")


def test_the_kubelets_values_stand(tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice")
    proc = FakeProc(tmp_path / "proc")
    proc.add(31, score=1000)
    qos = "kubepods.slice/kubepods-besteffort.slice"
    put_procs(tree, qos, [])
    put_procs(tree, qos + "/kubepods-besteffort-pod1.slice", [31])
    act, journal = actuator(tmp_path, tree, OomScoreBackend(tree.fs, proc.root), kubelet=KubeletRule())
    [d] = act.apply("oom_shaping", [Action(qos, SCORE, "500", {}, "")])
    assert d.outcome == REFUSED and "kubelet-owned" in d.error and proc.score(31) == 1000
    act.kubelet = KubeletRule(override=frozenset({SCORE}))
    [d] = act.apply("oom_shaping", [Action(qos, SCORE, "500", {}, "")])
    assert d.outcome == APPLIED and proc.score(31) == 500


# --- memory.oom.group -------------------------------------------------------------------------------

def test_memory_oom_group_on_v2_and_refused_once_on_hybrid(tmp_path):
    v2 = FakeCgroups(tmp_path / "a", "v2").add("be/pod1")
    for d in ("be", "be/pod1"):
        (v2.root / d / "memory.oom.group").write_text("0\n")
    act, journal = actuator(tmp_path / "a", v2)
    [d] = act.apply("oom_shaping", [Action("be/pod1", "memory.oom.group", "1", {}, "")])
    assert d.outcome == APPLIED and v2.read("be/pod1", "memory", "memory.oom.group").strip() == "1"
    [d] = act.restore_all("stopping")
    assert d.outcome == RESTORED and v2.read("be/pod1", "memory", "memory.oom.group").strip() == "0"
    ok, detail = probe_oom_group(Host(cgroup=v2.root))
    assert ok and "memory.oom.group" in detail

    hybrid = FakeCgroups(tmp_path / "b", "hybrid").add("be/pod1")
    backends = Backends([CgroupBackend(hybrid.fs)])
    act = Actuator(backends, RestoreJournal(tmp_path / "b" / "st"), DecisionLog(tmp_path / "b" / "st", send=None),
                   unsupported=backends.probe())
    want = [Action("be/pod1", "memory.oom.group", "1", {}, "")]
    [d] = act.apply("oom_shaping", want)
    assert d.outcome == REFUSED and "memory.oom.group is not available on this host" in d.error
    assert act.apply("oom_shaping", want) == []            # said once
    ok, detail = probe_oom_group(Host(cgroup=hybrid.root))
    assert not ok and "not on cgroup v2" in detail
