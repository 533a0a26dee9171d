"""The CPU one Prometheus scrape costs koordd (source = "prometheus"): the answer read from a real HTTP
server on 127.0.0.1 and its wanted histogram parsed, as the sensor's thread does every second. CPU is the
scraping thread's own (time.thread_time: the server's thread is not counted); each case is repeated and
reported as median, quartiles, min and max, in ms of CPU per scrape (= thousandths of a CPU at one scrape
a second).

    .venv/bin/python scripts/bench-scrape [--repeat 20] [--mib 7.9] [--old REV]

Cases (the answer just under the 8 MiB cap, as the review's):
- noise: 8 MiB of other families and the wanted histogram (20 series x 12 buckets), labels matched;
- family: 8 MiB of the wanted family's own bucket lines (one series per `i`), labels matched (one series);
- family-all: the same, no label matcher (every series wanted: the MAX_LINES cap ends the parse).
Parsers: "new" (koordd's: family_lines + its label reader), "old" (the parser of git revision --old,
default main's parent of this change: 469fc8b, whole text decoded and split), "prometheus_client" (its
text_string_to_metric_families on the whole answer, as item 3 of issue 35 asked to weigh), and
"prometheus_client-filtered" (the same on family_lines' lines only).
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from koordd.sensors import slo_prometheus as new
from koordtest.bench.common import REPO
from koordtest.hostile import HostileServer

METRIC = "req_seconds"
BOUNDS = ("0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf")


def noise_body(size: int) -> bytes:
    wanted = (f'{METRIC}_bucket{{handler="/h{s}",le="{b}"}} {100 * s + k}\n'
              for s in range(20) for k, b in enumerate(BOUNDS))
    noise = (f'http_client_requests_total{{peer="svc-{i % 997}",path="/api/v1/items/{i}",code="200"}} {i}\n'
             for i in itertools.count())
    return answer(itertools.chain(wanted, noise), size)


def family_body(size: int) -> bytes:
    return answer((f'{METRIC}_bucket{{handler="/h{i}",le="{b}"}} {i + k}\n'
                   for i in itertools.count() for k, b in enumerate(BOUNDS)), size)


def answer(lines: Iterator[str], size: int) -> bytes:
    """The whole lines of `lines` that fit in `size` bytes."""
    out, n = [], 0
    while n < size:
        out.append(next(lines))
        n += len(out[-1])
    return "".join(out).encode()[:size].rsplit(b"\n", 1)[0] + b"\n"


def load_old(rev: str):
    src = subprocess.run(["git", "show", f"{rev}:koordd/sensors/slo_prometheus.py"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="koordd-bench-")) / "old_slo_prometheus.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_slo_prometheus", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def prometheus_client_parse(text: str, labels: dict) -> int:
    from prometheus_client.parser import text_string_to_metric_families
    n = 0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == METRIC + "_bucket" and all(s.labels.get(k) == v for k, v in labels.items()):
                n += 1
    return n


def run_case(url: str, labels: dict, parser: str, old) -> None:
    if parser == "new":
        try:
            new.parse_buckets(new.scrape(url, 10.0), METRIC, labels)
        except new.ScrapeError as e:
            if e.kind != "too large":
                raise
    elif parser == "old":
        old.parse_buckets(old.scrape(url, 10.0), METRIC, labels)
    elif parser == "prometheus_client":
        prometheus_client_parse(new.scrape(url, 10.0).decode(), labels)
    else:
        body = new.scrape(url, 10.0)
        needles = tuple(f'{k}="{v}"'.encode() for k, v in labels.items())
        lines = new.family_lines(body, METRIC + "_bucket", needles)
        prometheus_client_parse("".join(f"{METRIC}_bucket{ln.decode()}\n" for ln in lines), labels)


def cases(size: int) -> dict[str, tuple[bytes, dict]]:
    """Each case's answer of `size` bytes and the labels its parse matches."""
    return {"noise": (noise_body(size), {"handler": "/h3"}), "family": (family_body(size), {"handler": "/h3"}),
            "family-all": (family_body(size), {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--mib", type=float, default=7.9)
    ap.add_argument("--old", default="469fc8b")
    ap.add_argument("--parsers", default="new,old,prometheus_client,prometheus_client-filtered")
    args = ap.parse_args(argv)
    size = int(args.mib * (1 << 20))
    old = load_old(args.old)
    print(f"python {sys.version.split()[0]}, answers of {size / (1 << 20):.2f} MiB, {args.repeat} scrapes each; "
          "ms of the scraping thread's CPU per scrape")
    print(f"{'case':<11} {'parser':<27} {'median':>8} {'q1':>8} {'q3':>8} {'min':>8} {'max':>8}")
    for case, (body, labels) in cases(size).items():
        with HostileServer("ok", body=body) as srv:
            for parser in args.parsers.split(","):
                samples = []
                for _ in range(args.repeat):
                    t = time.thread_time()
                    try:
                        run_case(srv.url, labels, parser, old)
                    except Exception as e:  # noqa: BLE001 - a parser that refuses the case
                        samples = None
                        print(f"{case:<11} {parser:<27} fails: {e!r}"[:120])
                        break
                    samples.append((time.thread_time() - t) * 1000)
                if samples:
                    q = statistics.quantiles(samples, n=4)
                    print(f"{case:<11} {parser:<27} {statistics.median(samples):8.1f} {q[0]:8.1f} {q[2]:8.1f} "
                          f"{min(samples):8.1f} {max(samples):8.1f}")
    return 0

