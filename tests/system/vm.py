"""Helpers for the system tests: the skip rule, systemctl/journalctl wrappers, cgroup reads.

TCG is slow and noisy: every wait here has a generous deadline, and CPU comparisons are ratios
measured within one run.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from koordtest.bench import common

CGROUP = Path("/sys/fs/cgroup")
UNIT = "koordd"
CONFIG = Path("/etc/koordd/koordd.toml")
SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "config" / "koordd.toml"
STATE_DIR = Path("/var/lib/koordd")
DROPIN_DIR = Path("/etc/systemd/system/koordd.service.d")
DROPIN = DROPIN_DIR / "test.conf"
BE, LS = "be.slice", "ls.slice"
MAX = "max 100000"          # an untouched cgroup's cpu.max


def _missing() -> list[str]:
    missing = []
    if os.environ.get("KOORDD_SYSTEM_TEST") != "1":
        missing.append("KOORDD_SYSTEM_TEST=1 is not set")
    if not os.path.isdir("/run/systemd/system"):
        missing.append("systemd is not PID 1")
    if not (CGROUP / "cgroup.controllers").is_file():
        missing.append("/sys/fs/cgroup is not a pure cgroup v2 hierarchy")
    if os.geteuid() != 0:
        missing.append("not root")
    return missing


SKIP_REASON = ("system tests run inside the VM of scripts/vmtest (koordd as a systemd service on a real "
               "cgroup-v2 kernel); here: " + "; ".join(_missing())) if _missing() else ""
# Every test module starts with `pytestmark = vm.only_in_vm`.
only_in_vm = pytest.mark.skipif(bool(SKIP_REASON), reason=SKIP_REASON)


# --- the guest kernel's build options ---------------------------------------------------------------------

def kernel_config(option: str) -> tuple[str | None, str]:
    """(OPTION's value in the running kernel's build config -- "y", "m", a string; "" where the config says
    "is not set" or has no line for it (a kernel too old for it); None where no config is readable --,
    what was read, quoted). Debian's and Ubuntu's kernels under scripts/vmtest keep the config in
    /usr/lib/modules/<release>/config."""
    import gzip
    release = os.uname().release
    for path in (Path(f"/usr/lib/modules/{release}/config"), Path(f"/boot/config-{release}"),
                 Path("/proc/config.gz")):
        try:
            data = path.read_bytes()
            text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(f"{option}="):
                return line.split("=", 1)[1].strip('"'), f"{path}: {line}"
            if line == f"# {option} is not set":
                return "", f"{path}: {line}"
        return "", f"{path}: no {option} line"
    return None, f"no build config for kernel {release} (/usr/lib/modules/{release}/config, /boot, /proc/config.gz)"


# --- commands ------------------------------------------------------------------------------------------

def sh(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}")
    return p


def systemctl(*args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
    return sh("systemctl", *args, check=check, timeout=timeout)


def show(prop: str, unit: str = UNIT) -> str:
    return sh("systemctl", "show", "-p", prop, "--value", unit).stdout.strip()


def is_active(unit: str = UNIT) -> str:
    return sh("systemctl", "is-active", unit, check=False).stdout.strip()


def main_pid() -> int:
    return int(show("MainPID") or 0)


def n_restarts() -> int:
    return int(show("NRestarts") or 0)


def wait_journal(predicate, timeout: float = 45):
    """wait_for for journal queries: journald lags under TCG, and each journalctl costs CPU (which
    koordd counts as LS/system usage), so poll slowly."""
    return wait_for(predicate, timeout, step=2.0)


def wait_for(predicate, timeout: float, step: float = 0.5):
    """predicate()'s first truthy value within `timeout` seconds, else None: koordtest's, polling every
    half second by default (each poll costs CPU under TCG)."""
    return common.wait_for(predicate, timeout, step)


def koordd_status() -> dict:
    """koordd's status file (<state_dir>/status.json), rewritten after every round; {} before the first."""
    try:
        return json.loads((STATE_DIR / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def koordd_pids() -> set[int]:
    """The processes of koordd.service, read from its cgroup: a file read, where `systemctl show`
    would cost CPU that koordd counts as system usage (and the tests measure it)."""
    try:
        return {int(p) for p in (CGROUP / "system.slice" / f"{UNIT}.service" / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def wait_ticks(loop: str, n: int, timeout: float = 240) -> None:
    """Wait until the running koordd has run `n` more rounds of `loop` (only files are read meanwhile).

    Settling is counted in koordd's own rounds, not seconds: under a slower emulator the wait gets
    longer and the test still sees what `n` rounds of the loop did."""
    def ticks() -> int | None:
        s = koordd_status()
        if s.get("pid") not in koordd_pids():
            return None              # no status from the running koordd yet (or a stale one)
        return s.get("loops", {}).get(loop, {}).get("ticks", 0)

    first = wait_for(lambda: (t := ticks()) is not None and (t,), timeout)    # (ticks,): 0 counts
    assert first, f"the running koordd wrote no status within {timeout}s: {koordd_status()}"
    assert wait_for(lambda: (ticks() or 0) >= first[0] + n, timeout), \
        f"koordd ran fewer than {n} rounds of {loop} in {timeout}s: {koordd_status()}"


def wait_tasks(cgroup: str, n: int, timeout: float = 60) -> None:
    """Wait until `cgroup` holds at least `n` processes (e.g. stress-ng and the workers it forks)."""
    def count() -> int:
        try:
            return len((CGROUP / cgroup / "cgroup.procs").read_text().split())
        except OSError:
            return 0
    assert wait_for(lambda: count() >= n, timeout), f"{cgroup} holds {count()} processes, not {n}"


def start_stress(unit: str, slice_: str, workers: int, *properties: str) -> None:
    """stress-ng with `workers` CPU workers as the transient service `unit` in `slice_`; returns once
    the workers are forked (stress-ng starts them after its own start)."""
    props = [f"--property={p}" for p in properties]
    sh("systemd-run", f"--slice={slice_}", f"--unit={unit}", *props, "stress-ng", "--cpu", str(workers), "--quiet")
    wait_tasks(f"{slice_}/{unit}.service", workers + 1)


def stop_units(*units: str) -> None:
    """Stopped and forgotten (no failed state left over), whether or not they ran."""
    for unit in units:
        systemctl("stop", unit, check=False)
        systemctl("reset-failed", unit, check=False)


def start_koordd_beside(*cgroups: str) -> None:
    """`systemctl start koordd` with `cgroups` (busy loads the test set up) frozen until it is up: under
    single-threaded TCG two busy loops leave koordd's start a third of one host CPU (70 s in CI). The
    loads then resume as koordd found them, so what it does to them is still what the test sees."""
    for cgroup in cgroups:
        (CGROUP / cgroup / "cgroup.freeze").write_text("1")
    try:
        systemctl("start", UNIT)
    finally:
        for cgroup in cgroups:
            (CGROUP / cgroup / "cgroup.freeze").write_text("0")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- journal -------------------------------------------------------------------------------------------

def journal_cursor() -> int:
    """Now, in the journal's clock (__REALTIME_TIMESTAMP, µs): later entries are read with journal(cursor).

    Not a journal cursor: journalctl 252's --after-cursor combined with matches (also -u) skips the
    first matching entry when the cursor's own entry does not match."""
    return time.time_ns() // 1000


def journal(cursor: int = 0, *matches: str, unit: str = UNIT) -> list[dict]:
    """Entries of `unit` (koordd's own and systemd's about it) after `cursor`, as journalctl -o json."""
    sh("journalctl", "--sync", check=False)
    args = ["journalctl", "-u", unit, "-o", "json", "--no-pager"]
    if cursor:
        args.append(f"--since=@{cursor // 1_000_000 - 1}")
    entries = []
    for line in sh(*args, *matches).stdout.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if int(e.get("__REALTIME_TIMESTAMP", 0)) > cursor:
            entries.append(e)
    return entries


def messages(entries: list[dict]) -> list[str]:
    out = []
    for e in entries:
        m = e.get("MESSAGE", "")
        if isinstance(m, list):        # journalctl's byte-array form for non-UTF-8 messages
            m = bytes(m).decode(errors="replace")
        out.append(m)
    return out


def journal_text(cursor: int = 0, unit: str = UNIT) -> str:
    return "\n".join(messages(journal(cursor, unit=unit)))


def decisions(cursor: int = 0, outcome: str | None = None, cgroup: str = BE) -> list[dict]:
    """be_suppress's cpu.max decisions on `cgroup` after `cursor`, from the journal."""
    matches = ["KOORDD_LOOP=be_suppress", f"KOORDD_CGROUP={cgroup}", "KOORDD_KNOB=cpu.max"]
    if outcome:
        matches.append(f"KOORDD_OUTCOME={outcome}")
    return journal(cursor, *matches)


# --- cgroups ---------------------------------------------------------------------------------------------

def cpu_max(cgroup: str = BE) -> str | None:
    try:
        return (CGROUP / cgroup / "cpu.max").read_text().strip()
    except OSError:
        return None


def knob(cgroup: str, name: str) -> str | None:
    """A cgroup file's value; None when it is not there."""
    try:
        return (CGROUP / cgroup / name).read_text().strip()
    except OSError:
        return None


def node_memory() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def quota(cgroup: str = BE) -> int | None:
    """cpu.max quota in µs, None for "max" or when the file is not there."""
    value = cpu_max(cgroup)
    if value is None or value.split()[0] == "max":
        return None
    return int(value.split()[0])


def usage_usec(cgroup: str) -> int:
    for line in (CGROUP / cgroup / "cpu.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value)
    raise AssertionError(f"no usage_usec in {cgroup}/cpu.stat")


def measure(seconds: float, *cgroups: str) -> dict[str, float]:
    """CPUs used by each cgroup over `seconds` (usage_usec deltas over wall time)."""
    t0, before = time.monotonic(), {c: usage_usec(c) for c in cgroups}
    time.sleep(seconds)
    t1, after = time.monotonic(), {c: usage_usec(c) for c in cgroups}
    return {c: (after[c] - before[c]) / 1e6 / (t1 - t0) for c in cgroups}


def held() -> list[dict]:
    """Entries of koordd's restore journal (<state_dir>/originals.jsonl), as koordd reads it."""
    from koordd.act.journal import read_held       # the installed koordd (/opt/koordd) runs these tests
    got = read_held(STATE_DIR)
    return got[0] if got else []


# --- koordd's configuration ------------------------------------------------------------------------------

# The start of most tests' configs: koordd's state where the unit keeps it, be.slice as BE, ls.slice as LS.
SLICES_CONFIG = f"""\
[daemon]
cgroup_root = ""
state_dir = "{STATE_DIR}"
log_level = "info"

[[classes]]
name = "BE"
cgroups = ["{BE}"]

[[classes]]
name = "LS"
cgroups = ["{LS}"]

"""


def write_config(text: str) -> None:
    """Replace the config the way editors do (write a temporary file, rename it over)."""
    tmp = CONFIG.with_name(".koordd.toml.test")
    tmp.write_text(text)
    os.replace(tmp, CONFIG)


def shipped_config() -> str:
    return SHIPPED_CONFIG.read_text()


def threshold_config() -> str:
    """The shipped config with be_suppress on koordlet's threshold rule and qos_baseline off: the
    tests of one loop's behaviour keep the other's knobs out of their measurements."""
    text = shipped_config()
    assert 'rule = "slack"' in text and "[loops.qos_baseline]\nenabled = true" in text
    return without_qos_baseline(text.replace('rule = "slack"', 'rule = "threshold"'))


def without_qos_baseline(text: str) -> str:
    assert "[loops.qos_baseline]\nenabled = true" in text
    return text.replace("[loops.qos_baseline]\nenabled = true", "[loops.qos_baseline]\nenabled = false")


# --- sched_ext ---------------------------------------------------------------------------------------------

SCHED_EXT = 7                   # the policy; Python's os module has no name for it
SCHED_EXT_DIR = "/sys/kernel/sched_ext"


def sched_ext_file(name: str) -> str:
    """A file of the kernel's sched_ext status (state, root/ops, enable_seq), "" where absent."""
    try:
        with open(f"{SCHED_EXT_DIR}/{name}") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def cpu_ticks(pid: int) -> int:
    """utime + stime of `pid`, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def pinned_busy_loop(unit: str, slice_: str, cpu: int, *properties: str) -> int:
    """A Python busy loop as the transient service `unit` in `slice_` (with systemd `properties`, such
    as "CPUWeight=300"), pinned to `cpu`; its pid."""
    sh("systemd-run", f"--slice={slice_}", f"--unit={unit}", *(f"--property={p}" for p in properties),
       "python3", "-c", "while True: pass")
    cgroup = f"{slice_}/{unit}.service"
    wait_tasks(cgroup, 1)
    pid = int((CGROUP / cgroup / "cgroup.procs").read_text().split()[0])
    os.sched_setaffinity(pid, {cpu})
    return pid
