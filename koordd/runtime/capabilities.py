"""What this host can do: one probe per kernel feature or library koordd may use.

Backs `koordctl doctor [--json]` and the daemon's start-up report. A probe never
raises: a missing feature is an unavailable `Capability` whose detail says why,
so callers degrade with one clear log line instead of failing later mid-loop.
Roots are injectable so tests can point every probe at a fake tree.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import socket
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, Collection

from koordd.backends.cgroup import KNOBS, kernel_lacks, unsupported_knobs
from koordd.kernel import perf
from koordd.kernel.cgroupfs import CgroupFS, Layout, LayoutError, detect_layout
from koordd.kernel.netlink import kernel_has_qdisc
from koordd.kernel.sched_ext import missing_reason, read_sched_ext
from koordd.sensors.lifecycle import start_sensor, stop_sensor
from koordd.sensors.registry import load_sensor_registry


@dataclass(frozen=True)
class Capability:
    name: str
    available: bool
    detail: str


@dataclass
class _Roots:
    cgroup: Path
    sys: Path
    proc: Path
    run: Path

    @cached_property
    def layout(self) -> Layout:
        # Shared by four probes; a LayoutError is not cached, so each of them reports it on its own.
        return detect_layout(self.cgroup)


# --- shared helpers ---------------------------------------------------------------------------------

def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _find_knob(root: Path, filename: str) -> Path | None:
    """`filename` in `root` or one level below: most cpu knobs exist only in non-root cgroups."""
    if (root / filename).is_file():
        return root / filename
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return None
    return next((c / filename for c in children if (c / filename).is_file()), None)


def _cpu_knob(layout: Layout, v2_file: str, v1_file: str, since: str) -> tuple[bool, str]:
    """Look for a cpu-controller knob in whichever hierarchy serves cpu (as CgroupFS does)."""
    if "cpu" in layout.v2_controllers and layout.unified is not None:
        root, filename = layout.unified, v2_file
        subtree = (_read(root / "cgroup.subtree_control") or "").split()
        if "cpu" not in subtree:
            # Without cpu in the root's subtree_control no cgroup has cpu.* files, whatever the kernel.
            return False, f"cpu not enabled in {root}/cgroup.subtree_control, so no cgroup has {v2_file}"
    elif "cpu" in layout.v1:
        root, filename = layout.v1["cpu"], v1_file
    else:
        return False, "no cpu controller in any hierarchy"
    found = _find_knob(root, filename)
    if found is not None:
        return True, f"found {found}"
    return False, f"no {filename} in {root} or its children (needs Linux {since})"


def _try_import(name: str):
    """(module, None) or (None, why): a missing optional library is a fact to report, not an error."""
    try:
        return importlib.import_module(name), None
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None, f"{name} not installed"
        return None, f"import {name}: {e}"
    except Exception as e:  # bcc raises OSError/Exception when libbcc is missing or broken
        return None, f"import {name}: {type(e).__name__}: {e}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


# --- probes -----------------------------------------------------------------------------------------

def _probe_cgroup(r: _Roots) -> tuple[bool, str]:
    try:
        return True, r.layout.describe()
    except LayoutError as e:
        return False, str(e)


def _probe_cpu_burst(r: _Roots) -> tuple[bool, str]:
    return _cpu_knob(r.layout, "cpu.max.burst", "cpu.cfs_burst_us", "5.14+")


def _probe_cpu_idle(r: _Roots) -> tuple[bool, str]:
    return _cpu_knob(r.layout, "cpu.idle", "cpu.idle", "5.15+")


def _probe_knobs(r: _Roots) -> tuple[bool, str]:
    """The knobs the cgroup layout offers whose files this kernel lacks (probed file by file)."""
    try:
        fs = CgroupFS(r.layout)
    except LayoutError as e:
        return False, str(e)
    missing = kernel_lacks(unsupported_knobs(fs), fs)
    offered = sorted(name for name, knob in KNOBS.items() if knob.supported(fs))
    if missing:
        return False, "; ".join(missing[name] for name in sorted(missing))
    return True, f"every knob the layout offers is there: {', '.join(offered)}"


def _probe_psi(r: _Roots) -> tuple[bool, str]:
    pressure = r.proc / "pressure"
    if not pressure.is_dir():
        return False, f"no {pressure}: kernel built without CONFIG_PSI or psi=0"
    readable = [res for res in ("cpu", "memory", "io") if _read(pressure / res) is not None]
    missing = sorted({"cpu", "memory", "io"} - set(readable))
    system = f"{pressure}: {','.join(readable) or 'none'} readable" + (f" ({','.join(missing)} not)" if missing else "")
    try:
        unified, why = r.layout.unified, "no v2 tree"
    except (LayoutError, OSError) as e:
        # A broken cgroup tree must not hide the system-wide PSI the memory loops rely on.
        unified, why = None, str(e)
    if unified is None:
        per_cg = f"per-cgroup: no ({why})"
    else:
        found = _find_knob(unified, "cpu.pressure")
        per_cg = f"per-cgroup: yes ({found})" if found else f"per-cgroup: no cpu.pressure in {unified}"
    return not missing, f"{system}; {per_cg}"


def _probe_perf(r: _Roots) -> tuple[bool, str]:
    """What the CPI sensor needs: counting a cgroup of the v2 tree on a CPU, software events first (does
    cgroup mode work at all?), then cycles and instructions (is there a PMU?). Available: both work."""
    try:
        v2_root, why = r.layout.unified, "no cgroup v2 tree"
    except (LayoutError, OSError) as e:
        v2_root, why = None, str(e)
    if v2_root is None:
        return False, f"cgroup-mode counting: no ({why}); hardware CPI: no"
    try:
        cpu = perf.online_cpus(r.sys)[0]
    except (OSError, ValueError, IndexError):
        cpu = 0
    paranoid = _read(r.proc / "sys/kernel/perf_event_paranoid")
    text = f"cgroup-mode counting (task-clock, context-switches on {v2_root}, CPU {cpu}): "
    software = perf.probe_cgroup_mode((perf.TASK_CLOCK, perf.CONTEXT_SWITCHES), v2_root, cpu)
    if software is not None:
        # Then the hardware events' errors would say nothing of the PMU (ENOENT also means "no such cgroup").
        return False, text + f"fails: {perf.explain(software, paranoid)}; hardware CPI: untested"
    hardware = perf.probe_cgroup_mode((perf.CYCLES, perf.INSTRUCTIONS), v2_root, cpu)
    hw_text = "available" if hardware is None else f"unavailable: {perf.explain(hardware, paranoid)}"
    return hardware is None, text + f"works; hardware CPI (cycles, instructions): {hw_text}"


_DISTRO_BCC = Path("/usr/lib/python3/dist-packages/bcc")


def _installed(name: str) -> str | None:
    """None when `name` can be imported, else why not, without importing it: bcc loads LLVM (some
    60 MB of RSS) and koordd probes at every start. Whether the program really loads is the
    run-queue sensor's to say (koordctl doctor's sensors line)."""
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):      # a None in sys.modules (tests) or a broken parent package
        found = False
    return None if found else f"{name} not installed"


def _probe_bpf(r: _Roots) -> tuple[bool, str]:
    why = _installed("bcc")
    if why and _DISTRO_BCC.is_dir():
        # python3-bpfcc installs for the distro interpreter only; a venv/pyenv python does not see it.
        why += f" for this python (a copy is in {_DISTRO_BCC.parent}: run with /usr/bin/python3 or a venv with --system-site-packages)"
    btf = r.sys / "kernel/btf/vmlinux"
    headers = Path("/lib/modules") / os.uname().release / "build"
    facts = [f"bcc: {why or 'installed'}", f"BTF {btf}: {_yes(btf.exists())}", f"headers {headers}: {_yes(headers.exists())}"]
    return why is None, "; ".join(facts)


def _probe_resctrl(r: _Roots) -> tuple[bool, str]:
    supported = "resctrl" in (_read(r.proc / "filesystems") or "").split()
    mount = r.sys / "fs/resctrl"
    if (mount / "info").is_dir():
        return True, f"mounted at {mount}"
    if supported:
        return False, f"kernel supports resctrl but it is not mounted (mount -t resctrl resctrl {mount})"
    return False, f"resctrl not in {r.proc}/filesystems (no RDT/CAT hardware or CONFIG_X86_CPU_RESCTRL off)"


def _probe_sched_ext(r: _Roots) -> tuple[bool, str]:
    status = read_sched_ext(r.sys)
    return (False, missing_reason(r.sys)) if status is None else (True, status.describe())


def _probe_netlink(r: _Roots) -> tuple[bool, str]:
    # Not imported: pyroute2 costs some 16 MB of RSS, paid only where a loop shapes traffic.
    why = _installed("pyroute2")
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE).close()
        raw = "a raw NETLINK_ROUTE socket opens"
    except OSError as e:
        return False, f"{why or 'pyroute2 installed'}; a raw NETLINK_ROUTE socket fails: {e}"
    fq = {True: "an fq qdisc for enforce = \"edt\"",
          False: "no fq qdisc (CONFIG_NET_SCH_FQ): net_shaping's enforce = \"edt\" is refused, htb works",
          None: "whether there is an fq qdisc (for edt) is in no module list or config"}[
        kernel_has_qdisc("sch_fq", root=r.proc.parent)]
    return (False, f"{why}; {raw}") if why else (True, f"pyroute2 installed; {raw}; {fq}")


def _probe_nvml(r: _Roots) -> tuple[bool, str]:
    pynvml, why = _try_import("pynvml")
    if pynvml is None:
        return False, why
    error = getattr(pynvml, "NVMLError", Exception)
    try:
        pynvml.nvmlInit()
    except error as e:
        return False, f"nvmlInit: {e}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    return count > 0, f"{count} GPU(s)"


def _probe_sensors(r: _Roots) -> tuple[bool, str]:
    """Each registered optional sensor (koordd's and third parties'), started and stopped again."""
    why, how = {}, {}
    for name, factory in sorted(load_sensor_registry().items()):
        sensor, why[name] = start_sensor(factory)
        if sensor is not None:
            how[name] = getattr(sensor, "detail", None)      # e.g. which source it started with
            stop_sensor(sensor)
    return all(w is None for w in why.values()), "; ".join(
        f"{n}: {w or 'starts'}" + (f" ({how[n]})" if how.get(n) else "") for n, w in why.items())


def _probe_journald(r: _Roots) -> tuple[bool, str]:
    sock = r.run / "systemd/journal/socket"
    _, why = _try_import("systemd.journal")
    return sock.exists() and why is None, f"{sock}: {_yes(sock.exists())}; python systemd.journal: {why or 'imports'}"


def _probe_systemd(r: _Roots) -> tuple[bool, str]:
    marker = r.run / "systemd/system"
    notify = os.environ.get("NOTIFY_SOCKET")
    detail = "systemd is PID 1" if marker.is_dir() else f"no {marker}: systemd is not PID 1"
    return marker.is_dir(), detail + (f"; NOTIFY_SOCKET={notify}" if notify else "; NOTIFY_SOCKET not set")


PROBES: list[tuple[str, Callable[[_Roots], tuple[bool, str]]]] = [
    ("cgroup", _probe_cgroup),
    ("cpu.max.burst", _probe_cpu_burst),
    ("cpu.idle", _probe_cpu_idle),
    ("knobs", _probe_knobs),
    ("psi", _probe_psi),
    ("perf", _probe_perf),
    ("bpf", _probe_bpf),
    ("resctrl", _probe_resctrl),
    ("sched_ext", _probe_sched_ext),
    ("netlink", _probe_netlink),
    ("nvml", _probe_nvml),
    ("sensors", _probe_sensors),
    ("journald", _probe_journald),
    ("systemd", _probe_systemd),
]


def probe_all(cgroup_root: Path | str = "/sys/fs/cgroup", sys_root: Path | str = "/sys",
              proc_root: Path | str = "/proc", run_root: Path | str = "/run",
              skip: Collection[str] = ()) -> list[Capability]:
    """Run every probe but those in `skip`; one that raises becomes an unavailable Capability carrying
    the exception."""
    roots = _Roots(Path(cgroup_root), Path(sys_root), Path(proc_root), Path(run_root))
    caps = []
    for name, probe in PROBES:
        if name in skip:
            continue
        try:
            available, detail = probe(roots)
        except Exception as e:
            available, detail = False, f"probe failed: {type(e).__name__}: {e}"
        caps.append(Capability(name, available, detail))
    return caps


def format_report(caps: list[Capability]) -> str:
    width = max((len(c.name) for c in caps), default=0)
    return "\n".join(f"{c.name:<{width}}  {_yes(c.available):<3}  {c.detail}" for c in caps)


def report_json(caps: list[Capability]) -> str:
    return json.dumps([asdict(c) for c in caps], indent=2)
