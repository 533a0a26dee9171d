"""net_class on a host with only cgroup v1 for it, on the real kernel: a net_cls hierarchy of the
test's own (mounted in a temp dir, unmounted at the end), a cpu cgroup of its own as the target in
koordd's primary hierarchy, and NetClassBackend forced to use that net_cls hierarchy. A sender in
the cgroup, started before koordd classes it, has its UDP datagrams queued in HTB class 1:20 once
the backend has moved it, and in the default class again after restoring "none", which also removes
the net_cls cgroup.

Needs root, a v1 cpu hierarchy, net_cls in the kernel, network namespaces, libbpf and pyroute2;
skipped otherwise (failed where scripts/test set the host up for eBPF).
"""
from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from koordd.kernel.cgroupfs import CgroupFS, detect_layout

from koordtest.kernel import CGROUP_ROOT
from .test_netclass_kernel import BE, HOST, OTHER, class_bytes, link, opened_classifier, veth  # noqa: F401 - fixtures

pytestmark = pytest.mark.kernel

TARGET = f"koordd-test-{os.getpid()}-netcls"


@pytest.fixture
def net_cls_mount():
    """A net_cls (v1) hierarchy mounted at a temp dir; its child cgroups removed and it unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root (mounts a net_cls hierarchy)")
    point = Path(tempfile.mkdtemp(prefix="koordd-netcls-"))
    done = subprocess.run(["mount", "-t", "cgroup", "-o", "net_cls", "none", str(point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        point.rmdir()
        pytest.skip(f"cannot mount a net_cls hierarchy: {done.stderr.strip()}")
    try:
        yield point
    finally:
        for d in sorted((p for p in point.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            d.rmdir()
        subprocess.run(["umount", str(point)], check=True)
        point.rmdir()


@pytest.fixture
def cpu_cgroup():
    """This test's cgroup in the v1 cpu hierarchy (the primary one on a v1 or hybrid host)."""
    cpu = CGROUP_ROOT / "cpu"
    if not (cpu / "cpu.cfs_quota_us").is_file():
        pytest.skip("no v1 cpu hierarchy at /sys/fs/cgroup/cpu")
    d = cpu / TARGET
    d.mkdir()
    try:
        yield d
    finally:
        d.rmdir()


class Sender:
    """A child process in `cgroup` (v1 `cgroup.procs`) with a UDP socket to the peer, sending on command."""

    def __init__(self, cgroup: Path):
        self.commands_r, self.commands = os.pipe()
        self.replies, self.replies_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            self._child(cgroup)
        os.close(self.commands_r)
        os.close(self.replies_w)
        assert os.read(self.replies, 1) == b"r"        # in its cgroup, socket open

    def _child(self, cgroup: Path) -> None:
        try:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                os.write(self.replies_w, b"r")
                while (n := int.from_bytes(os.read(self.commands_r, 4), "little")) > 0:
                    for _ in range(n):
                        s.sendto(b"x" * 1000, ("10.77.0.2", 9))
                    os.write(self.replies_w, b"s")
        finally:
            os._exit(0)

    def send(self, packets: int) -> None:
        os.write(self.commands, packets.to_bytes(4, "little"))
        assert os.read(self.replies, 1) == b"s"

    def stop(self) -> None:
        try:
            os.write(self.commands, (0).to_bytes(4, "little"))
        except BrokenPipeError:
            pass                                        # it is gone already
        os.waitpid(self.pid, 0)
        os.close(self.commands)
        os.close(self.replies)


def test_a_v1_cgroups_datagrams_go_to_its_net_cls_class_and_back(link, net_cls_mount, cpu_cgroup):
    from koordd.backends.netclass import ClassifierBackend, NetClassBackend
    ipr, index = link
    shared = opened_classifier()
    fs = CgroupFS(detect_layout(CGROUP_ROOT))
    backend = NetClassBackend(fs, shared, net_cls=net_cls_mount)
    ClassifierBackend(shared).write(HOST, "tc.classifier", "attached")
    sender = Sender(cpu_cgroup)
    try:
        assert backend.read(TARGET, "net_class") == "none"
        before = class_bytes(ipr, index)
        backend.write(TARGET, "net_class", "be")
        assert (net_cls_mount / TARGET / "net_cls.classid").read_text() == f"{0x10020}\n"
        assert (net_cls_mount / TARGET / "cgroup.procs").read_text().split() == [str(sender.pid)]
        assert backend.read(TARGET, "net_class") == "be"
        sender.send(60)
        # IPv4 + UDP headers and the Ethernet header: 42 bytes a datagram.
        after = class_bytes(ipr, index)
        assert after[BE] - before[BE] == 60 * 1042
        backend.write(TARGET, "net_class", "none")
        assert not (net_cls_mount / TARGET).exists() and backend.read(TARGET, "net_class") == "none"
        assert str(sender.pid) in (net_cls_mount / "cgroup.procs").read_text().split()
        sender.send(20)
        final = class_bytes(ipr, index)
        assert final[BE] == after[BE] and final[OTHER] - after[OTHER] >= 20 * 1042
    finally:
        sender.stop()
        shared.close()
