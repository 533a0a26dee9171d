"""The Debian package (scripts/package) on a real host: `dpkg -i` installs, enables and starts koordd,
which acts on the shipped config; an upgrade keeps the operator's edit of the conffile
/etc/koordd/koordd.toml (also when the new package ships a different default) and restarts koordd
(the old one restores its knobs, the new one applies them again); `dpkg --purge` stops and disables
it, removes its config and state, and every knob it changed is back. The man pages (koordd(8), koordctl(8),
koordd.toml(5)) are installed by the package, and by scripts/install before it.

Both packages are built inside the VM from its copy of the working tree, as a normal build would.
scripts/vmtest's image has koordd installed by scripts/install (/opt/koordd, its unit in
/etc/systemd/system, /etc/koordd, /usr/local/bin/koordctl): the fixture moves that installation aside
and brings it back afterwards, so the package meets a host without koordd.

Never run outside the VM: besides vm.only_in_vm, the module needs the image's own test runner
(/usr/local/sbin/koordd-systemtest), so a development host -- even a root one with systemd and
pure cgroup v2 -- never gets the package installed by a test.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from . import vm

VM_IMAGE_MARK = Path("/usr/local/sbin/koordd-systemtest")      # written into the image by scripts/vmtest
IN_VM_IMAGE = VM_IMAGE_MARK.is_file()

pytestmark = [vm.only_in_vm,
              pytest.mark.skipif(not IN_VM_IMAGE, reason=f"installs a .deb: only in scripts/vmtest's VM "
                                 f"(no {VM_IMAGE_MARK} here)")]

SRC = Path(__file__).resolve().parents[2]
V1, V2 = "0.1.0", "0.1.0+upgrade1"
PKG_UNIT = Path("/lib/systemd/system/koordd.service")
SCRIPTS_INSTALL = [Path("/etc/systemd/system/koordd.service"), Path("/etc/koordd"), vm.STATE_DIR,
                   Path("/usr/local/bin/koordctl")]
ASIDE = Path("/root/koordd-install-aside")
BE_KNOBS = ("cpu.idle", "cpu.weight", "cpu.max", "memory.high")
OPERATOR_EDIT = ('be_memory_high = ""', 'be_memory_high = "50%"   # the operator\'s edit')
NEW_DEFAULT = "\n# A line the next version's default config adds.\n"
MAN_PAGES = [Path("/usr/share/man/man8/koordd.8.gz"), Path("/usr/share/man/man8/koordctl.8.gz"),
             Path("/usr/share/man/man5/koordd.toml.5.gz")]
SCRIPTS_INSTALL_MAN = [Path("/usr/local/share/man/man8/koordd.8"), Path("/usr/local/share/man/man8/koordctl.8"),
                       Path("/usr/local/share/man/man5/koordd.toml.5")]


def dpkg_status() -> str:
    return vm.sh("dpkg-query", "-W", "-f=${Status} ${Version}", "koordd", check=False).stdout.strip()


def build(src: Path, version: str, out: Path) -> Path:
    p = vm.sh(str(src / "scripts" / "package"), "--version", version, "--out", str(out), "--no-lintian", timeout=300)
    deb = Path(p.stdout.strip().splitlines()[-1])
    assert deb.is_file() and deb.name == f"koordd_{version}_all.deb", p.stdout
    return deb


def dpkg(*args: str) -> str:
    p = vm.sh("env", "DEBIAN_FRONTEND=noninteractive", "dpkg", *args, timeout=600)
    return p.stdout + p.stderr


def knob_decisions(cursor: int, knob: str) -> list[tuple[str, str]]:
    return [(e.get("KOORDD_OUTCOME"), e.get("KOORDD_NEW"))
            for e in vm.journal(cursor, "KOORDD_LOOP=qos_baseline", f"KOORDD_CGROUP={vm.BE}", f"KOORDD_KNOB={knob}")]


@pytest.fixture
def host_without_koordd(koordd_stopped, cpu_controller, tmp_path):
    """scripts/install's koordd stopped and moved aside; be.slice with a process (so it exists) and
    the cpu controller; afterwards the package purged and the installation back."""
    ASIDE.mkdir(exist_ok=True)
    for path in SCRIPTS_INSTALL:
        if path.exists() or path.is_symlink():
            shutil.move(str(path), str(ASIDE / path.name))
    vm.systemctl("daemon-reload")
    vm.stop_units("pkgbe")
    vm.sh("systemd-run", f"--slice={vm.BE}", "--unit=pkgbe", "sleep", "infinity")
    vm.wait_tasks(f"{vm.BE}/pkgbe.service", 1)
    assert vm.wait_for(lambda: vm.knob(vm.BE, "cpu.idle") is not None, 30), "be.slice has no cpu.idle"
    yield tmp_path
    if dpkg_status():
        vm.sh("dpkg", "--purge", "koordd", check=False, timeout=600)
    vm.stop_units("pkgbe")
    for path in SCRIPTS_INSTALL:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        if (ASIDE / path.name).exists() or (ASIDE / path.name).is_symlink():
            shutil.move(str(ASIDE / path.name), str(path))
    vm.systemctl("daemon-reload")


def test_install_upgrade_keeps_the_operators_config_and_purge_leaves_nothing(host_without_koordd):
    tmp = host_without_koordd
    # The image's koordd came from scripts/install, which put the man pages in /usr/local/share/man.
    assert all(page.is_file() for page in SCRIPTS_INSTALL_MAN), [p for p in SCRIPTS_INSTALL_MAN if not p.is_file()]
    originals = {k: vm.knob(vm.BE, k) for k in BE_KNOBS}
    assert originals["cpu.idle"] == "0" and originals["memory.high"] == "max", originals
    assert dpkg_status() == "" and not vm.CONFIG.exists() and not PKG_UNIT.exists()

    # Two versions: the second ships a changed default config (dpkg must still keep the operator's).
    deb1 = build(SRC, V1, tmp / "v1")
    src2 = tmp / "src2"
    for part in ("pyproject.toml", "README.md", "koordd", "koordctl", "plugins", "bpf", "config", "systemd", "packaging",
                 "docs", "man", "scripts/package"):
        dst = src2 / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (SRC / part).is_dir() else shutil.copy2)(SRC / part, dst)
    (src2 / "config" / "koordd.toml").write_text(vm.shipped_config() + NEW_DEFAULT)
    deb2 = build(src2, V2, tmp / "v2")

    # --- install: enabled, started, acting on the shipped config -------------------------------------------
    cursor = vm.journal_cursor()
    out = dpkg("-i", str(deb1))
    assert dpkg_status() == f"install ok installed {V1}", out
    assert vm.CONFIG.read_text() == vm.shipped_config()
    assert vm.sh("systemctl", "is-enabled", vm.UNIT).stdout.strip() == "enabled"
    assert vm.is_active() == "active", vm.journal_text(cursor)
    assert vm.show("FragmentPath") == str(PKG_UNIT)
    pid1 = vm.main_pid()
    cmdline = Path(f"/proc/{pid1}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1:4] == [b"/usr/sbin/koordd", b"--config", b"/etc/koordd/koordd.toml"], cmdline
    assert vm.wait_for(lambda: vm.knob(vm.BE, "cpu.idle") == "1", 60), vm.journal_text(cursor)
    assert vm.wait_journal(lambda: ("applied", "1") in knob_decisions(cursor, "cpu.idle")), \
        knob_decisions(cursor, "cpu.idle")
    status = vm.sh("/usr/bin/koordctl", "status").stdout
    assert "qos_baseline" in status and "be_suppress" in status, status
    assert list(Path("/usr/lib/python3/dist-packages/koordd").glob("runtime/__pycache__/daemon.*.pyc")), \
        "postinst did not byte-compile koordd"
    # man koordd, man koordctl, man koordd.toml: the pages where man-db looks (the image has no man-db: where
    # it has, man -w finds them), and none left by the purge below.
    for page in MAN_PAGES:
        assert page.is_file() and page.read_bytes()[:2] == b"\x1f\x8b", f"{page} not installed"
    assert "/usr/share/man/man8/koordd.8.gz" in vm.sh("dpkg", "-L", "koordd").stdout
    if shutil.which("man"):
        assert vm.sh("man", "-w", "koordd").stdout.strip() in (str(MAN_PAGES[0]), str(SCRIPTS_INSTALL_MAN[0]))

    # --- the operator edits the conffile; the running koordd reloads it by itself ---------------------------
    high = vm.node_memory() * 50 // 100 // 4096 * 4096
    assert OPERATOR_EDIT[0] in vm.shipped_config()
    edited = vm.shipped_config().replace(*OPERATOR_EDIT)
    vm.write_config(edited)
    assert vm.wait_for(lambda: vm.knob(vm.BE, "memory.high") == str(high), 60), \
        f"memory.high {vm.knob(vm.BE, 'memory.high')} != {high}: {vm.journal_text(cursor)}"

    # --- upgrade: config kept, koordd restarted, knobs restored by the old and applied by the new one ---------
    cursor = vm.journal_cursor()
    out = dpkg("-i", "--force-confdef", "--force-confold", str(deb2))
    assert dpkg_status() == f"install ok installed {V2}", out
    assert vm.CONFIG.read_text() == edited, "the upgrade replaced the operator's config"
    dist = Path(str(vm.CONFIG) + ".dpkg-dist")
    assert dist.is_file() and dist.read_text() == vm.shipped_config() + NEW_DEFAULT, out
    assert vm.is_active() == "active", vm.journal_text(cursor)
    pid2 = vm.main_pid()
    assert pid2 not in (0, pid1) and not vm.pid_alive(pid1)
    assert vm.wait_for(lambda: vm.knob(vm.BE, "cpu.idle") == "1" and vm.knob(vm.BE, "memory.high") == str(high),
                       60), \
        (vm.knob(vm.BE, "cpu.idle"), vm.knob(vm.BE, "memory.high"), vm.journal_text(cursor))
    for knob, original, value in (("cpu.idle", originals["cpu.idle"], "1"),
                                  ("memory.high", originals["memory.high"], str(high))):
        seen = vm.wait_journal(lambda: d if ("restored", original) in (d := knob_decisions(cursor, knob))
                               and ("applied", value) in d[d.index(("restored", original)):] else None)
        assert seen, f"{knob}: no restore then apply across the upgrade: {knob_decisions(cursor, knob)}"
    text = vm.journal_text(cursor)
    assert "Stopped koordd.service" in text or "Stopping koordd" in text, text
    print(f"[vm] upgrade {V1} -> {V2}: pid {pid1} -> {pid2}, be.slice cpu.idle and memory.high "
          f"restored then applied again, config kept")

    # --- purge: stopped, disabled, config and state gone, every knob back -----------------------------------
    cursor = vm.journal_cursor()
    out = dpkg("--purge", "koordd")
    assert dpkg_status() == "", out
    assert vm.is_active() == "inactive"
    assert vm.show("LoadState") == "not-found", vm.show("LoadState")
    assert not Path("/etc/systemd/system/multi-user.target.wants/koordd.service").exists()
    assert not Path("/etc/systemd/system/koordd.service").is_symlink(), "a mask is left behind"
    left = [p for p in (Path("/etc/koordd"), vm.STATE_DIR, PKG_UNIT, Path("/usr/sbin/koordd"),
                        Path("/usr/bin/koordctl"), Path("/usr/lib/python3/dist-packages/koordd"),
                        Path("/usr/lib/python3/dist-packages/koordd_plugins"), *MAN_PAGES)
            if p.exists()]
    assert left == [], f"left after purge: {left}"
    assert {k: vm.knob(vm.BE, k) for k in BE_KNOBS} == originals
    assert not vm.koordd_pids()
    restored = knob_decisions(cursor, "cpu.idle")
    assert ("restored", originals["cpu.idle"]) in restored, restored
