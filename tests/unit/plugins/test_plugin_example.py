"""The example plugin (plugins/example-hello/, a package of its own) the whole way a third party's goes:
built and installed by pip (offline: no index, no build isolation, the venv's setuptools), found by koordd's
registry through its entry point, its section validated, its decision applied and recorded by one round of
koordd on a fake cgroup tree, and its own tests passing against the installed koordd. docs/plugins.md."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from koordtest.fakes.cgroup import FakeCgroups

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "plugins" / "example-hello"

CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"

[[classes]]
name = "BE"
cgroups = ["be.slice"]

[loops.hello]
enabled = true
weight = 3
"""


def run(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example installed into a folder of its own (as --target), built from a copy of its source."""
    tmp = tmp_path_factory.mktemp("plugin")
    src = tmp / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    done = run(sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation",
               "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target", str(tmp / "site"), str(src),
               env={"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "",
                    "PIP_CONSTRAINT": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp / "site"


def test_the_built_package_registers_its_loop_as_an_entry_point(site):
    [dist] = site.glob("koordd_hello-*.dist-info")
    assert "[koordd.loops]\nhello = koordd_hello:Hello\n" in (dist / "entry_points.txt").read_text()


def test_koordd_finds_the_plugin_runs_it_one_round_and_records_its_decision(site, tmp_path):
    tree = FakeCgroups(tmp_path, "v2").add("be.slice")
    config = tmp_path / "koordd.toml"
    config.write_text(CONFIG.format(root=tree.root, state=tmp_path / "state"))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))}
    done = run(sys.executable, "-m", "koordd.runtime.daemon", "--config", str(config), "--once", env=env)
    assert done.returncode == 0, done.stderr
    assert "loop hello started" in done.stderr and " ERROR " not in done.stderr, done.stderr
    assert tree.read("be.slice", "cpu", "cpu.weight").strip() == "3"
    [d] = [json.loads(line) for line in (tmp_path / "state" / "decisions.jsonl").read_text().splitlines()]
    assert (d["loop"], d["cgroup"], d["knob"], d["new"], d["outcome"]) == ("hello", "be.slice", "cpu.weight", "3",
                                                                           "applied"), d
    # Without the plugin on the path, [loops.hello] is a section of no loop: koordd refuses the config.
    assert run(sys.executable, "-m", "koordd.runtime.daemon", "--config", str(config), "--once").returncode == 78


def test_the_plugins_own_tests_pass_against_the_installed_koordd(site, tmp_path):
    tests = tmp_path / "tests"
    shutil.copytree(EXAMPLE / "tests", tests)
    done = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests), cwd=tmp_path,
               env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout, done.stdout
