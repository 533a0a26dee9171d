"""Fake cgroup trees in a temp dir, holding the kernel's literal file text.

    tree = FakeCgroups(tmp_path, "v2")            # or "v1", "hybrid", "v1-comount"
    tree.add("be.slice/job", usage_us=5_000_000, nr_throttled=3)
    tree.set("be.slice", "cpu", "cpu.max", "50000 100000\\n")
    tree.read("be.slice", "cpu", "cpu.max")
    tree.fs                                       # a CgroupFS over the detected layout

Layouts, as mounted on real hosts:
  v2          one tree at the root (cgroup.controllers = "cpuset cpu io memory pids").
  v1          one hierarchy per controller: cpu/ cpuacct/ cpuset/ memory/ (plus systemd/).
  hybrid      v1 plus unified/, a v2 tree with no CPU or memory controller ("hugetlb" only) that
              still has per-cgroup cpu.stat (usage_usec) and *.pressure files.
  v1-comount  v1 with cpu and cpuacct co-mounted in cpu,cpuacct/ and cpu, cpuacct symlinks to it.

`controller` None names the v2 tree (the root on v2, unified/ on hybrid). The fake cannot
enforce kernel rules: a write simply lands, exactly as written.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from koordd.core.class_rules import ClassRule
from koordd.kernel.cgroupfs import CgroupFS, detect_layout

LAYOUTS = ("v2", "v1", "hybrid", "v1-comount")
V2_CONTROLLERS = "cpuset cpu io memory pids"
V1_UNLIMITED = "9223372036854771712"
V1_HIERARCHIES = ("cpu", "cpuacct", "cpuset", "memory", "freezer", "systemd")


def psi(some_total: int = 0, full_total: int | None = 0, avg10: float = 0.0, avg60: float = 0.0,
        avg300: float = 0.0) -> str:
    """A *.pressure file; full_total None leaves out the "full" line (system cpu before 5.13)."""
    text = f"some avg10={avg10:.2f} avg60={avg60:.2f} avg300={avg300:.2f} total={some_total}\n"
    if full_total is not None:
        text += f"full avg10=0.00 avg60=0.00 avg300=0.00 total={full_total}\n"
    return text


def rules(classes: dict[str, str]) -> tuple[ClassRule, ...]:
    """Class rules of {pattern: class}, one rule per pattern, in order: what Sensors matches a tree against."""
    return tuple(ClassRule(cls, (pattern,)) for pattern, cls in classes.items())


class FakeCgroups:
    def __init__(self, base: Path, mode: str = "v2", cpus: str = "0-7", memory: bool = True):
        if mode not in LAYOUTS:
            raise ValueError(f"unknown layout {mode!r}")
        self.root = Path(base) / "cgroup"
        self.mode, self.cpus, self.memory = mode, cpus, memory
        self.root.mkdir(parents=True)
        if mode == "v2":
            self._make_v2_root(self.root, V2_CONTROLLERS if memory else "cpuset cpu io pids")
        else:
            self._make_v1_roots()
            if mode == "hybrid":
                self._make_v2_root(self.root / "unified", "hugetlb")

    # --- where things are ------------------------------------------------------

    @property
    def layout(self):
        return detect_layout(self.root)

    @property
    def fs(self) -> CgroupFS:
        return CgroupFS(self.layout)

    @property
    def v1(self) -> bool:
        return self.mode != "v2"

    def hierarchies(self) -> list[Path]:
        """Every real directory a cgroup has to exist in (a co-mount's links are not extra ones)."""
        if self.mode == "v2":
            return [self.root]
        out = [self.root / h for h in self._v1_dirs()]
        return out + [self.root / "unified"] if self.mode == "hybrid" else out

    def dir(self, cgroup: str, controller: str | None) -> Path:
        if self.mode == "v2":
            base = self.root
        elif controller is not None:
            base = self.root / controller
        elif self.mode == "hybrid":
            base = self.root / "unified"
        else:
            raise ValueError("a pure v1 layout has no v2 tree")
        return base / cgroup if cgroup else base

    def set(self, cgroup: str, controller: str | None, filename: str, text: str) -> None:
        (self.dir(cgroup, controller) / filename).write_text(text)

    def read(self, cgroup: str, controller: str | None, filename: str) -> str:
        return (self.dir(cgroup, controller) / filename).read_text()

    # --- building --------------------------------------------------------------

    def add(self, cgroup: str, *, usage_us: int = 0, nr_periods: int = 0, nr_throttled: int = 0,
            throttled_us: int = 0, memory_current: int = 0, memory_anon: int | None = None,
            cpuset: str | None = None) -> "FakeCgroups":
        """Create `cgroup` (and missing parents) in every hierarchy with the kernel's defaults."""
        parts = cgroup.split("/")
        for i in range(1, len(parts) + 1):
            cg = "/".join(parts[:i])
            if not (self.hierarchies()[0] / cg).is_dir():
                self._make_cgroup(cg)
        self.stat(cgroup, usage_us=usage_us, nr_periods=nr_periods, nr_throttled=nr_throttled,
                  throttled_us=throttled_us, memory_current=memory_current, memory_anon=memory_anon)
        if cpuset is not None:
            self.set(cgroup, "cpuset", "cpuset.cpus", cpuset + "\n")
        return self

    def stat(self, cgroup: str, *, usage_us: int = 0, nr_periods: int = 0, nr_throttled: int = 0,
             throttled_us: int = 0, memory_current: int = 0, memory_anon: int | None = None) -> None:
        """Rewrite the counters: cpu.stat (and v1 cpuacct.usage), memory usage (anon defaults to all of it)."""
        anon = memory_current if memory_anon is None else memory_anon
        if self.mode == "v2":
            self.set(cgroup, "cpu", "cpu.stat", _v2_cpu_stat(usage_us, nr_periods, nr_throttled, throttled_us))
            if self.memory:
                self.set(cgroup, "memory", "memory.current", f"{memory_current}\n")
                self.set(cgroup, "memory", "memory.stat", _v2_memory_stat(anon, memory_current - anon) + "\n")
            return
        self.set(cgroup, "cpu", "cpu.stat", _v1_cpu_stat(nr_periods, nr_throttled, throttled_us) + "\n")
        self.set(cgroup, "cpuacct", "cpuacct.usage", f"{usage_us * 1000}\n")
        if self.memory:
            self.set(cgroup, "memory", "memory.usage_in_bytes", f"{memory_current}\n")
            self.set(cgroup, "memory", "memory.stat", _v1_memory_stat(anon, memory_current - anon) + "\n")
        if self.mode == "hybrid":   # the v2 tree keeps core stats even without the cpu controller
            self.set(cgroup, None, "cpu.stat", f"usage_usec {usage_us}\nuser_usec {usage_us // 2}\n"
                                               f"system_usec {usage_us - usage_us // 2}\nnice_usec 0\n")

    def remove(self, cgroup: str) -> None:
        """The cgroup vanished (rmdir in every hierarchy)."""
        for h in self.hierarchies():
            shutil.rmtree(h / cgroup, ignore_errors=True)

    def _v1_dirs(self) -> tuple[str, ...]:
        dirs = ("cpu,cpuacct", "cpuset", "memory", "freezer", "systemd") if self.mode == "v1-comount" \
            else V1_HIERARCHIES
        return tuple(d for d in dirs if self.memory or d != "memory")

    def _make_v2_root(self, root: Path, controllers: str) -> None:
        root.mkdir(exist_ok=True)
        files = {"cgroup.controllers": controllers, "cgroup.subtree_control": "", "cgroup.procs": "1",
                 "cpu.stat": _v2_cpu_stat(0, 0, 0, 0)}
        if "cpuset" in controllers.split():
            files.update({"cpuset.cpus.effective": self.cpus, "cpuset.mems.effective": "0"})
        for res in ("cpu", "memory", "io"):
            files[f"{res}.pressure"] = psi().rstrip("\n")
        _write_all(root, files)

    def _make_v1_roots(self) -> None:
        for d in self._v1_dirs():
            (self.root / d).mkdir()
            _write_all(self.root / d, {"cgroup.procs": "1", "tasks": "1"})
        if self.mode == "v1-comount":
            (self.root / "cpu").symlink_to("cpu,cpuacct")
            (self.root / "cpuacct").symlink_to("cpu,cpuacct")
        _write_all(self.root / "cpu", _v1_cpu_files())
        _write_all(self.root / "cpuacct", {"cpuacct.usage": "0"})
        _write_all(self.root / "cpuset", {"cpuset.cpus": self.cpus, "cpuset.mems": "0",
                                          "cpuset.effective_cpus": self.cpus})
        if self.memory:
            _write_all(self.root / "memory", {"memory.usage_in_bytes": "0", "memory.limit_in_bytes": V1_UNLIMITED})

    def _make_cgroup(self, cg: str) -> None:
        parent = cg.rpartition("/")[0]
        if self.mode == "v2":
            d = self.root / cg
            d.mkdir()
            self.set(parent, None, "cgroup.subtree_control", V2_CONTROLLERS + "\n")
            inherited = self.read(parent, "cpuset", "cpuset.cpus.effective")
            files = {"cgroup.controllers": V2_CONTROLLERS, "cgroup.subtree_control": "", "cgroup.procs": "",
                     "cgroup.events": "populated 0\nfrozen 0", "cpu.max": "max 100000", "cpu.max.burst": "0",
                     "cpu.weight": "100", "cpu.idle": "0", "cpuset.cpus": "", "cpuset.mems": "",
                     "cpuset.cpus.effective": inherited.strip(), "cpuset.mems.effective": "0",
                     "memory.current": "0", "memory.max": "max", "memory.high": "max", "memory.low": "0",
                     "memory.min": "0", "memory.reclaim": "", "memory.swap.max": "max", "memory.stat": _v2_memory_stat(0),
                     "cgroup.freeze": "0", "cgroup.kill": ""}
            if not self.memory:
                files = {k: v for k, v in files.items() if not k.startswith("memory.")}
            for res in ("cpu", "memory", "io"):
                files[f"{res}.pressure"] = psi().rstrip("\n")
            _write_all(d, files)
            return
        for h in self._v1_dirs():
            (self.root / h / cg).mkdir()
            _write_all(self.root / h / cg, {"cgroup.procs": "", "tasks": ""})
        _write_all(self.dir(cg, "cpu"), _v1_cpu_files())
        _write_all(self.dir(cg, "cpuacct"), {"cpuacct.usage": "0"})
        # A new v1 cpuset starts empty ("\n"); systemd/kubelet copy the parent's CPUs in before use, as here.
        parent_cpus = self.read(parent, "cpuset", "cpuset.cpus").strip()
        _write_all(self.dir(cg, "cpuset"), {"cpuset.cpus": parent_cpus, "cpuset.mems": "0",
                                            "cpuset.effective_cpus": parent_cpus})
        if self.memory:
            _write_all(self.dir(cg, "memory"), {"memory.usage_in_bytes": "0",
                                                "memory.limit_in_bytes": V1_UNLIMITED,
                                                "memory.stat": _v1_memory_stat(0)})
        _write_all(self.dir(cg, "freezer"), {"freezer.state": "THAWED"})
        if self.mode == "hybrid":
            d = self.root / "unified" / cg
            d.mkdir()
            files = {"cgroup.controllers": "", "cgroup.subtree_control": "", "cgroup.procs": "",
                     "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnice_usec 0"}
            for res in ("cpu", "memory", "io"):
                files[f"{res}.pressure"] = psi().rstrip("\n")
            _write_all(d, files)


def _v2_cpu_stat(usage_us: int, nr_periods: int, nr_throttled: int, throttled_us: int) -> str:
    return (f"usage_usec {usage_us}\nuser_usec {usage_us // 2}\nsystem_usec {usage_us - usage_us // 2}\n"
            f"nice_usec 0\nnr_periods {nr_periods}\nnr_throttled {nr_throttled}\nthrottled_usec {throttled_us}\n"
            f"nr_bursts 0\nburst_usec 0\n")


def _v1_cpu_stat(nr_periods: int, nr_throttled: int, throttled_us: int) -> str:
    return (f"nr_periods {nr_periods}\nnr_throttled {nr_throttled}\nthrottled_time {throttled_us * 1000}\n"
            f"nr_bursts 0\nburst_time 0")


def _v2_memory_stat(anon: int, file: int = 0) -> str:
    return (f"anon {anon}\nfile {file}\nkernel 0\nshmem 0\nunevictable 0\ninactive_anon 0\nactive_anon {anon}\n"
            "workingset_refault_anon 0\nworkingset_refault_file 0")


def _v1_memory_stat(rss: int, cache: int = 0) -> str:
    return (f"cache {cache}\nrss {rss}\nunevictable 0\ntotal_cache {cache}\ntotal_rss {rss}\n"
            f"total_unevictable 0")


def _v1_cpu_files() -> dict[str, str]:
    return {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000", "cpu.cfs_burst_us": "0",
            "cpu.shares": "1024", "cpu.idle": "0", "cpu.stat": _v1_cpu_stat(0, 0, 0)}


def _write_all(d: Path, files: dict[str, str]) -> None:
    """Kernel files end in a newline (an empty one is a lone newline, like cpuset.cpus)."""
    for name, text in files.items():
        (d / name).write_text(text + "\n")


# The daemon on a fake tree (FakeCgroups): LS in ls.slice, BE in be.slice, be_suppress's rule slack each second.
# Formatted with the tree's root and a state_dir; a test adds its own be_suppress options below it.
SLACK_TREE_CONFIG = """
[daemon]
cgroup_root = "{root}"
state_dir = "{state}"
[[classes]]
name = "LS"
cgroups = ["ls.slice"]
[[classes]]
name = "BE"
cgroups = ["be.slice"]
[loops.be_suppress]
enabled = true
interval = "1s"
rule = "slack"
"""


def steady_node(monkeypatch, cores: float) -> None:
    """The node's CPU in use reads as `cores` every round. A daemon on a fake tree still reads the host's
    /proc/stat, whose counters move once a jiffy: two rounds a few milliseconds apart (a test's clock moves
    a second, the host's did not) see no tick, the node reads as blind, and a loop that needs it holds. Steal
    reads as none, whatever the host's hypervisor did meanwhile."""
    from koordd.sensors.node import NodeSensor
    monkeypatch.setattr(NodeSensor, "_cpu_used", lambda self, stat: cores)
    monkeypatch.setattr(NodeSensor, "_steal_worst", lambda self, stat: 0.0)     # nor the host's hypervisor
