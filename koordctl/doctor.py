"""koordctl doctor: what this host's kernel and libraries support, from the probes of koordd/runtime/capabilities.py."""
from __future__ import annotations

import argparse

from koordd.runtime.capabilities import format_report, probe_all, report_json


def cmd_doctor(args: argparse.Namespace) -> int:
    caps = probe_all(args.cgroup_root)
    print(report_json(caps) if args.json else format_report(caps))
    return 0
