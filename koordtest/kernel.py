"""The kernel tests' helpers (tests/kernel, whose conftest.py makes fixtures of them): cgroups of their
own on the real hierarchy, busy-loop hogs in them, and koordd run as a subprocess.

Everything here creates only cgroups named koordd-test-<pid>-<n> directly under the hierarchy
roots, moves only the processes it starts (each joins its cgroup before exec), and removes all of
it at teardown, also when a test fails: koordd first (SIGTERM, then SIGKILL), then the hogs
(SIGKILL to every pid listed in our own cgroups), then the cgroups, children before the parent.
No other cgroup is written to, except the `cgroup.subtree_control` of our own parent on cgroup v2.
"""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from koordctl.demo.cgroups import ScratchTree, die_with_parent
from koordd.act.journal import read_held
from koordtest.bench.common import wait_for  # noqa: F401  (the kernel tests import it from here)
from koordtest.koordd_proc import koordd_command

CGROUP_ROOT = Path("/sys/fs/cgroup")
CHILDREN = ("ls", "be")
HOG = ["/bin/sh", "-c", "while :; do :; done"] if os.path.exists("/bin/sh") \
    else [sys.executable, "-c", "while True: pass"]
NCPU = os.sysconf("SC_NPROCESSORS_ONLN")
_serial = itertools.count()


def detect_host() -> tuple[str, dict[str, Path]]:
    """("hybrid" | "v2", {role: hierarchy root}) or pytest.skip with what is missing.

    hybrid: v1 `cpu` (quota) and `cpuacct` (usage) hierarchies plus the unified tree (PSI).
    v2: the cgroup2 root with the cpu controller already enabled for its children.
    """
    if os.geteuid() != 0:
        pytest.skip("needs root: creates cgroups under /sys/fs/cgroup and writes their CPU quota")
    if (CGROUP_ROOT / "cgroup.controllers").is_file():
        enabled = (CGROUP_ROOT / "cgroup.subtree_control").read_text().split()
        if "cpu" not in enabled:
            pytest.skip("needs the cpu controller enabled in /sys/fs/cgroup/cgroup.subtree_control "
                        "(pure cgroup v2 host); the test does not change the host's root cgroup")
        return "v2", {"cpu": CGROUP_ROOT, "usage": CGROUP_ROOT, "unified": CGROUP_ROOT}
    cpu, cpuacct, unified = CGROUP_ROOT / "cpu", CGROUP_ROOT / "cpuacct", CGROUP_ROOT / "unified"
    if (cpu / "cpu.cfs_quota_us").is_file() and (cpuacct / "cpuacct.usage").is_file() \
            and (unified / "cgroup.controllers").is_file():
        return "hybrid", {"cpu": cpu, "usage": cpuacct, "unified": unified}
    pytest.skip("needs a hybrid cgroup host (v1 cpu + cpuacct hierarchies and the unified tree under "
                "/sys/fs/cgroup) or a pure cgroup v2 host with the cpu controller enabled")


@dataclass
class CgroupEnv(ScratchTree):
    """A parent cgroup `name` with children ls and be, present in every hierarchy in `roles`: the scratch
    tree of koordctl.demo.cgroups (the one implementation), and what the tests read of them. Tests
    subclass it (a dataclass) with cgroups made their own way; remove() takes every child in every root."""
    mode: str
    roles: dict[str, Path]
    name: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    children: tuple[str, ...] = CHILDREN

    def __post_init__(self):
        ScratchTree.__init__(self, self.name, self.roles.values(), ("cpu",) if self.mode == "v2" else ())

    def cgroup(self, child: str) -> str:
        """koordd's name for a child: the path relative to the hierarchy root."""
        return f"{self.name}/{child}"

    def dirs(self) -> list[Path]:
        return [root / self.name / c for root in self.roots for c in self.children] + \
            [root / self.name for root in self.roots]

    def dir(self, role: str, child: str | None = None) -> Path:
        d = self.roles[role] / self.name
        return d / child if child else d

    def create(self) -> None:
        super().create(self.children)

    def spawn(self, child: str, argv: list[str], idle_policy: bool = False, **popen) -> subprocess.Popen:
        """ScratchTree.spawn, its output thrown away unless asked for."""
        popen.setdefault("stdout", subprocess.DEVNULL)
        popen.setdefault("stderr", subprocess.DEVNULL)
        return super().spawn(child, argv, idle_policy, **popen)

    def spawn_hog(self, child: str) -> subprocess.Popen:
        """One busy loop in `child`."""
        return self.spawn(child, HOG)

    def destroy(self) -> list[str]:
        """Kill our processes, remove our cgroups; returns what could not be cleaned (empty: all gone)."""
        return self.remove()

    # --- readings -------------------------------------------------------------------

    def usage_ns(self, child: str) -> int:
        d = self.dir("usage", child)
        if self.mode == "hybrid":
            return int((d / "cpuacct.usage").read_text())
        for line in (d / "cpu.stat").read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == "usage_usec":
                return int(v) * 1000
        raise AssertionError(f"{d}/cpu.stat has no usage_usec")

    def cpu_max(self, child: str) -> str:
        """Canonical "<quota|max> <period>", as koordd writes it in its records."""
        d = self.dir("cpu", child)
        if self.mode == "hybrid":
            quota = int((d / "cpu.cfs_quota_us").read_text())
            period = int((d / "cpu.cfs_period_us").read_text())
            return f"{'max' if quota < 0 else quota} {period}"
        return (d / "cpu.max").read_text().strip()

    def quota_cores(self, child: str) -> float | None:
        """The quota as cores, None when unlimited."""
        quota, period = self.cpu_max(child).split()
        return None if quota == "max" else int(quota) / int(period)

    def raw_quota(self, child: str) -> str:
        """The kernel file as it reads: v1 cpu.cfs_quota_us ("-1" when unlimited), v2 cpu.max's first field."""
        d = self.dir("cpu", child)
        if self.mode == "hybrid":
            return (d / "cpu.cfs_quota_us").read_text().strip()
        return (d / "cpu.max").read_text().split()[0]

    def measure(self, seconds: float, step: float = 0.1) -> dict:
        """CPU use in cores over `seconds`: of ls and be, of the whole node ("node", from /proc/stat)
        and of everything else ("other" = node - ls - be); and the BE quota (cores) sampled meanwhile."""
        t0 = time.monotonic()
        n0 = proc_stat_busy()
        u0 = {c: self.usage_ns(c) for c in CHILDREN}
        quotas = []
        while time.monotonic() - t0 < seconds:
            quotas.append(self.quota_cores("be"))
            time.sleep(step)
        u1 = {c: self.usage_ns(c) for c in CHILDREN}
        n1 = proc_stat_busy()
        dt = time.monotonic() - t0
        out = {c: (u1[c] - u0[c]) / 1e9 / dt for c in CHILDREN}
        out["node"] = NCPU * (n1[0] - n0[0]) / max(n1[1] - n0[1], 1)
        out["other"] = max(out["node"] - out["ls"] - out["be"], 0.0)
        out["quotas"] = quotas
        return out


@dataclass
class FreezableEnv(CgroupEnv):
    """A CgroupEnv on roles as the memory tests detect them (tests/kernel/test_memory_evict_kernel.py's
    detect: the one root "v2" on a cgroup v2 host, a hierarchy per role on v1), whose children a test (or
    koordd) may freeze: destroy() thaws them all first, since a frozen v1 task cannot die."""

    def dir(self, role: str, child: str | None = None) -> Path:
        root = self.roles["v2" if self.mode == "v2" else role]
        return root / self.name / child if child else root / self.name

    def thaw_all(self) -> None:
        for child in self.children:
            try:
                if self.mode == "v2":
                    (self.dir("v2", child) / "cgroup.freeze").write_text("0")
                else:
                    (self.dir("freezer", child) / "freezer.state").write_text("THAWED")
            except OSError:
                pass

    def destroy(self) -> list[str]:
        self.thaw_all()
        return super().destroy()


def calm_window(measure, limit: float, what: str, attempts: int = 10) -> dict:
    """The first window from `measure()` in which work outside the test's cgroups ("other", in CPUs,
    koordd and pytest included) stayed at most `limit`.

    A node busy with other work does not fail a test: limits leave the test's own cgroups the CPU
    its comparison needs, and the checks on a window compare ratios or allow for the "other" it
    measured. Only a node too busy for any of `attempts` windows fails the test, saying so."""
    others = []
    for _ in range(attempts):
        m = measure()
        if m["other"] <= limit:
            return m
        others.append(m["other"])
    pytest.fail(f"node too busy with other work to measure {what}: {', '.join(f'{o:.2f}' for o in others)} "
                f"CPUs used outside the test's cgroups in {attempts} windows (limit {limit:.2f})")


def proc_stat_busy() -> tuple[int, int]:
    """(busy, total) jiffies of the whole node: total - idle - iowait, as koordd counts them."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu "):
                v = [int(x) for x in line.split()[1:9]]
                return sum(v) - v[3] - v[4], sum(v)
    raise AssertionError("/proc/stat has no aggregate cpu line")


def rmdir(d: Path) -> bool:
    """Whether `d` is gone (now or before): a cgroup whose last task just died is busy for a moment."""
    try:
        d.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def unique_name(tag: str = "") -> str:
    return f"koordd-test-{os.getpid()}-{tag}{next(_serial)}"


def created(env: CgroupEnv):
    """Fixture body: create `env`, yield it, and destroy it even when the test fails; a cleanup that
    left something behind fails the test."""
    try:
        env.create()
        yield env
    finally:
        problems = env.destroy()
    assert not problems, "cleanup failed: " + "; ".join(problems)


def stop_all(k: "Koordd") -> None:
    """Fixture teardown: koordd runs still alive get SIGTERM (restore), then SIGKILL."""
    for p in k.runs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


# --- koordd as a subprocess --------------------------------------------------------


@dataclass
class Koordd:
    """Config, state and runs of koordd for one test."""
    tmp: Path
    env: CgroupEnv
    runs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return self.tmp / "state"

    def write_config(self, enabled: bool = True, interval: str = "500ms", name: str = "koordd.toml",
                     extra: str = "", ls_extra: str = "") -> Path:
        """A config with LS and BE and be_suppress: `extra` goes into [loops.be_suppress], `ls_extra` into LS's
        class rule (its [classes.health] or [classes.slo] tables)."""
        return self.config_file(f"""
[[classes]]
name = "LS"
cgroups = [{json.dumps(self.env.cgroup("ls"))}]
{ls_extra}
[[classes]]
name = "BE"
cgroups = [{json.dumps(self.env.cgroup("be"))}]

[loops.be_suppress]
enabled = {"true" if enabled else "false"}
interval = {json.dumps(interval)}
{"" if 'rule = ' in extra else 'rule = "threshold"'}
threshold_percent = 65
policy = "cfs_quota"
{extra}""", name)

    def daemon_toml(self) -> str:
        """The [daemon] table of a kernel test's config: the host's cgroup root, this test's state_dir."""
        return f"""\
[daemon]
cgroup_root = ""
state_dir = {json.dumps(str(self.state_dir))}
log_level = "info"
"""

    def config_file(self, body: str, name: str = "koordd.toml") -> Path:
        """etc/<name> holding daemon_toml() and `body`. The config lives in a directory of its own: koordd
        watches that directory for edits."""
        path = self.tmp / "etc" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(self.daemon_toml() + body)
        return path

    def _env(self) -> dict:
        env = dict(os.environ)
        for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(k, None)      # never talk to a service manager from a test
        return env

    def start(self, config: Path, *args: str) -> subprocess.Popen:
        # Logs go elsewhere than the config's directory: koordd watches that one (and would see
        # every line it logs there as an event).
        log = self.tmp / "logs" / f"koordd-{len(self.logs)}.log"
        log.parent.mkdir(exist_ok=True)
        self.logs.append(log)
        with open(log, "w") as f:
            p = subprocess.Popen(koordd_command() + ["--config", str(config), *args], stdin=subprocess.DEVNULL,
                                 stdout=f, stderr=subprocess.STDOUT, env=self._env(),
                                 preexec_fn=lambda: die_with_parent(signal.SIGTERM))
        self.runs.append(p)
        return p

    def run_once(self, config: Path, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(koordd_command() + ["--config", str(config), "--once"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, env=self._env())

    def stop(self, p: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        p.send_signal(sig)
        return p.wait(timeout=timeout)

    def log_text(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-6000:]}" for p in self.logs if p.exists())

    # --- state files -------------------------------------------------------------

    def decisions(self) -> list[dict]:
        try:
            text = (self.state_dir / "decisions.jsonl").read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def held(self) -> list[dict] | None:
        """The restore journal's entries; None when koordd never wrote one."""
        got = read_held(self.state_dir)
        return got[0] if got else None

    def status(self) -> dict | None:
        try:
            return json.loads((self.state_dir / "status.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
