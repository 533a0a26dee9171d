"""scripts/package: the .deb it builds, read with dpkg-deb (nothing is installed here: installing,
upgrading and purging it are tests/system/test_package.py, in scripts/vmtest's VM only)."""
from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from koordd.core.catalogue import OWN_LOOPS
from koordd.kernel import bpf_objects

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "package"
SITE = "usr/lib/python3/dist-packages"

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=True, timeout=300, **kw)


def build(out: Path, *args: str) -> Path:
    p = run(str(SCRIPT), "--out", str(out), "--no-lintian", *args)
    deb = Path(p.stdout.strip().splitlines()[-1])
    assert deb.parent == out.resolve() and deb.is_file(), p.stdout
    return deb


def pyproject_version() -> str:
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split('"')[1]
    raise AssertionError("no version in pyproject.toml")


@pytest.fixture(scope="module")
def deb(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def tree(deb, tmp_path_factory) -> Path:
    """The package's files (dpkg-deb -x: unpacked into a directory, not installed) and DEBIAN/."""
    root = tmp_path_factory.mktemp("root")
    run("dpkg-deb", "-R", str(deb), str(root))
    return root


def field(deb: Path, name: str) -> str:
    return run("dpkg-deb", "-f", str(deb), name).stdout.strip()


def test_name_version_architecture_and_dependencies(deb):
    version = pyproject_version()
    assert deb.name == f"koordd_{version}_all.deb"
    assert field(deb, "Package") == "koordd"
    assert field(deb, "Version") == version
    assert field(deb, "Architecture") == "all"
    depends = [d.strip() for d in field(deb, "Depends").split(",")]
    assert "python3 (>= 3.11)" in depends          # tomllib
    # libbpf1: koordd's BPF loader; its programs are CO-RE objects: no bcc, no headers, no compiler.
    for name in ("python3-psutil", "python3-pyroute2", "python3-watchdog", "python3-systemd", "libbpf1"):
        assert any(d.split()[0] == name for d in depends), depends
    recommends = field(deb, "Recommends")
    assert "python3-prometheus-client (>= 0.16)" in recommends and "bpfcc" not in recommends, recommends
    assert int(field(deb, "Installed-Size")) > 100
    assert field(deb, "Maintainer")
    run("dpkg-deb", "-I", str(deb))                # the control archive reads


def test_files_owner_and_modes(deb):
    listing = run("dpkg-deb", "-c", str(deb)).stdout.splitlines()
    entries = {line.split()[-1].lstrip("."): line.split() for line in listing}
    assert all(e[1] == "root/root" for e in entries.values()), [e for e in entries.values() if e[1] != "root/root"]
    for path, mode in (("/usr/sbin/koordd", "-rwxr-xr-x"), ("/usr/bin/koordctl", "-rwxr-xr-x"),
                       ("/lib/systemd/system/koordd.service", "-rw-r--r--"),
                       ("/etc/koordd/koordd.toml", "-rw-r--r--"),
                       (f"/{SITE}/koordd/runtime/daemon.py", "-rw-r--r--"),
                       (f"/{SITE}/koordctl/cli.py", "-rw-r--r--"),
                       (f"/{SITE}/koordd_plugins/be_suppress.py", "-rw-r--r--"),
                       (f"/{SITE}/koordd/bpf/koordd_sched.bpf.o", "-rw-r--r--"),
                       (f"/{SITE}/koordd/bpf/runq_latency.bpf.o", "-rw-r--r--"),
                       (f"/{SITE}/koordd/bpf/net_classify.bpf.o", "-rw-r--r--"),
                       (f"/{SITE}/koordd/bpf/koordd_shared.h", "-rw-r--r--"),
                       ("/usr/share/doc/koordd/copyright", "-rw-r--r--"),
                       ("/usr/share/doc/koordd/changelog.gz", "-rw-r--r--")):
        assert path in entries, f"{path} is not in the package"
        assert entries[path][0] == mode, (path, entries[path])
    # Every BPF object koordd loads (koordd/kernel/bpf_objects.py), beside the sources in the tree's bpf/ it is
    # built from; not the types they were built against (2.7 MB no node reads).
    for shipped in bpf_objects.OBJECTS:
        assert entries.get(f"/{SITE}/koordd/bpf/{shipped.name}", [""])[0] == "-rw-r--r--", shipped.name
    for source in [*(ROOT / "bpf").glob("*.bpf.c"), ROOT / "bpf" / "scx.h"]:
        assert f"/{SITE}/koordd/bpf/{source.name}" in entries, source.name
    assert f"/{SITE}/koordd/bpf/vmlinux.h" not in entries
    # Every module of koordd, koordctl and the loops (plugins/: koordd_plugins) in the tree, and no byte code,
    # tests or scripts of the tree, nor the example plugin (plugins/example-hello/: a package of its own).
    for module in [*(ROOT / "koordd").rglob("*.py"), *(ROOT / "koordctl").rglob("*.py")]:
        assert f"/{SITE}/{module.relative_to(ROOT)}" in entries, module
    for module in (ROOT / "plugins").glob("*.py"):
        assert f"/{SITE}/koordd_plugins/{module.name}" in entries, module
    assert not [p for p in entries if p.endswith(".pyc") or "/tests/" in p or "__pycache__" in p or "hello" in p]
    tops = {p.split("/")[1] for p in entries if p.count("/") > 1}
    assert tops <= {"etc", "lib", "usr"}, tops
    assert {p.split("/")[5] for p in entries if p.startswith(f"/{SITE}/") and p.count("/") > 5} \
        == {"koordd", "koordctl", "koordd_plugins", f"koordd-{pyproject_version()}.dist-info"}


def test_the_config_is_a_conffile_and_the_shipped_default(deb, tree):
    assert (tree / "DEBIAN" / "conffiles").read_text().split() == ["/etc/koordd/koordd.toml"]
    assert (tree / "etc/koordd/koordd.toml").read_text() == (ROOT / "config" / "koordd.toml").read_text()
    # dpkg checks conffiles itself: md5sums lists the rest.
    md5 = [line.split()[1] for line in (tree / "DEBIAN" / "md5sums").read_text().splitlines()]
    assert "etc/koordd/koordd.toml" not in md5 and "usr/sbin/koordd" in md5 and "lib/systemd/system/koordd.service" in md5


def test_the_unit_is_the_hardened_one_pointing_at_the_packaged_daemon(tree):
    unit = (tree / "lib/systemd/system/koordd.service").read_text()
    assert "ExecStart=/usr/sbin/koordd --config /etc/koordd/koordd.toml\n" in unit
    assert "/opt/koordd" not in unit
    # Only ExecStart differs from systemd/koordd.service (its hardening, StateDirectory, watchdog).
    shipped = (ROOT / "systemd" / "koordd.service").read_text()
    assert unit == shipped.replace("ExecStart=/opt/koordd/bin/koordd ", "ExecStart=/usr/sbin/koordd ")
    assert "StateDirectory=koordd\n" in unit and "ProtectSystem=strict\n" in unit


def test_maintainer_scripts_parse_and_do_what_policy_asks(tree):
    scripts = {name: (tree / "DEBIAN" / name) for name in ("postinst", "prerm", "postrm")}
    for name, path in scripts.items():
        assert os.access(path, os.X_OK), name
        assert path.read_text().startswith("#!/bin/sh\n"), name
        subprocess.run(["sh", "-n", str(path)], check=True)
        if shutil.which("dash"):
            subprocess.run(["dash", "-n", str(path)], check=True)
    postinst, prerm, postrm = (p.read_text() for p in scripts.values())
    assert "deb-systemd-helper enable koordd.service" in postinst
    assert "deb-systemd-invoke restart koordd.service" in postinst and "py3compile -p koordd" in postinst
    assert "deb-systemd-invoke stop koordd.service" in prerm and "py3clean -p koordd" in prerm
    assert "deb-systemd-helper purge koordd.service" in postrm and "rm -rf /var/lib/koordd" in postrm


def test_the_commands_and_entry_points(tree):
    for path, module in (("usr/sbin/koordd", "koordd.runtime.daemon"), ("usr/bin/koordctl", "koordctl.cli")):
        text = (tree / path).read_text()
        assert text.startswith("#!/usr/bin/python3\n") and f"from {module} import main" in text, text
    dist_info = tree / SITE / f"koordd-{pyproject_version()}.dist-info"
    assert not (dist_info / "RECORD").exists()     # pip must not uninstall dpkg's files
    # koordd's own loops are entry points of its metadata, as a third party's are (pyproject.toml), each naming
    # a module of koordd_plugins; its sensors and backends are not (koordd/core/catalogue.py BUILTIN).
    eps = (dist_info / "entry_points.txt").read_text()
    for module in (ROOT / "plugins").glob("*.py"):
        if module.stem != "__init__":
            assert f"\n{module.stem} = koordd_plugins.{module.stem}:" in eps, (module.name, eps)
    assert "[koordd.sensors]" not in eps and "[koordd.backends]" not in eps, eps
    meta = email.parser.Parser().parsestr((dist_info / "METADATA").read_text())
    assert meta["Name"] == "koordd" and meta["Version"] == pyproject_version()


def test_the_man_pages_and_the_guides_are_in_it(tree):
    # man koordd, man koordctl, man koordd.toml after apt install: the committed pages of man/, gzipped where
    # man-db looks; the guides of docs/ (koordctl --help names them) under /usr/share/doc/koordd/docs/.
    import gzip
    for page, section in (("koordd.8", "8"), ("koordctl.8", "8"), ("koordd.toml.5", "5")):
        packed = tree / f"usr/share/man/man{section}/{page}.gz"
        assert packed.is_file(), f"{page} is not in the package"
        assert gzip.decompress(packed.read_bytes()).decode() == (ROOT / "man" / page).read_text()
    docs = tree / "usr/share/doc/koordd/docs"
    for guide in (ROOT / "docs").glob("*.md"):
        assert gzip.decompress((docs / f"{guide.name}.gz").read_bytes()).decode() == guide.read_text(), guide.name
    md5 = [line.split()[1] for line in (tree / "DEBIAN" / "md5sums").read_text().splitlines()]
    assert "usr/share/man/man8/koordd.8.gz" in md5 and "usr/share/man/man5/koordd.toml.5.gz" in md5


def test_the_unpacked_package_imports_and_finds_its_loops_and_bpf_files(tree):
    # The package's own tree alone on sys.path (-S: not this venv's editable koordd), as
    # /usr/lib/python3/dist-packages is on the target: the registry finds its own loops there, through the
    # dist-info's entry points, the sensors and the sched_ext loader their BPF files.
    code = ("import sys; import koordd.core.catalogue, koordd.kernel.sched_ext_scheduler, koordd.sensors.runq;"
            "assert koordd.core.catalogue.__file__.startswith(sys.argv[1]), koordd.core.catalogue.__file__;"
            "loops = koordd.core.catalogue.load_registry();"
            "assert all(c.__module__.startswith('koordd_plugins.') for c in loops.values()), loops;"
            "assert all(sys.modules[c.__module__].__file__.startswith(sys.argv[1]) for c in loops.values());"
            "names = list(loops);"
            "import koordd.kernel.netclass;"
            "assert koordd.kernel.sched_ext_scheduler.OBJECT.is_file() and koordd.sensors.runq.PROGRAM.is_file();"
            "assert koordd.kernel.netclass.PROGRAM.is_file();"
            "import koordd.kernel.bpf_objects as o;"
            "assert all(p.is_file() and str(p).startswith(sys.argv[1]) for p in (*o.OBJECTS, o.SHARED_HEADER));"
            "print(' '.join(names))")
    site = str(tree / SITE)
    env = {**os.environ, "PYTHONPATH": site, "PYTHONDONTWRITEBYTECODE": "1"}
    p = run(sys.executable, "-S", "-c", code, site, env=env, cwd=str(tree))
    names = p.stdout.split()
    assert names == list(OWN_LOOPS), p.stdout


def test_a_dev_build_sorts_between_releases_and_an_explicit_version_wins(tmp_path):
    dev = build(tmp_path, "--dev")
    version = field(dev, "Version")
    assert version.startswith(pyproject_version() + "~git"), version
    assert subprocess.run(["dpkg", "--compare-versions", version, "lt", pyproject_version()]).returncode == 0
    explicit = build(tmp_path, "--version", "9.9.9+test1")
    assert field(explicit, "Version") == "9.9.9+test1"
    bad = subprocess.run([str(SCRIPT), "--out", str(tmp_path), "--version", "not a version"], capture_output=True, text=True)
    assert bad.returncode != 0 and "not a Debian version" in bad.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="as a normal user the other tests already build it unprivileged")
def test_a_normal_user_builds_it():
    tmp_path = Path(tempfile.mkdtemp(prefix="koordd-package-test."))   # pytest's tmp_path is root's alone
    tmp_path.chmod(0o1777)
    try:
        _build_as_nobody(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _build_as_nobody(tmp_path: Path) -> None:
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        "env", f"TMPDIR={tmp_path}", "HOME=/nonexistent", str(SCRIPT), "--out", str(tmp_path / "out"),
                        "--no-lintian"], capture_output=True, text=True, timeout=300)
    if p.returncode != 0 and "Permission denied" in p.stderr:
        pytest.skip(f"the checkout is not readable by nobody: {p.stderr.strip()[:200]}")
    assert p.returncode == 0, p.stderr
    deb = Path(p.stdout.strip().splitlines()[-1])
    assert deb.stat().st_uid == 65534
    assert all(line.split()[1] == "root/root" for line in run("dpkg-deb", "-c", str(deb)).stdout.splitlines())


def test_nothing_is_installed_on_this_host_by_the_package_tests():
    # The VM test that runs dpkg -i guards itself with the VM image's test runner, absent here.
    from tests.system import test_package as vm_test
    if not vm_test.IN_VM_IMAGE:
        assert vm_test.pytestmark[1].args[0] is True       # its skipif holds on this host
