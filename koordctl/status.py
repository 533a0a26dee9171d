"""koordctl status: is koordd running, its loops, sensors and the knobs it holds."""
from __future__ import annotations

import argparse
import json
import time

from koordctl.common import CtlError, ago, local_time, pid_alive, table, target_text
from koordctl.running import host_owner, trusted_state_dir
from koordctl.shapes import HELD, Malformed, STATUS, check, seq
from koordctl.statefiles import bounded, escaped, read_document
from koordd.act.journal import RestoreJournal, read_held
from koordd.core.feeds import STATUS_FILE
from koordd.core.printable import printable


def cmd_status(args: argparse.Namespace) -> int:
    sd = trusted_state_dir(args)
    status = read_document(sd / STATUS_FILE, STATUS)
    if not isinstance(status, dict):
        print(f"koordd has not run with state_dir {sd}")
        return 1
    # The restore journal is written before every knob and survives a crash; status.json may be stale.
    # Read with read_held rather than by RestoreJournal: a reader takes no part in the journal.
    bad = sd / RestoreJournal.FILE if (sd / RestoreJournal.FILE).exists() else sd / RestoreJournal.V1_FILE
    bounded(bad)
    try:
        journal = read_held(sd)
    except (OSError, ValueError, RecursionError) as e:
        raise CtlError(f"{bad}: unreadable: {printable(getattr(e, 'strerror', None) or e)}") from None
    if journal is not None:
        try:
            check(journal[0], seq(HELD))
        except Malformed as e:
            raise CtlError(f"{journal[1]}: {printable(e)}: not what koordd writes") from None
    held, source = (journal[0], journal[1].name) if journal is not None else (status.get("held") or [], STATUS_FILE)
    running = pid_alive(status.get("pid"))
    holder, owner_text = host_owner()
    if args.json:
        print(json.dumps({**status, "state_dir": str(sd), "running": running, "held": held,
                          "held_source": source, "owner": None if holder is None else holder.__dict__},
                         indent=1, sort_keys=True))
        return 0 if running else 1
    now = time.time()
    status, held = escaped(status), escaped(held)     # what a workload named cannot reach the terminal
    state = "running" if running else "not running"
    print(table([
        ("koordd", f"{state} (pid {status.get('pid')}, status updated {ago(status.get('updated'), now)})"),
        ("started", f"{local_time(status.get('started'))} ({ago(status.get('started'), now)})"),
        ("config", status.get("config")),
        ("dry-run", "yes" if status.get("dry_run") else "no"),
        ("cgroups", status.get("cgroups")),
        ("state_dir", sd),
        # The koordd that writes this host's knobs, whatever its state_dir (koordd/act/owner.py).
        ("owner", owner_text),
        *((("metrics", f"http://{status['metrics']}/metrics"),) if status.get("metrics") else ()),
        *((("reclaimable", reclaimable_text(status["reclaimable"])),) if status.get("reclaimable") else ()),
    ]))
    report = status.get("report")
    if isinstance(report, dict):
        print()
        print("\n".join(report_lines(report)))
    loops = status.get("loops") or {}
    print()
    print(table([(name, "?" if r.get("interval") is None else f"{r['interval']:g}s", r.get("ticks"), ago(r.get("last_tick"), now),
                  r.get("failures"), r.get("last_error")) for name, r in loops.items()],
                ("LOOP", "INTERVAL", "TICKS", "LAST TICK", "FAILURES", "LAST ERROR"))
          if loops else "no loops enabled")
    sensors = {name: s for name, s in (status.get("sensors") or {}).items() if s.get("loops")}
    if sensors:                  # only those an enabled loop or an SLO needs: the others are stopped by design
        print()
        print(table([(name, s.get("state"), ", ".join(s.get("loops") or ()), s.get("reason") or "")
                     for name, s in sorted(sensors.items())], ("SENSOR", "STATE", "USED BY", "REASON")))
    print()
    print(f"held knobs (from {source}):" if held else f"held knobs (from {source}): none")
    if held:
        print(table([(target_text(h), h.get("knob"), h.get("original"), h.get("owner"),
                      f"{local_time(h.get('since'))} ({ago(h.get('since'), now)})") for h in held],
                    ("TARGET", "KNOB", "ORIGINAL", "OWNER", "SINCE")))
    return 0 if running else 1


def reclaimable_text(r: dict) -> str:
    """What LS was given but left unused (koordd/core/reclaimable.py): "1.25 CPUs, 3.0 GiB"; "?" for a resource
    unknown in the last round."""
    cpu, memory = (r.get("cpu_cores") or {}).get("reclaimable"), (r.get("memory_bytes") or {}).get("reclaimable")
    cpus = "? CPUs" if cpu is None else f"{cpu:.2f} CPUs"
    mem = "? GiB" if memory is None else f"{memory / 2**30:.1f} GiB"
    return f"{cpus}, {mem} (of {r.get('ls_cgroups', 0)} LS cgroups' limits, unused over the window)"


def report_lines(r: dict, most: int = 5) -> list[str]:
    """A short view of the node report (koordd/core/report.py, README "Node report"): the fairness index,
    the tenants with the largest dominant shares, and each workload's latency and violation rate."""
    def pct(x) -> str:
        return "?" if x is None else f"{100 * x:.1f}%"

    fair = (r.get("fairness") or {}).get("jain_index")
    tenants = sorted(r.get("tenants") or [], key=lambda t: -(t.get("dominant_share") or 0))
    out = [f"node report (schema {r.get('schema')}): {len(tenants)} tenants, fairness (Jain) "
           + ("?" if fair is None else f"{fair:.3f}")]
    cap, use = r.get("capacity") or {}, r.get("usage") or {}

    def num(x, scale: float = 1.0, fmt: str = ".2f") -> str:
        return "?" if x is None else format(x / scale, fmt)
    out.append(f"node: {num(use.get('cpu_cores'))} of {num(cap.get('cpu_cores'), fmt='g')} CPUs, "
               f"{num(use.get('memory_bytes'), 2**30, '.1f')} of {num(cap.get('memory_bytes'), 2**30, '.1f')} GiB used")
    if tenants:
        out.append(table([(t.get("name"), pct(t.get("cpu_share")), pct(t.get("memory_share")),
                           pct(t.get("dominant_share"))) for t in tenants[:most]],
                         ("TENANT", "CPU", "MEMORY", "DOMINANT")))
        if len(tenants) > most:
            out.append(f"... and {len(tenants) - most} more (koordctl status --json)")
    workloads = r.get("workloads") or []
    if workloads:
        def ms(us) -> str:
            return "?" if us is None else f"{us / 1000:.2f}ms"
        out.append(table([(w.get("cgroup"), w.get("class"), f"{ms(w.get('latency_us'))} / {ms(w.get('target_us'))}",
                           f"{pct(w.get('violation_rate'))} (of {pct(w.get('violation_target'))})", w.get("requests"))
                          for w in workloads[:most]],
                         ("WORKLOAD", "CLASS", "LATENCY / TARGET", "OVER TARGET", "REQUESTS")))
    return out
