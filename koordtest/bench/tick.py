"""Benchmark one koordd tick (snapshot + be_suppress decide + actuator apply) on a fake v2 tree
with many BE pods, with pyperf. The per-tick cost bounds how short a loop interval can be.

    .venv/bin/pip install pyperf && .venv/bin/python scripts/bench-tick [--pods 200] [pyperf options]
"""
import tempfile
from pathlib import Path

import pyperf

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.koordd_proc import to_toml

from koordd.act.actuator import Actuator
from koordd.core.config import parse_config
from koordd.act.decision_log import DecisionLog
from koordd_plugins.be_suppress import BeSuppress
from koordd.sensors.collect import Sensors
from koordd.act.journal import RestoreJournal

CONFIG = to_toml({"classes": [{"name": "BE", "cgroups": ["kubepods.slice/kubepods-besteffort.slice/*"]},
                              {"name": "LS", "cgroups": ["kubepods.slice/kubepods-burstable.slice/*"]}],
                  "loops": {"be_suppress": {"enabled": True}}})


def main():
    def forward(cmd, args):      # pyperf's workers get this script's own option too
        cmd += ["--pods", str(args.pods)]

    runner = pyperf.Runner(add_cmdline_args=forward)
    runner.argparser.add_argument("--pods", type=int, default=200, help="BE pods (LS pods: the same)")
    args = runner.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="koordd-bench-"))
    tree = FakeCgroups(tmp, "v2", cpus="0-63")
    for i in range(args.pods):
        tree.add(f"kubepods.slice/kubepods-besteffort.slice/pod{i}", usage_us=i * 1000)
        tree.add(f"kubepods.slice/kubepods-burstable.slice/pod{i}", usage_us=i * 1000)
    config = parse_config(CONFIG, "bench.toml", {"be_suppress": BeSuppress})
    settings = config.loops["be_suppress"]
    sensors = Sensors(tree.fs, config.classes)
    actuator = Actuator(tree.fs, RestoreJournal(tmp / "state"), DecisionLog(tmp / "state"))
    state = BeSuppress.initial_state(settings)
    sensors.snapshot(fields=BeSuppress.needs(settings))

    fields = BeSuppress.needs(settings)        # what koordd reads when be_suppress is the only loop

    def tick():
        snap = sensors.snapshot(fields=fields)
        actuator.apply("be_suppress", BeSuppress.decide(snap, settings, state))

    runner.bench_func(f"tick ({args.pods} BE + {args.pods} LS pods)", tick)
