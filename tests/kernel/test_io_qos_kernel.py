"""On the real kernel: io_qos's knobs and loop on this host's block IO controller. On a hybrid host
(v1 blkio) io.max is spread over blkio.throttle.{read,write}_{bps,iops}_device and io.weight is
blkio.bfq.weight; on a pure v2 host with io enabled at the root, the io.* files.

The disks are loop devices over files in /tmp made for the test (losetup; detached at teardown), so no
real disk's limits are touched: one is koordd's, the other carries a limit "someone else" set on the
BE cgroup, which must come through koordd's writes and restore untouched. A direct-IO read in the BE
cgroup shows the throttle at work (2 MiB at rbps 1 MiB/s takes about 2 s). Needs root and losetup.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from koordd.backends.cgroup_knobs import KNOBS, V1_THROTTLE
from koordd.core import blkio
from koordd.kernel.cgroupfs import CgroupFS, detect_layout
from koordd.sensors.blockdev import BlockDeviceSensor
from koordtest.kernel import CGROUP_ROOT, CgroupEnv, created, detect_host, unique_name, wait_for

pytestmark = pytest.mark.kernel
LOOP = "io_qos"


@pytest.fixture
def cgroups():
    """ls and be of our own, in the blkio hierarchy too (hybrid) or with io passed down (v2)."""
    mode, roles = detect_host()
    if mode == "hybrid":
        blk = CGROUP_ROOT / "blkio"
        if not (blk / "blkio.throttle.read_bps_device").is_file():
            pytest.skip("no v1 blkio hierarchy with blkio.throttle.* (CONFIG_BLK_DEV_THROTTLING)")
        roles = {**roles, "blkio": blk}
    elif "io" not in (CGROUP_ROOT / "cgroup.subtree_control").read_text().split():
        pytest.skip("needs the io controller enabled in /sys/fs/cgroup/cgroup.subtree_control")
    env = CgroupEnv(mode, roles, unique_name("io"))
    if mode == "v2":
        env.pass_down = ("cpu", "io")
    yield from created(env)


@pytest.fixture
def loops(tmp_path_factory):
    """Two loop devices over files of 8 MiB under /tmp: [(path, "MAJ:MIN")]; detached afterwards."""
    if shutil.which("losetup") is None:
        pytest.skip("needs losetup (util-linux)")
    made = []
    try:
        for i in range(2):
            backing = tmp_path_factory.mktemp("ioqos") / f"disk{i}.img"
            with open(backing, "wb") as f:
                f.write(os.urandom(1 << 20) * 8)
            try:
                dev = subprocess.run(["losetup", "-f", "--show", str(backing)], check=True, capture_output=True,
                                     text=True).stdout.strip()
            except subprocess.CalledProcessError as e:
                pytest.skip(f"losetup failed: {e.stderr.strip()}")
            made.append((dev, Path(f"/sys/block/{Path(dev).name}/dev").read_text().strip()))
        yield made
    finally:
        for dev, _ in made:
            subprocess.run(["losetup", "-d", dev], check=False)


def fs_of() -> CgroupFS:
    return CgroupFS(detect_layout(CGROUP_ROOT))


def raw(cgroups, child: str, filename: str) -> str:
    return (cgroups.dir("blkio" if cgroups.mode == "hybrid" else "cpu", child) / filename).read_text()


def foreign_limit(cgroups, dev: str) -> str:
    """Someone else's limit on `dev` for be: riops 7777."""
    fs = fs_of()
    KNOBS["io.max"].write(fs, cgroups.cgroup("be"), f"{dev} riops=7777")
    return f"{dev} rbps=max wbps=max riops=7777 wiops=max"


def test_knob_round_trip_on_a_loop_device(cgroups, loops):
    fs, be = fs_of(), cgroups.cgroup("be")
    (_, mine), (_, other) = loops
    knob = KNOBS["io.max"]
    theirs = foreign_limit(cgroups, other)
    assert knob.read(fs, be) == theirs
    value = f"{mine} rbps=1048576 wbps=2097152 riops=300 wiops=max"
    knob.write(fs, be, knob.normalize(value))
    assert knob.read(fs, be) == blkio.normalize_io_max(value + "\n" + theirs)
    if cgroups.mode == "hybrid":       # the v1 form: one line per field, in its own file
        assert f"{mine} 1048576" in raw(cgroups, "be", V1_THROTTLE["rbps"])
        assert f"{mine} 2097152" in raw(cgroups, "be", V1_THROTTLE["wbps"])
        assert f"{mine} 300" in raw(cgroups, "be", V1_THROTTLE["riops"])
        assert mine not in raw(cgroups, "be", V1_THROTTLE["wiops"])
    # Putting back the device's "no limit" line removes it and leaves the other device's.
    knob.write(fs, be, blkio.scope("", value))
    assert knob.read(fs, be) == theirs
    # The kernel refuses 0 limits the way koordd says: koordd refuses them first.
    with pytest.raises(ValueError, match="at least 1"):
        knob.normalize(f"{mine} rbps=0")


def test_io_weight_round_trip(cgroups):
    fs, ls = fs_of(), cgroups.cgroup("ls")
    knob = KNOBS["io.weight"]
    if not knob.supported(fs) or knob.present(fs) is False:
        pytest.skip("no io.weight / blkio.bfq.weight on this kernel (BFQ not loaded, no iocost)")
    try:
        before = knob.read(fs, ls)
    except FileNotFoundError:
        pytest.skip("this cgroup has no io.weight / blkio.bfq.weight file")
    knob.write(fs, ls, "default 700")
    assert knob.read(fs, ls) == "default 700"
    knob.write(fs, ls, before)
    assert knob.read(fs, ls) == before


def test_block_device_sensor_names_the_loop_devices(loops):
    sensor = BlockDeviceSensor()
    sensor.start()
    try:
        section = sensor.sample()
        for dev, majmin in loops:
            assert section.resolve(dev) == (majmin, "device")
            assert section.resolve(majmin)[0] == majmin
        root_dev = os.stat("/").st_dev
        disk, why = section.resolve("/")
        if os.major(root_dev):           # the root filesystem is on a block device (not overlay or tmpfs)
            assert disk is not None, why
    finally:
        sensor.stop()


def direct_read_seconds(cgroups, child: str, dev: str, mib: int = 2) -> float:
    t0 = time.monotonic()
    p = cgroups.spawn(child, ["dd", f"if={dev}", "of=/dev/null", "bs=64k", f"count={mib * 16}", "iflag=direct"])
    assert p.wait(timeout=60) == 0
    return time.monotonic() - t0


def config(koordd, dev: str) -> Path:
    extra = ("[loops.io_qos]\nenabled = true\ninterval = \"500ms\"\n"
             f"devices = [\"{dev}\"]\nbe_io_max = \"rbps=1M wiops=100\"\nls_io_weight = 500\nbe_io_weight = 50\n")
    return koordd.write_config(enabled=False, extra=extra)


def io_decisions(koordd, outcome: str | None = None) -> list[dict]:
    return [d for d in koordd.decisions() if d.get("loop") == LOOP and (outcome is None or d["outcome"] == outcome)]


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL and restart"])
def test_loop_limits_be_only_and_restores_per_device(cgroups, koordd, loops, capsys, how):
    fs, be, ls = fs_of(), cgroups.cgroup("be"), cgroups.cgroup("ls")
    (dev, mine), (_, other) = loops
    theirs = foreign_limit(cgroups, other)
    weights = KNOBS["io.weight"].supported(fs) and KNOBS["io.weight"].present(fs) is not False
    before = {cg: KNOBS["io.weight"].read(fs, cg) for cg in (be, ls)} if weights else {}
    free = direct_read_seconds(cgroups, "be", dev)

    proc = koordd.start(config(koordd, dev))
    wanted = f"{mine} rbps=1048576 wbps=max riops=max wiops=100"
    assert wait_for(lambda: KNOBS["io.max"].read(fs, be) == blkio.normalize_io_max(wanted + "\n" + theirs), 20), \
        f"{KNOBS['io.max'].read(fs, be)!r}\n{io_decisions(koordd)}\n{koordd.log_text()}"
    applied = {(d["cgroup"], d["knob"]): (d["old"], d["new"]) for d in io_decisions(koordd, "applied")}
    assert applied[(be, "io.max")] == (blkio.scope("", wanted), wanted)       # scoped: the other disk is not in it
    assert KNOBS["io.max"].read(fs, ls) == "", "LS got an IO limit"
    if weights:
        assert wait_for(lambda: KNOBS["io.weight"].read(fs, ls) == "default 500"
                        and KNOBS["io.weight"].read(fs, be) == "default 50", 10), io_decisions(koordd)
    limited = direct_read_seconds(cgroups, "be", dev)
    ls_time = direct_read_seconds(cgroups, "ls", dev)
    with capsys.disabled():
        print(f"\n[kernel] io_qos ({cgroups.mode}): 2 MiB direct read in BE {free:.2f}s without koordd, "
              f"{limited:.2f}s under rbps=1M; in LS {ls_time:.2f}s")
    assert limited >= 1.0 and limited > 3 * free, (free, limited)

    if how == "SIGTERM":
        assert koordd.stop(proc) == 0, koordd.log_text()
    else:
        koordd.stop(proc, signal.SIGKILL)
        assert KNOBS["io.max"].read(fs, be) != theirs          # a kill restores nothing ...
        proc = koordd.start(koordd.write_config(enabled=False))  # ... the next start does (loop off)
        assert wait_for(lambda: KNOBS["io.max"].read(fs, be) == theirs, 20), koordd.log_text()
        assert koordd.stop(proc) == 0, koordd.log_text()
    # Device by device: koordd's disk unlimited again, the other disk's limit as its owner left it.
    assert KNOBS["io.max"].read(fs, be) == theirs
    if weights:
        assert {cg: KNOBS["io.weight"].read(fs, cg) for cg in (be, ls)} == before
    assert not koordd.held(), koordd.held()
