"""A real Prometheus server (Debian's `prometheus` package; scripts/test installs it as root) scrapes a
koordd running on a fake cgroup tree, and PromQL through its HTTP API returns koordd's series.

Everything listens on 127.0.0.1, on ports free at the time; Prometheus keeps its data in the test's
temp dir and is stopped at the end (its packaged service is never started). Skipped without the
binary, unless scripts/test set this host up (KOORDD_REQUIRE_EBPF): then it fails.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest

from koordd.act.decision_log import read_decisions
from koordtest.metricsnode import free_port, get, run_koordd, wait_for


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("KOORDD_REQUIRE_EBPF"):
            pytest.fail("scripts/test set this host up, yet prometheus is missing (apt install prometheus)")
        pytest.skip("prometheus is not installed (apt install prometheus)")
    return path


def cores(cpu_max: str) -> float:
    quota, period = cpu_max.split()
    return float("inf") if quota == "max" else int(quota) / int(period)


def query(base: str, promql: str) -> list[dict]:
    status, body = get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert status == 200, body
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def wait_for_result(base: str, promql: str, proc: subprocess.Popen, timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "prometheus exited"
        try:
            result = query(base, promql)
            if result:
                return result
        except (OSError, AssertionError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{promql!r} returned nothing for {timeout:g} s")


@pytest.fixture
def koordd(tmp_path):
    port = free_port()
    (tmp_path / "node").mkdir()
    proc, _ = run_koordd(tmp_path / "node", port)
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", "ok", proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def prometheus(tmp_path, koordd):
    binary = prometheus_binary()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: koordd
    static_configs:
      - targets: ["127.0.0.1:{koordd}"]
""")
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=log, cwd=tmp_path)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_prometheus_scrapes_koordd_and_promql_returns_its_series(prometheus, koordd, tmp_path):
    base, proc = prometheus
    try:
        [up] = wait_for_result(base, 'up{job="koordd"} == 1', proc)
        assert up["metric"]["instance"] == f"127.0.0.1:{koordd}"
        # per-class: the LS class's limit, from its cpu.max on the fake tree (1 core)
        [ls] = wait_for_result(base, 'koordd_class_cpu_limit_cores{class="LS"}', proc)
        assert float(ls["value"][1]) == 1.0
        # per-cgroup with its labels, and BE's cpu.max as be_suppress holds it
        [held] = wait_for_result(base, 'koordd_held_knob_value{knob="cpu.max",target="be.slice"}', proc)
        # (its cap in cores: one be_suppress applied, whatever the host's load made it)
        applied = {cores(d["new"]) for d in read_decisions(tmp_path / "node" / "state")
                   if d["knob"] == "cpu.max" and d["outcome"] == "applied"}
        assert held["metric"]["owner"] == "be_suppress" and float(held["value"][1]) in applied, (held, applied)
        # a counter Prometheus can take a rate of: be_suppress ticks up to five times a second (fewer on a busy host)
        [ticks] = wait_for_result(base, 'rate(koordd_loop_ticks_total{loop="be_suppress"}[5s])', proc)
        assert 0.5 < float(ticks["value"][1]) < 8.0
        # decisions by loop and outcome, and the reclaimable figure
        assert wait_for_result(base, 'sum by (loop, outcome) (koordd_decisions_total) > 0', proc)[0]["metric"] == \
            {"loop": "be_suppress", "outcome": "applied"}
        [reclaim] = wait_for_result(base, "koordd_reclaimable_cpu_cores", proc)
        assert 0.0 <= float(reclaim["value"][1]) <= 1.0
    except AssertionError:
        print((tmp_path / "prometheus.log").read_text()[-3000:])
        raise
