"""koordd's footprint on the shipped config (issue 36): what a daemon run on config/koordd.toml as shipped
imports. Each module named here is used by an optional feature only, and costs RSS in every koordd that
imports it (measured on the 2-CPU development host, docs/benchmarks.md "Footprint (issue 36) and overhead
after the house rework (issue 37)"): a change that imports one at start for everyone fails here, not in a
benchmark a month later. No timing, no size: which modules, after one real round on a fake tree."""
from __future__ import annotations

import json
import subprocess
import sys

from koordtest.fakes.cgroup import FakeCgroups
from koordtest.koordd_proc import shipped_config

# module -> the feature that needs it (and what it cost where measured)
OPTIONAL = {
    "ssl": "https peers only: the report push, a Prometheus SLO source (libssl+libcrypto: 4 MB)",
    "_ssl": "as ssl",
    "http.client": "no koordd code path (netpeer speaks HTTP/1.1 itself)",
    "urllib.request": "no koordd code path",
    "prometheus_client": "[metrics] enable only (2.9 MB)",
    "koordd.runtime.metrics": "[metrics] enable only",
    "pynvml": "the GPU sensor, where a loop needs it; the start-up probe runs in a child process",
    "pyroute2": "net_shaping only (16 MB)",
    "bcc": "replaced by the CO-RE loader (81 MB of LLVM)",
    "numpy": "no koordd code path",
    "matplotlib": "benchmarks only",
    "difflib": "the config checker's suggestion for an unknown key only (0.4 MB)",
    # The standard library's convenience, replaced by a few lines of koordd's own (docs/benchmarks.md,
    # "Footprint"): what each imports at its top costs more than the job koordd has for it.
    "importlib.metadata": "no koordd code path: koordd/core/installed.py reads the entry points (2.5 MB)",
    "email": "as importlib.metadata",
    "statistics": "no koordd code path: core/experiment.py's median and fmean (0.8 MB with decimal)",
    "decimal": "as statistics",
    "tempfile": "no koordd code path: act/journal.py's write_atomic names its own file (0.8 MB)",
    "zipfile": "no koordd code path: importlib.resources's readers import it; kernel/bpf_objects.py does without",
}

RUN = """
import json, sys
from koordd.runtime.daemon import main
rc = main(["--config", sys.argv[1], "--once"])
print(json.dumps({"rc": rc, "modules": sorted(sys.modules)}))
"""


def test_the_shipped_config_imports_no_optional_feature_s_modules(tmp_path):
    tree = FakeCgroups(tmp_path / "cg", "v2")
    for cg in ("ls.slice", "ls.slice/pod0", "be.slice", "be.slice/pod0", "system.slice"):
        tree.add(cg)
    config = tmp_path / "etc" / "koordd.toml"
    config.parent.mkdir()
    config.write_text(shipped_config({"LS": ["ls.slice"], "BE": ["be.slice"]}, tmp_path / "state",
                                     changes=(("daemon.cgroup_root", str(tree.root)),)))
    out = subprocess.run([sys.executable, "-c", RUN, str(config)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0, out.stderr[-3000:]
    assert "koordd.runtime.service" in got["modules"] and "koordd_plugins.be_suppress" in got["modules"]
    loaded = {m: why for m, why in OPTIONAL.items()
              if any(name == m or name.startswith(m + ".") for name in got["modules"])}
    assert loaded == {}, f"imported on the shipped config: {loaded}"
