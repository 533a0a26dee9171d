"""koordctl demo: LS and BE on the same CPUs, without and with koordd, watched live and plotted.

Three phases of equal length, one run:
  1. LS alone: an LS cgroup whose CPU demand follows a sine wave (koordctl/demo/load.py) gets what it asks.
  2. no control: a BE cgroup with a busy loop on every CPU joins; LS no longer gets what it asks.
  3. koordd on: koordd runs (a subprocess on a temporary config) and manages BE with the chosen loops.

Everything it makes is its own: cgroups koordd-demo-<pid>/ls and /be in every hierarchy the host has
for CPU (v1 cpu and cpuacct plus the unified tree on hybrid hosts; the v2 tree on pure v2), worker
processes that join them before exec, and a temporary directory with koordd's config, state and log.
koordd classifies only those two cgroups and keeps its state in that directory, so a koordd service on
the host is not disturbed. All of it is removed at the end, after Ctrl-C, SIGTERM or SIGHUP, and after
an error: koordd first (SIGTERM: it restores BE's knobs), then the workers, then the cgroups.
Should the demo itself be SIGKILLed, its workers and koordd follow (parent-death signals); only the
empty cgroups stay.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, TextIO

from koordctl.common import CtlError
from koordctl.demo import Settings
from koordctl.demo.cgroups import DemoCgroups, DemoError, hierarchy_roots, joiner
from koordctl.demo.load import BE_LOOP, mean_demand
from koordctl.demo.view import LinePrinter, LiveView, PHASES, Sample, frame, plot, summarize, summary_lines
from koordctl.running import host_owner
from koordd.kernel.cgroupfs import DEFAULT_ROOT, Layout, LayoutError, detect_layout
from koordd.sensors.node import parse_proc_stat_cpu

SAMPLE = 0.5                     # seconds per sample: the live view's refresh and the plot's resolution
WORKER_START = 1.0               # seconds from spawning the LS workers to their start: time to start Python
STOP_TIMEOUT = 15.0              # koordd restores its knobs on SIGTERM; after this it gets SIGKILL


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: handled as Ctrl-C is."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# --- koordd ---------------------------------------------------------------------------------------------

LS_RUNQ_P99_MS = 10              # the demo LS's health target: a tenth of its slot (load.SLOT)

def koordd_config(cgroups: DemoCgroups, state_dir: Path, loops: tuple[str, ...]) -> str:
    """koordd's config for the demo: only the demo's two cgroups classified, the chosen loops on with the
    shipped defaults, its own state_dir."""
    lines = ["# koordctl demo: koordd for the demo's own cgroups only, with a state_dir of its own.",
             "[daemon]", f"cgroup_root = {json.dumps(str(cgroups.layout.root))}",
             f"state_dir = {json.dumps(str(state_dir))}", 'log_level = "info"', ""]
    for cls, child in (("LS", "ls"), ("BE", "be")):
        lines += ["[[classes]]", f'name = "{cls}"', f"cgroups = [{json.dumps(cgroups.path(child))}]", ""]
        if cls == "LS":
            # LS's unit of work is a 100 ms slot: a wait of a few ms costs it nothing, and the 2 ms
            # default (a server answering in µs) would hold BE back for waits that do not matter.
            lines += ["[classes.health]", f'runq_p99 = "{LS_RUNQ_P99_MS:g}ms"', ""]
    for loop in loops:
        lines += [f"[loops.{loop}]", "enabled = true", ""]
    return "\n".join(lines)


def koordd_command(config: Path) -> list[str]:
    """This Python's koordd (the venv's or the installed one), not whichever is first on PATH."""
    return [sys.executable, "-m", "koordd.runtime.daemon", "--config", str(config)]


@dataclass
class Demo:
    """One run: its cgroups, workers, koordd and temporary directory, and the samples taken."""
    layout: Layout
    settings: Settings
    cpus: list[int]
    name: str = field(default_factory=lambda: f"koordd-demo-{os.getpid()}")
    samples: list[Sample] = field(default_factory=list)
    workers: list[subprocess.Popen] = field(default_factory=list)
    koordd: subprocess.Popen | None = None
    tmp: Path | None = None

    def __post_init__(self):
        self.cgroups = DemoCgroups(self.layout, self.name)

    @property
    def state_dir(self) -> Path:
        return self.tmp / "state"

    @property
    def log_path(self) -> Path:
        return self.tmp / "koordd.log"

    # --- set-up and the phases ------------------------------------------------------------------------

    def play(self, show: Callable[["Demo", Sample], None]) -> None:
        """Create everything, run the three phases, call show() with every sample."""
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        self.cgroups.create()
        # The workers start a little later than they are spawned: Python's own start-up is not LS's demand.
        start = time.monotonic() + WORKER_START
        for cpu in self.cpus:
            self._spawn("ls", [sys.executable, "-m", "koordctl.demo.load", "--start", repr(start),
                               "--period", repr(self.settings.period), "--low", repr(self.settings.low),
                               "--high", repr(self.settings.high)], cpu)
        time.sleep(max(0.0, start - time.monotonic()))
        steps = round(self.settings.phase / SAMPLE)
        last = self._counters()
        for n in range(len(PHASES) * steps):
            phase = n // steps
            if n == steps:
                for cpu in self.cpus:
                    self._spawn("be", BE_LOOP, cpu)
            elif n == 2 * steps:
                self._start_koordd()
            time.sleep(max(0.0, start + (n + 1) * SAMPLE - time.monotonic()))
            if self.koordd is not None and self.koordd.poll() is not None:
                raise DemoError(f"koordd exited with status {self.koordd.returncode}:\n{self.koordd_log()}")
            now = self._counters()
            self.samples.append(self._sample(start, last, now, phase))
            show(self, self.samples[-1])
            last = now

    def _spawn(self, child: str, argv: list[str], cpu: int) -> None:
        # A session of its own: Ctrl-C reaches the demo only, which then stops things in order.
        self.workers.append(subprocess.Popen(
            argv, preexec_fn=joiner(self.cgroups.procs_files(child), cpu, signal.SIGKILL),
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, close_fds=True))

    def _start_koordd(self) -> None:
        config = self.tmp / "etc" / "koordd.toml"       # a directory of its own: koordd watches it
        config.parent.mkdir()
        config.write_text(koordd_config(self.cgroups, self.state_dir, self.settings.loops))
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        with open(self.log_path, "w") as log:
            self.koordd = subprocess.Popen(
                koordd_command(config), preexec_fn=joiner([], None, signal.SIGTERM), start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, close_fds=True)

    def _counters(self) -> tuple[float, int, int, tuple[int, int]]:
        with open("/proc/stat") as f:
            node = parse_proc_stat_cpu(f.read())
        return time.monotonic(), self.cgroups.usage_ns("ls"), self.cgroups.usage_ns("be"), node

    def _sample(self, start: float, last: tuple, now: tuple, phase: int) -> Sample:
        (t0, ls0, be0, node0), (t1, ls1, be1, node1) = last, now
        dt = max(t1 - t0, 1e-6)
        ls, be = (ls1 - ls0) / 1e9 / dt, (be1 - be0) / 1e9 / dt
        busy = os.sysconf("SC_NPROCESSORS_ONLN") * (node1[0] - node0[0]) / max(node1[1] - node0[1], 1)
        s = self.settings
        asked = mean_demand(t0 - start, t1 - start, s.period, s.low, s.high) * len(self.cpus)
        quota, idle = self.cgroups.be_limits()
        return Sample(t=t1 - start, dt=dt, phase=phase, ls_asked=asked, ls_used=ls, be_used=be,
                      other=max(busy - ls - be, 0.0), be_quota=quota, be_idle=idle)

    # --- koordd's side -----------------------------------------------------------------------------------

    def koordd_status(self) -> dict | None:
        try:
            status = json.loads((self.state_dir / "status.json").read_text())
        except (OSError, ValueError):
            return None
        return status if isinstance(status, dict) else None

    def koordd_log(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def koordd_changes(self) -> Counter:
        """How often koordd wrote each (loop, knob), from its decision log: what it did during the demo."""
        changes: Counter = Counter()
        if self.koordd is None:
            return changes
        try:
            text = (self.state_dir / "decisions.jsonl").read_text()
        except OSError:
            return changes
        for line in text.splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict) and d.get("outcome") in ("applied", "refused"):
                changes[(d.get("loop"), d.get("knob"), d.get("outcome"))] += 1
        return changes

    # --- the end ---------------------------------------------------------------------------------------

    def clean_up(self) -> list[str]:
        """Stop koordd (it restores BE's knobs while BE still exists), kill the workers, remove the cgroups
        and the temporary directory. What could not be done, as text; empty when all of it is gone."""
        problems = []
        if self.koordd is not None and self.koordd.poll() is None:
            self.koordd.terminate()
            try:
                if self.koordd.wait(STOP_TIMEOUT) != 0:
                    problems.append(f"koordd exited with status {self.koordd.returncode} on SIGTERM:"
                                    f" BE's knobs may not all have been restored\n{self.koordd_log()}")
            except subprocess.TimeoutExpired:
                problems.append(f"koordd did not stop within {STOP_TIMEOUT:g}s of SIGTERM: killed")
                self.koordd.kill()
                self.koordd.wait()
        for p in self.workers:
            if p.poll() is None:
                p.kill()
        for p in self.workers:
            p.wait()
        problems += self.cgroups.remove()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return problems


@contextmanager
def signals_stop() -> Iterator[None]:
    """SIGTERM and SIGHUP (the terminal went away) stop the demo as Ctrl-C does: through the clean-up."""
    def stop(signum, frame):
        raise Stopped(signum)
    saved = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """No signal may cut the clean-up short: it is bounded (koordd gets SIGKILL after STOP_TIMEOUT)."""
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


# --- one run, start to end ---------------------------------------------------------------------------------

def koordd_text(demo: Demo) -> str:
    """koordd's state for the live view."""
    if demo.koordd is None:
        return "not running (phase 3 starts it)"
    status = demo.koordd_status()
    loops = (status or {}).get("loops") or {}
    if not loops:
        return f"starting (pid {demo.koordd.pid}, loops {', '.join(demo.settings.loops)})"
    ticks = {name: r.get("ticks", 0) for name, r in sorted(loops.items())}
    return f"running (pid {demo.koordd.pid}): " + ", ".join(f"{name} {n} tick{'' if n == 1 else 's'}"
                                                          for name, n in ticks.items())


def changes_lines(changes: Counter) -> list[str]:
    if not changes:
        return ["koordd changed nothing."]
    return ["koordd's writes on BE (its decision log): " + ", ".join(
        f"{loop} {knob} {n}x" + (" refused" if outcome == "refused" else "")
        for (loop, knob, outcome), n in sorted(changes.items(), key=lambda kv: tuple(map(str, kv[0]))))]


def run(settings: Settings, plot_path: Path | None, layout: Layout, out: TextIO = sys.stdout) -> int:
    """The whole demo on this host: intro, live view, clean-up, summary, plot. The exit status: 0, 1 when
    something failed or could not be cleaned up, 128 + the signal when stopped by one."""
    cpus = sorted(os.sched_getaffinity(0))
    # Phases of whole samples, so that no sample straddles two phases.
    settings = replace(settings, phase=max(1, round(settings.phase / SAMPLE)) * SAMPLE)
    demo = Demo(layout, settings, cpus)
    roots = ", ".join(str(r) for r in demo.cgroups.roots)
    print(f"koordctl demo: {len(cpus)} CPUs, cgroup {layout.mode}; cgroups {demo.name}/ls and /be in {roots}.\n"
          f"LS wants {settings.low:.0%} to {settings.high:.0%} of every CPU, a sine of {settings.period:g}s; "
          f"BE a busy loop per CPU. Three phases of {settings.phase:g}s: {', '.join(PHASES)} "
          f"(loops {', '.join(settings.loops)}).\n", file=out, flush=True)
    tty = out.isatty()
    stopped: Stopped | KeyboardInterrupt | None = None
    failure: str | None = None
    with signals_stop():
        try:
            with (LiveView(out) if tty else LinePrinter(out)) as view:
                def show(d: Demo, s: Sample) -> None:
                    if tty:
                        view.show(frame(s, len(cpus), settings.phase, koordd_text(d), view.width()))
                    else:
                        view.sample(s)
                demo.play(show)
        except KeyboardInterrupt as e:
            stopped = e
        except (DemoError, OSError) as e:
            failure = str(e)
        finally:
            with signals_ignored():
                changes = demo.koordd_changes()
                problems = demo.clean_up()
    try:
        return _report(demo, settings, plot_path, out, stopped, failure, problems, changes)
    except KeyboardInterrupt:            # a second Ctrl-C while the plot is drawn: everything is gone already
        return 130


def _report(demo: Demo, settings: Settings, plot_path: Path | None, out: TextIO, stopped, failure: str | None,
            problems: list[str], changes: Counter) -> int:
    ncpu = len(demo.cpus)
    if stopped is not None:
        name = signal.Signals(stopped.signum).name if isinstance(stopped, Stopped) else "Ctrl-C"
        print(f"stopped by {name} after {demo.samples[-1].t if demo.samples else 0:.1f}s", file=out)
    if failure:
        print(f"koordctl demo: {failure}", file=sys.stderr, flush=True)
    done = [f"{demo.name} removed"] if demo.cgroups.removed else []
    done += ["its processes ended"] if demo.workers else []
    done += ["koordd stopped and its changes undone"] if demo.koordd is not None else []
    print("clean-up failed: " + "; ".join(problems) if problems else
          "cleaned up: " + (", ".join(done) or "nothing had been made yet"), file=out)
    if demo.samples:
        print("", *summary_lines(summarize(demo.samples, ncpu)), sep="\n", file=out)
    if demo.koordd is not None:
        print("", *changes_lines(changes), sep="\n", file=out)
    if plot_path is not None and demo.samples:
        print("", file=out)
        title = f"koordctl demo: {ncpu} CPUs, cgroup {demo.layout.mode}, koordd loops {', '.join(settings.loops)}"
        try:
            plot(demo.samples, ncpu, settings.phase, title, plot_path)
        except ImportError:
            print("no plot: matplotlib is not installed (apt install python3-matplotlib; scripts/demo does)",
                  file=out)
        else:
            _give_to_sudo_user(plot_path)
            print(f"plot: {plot_path}", file=out)
    if problems or failure:
        return 1
    if stopped is not None:
        return 128 + (stopped.signum if isinstance(stopped, Stopped) else signal.SIGINT)
    return 0


def _give_to_sudo_user(path: Path) -> None:
    """Under sudo, the plot belongs to the user who ran it, not to root."""
    try:
        os.chown(path, int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"]))
    except (KeyError, ValueError, OSError):
        pass


def cmd_demo(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise CtlError("demo: needs root (it creates cgroups under /sys/fs/cgroup and starts koordd)")
    try:
        layout = detect_layout(DEFAULT_ROOT)
        hierarchy_roots(layout)          # a host without the hierarchies the demo needs says so now
    except (LayoutError, DemoError) as e:
        raise CtlError(f"demo: {e}") from None
    holder, _ = host_owner()
    if holder is not None:          # its koordd would refuse (one koordd per host owns the knobs)
        raise CtlError(f"demo: {holder.describe()} owns this host's knobs: stop it first (systemctl stop koordd)")
    settings = Settings(phase=args.phase, period=args.period, loops=args.loops)
    return run(settings, None if args.no_plot else args.plot, layout)
