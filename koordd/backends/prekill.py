"""The prekill hook: a configured command run for a victim cgroup right before memory_evict kills it.

One knob, `cgroup.prekill`, a command (like `cgroup.kill`: never read, compared or restored). Its
target is the victim's cgroup path; its value says what to run, as canonical JSON
{"argv": [...], "timeout": seconds}, built by the loop from its options (memory_evict's
`prekill_command`, `prekill_timeout`): the loop stays pure, the process is started here, in the
backend layer, by the actuator, in the same round and just before the kill (the loop puts the hook's
action right before the kill's).

The command is run without a shell (argv as given), with the victim's cgroup path (relative to the
cgroup root) as its last argument and in KOORDD_CGROUP, its directory in the hierarchy koordd
walks in KOORDD_CGROUP_DIR, stdin from /dev/null. It gets `timeout` seconds; then its whole process
group is killed. A hook that fails (cannot start, exits non-zero, times out) is one refused decision
(one log line, with the end of its stderr) and nothing else: the kill that follows is a separate
action and goes ahead. Dry-run runs no hook. The actuator's guard refuses the hook where it refuses
the kill (an LS cgroup, one holding LS work, PID 1's or koordd's: koordd/act/protect.py).
"""
from __future__ import annotations

import errno
import json
import math
import os
import select
import signal
import subprocess
import time

from koordd.core.backend import Backend, BackendSet, InvalidValue, KnobSpec, TargetGone
from koordd.kernel.cgroupfs import CgroupFS

MAX_TIMEOUT = 60.0        # s: the round (every loop's) waits for the hook; memory pressure will not
STDERR_TAIL = 200         # characters of the hook's stderr in the decision
STDERR_KEEP = 4 * STDERR_TAIL   # bytes of it kept while it runs (room for multi-byte characters)
PRIVATE_ENV = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                         "LISTEN_FDNAMES"})


def hook_value(argv: tuple[str, ...] | list[str], timeout: float) -> str:
    """The canonical value of cgroup.prekill for `argv` and `timeout` (what a loop writes)."""
    return json.dumps({"argv": list(argv), "timeout": float(timeout)}, separators=(",", ":"), sort_keys=True)


def parse_hook(text: str) -> tuple[list[str], float]:
    try:
        d = json.loads(text)
    except ValueError as e:
        raise InvalidValue(f"cgroup.prekill must be JSON {{\"argv\": [...], \"timeout\": s}}: {e}") from None
    if not isinstance(d, dict) or set(d) != {"argv", "timeout"}:
        raise InvalidValue("cgroup.prekill must be an object with exactly argv and timeout")
    argv, timeout = d["argv"], d["timeout"]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise InvalidValue("cgroup.prekill argv must be a non-empty array of strings")
    if not os.path.isabs(argv[0]):
        # No PATH lookup: which program runs must not depend on koordd's environment.
        raise InvalidValue(f"cgroup.prekill argv[0] must be an absolute path, got {argv[0]!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
            or not 0 < timeout <= MAX_TIMEOUT:
        raise InvalidValue(f"cgroup.prekill timeout must be 0..{MAX_TIMEOUT:g} s, got {timeout!r}")
    return argv, float(timeout)


def _normalize(text: str) -> str:
    argv, timeout = parse_hook(text)
    return hook_value(argv, timeout)


class HookFailed(OSError):
    """The hook did not succeed; the message says how (the actuator records it as a refused decision)."""


class PrekillBackend(Backend):
    kind = "prekill"
    cgroup_targets = True       # the guard and the kubelet rule look at the victim
    knobs = {"cgroup.prekill": KnobSpec(
        "cgroup.prekill", "run a hook for the cgroup before it is killed: {\"argv\": [...], \"timeout\": s} "
                          "(memory_evict's prekill_command)", _normalize, oneshot=True)}

    def __init__(self, fs: CgroupFS):
        self.fs = fs

    def read(self, target: str, knob: str) -> str:
        raise InvalidValue("cgroup.prekill is a command: it has no value to read")

    def write(self, target: str, knob: str, value: str) -> None:
        argv, timeout = parse_hook(value)
        controller = self.fs.walk_controller()
        directory = self.fs.dir(controller, target)
        if directory is None or not directory.is_dir():
            raise TargetGone(target)                # killed or removed already: no hook for it
        # Not the service manager's sockets: the hook is not koordd and must not speak for it.
        env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
        env.update(KOORDD_CGROUP=target, KOORDD_CGROUP_DIR=str(directory))
        try:
            proc = subprocess.Popen([*argv, target], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=env, start_new_session=True, close_fds=True)
        except OSError as e:
            raise HookFailed(e.errno or errno.EIO, f"prekill hook {argv[0]} cannot start: {e.strerror or e}") from None
        try:
            err = _stderr_tail(proc, time.monotonic() + timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise HookFailed(errno.ETIMEDOUT, f"prekill hook {argv[0]} timed out after {timeout:g}s for {target}: "
                                              f"killed; the kill goes ahead") from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-STDERR_TAIL:]
            how = f"exited with status {proc.returncode}" if proc.returncode > 0 else \
                f"died of signal {-proc.returncode}"
            raise HookFailed(0, f"prekill hook {argv[0]} {how} for {target}; the kill goes ahead"
                                           + (f"; stderr: {tail}" if tail else ""))


def _stderr_tail(proc: subprocess.Popen, deadline: float) -> bytes:
    """Wait for the hook until `deadline` (monotonic), keeping only the end of its stderr: a hook that
    writes without end must not fill koordd's memory (communicate() would keep all of it).
    subprocess.TimeoutExpired when the deadline passes first."""
    kept = b""
    with proc.stderr:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            ready, _, _ = select.select([proc.stderr], [], [], left)
            if not ready:
                continue
            chunk = os.read(proc.stderr.fileno(), 1 << 16)
            if not chunk:
                break                           # stderr closed: the hook is ending (or closed it itself)
            kept = (kept + chunk)[-STDERR_KEEP:]
    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    return kept


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the hook and whatever it started (its own session), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:    # pragma: no cover - a process that survives SIGKILL (D state)
        pass


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends."""
    return [PrekillBackend(fs)]


BACKENDS = BackendSet((PrekillBackend,), backends)     # koordd/core/registry.py BUILTIN
