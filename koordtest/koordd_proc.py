"""koordd as a subprocess of a benchmark: a config and state directory of its own, its output in a log
file, SIGTERM at the end (so it restores every knob it changed) and its exit status checked.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from koordtest.bench.cgroup_tree import die_with_parent

REPO = Path(__file__).resolve().parents[1]        # the checkout: koordtest is installed editable
SHIPPED_CONFIG = REPO / "config" / "koordd.toml"
SERVICE_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def koordd_command(koordd: str | None = None, profile: Path | None = None, runq_source: str | None = None) -> list[str]:
    """This venv's koordd (or `koordd`, e.g. another checkout's, to compare), under cProfile if asked.
    `runq_source`: the run-queue sensor limited to that source (e.g. "schedstat", to measure the fallback
    on a host where the eBPF program loads), set in the process before the daemon's main runs."""
    if koordd is None:
        script = Path(sys.executable).parent / "koordd"
        koordd = str(script) if script.exists() else None
    python = str(Path(koordd).parent / "python") if koordd else sys.executable
    if runq_source is not None:
        if profile is not None:
            raise ValueError("runq_source and profile do not go together")
        return [python, "-c", "import runpy, koordd.sensors.runq as r; "
                f"r.DEFAULT_SOURCES = ({runq_source!r},); "
                "runpy.run_module('koordd.runtime.daemon', run_name='__main__')"]
    if profile is not None:
        return [python, "-m", "cProfile", "-o", str(profile), "-m", "koordd.runtime.daemon"]
    return [koordd] if koordd else [sys.executable, "-m", "koordd.runtime.daemon"]


class KoorddProcess:
    """One run of koordd on `config_text`, in `workdir` (etc/koordd.toml, state/, koordd.log).

    The config sits in a directory of its own: koordd watches its config's directory for edits, and
    would take every line of a log written there for one. koordd runs in a session of its own, so a
    Ctrl-C meant for the benchmark does not stop it before the benchmark's own cleanup does."""

    def __init__(self, config_text: str, workdir: Path, command: list[str] | None = None):
        self.workdir = workdir
        self.config = workdir / "etc" / "koordd.toml"
        self.log = workdir / "koordd.log"
        self.command = command or koordd_command()
        self.config_text = config_text
        self.proc: subprocess.Popen | None = None

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    def start(self) -> "KoorddProcess":
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self.config_text)
        env = {k: v for k, v in os.environ.items() if k not in SERVICE_ENV}   # never talk to a service manager
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.command + ["--config", str(self.config)], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                         preexec_fn=lambda: die_with_parent(signal.SIGTERM))
        return self

    def check_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"koordd exited {self.proc.returncode if self.proc else 'before start'}:\n"
                               f"{self.log_tail()}")

    def status(self) -> dict:
        return json.loads((self.state_dir / "status.json").read_text())

    def wait_ready(self, timeout: float = 180.0, ticks: int = 2) -> float:
        """Seconds until every loop has ticked `ticks` times and every optional sensor a loop needs is
        running or known to be unavailable (the run-queue sensor compiles and loads its BPF program
        first: seconds of CPU and kernel time): a benchmark measures koordd running, not koordd
        starting. RuntimeError on timeout."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            self.check_running()
            try:
                status = self.status()
            except (OSError, ValueError):
                status = {}
            loops = status.get("loops") or {}
            sensors = status.get("sensors") or {}
            if loops and all(r.get("ticks", 0) >= ticks for r in loops.values()) and \
                    all(s.get("state") in ("running", "unavailable") for s in sensors.values() if s.get("loops")):
                return time.monotonic() - t0
            time.sleep(0.1)
        raise RuntimeError(f"koordd not ready after {timeout:g}s:\n{self.log_tail()}")

    def decisions(self) -> list[dict]:
        try:
            lines = (self.state_dir / "decisions.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (koordd restores what it changed), SIGKILL after `timeout`; the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def __enter__(self) -> "KoorddProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- the shipped config, pointed at a benchmark's cgroups ---------------------------------------------

def shipped_config(classes: dict[str, list[str]], state_dir: Path, shipped: Path = SHIPPED_CONFIG,
                   changes: tuple[tuple[str, Any], ...] = (), slo: dict[str, dict] | None = None) -> str:
    """config/koordd.toml as shipped, except: the class rules named in `classes` match only the given
    cgroups (the other classes stay as shipped), the state lives in `state_dir`, each of `changes`
    ("loops.sched_ext.scheduler", "koordd") sets one option, and a class named in `slo` gets that
    [classes.slo] table."""
    data = tomllib.loads(shipped.read_text())
    data.setdefault("daemon", {})["state_dir"] = str(state_dir)
    for rule in data.get("classes", []):
        if rule["name"] in classes:
            rule["cgroups"] = list(classes[rule["name"]])
        if slo and rule["name"] in slo:
            rule["slo"] = dict(slo[rule["name"]])
    for dotted, value in changes:
        *tables, key = dotted.split(".")
        table = data
        for name in tables:
            table = table.setdefault(name, {})
        table[key] = value
    return to_toml(data)


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """TOML for what a koordd config holds: tables, arrays of tables, strings, numbers, booleans and
    arrays of those (JSON's string escapes are valid TOML)."""
    lines, tables = [], []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((f"[{prefix}{key}]", value, f"{prefix}{key}."))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables += [(f"[[{prefix}{key}]]", v, f"{prefix}{key}.") for v in value]
        else:
            lines.append(f"{key} = {_value(value)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for header, table, sub in tables:
        out += f"\n{header}\n" + to_toml(table, sub)
    return out


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")
