"""Issue 25, the daemon's part: one koordd per host (koordd/act/owner.py), no reload loop, a repointed
config symlink followed, a state_dir trusted only if root's alone, a tree that cannot be listed
releases nothing, and a long stop asks systemd for time."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from koordd.act import owner
from koordd.act.journal import Held, RestoreJournal
from koordd.act.owner import HostOwned, OwnerLock, UntrustedLock, current_holder
from koordd.core.config import load_config
from koordd.core.catalogue import load_registry
from koordd.core.trust import SKIP_ENV, untrusted
from koordd.runtime.daemon import Daemon
from koordd.runtime.notify import StopExtender
from koordtest.notify import NotifySocket
from unit.runtime.test_daemon import CONFIG, Node, wait_for

REGISTRY = load_registry()
MAX = "max 100000"


def status(node: Node) -> dict:
    try:
        return json.loads((node.state / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def ticks(node: Node) -> int:
    return status(node).get("loops", {}).get("be_suppress", {}).get("ticks", 0)


def other_config(node: Node, tmp_path, name="other") -> "os.PathLike":
    """A config of its own for the same tree, with another state_dir."""
    d = tmp_path / name
    d.mkdir()
    path = d / "koordd.toml"
    path.write_text(CONFIG.format(root=node.tree.root, state=d / "state", enabled="true", threshold=65))
    return path


def run(config, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "koordd.runtime.daemon", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=60)


def terminate(proc: subprocess.Popen, node: Node) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, node.log()[-4000:]


# --- defect 2: one koordd per host -------------------------------------------------------------------

def test_a_second_daemon_refuses_naming_the_first_and_writes_nothing(tmp_path):
    node = Node(tmp_path)
    first = Daemon(load_config(node.config, REGISTRY), REGISTRY)
    other = other_config(node, tmp_path)
    try:
        for config in (node.config, other):      # the same state_dir, and another one
            with pytest.raises(HostOwned) as e:
                Daemon(load_config(config, REGISTRY), REGISTRY)
            holder = e.value.holder
            assert (holder.pid, holder.config, holder.state_dir) == (os.getpid(), str(node.config), str(node.state))
            assert f"koordd pid {os.getpid()}" in str(e.value) and str(node.state) in str(e.value)
        assert not (other.parent / "state").exists()         # refused before its state_dir was made
    finally:
        first.stop()
    # Released at stop: the next one owns the host.
    Daemon(load_config(other, REGISTRY), REGISTRY).stop()


def test_once_and_another_instance_beside_a_running_koordd_refuse_and_change_nothing(tmp_path):
    node = Node(tmp_path)
    proc, _ = node.start()
    other = other_config(node, tmp_path)
    try:
        wait_for(lambda: node.cpu_max() != MAX, what="BE capped")
        # The holder keeps moving BE's cap meanwhile (and what it wrote with it): what must not change is
        # whose the knob is and what it goes back to, and its value must be one the holder applied.
        def holds() -> list[tuple]:
            return sorted((h["target"], h["knob"], h["original"], h["owner"]) for h in node.held())
        held = holds()
        for config in (node.config, other):
            got = run(config, "--once")
            assert got.returncode == 75, got.stderr
            assert f"koordd pid {proc.pid}" in got.stderr and f"config {node.config}" in got.stderr, got.stderr
            assert f"state_dir {node.state}" in got.stderr
        assert not (other.parent / "state").exists()
        assert holds() == held
        value = node.cpu_max()          # its decision is recorded just after the write: waited for
        wait_for(lambda: value in {d["new"] for d in node.decisions() if d["knob"] == "cpu.max"
                                   and d["outcome"] == "applied"}, what=f"a decision of the holder's that applied {value}")
    finally:
        terminate(proc, node)
    assert node.cpu_max() == MAX and node.held() == []


def kill_9_after_a_state_dir_change(node: Node) -> None:
    """koordd started, BE capped, the config then naming a new state_dir (state-after), koordd killed."""
    proc, _ = node.start()
    wait_for(lambda: node.cpu_max() != MAX, what="BE capped")
    node.state = node.tmp / "state-after"
    node.write_config()
    proc.kill()
    proc.wait(timeout=30)


def test_a_state_dir_changed_then_a_kill_9_abandons_no_hold(tmp_path):
    # Defect 8: the config names a new state_dir (it takes effect at the next start), koordd is killed
    # before a clean stop; the next koordd, on the new state_dir, must still put BE's cpu.max back.
    node = Node(tmp_path)
    kill_9_after_a_state_dir_change(node)
    again, _ = node.start(sock="notify-again.sock")     # its SIGTERM handler is in place: the stop restores
    assert "carried over" in node.log(), node.log()[-3000:]
    terminate(again, node)
    assert node.cpu_max() == MAX, node.log()[-3000:]
    assert node.held() == []


def test_a_start_refused_after_a_state_dir_change_still_leaves_the_old_holds_to_the_next(tmp_path, monkeypatch):
    # Defect 8's sibling: the lock's file was the only note of where the killed koordd kept its holds, and
    # the next koordd overwrote it before refusing (here: a state_dir others could write, exit 78). The one
    # after it, on the fixed state_dir, must still carry them over and put BE's cpu.max back.
    monkeypatch.delenv(SKIP_ENV, raising=False)
    node = Node(tmp_path)
    kill_9_after_a_state_dir_change(node)
    node.state.mkdir(mode=0o700)
    node.state.chmod(0o770)
    assert node.run("--once").returncode == 78, node.log()
    node.state.chmod(0o700)
    assert "carry_from" in owner.lock_path().read_text()
    again, _ = node.start(sock="notify-again.sock")
    assert "carried over" in node.log(), node.log()[-3000:]
    assert json.loads(owner.lock_path().read_text())["carry_from"] == []
    terminate(again, node)
    assert node.cpu_max() == MAX, node.log()[-3000:]
    assert node.held() == []


def test_a_start_removes_the_temporaries_a_kill_left_in_its_state_dir(tmp_path):
    node = Node(tmp_path)
    node.state.mkdir(mode=0o700)
    left = [node.state / f".{name}.k1ll3d" for name in ("status.json", "top.json", RestoreJournal.FILE)]
    for path in left:
        path.write_text("{}")
    mine = node.state / ".operators-notes"
    mine.write_text("kept")
    assert node.run("--once").returncode == 0, node.log()
    assert not any(p.exists() for p in left) and mine.read_text() == "kept"


def test_restores_at_start_are_guarded_by_the_classes_too(tmp_path):
    # Defect 7: a hold saying ls.slice was frozen, whose loop is not enabled now: the start's recovery
    # would "restore" the freeze. The guard knew only PID 1's and koordd's cgroups there; the classes too now.
    node = Node(tmp_path)
    node.tree.set("ls.slice", "cgroup", "cgroup.freeze", "0\n")
    journal = RestoreJournal(node.state)
    journal.add(Held("ls.slice", "cgroup.freeze", "1", "memory_evict", 1.0))
    journal.close()
    node.run("--once")
    assert node.tree.read("ls.slice", "cgroup", "cgroup.freeze").strip() == "0", node.log()[-3000:]
    assert any(d["knob"] == "cgroup.freeze" and d["outcome"] == "refused" for d in node.decisions()), node.decisions()


def test_a_killed_holder_leaves_no_lock(tmp_path):
    node = Node(tmp_path)
    proc, _ = node.start()
    proc.kill()
    proc.wait(timeout=30)
    assert current_holder() is None
    got = run(node.config, "--once")
    assert got.returncode == 0, got.stderr
    assert "re-adopting be.slice cpu.max" in got.stderr


def test_a_dry_run_beside_the_holder_writes_no_knob_and_not_in_its_state_dir(tmp_path):
    node = Node(tmp_path)
    holder = Daemon(load_config(node.config, REGISTRY), REGISTRY)
    try:
        got = run(node.config, "--once", "--dry-run")        # the holder's own state_dir: refused
        assert got.returncode == 75 and "a dry-run there would overwrite its status" in got.stderr, got.stderr
        other = other_config(node, tmp_path)
        got = run(other, "--once", "--dry-run")
        assert got.returncode == 0, got.stderr
        assert f"koordd pid {os.getpid()}" in got.stderr and "this dry-run writes none" in got.stderr
        assert node.cpu_max() == MAX
        outcomes = [json.loads(line)["outcome"] for line in
                    (other.parent / "state" / "decisions.jsonl").read_text().splitlines()]
        assert outcomes and set(outcomes) == {"dry-run"}
    finally:
        holder.stop()


def test_the_holder_is_named_from_the_file_or_from_proc_locks(tmp_path):
    path = tmp_path / "run" / "owner.lock"
    assert current_holder(path) is None
    lock = OwnerLock.take("/etc/k.toml", "/var/lib/k", path)
    got = current_holder(path)
    assert (got.pid, got.config, got.state_dir) == (os.getpid(), "/etc/k.toml", "/var/lib/k") and got.since
    lock.release()
    assert current_holder(path) is None
    # A holder that has not written who it is yet: its pid still comes from /proc/locks.
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(HostOwned) as e:
            OwnerLock.take("/etc/k.toml", "/var/lib/k", path)
        assert e.value.holder.pid == os.getpid() and e.value.holder.config is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("make", ["world-writable dir", "file of another user", "group-writable file"])
def test_a_lock_others_could_change_is_refused(tmp_path, monkeypatch, make):
    node = Node(tmp_path)
    d = tmp_path / "run"
    d.mkdir()
    lock = d / "owner.lock"
    if make == "world-writable dir":
        d.chmod(0o777)
    else:
        lock.write_text("")
        os.chown(lock, 1000, 0) if make == "file of another user" else lock.chmod(0o664)
    monkeypatch.setenv(owner.TEST_ENV, str(lock))
    with pytest.raises(UntrustedLock):
        Daemon(load_config(node.config, REGISTRY), REGISTRY)
    assert node.run("--once").returncode == 78
    assert node.cpu_max() == MAX and not node.state.exists()


# --- defect 7, the state_dir: trusted only if root's alone ---------------------------------------------

FORGED = [{"version": 3}, {"hold": {"target": "be.slice", "knob": "cpu.weight", "original": "1",
                                    "owner": "qos_baseline", "since": 1.0, "kind": "cgroup"}}]


@pytest.mark.parametrize("make, why", [
    ("dir of another user", "is owned by uid 1000"),
    ("group-writable dir", "is group-writable (mode 0770)"),
    ("sticky world-writable dir", "may be written by others than root (mode 1777)"),
    ("world-writable parent", "is group- and world-writable (mode 0777)"),
    ("journal of another user", "originals.jsonl is owned by uid 1000"),
    ("world-writable journal", "originals.jsonl is world-writable (mode 0602)"),
    ("journal a symlink others could repoint", "is group- and world-writable (mode 0777)"),
])
def test_a_state_dir_others_could_change_is_refused_and_its_journal_not_restored(tmp_path, monkeypatch, make, why):
    monkeypatch.delenv(SKIP_ENV, raising=False)     # honest: no check is skipped
    node = Node(tmp_path)
    if make == "world-writable parent":
        node.state = tmp_path / "shared" / "state"
        node.write_config()
    node.state.mkdir(mode=0o700, parents=True)
    journal = node.state / RestoreJournal.FILE
    text = "".join(json.dumps(r) + "\n" for r in FORGED)
    if make == "journal a symlink others could repoint":
        shared = tmp_path / "shared"
        shared.mkdir()
        (shared / "j").write_text(text)
        journal.symlink_to(shared / "j")
        shared.chmod(0o777)
    else:
        journal.write_text(text)
        journal.chmod(0o600)
    {"dir of another user": lambda: os.chown(node.state, 1000, 0),
     "group-writable dir": lambda: node.state.chmod(0o770),
     "sticky world-writable dir": lambda: node.state.chmod(0o1777),
     "world-writable parent": lambda: node.state.parent.chmod(0o777),
     "journal of another user": lambda: os.chown(journal, 1000, 0),
     "world-writable journal": lambda: journal.chmod(0o602)}.get(make, lambda: None)()
    assert node.run("--once").returncode == 78, node.log()
    assert "refusing to start" in node.log() and why in node.log(), node.log()
    assert node.tree.read("be.slice", "cpu", "cpu.weight").strip() == "100"       # the forged "original" not written
    assert node.cpu_max() == MAX


def test_a_state_dir_root_alone_can_change_is_used(tmp_path, monkeypatch):
    monkeypatch.delenv(SKIP_ENV, raising=False)
    node = Node(tmp_path)
    node.state.mkdir(mode=0o750)
    (node.state / RestoreJournal.FILE).write_text("".join(json.dumps(r) + "\n" for r in FORGED))
    assert node.run("--once").returncode == 0, node.log()
    assert node.tree.read("be.slice", "cpu", "cpu.weight").strip() == "1"         # its journal is koordd's own


# --- the config path: every link on the way checked (a sibling of defect 7) ----------------------------

def test_a_link_chain_through_a_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(SKIP_ENV, raising=False)
    etc, shared = tmp_path / "etc", tmp_path / "shared"
    etc.mkdir(mode=0o755)
    shared.mkdir()
    (etc / "real.toml").write_text("[daemon]\n")
    (shared / "hop").symlink_to(etc / "real.toml")          # anyone may repoint this one
    (etc / "koordd.toml").symlink_to(shared / "hop")
    shared.chmod(0o777)
    assert untrusted(etc / "koordd.toml") == f"{shared} is group- and world-writable (mode 0777)"
    shared.chmod(0o755)
    assert untrusted(etc / "koordd.toml") is None


# --- defect 4: a reload does not set off the next one --------------------------------------------------

def test_one_sighup_is_one_reload(tmp_path):
    node = Node(tmp_path)
    proc, notify = node.start()
    reloads = lambda: sum("RELOADING=1" in m.split("\n") for m in notify.texts())
    try:
        wait_for(lambda: ticks(node) >= 1, what="a first tick")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: reloads() == 1 and "reloaded" in node.log(), what="the reload")
        after = ticks(node)
        # koordd's own read of the file (watchdog >= 2.3 reports its open and close) must not count as a
        # change: no second reload while 15 more rounds (3 s at 200 ms, six debounces) pass.
        wait_for(lambda: ticks(node) >= after + 15, what="15 rounds after the reload")
        assert reloads() == 1, node.log()[-3000:]
        assert node.log().count("reloaded ") == 1
    finally:
        terminate(proc, node)


def test_a_repointed_config_symlink_and_the_file_it_leads_to_are_followed(tmp_path):
    node = Node(tmp_path)
    conf = tmp_path / "conf"
    conf.mkdir()
    on = node.config.read_text()
    (conf / "a.toml").write_text(on)
    (conf / "b.toml").write_text(on.replace("enabled = true", "enabled = false"))
    node.config.unlink()
    node.config.symlink_to(conf / "a.toml")
    proc = node.run(wait=False)
    try:
        wait_for(lambda: node.cpu_max() != MAX, what="BE capped")
        # Repointed as `ln -sf` does (a new link renamed over the old): the loop is off in b.toml.
        tmp = node.config.with_name(".new")
        tmp.symlink_to(conf / "b.toml")
        os.replace(tmp, node.config)
        wait_for(lambda: node.cpu_max() == MAX, what="the repointed link's config applied")
        # The file it leads to now, edited in place: the loop on again.
        (conf / "b.toml").write_text(on)
        wait_for(lambda: node.cpu_max() != MAX, what="an edit of the new target applied")
    finally:
        terminate(proc, node)


# --- 13: a tree that could not be listed is no empty tree ---------------------------------------------

@contextmanager
def unlistable(root) -> Iterator[None]:
    """Within the block, os.scandir of anything below `root` fails as with no file descriptor left (EMFILE)."""
    scandir, root = os.scandir, str(root)

    def no_fds(path="."):
        if str(path).startswith(root):
            raise OSError(errno.EMFILE, "Too many open files", str(path))
        return scandir(path)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, "scandir", no_fds)
        yield


def test_a_round_that_cannot_list_the_tree_releases_nothing(tmp_path):
    node = Node(tmp_path)
    daemon = Daemon(load_config(node.config, REGISTRY), REGISTRY)
    daemon.start()
    time.sleep(0.2)                                          # one interval: usage rates need it
    daemon.round(list(daemon.runner.runs.values()))
    capped, held = node.cpu_max(), node.held()
    assert capped != MAX and held
    try:
        with unlistable(node.tree.root):
            daemon.round(list(daemon.runner.runs.values()))
            assert node.cpu_max() == capped and node.held() == held
    finally:
        daemon.stop()
    assert node.cpu_max() == MAX


def test_a_start_that_cannot_list_the_tree_recovers_at_the_first_round_that_can(tmp_path):
    """A hold of a loop not enabled now (it went back at the start's recovery) waits while the tree cannot
    be listed, and goes back at the first round that can list it, not only at the stop."""
    node = Node(tmp_path)
    node.tree.set("be.slice", "cpu", "cpu.weight", "7\n")
    journal = RestoreJournal(node.state)
    journal.add(Held("be.slice", "cpu.weight", "100", "avx_weight", 1.0))
    journal.close()
    daemon = Daemon(load_config(node.config, REGISTRY), REGISTRY)
    with unlistable(node.tree.root):
        daemon.start()
        assert daemon.recovery_pending and node.tree.read("be.slice", "cpu", "cpu.weight").strip() == "7"
        daemon.round([])
        assert daemon.recovery_pending                      # still cannot: still kept
    try:
        daemon.round([])
        assert not daemon.recovery_pending
        assert node.tree.read("be.slice", "cpu", "cpu.weight").strip() == "100"
        assert all(h.owner != "avx_weight" for h in daemon.journal.entries())
    finally:
        daemon.stop()


def test_children_raise_on_a_listing_error_and_are_empty_for_a_gone_cgroup(tmp_path, monkeypatch):
    from koordtest.fakes.cgroup import FakeCgroups
    fs = FakeCgroups(tmp_path, "v2").add("be.slice/a").fs
    assert fs.children(None, "be.slice") == ["be.slice/a"] and fs.children(None, "gone") == []
    monkeypatch.setattr(os, "scandir", lambda p: (_ for _ in ()).throw(OSError(errno.ENOMEM, "no memory")))
    with pytest.raises(OSError):
        fs.children(None, "be.slice")


# --- 13: a long stop asks systemd for time while it makes progress -------------------------------------

def extensions(notify: NotifySocket) -> list[int]:
    return [int(line.split("=", 1)[1]) for m in notify.texts() for line in m.split("\n")
            if line.startswith("EXTEND_TIMEOUT_USEC=")]


def test_the_stop_extender_extends_while_restores_progress_and_not_after(tmp_path, monkeypatch):
    notify = NotifySocket(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify.path))
    made = [0]
    with StopExtender(lambda: made[0], every=0.05, stall=0.5) as ext:
        for _ in range(12):                      # restores keep coming, beyond `stall`
            made[0] += 1
            seen = ext.checks
            wait_for(lambda: ext.checks > seen, what="a check")
        wait_for(lambda: len(extensions(notify)) >= 12, what="extensions while restoring")
        assert not ext.stalled.is_set()
        wait_for(ext.stalled.is_set, what="the stall noticed")        # no progress any more
        n, seen = len(extensions(notify)), ext.checks
        wait_for(lambda: ext.checks >= seen + 5, what="five more checks")
        assert len(extensions(notify)) == n
    assert all(0 < usec <= 0.55e6 for usec in extensions(notify))


def test_a_stop_under_systemd_asks_for_time_to_restore(tmp_path):
    node = Node(tmp_path)
    proc, notify = node.start()
    wait_for(lambda: node.cpu_max() != MAX, what="BE capped")
    terminate(proc, node)
    assert extensions(notify), notify.texts()
    assert node.cpu_max() == MAX


# --- where the lock lives: the unit makes it, the DaemonSet shares the host's -------------------------

def test_the_unit_and_the_daemonset_give_every_koordd_the_same_lock_directory():
    from pathlib import Path
    yaml = pytest.importorskip("yaml")
    root = Path(__file__).resolve().parents[2]
    unit = (root / "systemd" / "koordd.service").read_text()
    assert owner.PATH.parent == Path("/run/koordd")
    # Made by systemd under ProtectSystem=strict, and not removed between runs.
    assert "RuntimeDirectory=koordd\n" in unit and "RuntimeDirectoryPreserve=yes\n" in unit
    pod = yaml.safe_load((root / "deploy" / "kubernetes" / "daemonset.yaml").read_text())["spec"]["template"]["spec"]
    [container] = [c for c in pod["containers"] if c["name"] == "koordd"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == str(owner.PATH.parent)]
    assert volumes[mount["name"]]["hostPath"]["path"] == str(owner.PATH.parent) and not mount.get("readOnly")


# --- koordctl names the holder -------------------------------------------------------------------------

def test_koordctl_status_names_the_host_owner_and_demo_refuses_beside_it(tmp_path, capsys):
    from koordctl.cli import main
    node = Node(tmp_path)
    holder = Daemon(load_config(node.config, REGISTRY), REGISTRY)
    try:
        holder._write_status()
        main(["status", "--state-dir", str(node.state)])
        assert f"owner      koordd pid {os.getpid()}" in capsys.readouterr().out
        main(["status", "--json", "--state-dir", str(node.state)])
        assert json.loads(capsys.readouterr().out)["owner"]["pid"] == os.getpid()
        assert main(["demo"]) == 2
        assert f"demo: koordd pid {os.getpid()}" in capsys.readouterr().err
    finally:
        holder.stop()
    main(["status", "--state-dir", str(node.state)])
    assert "owner      none (no koordd writes this host's knobs)" in capsys.readouterr().out
