"""koordd cannot be turned against its host: targets never lead out of their root; a config file
only root can change."""
from __future__ import annotations

import os
import signal
import stat

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.journal import Held
from koordd.core.config import ConfigError, load_config
from koordd.core.decisions import APPLIED, Decision, REFUSED
from koordd.core.loop import Action
from koordd.core.catalogue import load_registry
from koordd.core.trust import SKIP_ENV, untrusted
from koordd.kernel.cgroupfs import OutsideRoot
from koordd_plugins.memory_evict import MemoryEvict
from unit.act.test_actuator import make_rig, on_disk, records
from unit.plugins.test_memory_evict import cg, settings as evict_settings, snap


@pytest.fixture
def outside(tmp_path):
    """A directory beside the cgroup root that looks like a cgroup: what an escape would write to."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "cpu.max").write_text("max 100000\n")
    return d


def cap(target: str) -> Action:
    return Action(target, "cpu.max", "50000 100000", {}, "cap")


@pytest.mark.parametrize("target", ["../outside", "be.slice/../../outside", "be.slice/../../../etc"])
def test_a_journal_entry_leading_out_of_the_root_is_refused_and_dropped(tmp_path, outside, target):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add("be.slice"))
    rig.journal.add(Held(target, "cpu.max", "1 100000", "be_suppress", 1.0))
    [d] = rig.act.restore_all("koordd stopping")
    assert d.outcome == REFUSED and "leads out of" in d.error and "dropped" in d.error
    assert (outside / "cpu.max").read_text() == "max 100000\n"        # never written
    assert on_disk(rig) == [] and records(rig)[-1]["target"] == target


def test_a_loop_target_leading_out_is_refused_before_any_read(tmp_path, outside):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add("be.slice"))
    [d] = rig.act.apply("be_suppress", [cap("../outside")])
    assert d.outcome == REFUSED and "'..'" in d.error and d.old is None
    assert (outside / "cpu.max").read_text() == "max 100000\n" and on_disk(rig) == []


def test_a_symlinked_cgroup_directory_is_refused_at_the_write(tmp_path, outside):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    os.symlink(outside, tree.root / "be.slice" / "evil")
    rig = make_rig(tmp_path, tree)
    [d] = rig.act.apply("be_suppress", [cap("be.slice/evil")])
    assert d.outcome == REFUSED and str(outside) in d.error
    assert (outside / "cpu.max").read_text() == "max 100000\n" and on_disk(rig) == []


def test_a_symlinked_knob_file_is_not_followed(tmp_path, outside):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    knob = tree.root / "be.slice" / "cpu.max"
    knob.unlink()
    os.symlink(outside / "cpu.max", knob)
    rig = make_rig(tmp_path, tree)
    [d] = rig.act.apply("be_suppress", [cap("be.slice")])
    assert d.outcome == REFUSED and "ELOOP" in d.error
    assert (outside / "cpu.max").read_text() == "max 100000\n" and on_disk(rig) == []


def test_a_leading_slash_stays_below_the_root(tmp_path):
    rig = make_rig(tmp_path, FakeCgroups(tmp_path, "v2").add("be.slice"))
    [d] = rig.act.apply("be_suppress", [cap("/be.slice")])
    assert d.outcome == APPLIED and rig.tree.read("be.slice", "cpu", "cpu.max") == "50000 100000"


def test_reads_refuse_dot_dot_too(tmp_path):
    fs = FakeCgroups(tmp_path, "v2").fs
    with pytest.raises(OutsideRoot):
        fs.read("cpu", "a/../..", "cpu.max")
    assert fs.read("cpu", "", "cgroup.controllers")       # a name merely containing dots is fine


# --- the config file: trusted only if only root can change it (sshd's StrictModes) ------------------

@pytest.fixture
def strict(monkeypatch):
    monkeypatch.delenv(SKIP_ENV, raising=False)


@pytest.fixture
def etc(tmp_path):
    d = tmp_path / "etc"
    d.mkdir(mode=0o755)
    f = d / "koordd.toml"
    f.write_text("[daemon]\n")
    f.chmod(0o644)
    return f


def test_a_root_owned_file_nobody_else_can_write_loads(strict, etc):
    assert untrusted(etc) is None and load_config(etc, load_registry())


@pytest.mark.parametrize("what, mode, why", [("file", 0o664, "group-writable (mode 0664)"),
                                             ("file", 0o646, "world-writable (mode 0646)"),
                                             ("dir", 0o777, "group- and world-writable (mode 0777)")])
def test_a_file_or_directory_others_can_write_is_refused(strict, etc, what, mode, why):
    path = etc if what == "file" else etc.parent
    path.chmod(mode)
    with pytest.raises(ConfigError) as e:
        load_config(etc, load_registry())
    [line] = e.value.errors
    assert line.startswith(f"{etc}: refused: {path} is {why}") and "chmod go-w" in line


def test_a_file_owned_by_another_user_is_refused(strict, etc):
    os.chown(etc, 1000, 0)
    assert untrusted(etc) == f"{etc} is owned by uid 1000, not root"


def test_a_sticky_world_writable_directory_is_fine(strict, etc):
    etc.parent.chmod(0o1777)          # like /tmp: only an entry's owner may rename or remove it
    assert untrusted(etc) is None


def test_a_symlink_is_judged_by_what_it_leads_to(strict, etc, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "real.toml").write_text("[daemon]\n")
    link = etc.parent / "link.toml"
    link.symlink_to(shared / "real.toml")
    assert untrusted(link) == f"{shared} is group- and world-writable (mode 0777)"
    safe = etc.parent / "safe.toml"
    safe.symlink_to(etc)
    assert untrusted(safe) is None


def test_koordd_refuses_to_start_and_refuses_a_reload_on_an_untrusted_file(strict, tmp_path):
    from unit.runtime.test_daemon import Node, wait_for
    node = Node(tmp_path)
    node.config.chmod(0o666)
    assert node.run("--once").returncode == 78
    assert f"{node.config}: refused: {node.config} is group- and world-writable" in node.log()
    node.config.chmod(0o644)
    proc, _ = node.start()
    try:
        wait_for(lambda: node.cpu_max() != "max 100000", what="BE capped")
        node.config.parent.chmod(0o777)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload refused" in node.log() and "world-writable" in node.log(), what="refusal")
        assert proc.poll() is None and node.cpu_max() != "max 100000"     # the running config stays
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, node.log()


# --- local interfaces: root's alone ------------------------------------------------------------------

def test_every_file_koordd_makes_is_root_only(tmp_path):
    from unit.runtime.test_daemon import Node
    node = Node(tmp_path)
    assert node.run("--once").returncode == 0, node.log()
    assert stat.S_IMODE(node.state.stat().st_mode) == 0o700
    files = list(node.state.iterdir())
    assert {"status.json", "decisions.jsonl"} <= {f.name for f in files}
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_a_state_dir_open_to_every_user_is_closed_with_a_warning(tmp_path):
    from unit.runtime.test_daemon import Node
    node = Node(tmp_path)
    node.state.mkdir(mode=0o755)
    node.state.chmod(0o755)
    assert node.run("--once").returncode == 0, node.log()
    assert stat.S_IMODE(node.state.stat().st_mode) == 0o750
    assert f"{node.state} was open to every user (mode 0755): now 0750" in node.log()


def test_a_top_request_not_written_by_root_is_ignored(tmp_path):
    from koordd.core.feeds import REQUEST_FILE, TopRequest
    from koordd.runtime.topfeed import TopFeed
    from koordctl.top import write_request
    write_request(tmp_path, TopRequest(interval=1.0))
    feed = TopFeed(tmp_path)
    assert feed.check(0.0) and feed.active
    feed.withdraw()
    os.chown(tmp_path / REQUEST_FILE, 1000, 1000)
    fresh = TopFeed(tmp_path)
    assert not fresh.check(0.0) and not fresh.active


# --- kill rate limits under a flood of triggers --------------------------------------------------------

@hsettings(max_examples=60, deadline=None)
@given(max_kills=st.integers(1, 6), gaps=st.lists(st.floats(0.05, 5.0), min_size=50, max_size=300),
       new_per_tick=st.integers(1, 8), refused_every=st.integers(2, 7))
def test_kills_stay_under_the_limit_in_every_minute_of_a_flood(max_kills, gaps, new_per_tick, refused_every):
    """Memory over the threshold and under full pressure every tick, fresh BE victims every tick, ticks
    as close as 50 ms, some kills refused by the kernel: no 60 s window holds more than the limit."""
    opts = evict_settings(max_kills_per_minute=max_kills, cooldown="0s", reclaim=False, pressure_full_percent=10,
                    pressure_duration="0s")
    state = MemoryEvict.initial_state(opts)
    t, kills, n = 1000.0, [], 0
    for i, gap in enumerate(gaps):
        t += gap
        victims = [cg(f"be/job{n + k}", anon=200) for k in range(new_per_tick)]
        n += new_per_tick
        actions = MemoryEvict.decide(snap(950, victims, t=t, pressure=90), opts, state)
        decisions = [Decision(t, "memory_evict", a.target, a.knob, None, a.value,
                              REFUSED if (i % refused_every == 0) else APPLIED, "", {}, kind="cgroup")
                     for a in actions]
        MemoryEvict.settle(actions, decisions, opts, state)
        kills += [t for d in decisions if d.knob == "cgroup.kill" and d.outcome == APPLIED]
    assert kills, "the flood never killed: the test shows nothing"
    for start in kills:
        assert sum(start <= k < start + 60 for k in kills) <= max_kills
