"""scripts/bench-oom's pure parts (koordtest/bench/oom.py): the kernel-log parser (chosen victims, memory.oom.group kills, the
marker), the naming of victims by unit, the summary, and koordd's config it writes. No root, no VM."""
from __future__ import annotations

from koordd.core.config import parse_config
from koordd.runtime.docs import shipped_loops
from koordtest.bench import oom as bo

# Shaped like Linux 6.x/7.x's mm/oom_kill.c output (dmesg, timestamps in front).
LOG = """\
[   10.000000] bench-oom: arm off start 1
[   50.100000] python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0
[   50.200000] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/ls.slice/oomls.service,task=python3,pid=401,uid=0
[   50.200100] Out of memory: Killed process 401 (python3) total-vm:935000kB, anon-rss:921600kB, file-rss:4kB, shmem-rss:0kB, UID:0 pgtables:1900kB oom_score_adj:0
[   70.000000] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/system.slice/oomhog.service,task=python3,pid=420,uid=0
[   70.000100] Out of memory: Killed process 420 (python3) total-vm:1500000kB, anon-rss:1433600kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:3000kB oom_score_adj:0
[  100.000000] bench-oom: arm koordd start 2
[  150.000000] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/be.slice/oombe.service,task=python3,pid=502,uid=0
[  150.000100] Out of memory: Killed process 502 (python3) total-vm:170000kB, anon-rss:153600kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:400kB oom_score_adj:1000
[  150.000200] Tasks in /be.slice/oombe.service are going to be killed due to memory.oom.group set
[  150.000300] Out of memory: Killed process 501 (python3) total-vm:170000kB, anon-rss:153600kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:400kB oom_score_adj:1000
[  150.000400] Out of memory: Killed process 502 (python3) total-vm:0kB, anon-rss:0kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:0kB oom_score_adj:1000
[  170.000000] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/system.slice/oomhog.service,task=python3,pid=520,uid=0
[  170.000100] Out of memory: Killed process 520 (python3) total-vm:900000kB, anon-rss:880000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:2000kB oom_score_adj:0
"""


def test_after_marker_takes_the_log_after_the_last_marker_line():
    assert bo.after_marker(LOG, "arm koordd start").startswith("[  150.000000] oom-kill:")
    assert "arm koordd" not in bo.after_marker(LOG, "arm koordd start")
    assert bo.after_marker(LOG, "no such marker") == ""


def test_kills_in_order_with_score_size_and_the_chosen_victims_cgroup():
    off = bo.parse_kills(bo.after_marker(LOG, "arm off start").split("bench-oom: arm koordd")[0])
    assert [(k.pid, k.oom_score_adj, k.anon_rss_mib, k.chosen, k.memcg) for k in off] == [
        (401, 0, 900.0, True, "/ls.slice/oomls.service"),
        (420, 0, 1400.0, True, "/system.slice/oomhog.service")]


def test_a_memory_oom_group_kill_names_its_group_and_only_the_chosen_one_is_chosen():
    kills = bo.parse_kills(bo.after_marker(LOG, "arm koordd start"))
    assert [(k.pid, k.chosen, k.group) for k in kills] == [
        (502, True, ""), (501, False, "/be.slice/oombe.service"), (502, False, "/be.slice/oombe.service"),
        (520, True, "")]
    assert {k.oom_score_adj for k in kills[:3]} == {1000}


def test_victims_are_named_by_the_recorded_pids_else_by_their_cgroup():
    kills = bo.name_units(bo.parse_kills(bo.after_marker(LOG, "arm koordd start")), {501: "oombe", 502: "oombe"})
    assert [k.unit for k in kills] == ["oombe", "oombe", "oombe", "oomhog"]
    arm = bo.Arm("koordd", kills=kills)
    line = bo.summary(arm)
    assert line.startswith("koordd: oombe:502(python3, adj 1000") and line.endswith("whole BE pod killed")
    assert bo.summary(bo.Arm("off")) == "off: no OOM kill; BE untouched"
    one = bo.Arm("x", kills=[bo.Kill(7, "python3", 1000, 150.0, unit="oombe")] * 2)     # the same pid twice
    assert bo.summary(one).endswith("half the BE pod killed")


def test_koordds_config_enables_only_oom_shaping_with_be_above_ls():
    cfg = parse_config(bo.KOORDD_CONFIG, "bench.toml", shipped_loops())
    assert [name for name, s in cfg.loops.items() if s.enabled] == ["oom_shaping"]
    assert {r.name: r.patterns for r in cfg.classes} == {"BE": ("be.slice",), "LS": ("ls.slice",)}
    s = cfg.loops["oom_shaping"]
    assert (s.be_oom_score_adj, s.ls_oom_score_adj, s.be_oom_group) == (1000, -900, True)
