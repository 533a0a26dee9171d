"""deploy/grafana/koordd-dashboard.json cannot drift from what koordd exports: every panel's PromQL
names series koordd/runtime/metrics.py declares (or prometheus-client's process collector writes), with
labels those series have, and parses as PromQL (promtool, from Debian's prometheus package)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from koordd.core.config import CLASS_NAMES
from koordd.runtime.metrics import Exporter, SERIES

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "koordd-dashboard.json"
TARGET_LABELS = {"instance", "job"}         # what Prometheus adds to every series it scrapes
NAME = re.compile(r"\b((?:koordd|process)_[a-zA-Z0-9_]+)\b")
SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
# Label values with a fixed domain: a typo there selects nothing, silently.
DOMAINS = {"class": set(CLASS_NAMES), "resource": {"cpu", "memory", "io"}, "kind": {"some", "full"},
           "quantile": {"0.5", "0.99", "1"}, "outcome": {"applied", "dry-run", "refused", "restored", "left", "deferred"}}


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out += p.get("panels", [])          # a collapsed row keeps its panels inside it
    return out


def exported() -> dict[str, set[str]]:
    """Series name -> its labels: koordd's table, and what the process collector writes."""
    names = {name: set(labels) for name, (_, labels, _) in SERIES.items()}
    text = Exporter().exposition().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            names.setdefault(s.name, set(s.labels))
    return names


DASH = json.loads(DASHBOARD.read_text())
EXPRS = [(p["title"], t["expr"]) for p in panels(DASH) for t in p.get("targets", [])]


def test_the_dashboard_is_grafana_json_with_unique_panel_ids():
    assert DASH["title"] and DASH["uid"] and isinstance(DASH["schemaVersion"], int)
    ids = [p["id"] for p in panels(DASH)]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in DASH["templating"]["list"]} >= {"datasource", "instance"}
    assert len(EXPRS) >= 10


def test_it_plots_ls_health_against_be_knobs_and_decisions():
    text = " ".join(e for _, e in EXPRS)
    for name in ("koordd_class_runq_latency_seconds", "koordd_class_pressure_ratio", "koordd_class_cpu_limit_cores",
                 "koordd_held_knob_value", "koordd_decisions_total", "koordd_reclaimable_cpu_cores"):
        assert name in text


@pytest.mark.parametrize("title, expr", EXPRS, ids=[f"{t}:{i}" for i, (t, _) in enumerate(EXPRS)])
def test_every_query_names_series_koordd_exports_with_their_labels(title, expr):
    series = exported()
    names = set(NAME.findall(expr))
    assert names, f"{title}: {expr!r} names no koordd series"
    unknown = names - set(series)
    assert not unknown, f"{title}: {sorted(unknown)} are not exported by koordd/runtime/metrics.py"
    for name, matchers in SELECTOR.findall(expr):
        for label, _, value in MATCHER.findall(matchers):
            assert label in series[name] | TARGET_LABELS, f"{title}: {name} has no label {label!r}"
            if label in DOMAINS and not value.startswith("$"):
                values = set(value.split("|"))
                assert values <= DOMAINS[label], f"{title}: {label}={value!r} can match nothing"
    have = set().union(*(series[n] for n in names)) | TARGET_LABELS
    for group in BY.findall(expr):
        labels = {x.strip() for x in group.split(",") if x.strip()}
        assert labels <= have, f"{title}: grouped by {labels - have}, which {sorted(names)} lack"


def test_every_query_is_promql_that_promtool_accepts(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("KOORDD_REQUIRE_EBPF"):
            pytest.fail("scripts/test set this host up, yet promtool (Debian's prometheus package) is missing")
        pytest.skip("promtool is not installed (apt install prometheus)")
    rules = [{"record": f"koordd:dashboard_{i}", "expr": expr.replace("$__rate_interval", "1m")
              .replace("$instance", ".*").replace("$job", ".*")} for i, (_, expr) in enumerate(EXPRS)]
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))    # JSON is YAML
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
