"""Fixtures of every test: fake cgroup trees (koordtest/fakes/cgroup.py; `tree` runs a test once per layout),
every decide() checked against its needs() (koordtest/needs.py), no BPF outside tests/kernel, an owner lock
of the test's own, no hold of the host's /dev/cpu_dma_latency in unit tests."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordtest.fakes.cgroup import LAYOUTS, FakeCgroups
from koordtest.needs import reads_only_what_it_needs


@pytest.fixture(params=LAYOUTS)
def tree(request, tmp_path) -> FakeCgroups:
    """A fake tree with be.slice/job, once per layout: v2, v1, hybrid, v1-comount."""
    return FakeCgroups(tmp_path, request.param).add("be.slice/job")


# --- every decide() reads only the sample fields and sections its loop's needs() names --------------

@pytest.fixture(autouse=True)
def decide_reads_only_what_it_needs(monkeypatch):
    """The sensors read only what the enabled loops' needs() name (every other field stays None, every
    other section is absent), so a loop that reads one it does not name would see nothing on a real
    host. Every decide() in every test runs on a snapshot that notes what is read, and the test fails
    on a field or section needs() left out."""
    from koordd.runtime.docs import shipped_loops
    for cls in shipped_loops().values():
        monkeypatch.setattr(cls, "decide", reads_only_what_it_needs(cls))


TESTS = Path(__file__).resolve().parent


def tier(request) -> str:
    """The tier a test is in: "kernel" (tests/kernel), "system" (tests/system) or "unit" (tests/unit). By the
    folder under tests/, not by a name anywhere in the path (tests/unit/kernel holds unit tests)."""
    path = Path(str(request.node.fspath)).resolve()
    return path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else "unit"


# --- unit tests load no BPF program into the host's kernel --------------------------------------

@pytest.fixture(autouse=True)
def no_bpf_outside_kernel_tests(request, monkeypatch):
    """The run-queue sensor koordd's registry makes reads schedstat in unit tests (doctor starts every
    sensor to see which work): loading the real BPF program is for tests/kernel, on purpose."""
    if tier(request) != "kernel":
        from koordd.kernel import libbpf
        from koordd.sensors import runq
        monkeypatch.setattr(runq, "DEFAULT_SOURCES", (runq.SCHEDSTAT,))

        def refuse(self, path, *args, **kwargs):
            raise libbpf.BpfError(f"{path}: unit tests load no BPF program (fake the loader; tests/kernel load)")
        monkeypatch.setattr(libbpf.BpfObject, "__init__", refuse)


# The config owner check (koordd/core/trust.py) is tested in tests/unit/test_security.py; elsewhere tests load
# configs from a checkout whose owner they do not choose. Inherited by the koordd processes they start.
os.environ.setdefault("KOORDD_TEST_SKIP_CONFIG_OWNER_CHECK", "1")


# One koordd per host (koordd/act/owner.py): each test's koordd, in-process or started as a process, locks a
# file of the test's own, so tests running side by side (and a koordd service on the host) do not refuse
# each other. The tests of the lock itself choose their file. The VM's system tests drive the koordd service
# and koordctl beside it: they use the host's own lock, as an operator's would.
@pytest.fixture(autouse=True)
def owner_lock_of_the_test(request, tmp_path_factory, monkeypatch):
    from koordd.act.owner import TEST_ENV
    if tier(request) == "system":
        monkeypatch.delenv(TEST_ENV, raising=False)
        return
    monkeypatch.setenv(TEST_ENV, str(tmp_path_factory.mktemp("owner") / "owner.lock"))


# --- unit tests hold no request on the host's /dev/cpu_dma_latency ---------------------------------

@pytest.fixture(autouse=True)
def no_host_pm_qos_in_unit_tests(request, tmp_path_factory, monkeypatch):
    """koordd's PM QoS backend (koordd/backends/pm_qos.py) holds the host's CPU latency request: in unit
    tests, in-process or in a koordd they start, it finds no device (a path in the test's own folder that a
    test may create) unless the test gives it one. tests/kernel hold the real device, on purpose."""
    from koordd.kernel.pm_qos import TEST_ENV as PM_QOS_ENV
    if tier(request) == "unit":
        monkeypatch.setenv(PM_QOS_ENV, str(tmp_path_factory.mktemp("pm_qos") / "cpu_dma_latency"))
    else:
        monkeypatch.delenv(PM_QOS_ENV, raising=False)
