"""koordctl doctor: what this host's kernel and libraries support, from the probes of
koordd/runtime/capabilities.py; and, where a koordd runs, the BPF programs it has loaded (its status file
lists them: where each runs, its run time, its maps' sizes)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from koordctl.common import CtlError
from koordctl.running import running_koordd
from koordctl.shapes import STATUS
from koordctl.statefiles import escaped, read_document, refuse_untrusted
from koordd.core.feeds import STATUS_FILE
from koordd.runtime.capabilities import format_report, probe_all, report_json


def cmd_doctor(args: argparse.Namespace) -> int:
    caps = probe_all(args.cgroup_root)
    if args.json:
        print(report_json(caps))
        return 0
    print(format_report(caps))
    print()
    try:
        pid, bpf = running_bpf()
    except CtlError as e:       # the host's report stands; the running koordd's files are not shown
        print(f"koordctl: BPF programs not shown: {e}", file=sys.stderr)
        return 2
    print(format_bpf(pid, None if bpf is None else escaped(bpf)))
    return 0


def running_bpf() -> tuple[int | None, dict | None]:
    """The running koordd's pid and the BPF report of its status file (None, None where none runs).
    CtlError where its state_dir is not one koordd would trust or its status.json not what koordd writes."""
    holder = running_koordd()
    if holder is None:
        return None, None
    if not holder.state_dir:
        return holder.pid, None
    sd = Path(holder.state_dir)
    refuse_untrusted(sd)
    status = read_document(sd / STATUS_FILE, STATUS)
    bpf = status.get("bpf") if isinstance(status, dict) else None
    return holder.pid, bpf if isinstance(bpf, dict) else None


def _cost(program: dict, counted: bool | None) -> str:
    if not counted:
        return "run time not counted"
    runs, ns = int(program.get("run_cnt") or 0), int(program.get("run_time_ns") or 0)
    return f"{runs} runs, {ns / runs:.0f} ns each, {ns / 1e6:.1f} ms in all" if runs else "not run yet"


def format_bpf(pid: int | None, bpf: dict | None) -> str:
    if pid is None:
        return "BPF programs: no koordd runs on this host"
    if bpf is None:
        return f"BPF programs: koordd (pid {pid}) has written no report of them (no status yet, or an older koordd)"
    counted = bpf.get("stats_enabled")
    lines = [f"BPF programs loaded by koordd (pid {pid}):"]
    objects = bpf.get("objects") or []
    if not objects:
        lines.append("  none: no loop or sensor enabled needs one")
    for o in objects:
        lines.append(f"  {o.get('object')}")
        for p in o.get("programs") or []:
            where = ", ".join(p.get("attached") or []) or "not attached"
            lines.append(f"    program {p.get('name')} (id {p.get('id')}): {where}; {_cost(p, counted)}")
        for m in o.get("maps") or []:
            extra = "; " + ", ".join(m["attached"]) if m.get("attached") else ""
            # 0 entries: a task's or socket's own storage (BPF_MAP_TYPE_TASK_STORAGE, SK_STORAGE), one per object
            size = f"{m.get('max_entries')} entries" if m.get("max_entries") != 0 else "one per task or socket"
            lines.append(f"    map {m.get('name')}: {size} of {m.get('key_size')} + {m.get('value_size')} bytes{extra}")
    if counted is False:
        lines.append("  kernel.bpf_stats_enabled is 0: the kernel counts no run time "
                     "(sysctl -w kernel.bpf_stats_enabled=1 counts it, at a clock read per run)")
    return "\n".join(lines)
