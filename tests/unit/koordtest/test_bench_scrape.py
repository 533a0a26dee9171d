"""scripts/bench-scrape's logic (koordtest/bench/scrape.py): the answers it serves and the parsers it times."""
from __future__ import annotations

import pytest

from koordd.sensors import slo_prometheus
from koordtest.bench import scrape
from koordtest.hostile import HostileServer

SIZE = 64 << 10


@pytest.mark.parametrize("make", [scrape.noise_body, scrape.family_body])
def test_an_answer_is_whole_lines_up_to_its_size(make):
    body = make(SIZE)
    assert SIZE - 200 < len(body) <= SIZE and body.endswith(b"\n")
    assert all(line.startswith((b"req_seconds_bucket{", b"http_client_requests_total{"))
               for line in body.splitlines())


def test_each_case_holds_the_wanted_series():
    for case, (body, labels) in scrape.cases(SIZE).items():
        if labels:
            buckets = slo_prometheus.parse_buckets(body, scrape.METRIC, labels)
            assert [le for le, _ in buckets][-1] == float("inf") and len(buckets) == len(scrape.BOUNDS), case
            assert scrape.prometheus_client_parse(body.decode(), labels) == len(scrape.BOUNDS), case


@pytest.mark.parametrize("parser", ["new", "prometheus_client", "prometheus_client-filtered"])
def test_a_parser_reads_the_case_from_a_real_server(parser):
    body, labels = scrape.cases(SIZE)["noise"]
    with HostileServer("ok", body=body) as srv:
        scrape.run_case(srv.url, labels, parser, old=None)
