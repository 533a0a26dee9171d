"""Issue 25, defect 1: class roots nested in one another (an LS cgroup below a BE root, and the reverse).

Every class root is found at any depth, the deepest match giving a cgroup its class; no throttle, freeze
or kill lands on a cgroup that is or holds an LS, LSR, LSE or SYSTEM cgroup; usage is counted once; a
nested class root is never a member (a pod) of the root above it; and the config says at validate time
where a BE pattern can hold a cgroup of another class.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fakecgroup import FakeCgroups

MiB = 1 << 20

CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"

[[classes]]
name = "BE"
cgroups = {be}

[[classes]]
name = "LS"
cgroups = {ls}

[loops.be_suppress]
enabled = true
interval = "200ms"
rule = "threshold"
threshold_percent = 65

[loops.memory_evict]
enabled = true
interval = "200ms"
scope = "{scope}"
threshold_percent = 50
reclaim = false
cooldown = "0s"
"""


def run_once(tmp: Path, tree: FakeCgroups, be: list[str], ls: list[str], scope: str) -> list[dict]:
    """koordd --once with be_suppress and memory_evict on; its decisions."""
    state, config = tmp / "state", tmp / "etc" / "koordd.toml"
    config.parent.mkdir()
    config.write_text(CONFIG.format(root=tree.root, state=state, be=json.dumps(be), ls=json.dumps(ls), scope=scope))
    done = subprocess.run([sys.executable, "-m", "koordd.daemon", "--config", str(config), "--once"],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    path = state / "decisions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def harmful(decisions: list[dict], cgroup: str) -> list[dict]:
    """Writes koordd carried out on `cgroup` that cap, freeze or kill it."""
    return [d for d in decisions if d["cgroup"] == cgroup and d["outcome"] == "applied"
            and d["knob"] in ("cpu.max", "cgroup.kill", "cgroup.freeze") and d["new"] not in ("0", None)
            and not d["new"].startswith("max")]


def test_an_ls_job_below_a_be_root_is_neither_capped_nor_killed_nor_is_its_parent(tmp_path):
    # be.slice holds ls-job (LS by the config) beside batch (BE). The scope is over its memory mark, and
    # ls-job is the largest BE member by the old reading: memory_evict's first victim.
    tree = FakeCgroups(tmp_path, "v2")
    tree.add("be.slice/ls-job", memory_current=600 * MiB).add("be.slice/batch", memory_current=300 * MiB)
    tree.stat("be.slice", memory_current=900 * MiB)
    tree.set("be.slice", "memory", "memory.max", f"{1000 * MiB}\n")
    decisions = run_once(tmp_path, tree, ["be.slice"], ["be.slice/ls-job"], "be.slice")

    assert not harmful(decisions, "be.slice/ls-job"), decisions
    assert not harmful(decisions, "be.slice"), decisions          # capping it would cap ls-job too
    assert tree.read("be.slice/ls-job", "cgroup", "cgroup.kill").strip() == ""
    assert tree.read("be.slice", "cpu", "cpu.max").strip() == "max 100000"
    # Not a test of nothing: memory_evict acted, on the BE job beside the LS one.
    assert [(d["cgroup"], d["knob"]) for d in decisions if d["outcome"] == "applied"] == \
        [("be.slice/batch", "cgroup.kill")], decisions


def test_the_docs_kubepods_example_leaves_kubepods_uncapped(tmp_path):
    # BE kubepods.slice with LS guaranteed pods right below it: kubepods.slice holds LS.
    tree = FakeCgroups(tmp_path, "v2")
    tree.add("kubepods.slice/kubepods-pod1.slice").add("kubepods.slice/kubepods-besteffort.slice")
    tree.stat("kubepods.slice")          # its cpu.stat: be_suppress sizes what it can read
    decisions = run_once(tmp_path, tree, ["kubepods.slice"], ["kubepods.slice/kubepods-pod*.slice"], "")

    assert not harmful(decisions, "kubepods.slice"), decisions
    assert tree.read("kubepods.slice", "cpu", "cpu.max").strip() == "max 100000"
