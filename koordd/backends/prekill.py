"""The prekill hook: a configured command run for a victim cgroup right before memory_evict kills it.

One knob, `cgroup.prekill`, a command (like `cgroup.kill`: never read, compared or restored). Its
target is the victim's cgroup path; its value says what to run, as canonical JSON
{"argv": [...], "timeout": seconds}, built by the loop from its options (memory_evict's
`prekill_command`, `prekill_timeout`): the loop stays pure, the process is started here, in the
backend layer, by the actuator (the loop puts the hook's action right before the kill's).

The hook runs beside the round, never in it (KnobSpec.beside): the actuator start()s it and goes on;
a thread of its own (Hook) watches it, and the actuator holds the kill (and whatever else the loop
asked of that victim in that round) back until the hook is done or the eviction's budget ran out,
then makes the kill on the main thread, through the same checks as any write. Every hook started
in one round by the loop shares one budget, `timeout` from the first one's start (at most
MAX_TIMEOUT). A stop (or the loop disabled) cancels the hooks still running: their process groups
are killed, and the kills that were to follow them are not made.

The command is run without a shell (argv as given), with the victim's cgroup path (relative to the
cgroup root) as its last argument and in KOORDD_CGROUP, its directory in the hierarchy koordd
walks in KOORDD_CGROUP_DIR, stdin from /dev/null. When the budget runs out its whole process
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
import threading
import time
from typing import Callable

from koordd.core.backend import Backend, BackendSet, Harm, InvalidValue, Job, KnobSpec, TargetGone
from koordd.kernel.cgroupfs import CgroupFS

# s: the most a hook may take. Memory pressure does not wait long for an eviction, and memory_evict counts
# a victim's memory as freed for 15 s from its decision (KILL_SETTLE): the kill must land inside that.
# Well under half of systemd's WatchdogSec=30s (systemd/koordd.service) too, though a hook never holds
# up a round now: the actuator only starts it, and its thread waits for it.
MAX_TIMEOUT = 10.0
KILL_WAIT = 5.0           # s to reap a hook after SIGKILL (one in D state is left behind)
REAP_POLL = 0.05          # s between looks at a hook that closed its stderr but runs on
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


class _Cancelled(Exception):
    pass


class Hook(Job):
    """One hook process, watched by a thread of its own (begin()): it keeps the end of the hook's stderr,
    kills the hook's process group at the deadline or on cancel(), and reaps it. That thread is the only
    one that touches the process (no kill can land on a reaped, reused pid)."""

    def __init__(self, proc: subprocess.Popen, argv: list[str], target: str, timeout: float):
        self.proc, self.argv, self.target, self.timeout = proc, argv, target, timeout
        self.started = time.monotonic()
        self._error: HookFailed | None = None
        self._why = ""
        self._done = threading.Event()
        self._cancel_r, self._cancel_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def begin(self, deadline: float, woken: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=self._watch, args=(deadline, woken), daemon=True,
                                        name=f"koordd-prekill-{self.proc.pid}")
        self._thread.start()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> None:
        if self._error is not None:
            raise self._error

    def cancel(self, why: str) -> None:
        if self._done.is_set():
            return
        self._why = why
        with self._lock:                            # not once the watcher closed the pipe (a reused fd)
            if self._cancel_w >= 0:
                try:
                    os.write(self._cancel_w, b"!")
                except BlockingIOError:
                    pass
        if self._thread is None:                    # never begun: end it here, nobody else touches it
            self._watch(time.monotonic(), lambda: None)
        else:
            self._thread.join(KILL_WAIT + 1)

    def _watch(self, deadline: float, woken: Callable[[], None]) -> None:
        argv0, target, timeout = self.argv[0], self.target, self.timeout
        try:
            try:
                err = _stderr_tail(self.proc, deadline, self._cancel_r)
            except subprocess.TimeoutExpired:
                _kill_group(self.proc)
                ran = max(0.0, min(timeout, deadline - self.started))
                self._error = HookFailed(errno.ETIMEDOUT, f"prekill hook {argv0} timed out after {ran:.3g}s for "
                                                          f"{target}: killed; the kill goes ahead")
                return
            except _Cancelled:
                _kill_group(self.proc)
                self._error = HookFailed(errno.ECANCELED, f"prekill hook {argv0} for {target} ended: {self._why}")
                return
            if self.proc.returncode != 0:
                tail = err.decode(errors="replace").strip()[-STDERR_TAIL:]
                how = f"exited with status {self.proc.returncode}" if self.proc.returncode > 0 else \
                    f"died of signal {-self.proc.returncode}"
                self._error = HookFailed(0, f"prekill hook {argv0} {how} for {target}; the kill goes ahead"
                                            + (f"; stderr: {tail}" if tail else ""))
        except Exception as e:  # noqa: BLE001 - the watcher must always say it is done
            _kill_group(self.proc)
            self._error = HookFailed(errno.EIO, f"prekill hook {argv0} for {target}: watching it failed: {e}")
        finally:
            with self._lock:
                for fd in (self._cancel_r, self._cancel_w):
                    os.close(fd)
                self._cancel_r = self._cancel_w = -1
            self._done.set()
            woken()


class PrekillBackend(Backend):
    kind = "prekill"
    cgroup_targets = True       # the guard and the kubelet rule look at the victim
    knobs = {"cgroup.prekill": KnobSpec(
        "cgroup.prekill", "run a hook for the cgroup before it is killed: {\"argv\": [...], \"timeout\": s} "
                          "(memory_evict's prekill_command)", _normalize, oneshot=True, beside=True,
        harm=Harm("run the prekill hook of"))}      # the prelude to a kill (memory_evict)

    def __init__(self, fs: CgroupFS):
        self.fs = fs

    def read(self, target: str, knob: str) -> str:
        raise InvalidValue("cgroup.prekill is a command: it has no value to read")

    def write(self, target: str, knob: str, value: str) -> None:
        """Run the hook to its end (not in koordd's rounds: the actuator start()s it; tools and tests)."""
        hook = self.start(target, knob, value)
        hook.begin(time.monotonic() + hook.timeout, lambda: None)
        hook._thread.join()
        hook.result()

    def start(self, target: str, knob: str, value: str) -> Hook:
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
        return Hook(proc, argv, target, timeout)


def _stderr_tail(proc: subprocess.Popen, deadline: float, cancel: int = -1) -> bytes:
    """Wait for the hook until `deadline` (monotonic), keeping only the end of its stderr: a hook that
    writes without end must not fill koordd's memory (communicate() would keep all of it).
    subprocess.TimeoutExpired when the deadline passes first; _Cancelled once `cancel` (a pipe's read end)
    is readable."""
    kept = b""
    watched = [proc.stderr] + ([cancel] if cancel >= 0 else [])
    with proc.stderr:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select(watched, [], [], max(left, 0.0))
            if cancel in ready:
                raise _Cancelled()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            if not ready:
                continue
            chunk = os.read(proc.stderr.fileno(), 1 << 16)
            if not chunk:
                break                           # stderr closed: the hook is ending (or closed it itself)
            kept = (kept + chunk)[-STDERR_KEEP:]
    # A hook that closed its stderr and runs on: looked at every REAP_POLL s, so a cancel is seen.
    while proc.poll() is None:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([cancel] if cancel >= 0 else [], [], [], min(max(left, 0.0), REAP_POLL))
        if ready:
            raise _Cancelled()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, 0)
    return kept


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the hook and whatever it started (its own session), and reap it. Only while the hook is not
    reaped: its pid (the group's id) cannot have been reused."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.communicate(timeout=KILL_WAIT)
    except (subprocess.TimeoutExpired, ValueError):    # pragma: no cover - a process that survives SIGKILL (D state)
        pass


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends."""
    return [PrekillBackend(fs)]


BACKENDS = BackendSet((PrekillBackend,), backends)     # koordd/core/catalogue.py BUILTIN
