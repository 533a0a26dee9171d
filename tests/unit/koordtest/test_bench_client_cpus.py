"""bench-qos --client-cpus: the lowest CPUs for the client's processes, the others for LS, BE, koordd and
bench-qos itself (sched_setaffinity), the node the experiment sees shrunk to those others, the record and the
report line; and the proof's choice of how many to reserve by the host's CPUs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from koordtest.bench import proof, qos_cli
from koordtest.bench.qos_cli import (client_processes, cpus_line, cpus_record, load_rates, ls_be_cpus, sensor_table,
                                     trust_notes)
from koordtest.bench.qos_run import BE, Bench, SETUPS, client_preexec, on_cpus, split_cpus, start_antagonist

SIXTEEN = range(16)


def bench_qos_args(argv: list[str], cpus, monkeypatch) -> object:
    monkeypatch.setattr(qos_cli, "host_cpus", lambda: list(cpus))        # the host's CPUs, whatever this one has
    return qos_cli.parse_args(argv + ["--engine", "python", "--no-install"])


def test_the_client_gets_the_lowest_cpus_and_ls_and_be_the_others():
    split = split_cpus(2, SIXTEEN)
    assert split.client == (0, 1) and split.rest == tuple(range(2, 16))
    assert split.describe() == "client on CPUs 0-1, LS and BE on 2-15"
    assert split.record() == {"client": "0-1", "ls_be": "2-15"}
    # the lowest of the CPUs bench-qos may use, where it is confined to some
    assert split_cpus(1, [7, 3, 5]).client == (3,) and split_cpus(1, [7, 3, 5]).rest == (5, 7)


def test_no_reservation_is_todays_layout():
    assert split_cpus(0, SIXTEEN) is None
    assert ls_be_cpus(None) == os.cpu_count()
    assert client_processes("auto", 16, 88594) == client_processes("auto", 16, 88594, client_cpus=0) == 4


@pytest.mark.parametrize("n", [16, 17, -1])
def test_a_reservation_leaving_ls_and_be_no_cpu_is_refused_naming_the_option(n):
    with pytest.raises(ValueError, match=f"--client-cpus {n}"):
        split_cpus(n, SIXTEEN)


def test_bench_qos_refuses_it_on_the_command_line_and_keeps_it_otherwise(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        bench_qos_args(["--client-cpus", "2"], range(2), monkeypatch)
    assert "--client-cpus 2" in capsys.readouterr().err
    assert bench_qos_args(["--client-cpus", "2"], SIXTEEN, monkeypatch).cpus == split_cpus(2, SIXTEEN)
    assert bench_qos_args([], SIXTEEN, monkeypatch).cpus is None


def test_loads_servers_and_workers_count_the_cpus_left_to_ls_and_be(tmp_path):
    split = split_cpus(2, SIXTEEN)
    assert ls_be_cpus(split) == 14
    # 50% of 14 CPUs at 100 µs of LS CPU a request, not of 16
    assert load_rates({50: 100e-6}, ls_be_cpus(split)) == {50: pytest.approx(70_000)}
    bench = Bench(tree=SpawnRecorder(), fs=None, ncpu=ls_be_cpus(split), ls_kind=None, antagonist="cpu",
                  be_memory=14 << 20, seconds=1, warmup=1, drain=1, realtime_client=False, koordd_config=None,
                  koordd_command=[], cpus=split)
    start_antagonist(bench, SETUPS[0], "cpu", tmp_path / "be.counters", tmp_path, {})
    assert len(bench.tree.spawned) == 14 and {child for child, _ in bench.tree.spawned} == {BE}
    assert {argv[argv.index("--memory") + 1] for _, argv in bench.tree.spawned} == {str(1 << 20)}
    assert bench.host_ncpu == 16 and bench.client_cpus == 2       # the CPU meter's /proc/stat spans all 16
    assert cpus_record(bench) == {"node_cpus": 16, "ls_be_cpus": 14, "client": "0-1", "ls_be": "2-15"}
    bench.cpus, bench.ncpu = None, 16
    assert cpus_record(bench) == {"node_cpus": 16, "ls_be_cpus": 16, "client": None, "ls_be": None}


class SpawnRecorder:
    def __init__(self):
        self.spawned = []

    def spawn(self, child, argv, **popen):
        self.spawned.append((child, argv))
        return None


def test_auto_gives_the_client_at_most_an_engine_per_reserved_cpu():
    # 77k one-key gets/s (15% of 14 CPUs) would ask for 4 engines: two reserved CPUs hold two
    assert client_processes("auto", 14, 77_500, client_cpus=2) == 2
    assert client_processes("auto", 14, 13966, client_cores=9.0, client_cpus=2) == 2
    assert client_processes("auto", 14, 13966, client_cores=0.86, client_cpus=1) == 1
    assert client_processes("auto", 12, 100_000, client_cpus=4) == 4            # beyond a quarter of 12: its own
    assert client_processes("auto", 14, 10, client_cpus=2) == 1
    assert client_processes("5", 14, 10, client_cpus=2) == 5                    # as asked


def test_the_report_says_where_the_client_ran():
    line = cpus_line(split_cpus(2, SIXTEEN), 16)
    assert "client on CPUs 0-1, LS and BE on 2-15" in line and "--client-cpus 2" in line
    assert "LS and BE's 14 only" in line
    assert cpus_line(split_cpus(1, range(2)), 2).startswith("CPUs: client on CPU 0, LS and BE on 1 ")
    assert cpus_line(None, 2) == "CPUs: the client, LS, BE and koordd share all 2 (no --client-cpus)"


def test_the_report_gives_the_affinity_the_kernel_had():
    run = {"ls": None, "cpu": {"other": 0.1}, "setup": "be-alone", "reclaim_scanned": 0,
           "affinity": {"ls": "2-15", "be": "2-15", "client": "0-1"}}
    notes = trust_notes([run])
    assert any("client 0-1" in n and "ls 2-15" in n and "be 2-15" in n for n in notes)


def test_the_report_says_how_long_requests_waited_in_the_client_which_the_kernel_cannot_see():
    ls = {"p99": 0.65, "answered": 1000, "send_lag_p99": 0.0002, "scheduling": "SCHED_FIFO", "unfinished": 0,
          "errors": 0, "count": 1000, "socket_wait_p99": 0.48, "socket_wait_max": 0.9}
    run = {"ls": ls, "sensor": {"p99": 0.015, "count": 700, "crowded": 630}, "cpu": {"other": 0.1},
           "setup": "be-idle", "load": 70, "reclaim_scanned": 0}
    notes = trust_notes([run])
    assert any("waited in the client" in n and "median 480.00 ms" in n and "the longest 900 ms" in n for n in notes)
    table = sensor_table([run])
    # ... and the share of the responses the kernel saw sent on a full socket (koordd's app_socket_full)
    assert "| 70% | be-idle | 650.00 | 15.00 | 0.02 | 480.00 | 90.0% | 700 of 1000 answered |" in table, table
    # a run from before the client noted it (or the program counted crowded sockets): no line, dashes
    del ls["socket_wait_p99"], ls["socket_wait_max"], run["sensor"]["crowded"]
    assert not any("waited in the client" in n for n in trust_notes([run]))
    assert "| 0.02 | - | - | 700 of" in sensor_table([run])


def affinity_of_child(**popen) -> list[int]:
    code = "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))"
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                     **popen).stdout)


def test_the_client_and_everything_else_the_benchmark_starts_land_on_their_cpus():
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: nothing to split")
    split = split_cpus(1, allowed)
    with on_cpus(split.rest):
        assert affinity_of_child() == list(split.rest)                              # servers, BE, koordd
        assert affinity_of_child(preexec_fn=client_preexec(split.client)) == [allowed[0]]     # the client
    assert sorted(os.sched_getaffinity(0)) == allowed                               # bench-qos put back
    with on_cpus(None):
        assert affinity_of_child(preexec_fn=client_preexec(None)) == allowed          # 0: all share all


def test_the_proof_reserves_an_eighth_of_the_node_and_none_under_8_cpus():
    assert [proof.client_cpus_for(n) for n in (1, 2, 7, 8, 15, 16, 32)] == [0, 0, 0, 1, 1, 2, 4]
    for c in proof.plan("default", is_quick=False, ncpu=16):
        assert c.argv()[-2:] == ["--client-cpus", "2"]
    for c in proof.plan("default", is_quick=True, ncpu=2):          # the 2-CPU dry run as before
        assert "--client-cpus" not in c.argv()
    assert "--client-cpus 2: the client on CPUs 0-1, LS and BE on 2-15 of 16" in proof.client_cpus_words(16)
    assert "none reserved on 2 CPUs" in proof.client_cpus_words(2)


def test_the_16_cpu_plan_is_a_valid_bench_qos_command_there(monkeypatch):
    for c in proof.plan("all", is_quick=False, ncpu=16):
        args = bench_qos_args(c.argv(), SIXTEEN, monkeypatch)
        assert args.cpus.client == (0, 1) and args.frontier


def test_the_proof_report_says_the_reservation():
    md = proof.summary([], False, 1.0, "16 CPUs", proof.client_cpus_words(16))
    assert "- client CPUs: --client-cpus 2" in md
