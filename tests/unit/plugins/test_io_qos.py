"""io_qos: the io.max / io.weight text (koordd/core/blkio.py), naming disks (block_devices sensor and
BlockDevices.resolve), the loop's decisions on hand-built snapshots, and the knobs through the real
actuator on fake trees (v2 io.*, v1 blkio.*), with per-device restore and LS protection."""
from __future__ import annotations

import errno
import os

import pytest

from koordtest.fakes.cgroup import FakeCgroups
from koordd.act.actuator import Actuator
from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal
from koordd.act.protect import harm
from koordd.backends import cgroup_knobs as cgroup_backend
from koordd.backends.cgroup_knobs import KNOBS, CgroupBackend, probe_io
from koordd.core import blkio
from koordd.core.backend import InvalidValue
from koordd.core.blkio import BLOCK_DEVICES, BlockDevices
from koordd.core.config import ConfigError, loop_options, make_settings, parse_config
from koordd.core.decisions import APPLIED, LEFT, REFUSED, RESTORED
from koordd.core.kubelet import KubeletRule
from koordd.core.catalogue import load_registry
from koordd.core.snapshot import CgroupSample, NodeSample, Pressure, PressureStat, Snapshot
from koordd.kernel.cgroupfs import CgroupFS
from koordd.kernel.host_probe import Host
from koordd_plugins.io_qos import IoQos, State
from koordd.sensors.blockdev import BlockDeviceSensor, parse_mountinfo, read_devices

ALL = frozenset(KNOBS)
DISKS = BlockDevices(disks={"8:0": "8:0", "8:1": "8:0", "8:16": "8:16", "253:0": "253:0"},
                     names={"/dev/sda": "8:0", "/dev/sda1": "8:1", "/dev/sdb": "8:16", "/dev/dm-0": "253:0",
                            "/dev/mapper/vg-data": "253:0"},
                     mounts={"/": "8:1", "/var/lib/containerd": "253:0", "/proc": "0:21", "/data": "8:16"})


# --- the canonical text ------------------------------------------------------------------------------

def test_io_max_canonical_form_sorts_devices_and_names_every_field():
    text = "8:16 wbps=1048576\n8:0 rbps=10M riops=100 wbps=max"
    assert blkio.normalize_io_max(text) == ("8:0 rbps=10485760 wbps=max riops=100 wiops=max\n"
                                            "8:16 rbps=max wbps=1048576 riops=max wiops=max")
    assert blkio.normalize_io_max("") == ""
    # Idempotent: a reading of koordd's own value is that value.
    once = blkio.normalize_io_max(text)
    assert blkio.normalize_io_max(once) == once


@pytest.mark.parametrize("text, error", [
    ("8:0 rbps=0", "rbps must be at least 1"),
    ("8:0 riops=10K", "riops must be a positive integer or max"),
    ("8:0 rbps=-5", "rbps must be a positive integer or a size"),
    ("8:0 speed=5", "expected rbps/wbps/riops/wiops"),
    ("8:0 rbps=1 rbps=2", "rbps given twice"),
    ("sda rbps=1", "not a device number"),
    ("8:0 rbps=1\n8:0 wbps=2", "named twice"),
    ("8:0 rbps=" + "9" * 400, "past the kernel's 64-bit limit"),
])
def test_io_max_bad_values_say_what_is_wrong(text, error):
    with pytest.raises(ValueError, match=error):
        blkio.normalize_io_max(text)
    with pytest.raises(InvalidValue, match="io.max"):
        KNOBS["io.max"].normalize(text)


def test_scope_keeps_only_the_wanted_devices_and_names_missing_ones_unlimited():
    current = "8:16 rbps=5 wbps=max riops=max wiops=max"
    assert blkio.scope(current, "8:0 wbps=1") == "8:0 rbps=max wbps=max riops=max wiops=max"
    assert blkio.scope(current + "\n8:0 wbps=7", "8:0 wbps=1") == "8:0 rbps=max wbps=7 riops=max wiops=max"


@pytest.mark.parametrize("new, original, tighter", [
    ("8:0 wbps=10", "8:0 wbps=max", True),
    ("8:0 wbps=10", "8:0 wbps=20", True),
    ("8:0 wbps=30", "8:0 wbps=20", False),
    ("8:0 wbps=max", "8:0 wbps=20", False),
    ("8:16 riops=5", "", True),                   # a device the original does not name had no limit
    ("garbled", "8:0 wbps=1", True),              # not comparable: not writable on protected work
])
def test_tighter(new, original, tighter):
    assert blkio.tighter(new, original) is tighter
    assert (harm(KNOBS["io.max"], new, original) == "cap the IO of") is tighter


@pytest.mark.parametrize("text, canonical", [("200", "default 200"), ("default 50\n8:0 10", "default 50"),
                                             (" default 1 ", "default 1")])
def test_io_weight_is_the_default_line(text, canonical):
    assert KNOBS["io.weight"].normalize(text) == canonical


@pytest.mark.parametrize("text", ["0", "10001", "default", "heavy", "8:0 10"])
def test_io_weight_bad_values(text):
    with pytest.raises(InvalidValue, match="io.weight"):
        KNOBS["io.weight"].normalize(text)


# --- naming disks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, disk", [
    ("8:0", "8:0"), ("8:1", "8:0"),                                  # a partition stands for its disk
    ("/dev/sda1", "8:0"), ("/dev/mapper/vg-data", "253:0"), ("/dev/sdb", "8:16"),
    ("/", "8:0"), ("/var/lib/containerd/io.containerd.snapshotter", "253:0"), ("/var/lib/other", "8:0"),
    ("/data", "8:16"), ("//data/./x", "8:16"), ("/database", "8:0"),  # /database is not below /data
])
def test_resolve(spec, disk):
    assert DISKS.resolve(spec)[0] == disk


@pytest.mark.parametrize("spec, why", [("9:9", "no block device 9:9"), ("/proc/self", "no block device"),
                                       ("sda", "neither MAJ:MIN"), ("/a/../b", "\"..\"")])
def test_resolve_failures_say_why(spec, why):
    disk, reason = DISKS.resolve(spec)
    assert disk is None and why in reason


def test_mountinfo_parsing_unescapes_and_the_last_mount_wins():
    text = ("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
            "30 22 253:0 / /var/lib/my\\040disk rw - xfs /dev/dm-0 rw\n"
            "31 22 8:16 / /var/lib/my\\040disk rw - xfs /dev/sdb rw\n")
    assert parse_mountinfo(text) == {"/": "8:1", "/var/lib/my disk": "8:16"}


def fake_sys(tmp_path):
    """/sys/dev/block links into /sys/devices, as the kernel lays them out: sda with partition sda1, dm-0."""
    sys_root = tmp_path / "sys"
    devices = sys_root / "devices/virtual/block"
    for rel, dev in (("sda", "8:0"), ("sda/sda1", "8:1"), ("dm-0", "253:0")):
        (devices / rel).mkdir(parents=True)
        (devices / rel / "dev").write_text(dev + "\n")
    (devices / "sda/sda1/partition").write_text("1\n")
    (devices / "dm-0/dm").mkdir()
    (devices / "dm-0/dm/name").write_text("vg-data\n")
    links = sys_root / "dev/block"
    links.mkdir(parents=True)
    for rel, dev in (("sda", "8:0"), ("sda/sda1", "8:1"), ("dm-0", "253:0")):
        os.symlink(devices / rel, links / dev)
    return sys_root


def test_sensor_reads_devices_and_mounts_and_rereads_when_devices_change(tmp_path):
    sys_root = fake_sys(tmp_path)
    disks, names = read_devices(str(sys_root / "dev/block"))
    assert disks == {"8:0": "8:0", "8:1": "8:0", "253:0": "253:0"}
    assert names == {"/dev/sda": "8:0", "/dev/sda1": "8:1", "/dev/dm-0": "253:0", "/dev/mapper/vg-data": "253:0"}
    proc = tmp_path / "proc/self"
    proc.mkdir(parents=True)
    (proc / "mountinfo").write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    sensor = BlockDeviceSensor(str(sys_root), str(tmp_path / "proc"))
    sensor.start()
    try:
        first = sensor.sample()
        assert first.resolve("/srv")[0] == "8:0"
        assert sensor.sample() is first                   # nothing changed: nothing read again
        (sys_root / "devices/virtual/block/sdb").mkdir()
        (sys_root / "devices/virtual/block/sdb/dev").write_text("8:16\n")
        os.symlink(sys_root / "devices/virtual/block/sdb", sys_root / "dev/block/8:16")
        assert sensor.sample().resolve("/dev/sdb")[0] == "8:16"
    finally:
        sensor.stop()


def test_sensor_unavailable_without_sysfs(tmp_path):
    from koordd.sensors.contract import SensorUnavailable
    with pytest.raises(SensorUnavailable, match="sysfs"):
        BlockDeviceSensor(str(tmp_path / "nosys"), str(tmp_path)).start()


# --- the loop's decisions ------------------------------------------------------------------------------

def settings(**kw):
    return make_settings(loop_options(IoQos), {"enabled": True, **kw})


def io(some_avg10=0.0, growth=None):
    return PressureStat(Pressure(some_avg10, some_avg10, some_avg10, 0, growth), None)


def snap(*cgroups, held=None, devices=DISKS, supported=ALL, time=1.0):
    return Snapshot(time=time, wall=0.0, node=NodeSample(cpu_count=2, cpu_used=1.0),
                    cgroups={c.path: c for c in cgroups}, supported=supported, held=held or {},
                    sections={BLOCK_DEVICES: devices} if devices is not None else {})


def triples(actions):
    return [(a.target, a.knob, a.value) for a in actions]


BE, LS = CgroupSample("be.slice", "BE"), CgroupSample("ls.slice", "LS")
WBPS = "8:0 rbps=max wbps={} riops=max wiops=max"


def test_off_by_default_and_writes_nothing_without_options():
    s = make_settings(loop_options(IoQos), {})
    assert not s.enabled
    assert IoQos.decide(snap(BE, LS), settings(), State()) == []
    assert IoQos.writes(settings()) == frozenset() and IoQos.needs(settings()) == frozenset()


def test_static_weights_and_limits():
    s = settings(devices=["/dev/sda1", "/data", "/proc"], be_io_max="wbps=10M riops=500", ls_io_weight=500,
                 be_io_weight=10)
    actions = IoQos.decide(snap(BE, LS), s, State())
    limits = "rbps=max wbps=10485760 riops=500 wiops=max"
    assert triples(actions) == [("ls.slice", "io.weight", "default 500"), ("be.slice", "io.weight", "default 10"),
                                ("be.slice", "io.max", f"8:0 {limits}\n8:16 {limits}")]
    reason = actions[-1].reason
    assert reason["devices"] == {"/dev/sda1": "8:0", "/data": "8:16"} and "/proc" in reason["unresolved"]
    assert IoQos.writes(s) == {("BE", "io.max"), ("BE", "io.weight"), ("LS", "io.weight"), ("LSR", "io.weight"),
                               ("LSE", "io.weight")}
    assert IoQos.needs(s) == {BLOCK_DEVICES}


def test_knobs_the_host_lacks_are_not_asked_for():
    s = settings(devices=["8:0"], be_io_max="wbps=1M", ls_io_weight=500)
    assert IoQos.decide(snap(BE, LS, supported=ALL - {"io.max", "io.weight"}), s, State()) == []


def test_no_sensor_section_or_no_disk_holds():
    s = settings(devices=["8:0"], be_io_max="wbps=1M")
    assert IoQos.decide(snap(BE, devices=None), s, State()) == []
    assert IoQos.decide(snap(BE), settings(devices=["9:9"], be_io_max="wbps=1M"), State()) == []


def test_a_be_root_holding_ls_work_gets_no_limit():
    nested = CgroupSample("be.slice/ls-job", "LS")
    actions = IoQos.decide(snap(BE, nested), settings(devices=["8:0"], be_io_max="wbps=1M"), State())
    assert triples(actions) == [("be.slice", "io.max", None)]


def test_changed_disks_give_back_the_old_hold_first():
    s = settings(devices=["/dev/sdb"], be_io_max="wbps=1M")
    actions = IoQos.decide(snap(BE, held={("be.slice", "io.max"): WBPS.format("max")}), s, State())
    assert triples(actions) == [("be.slice", "io.max", None),
                                ("be.slice", "io.max", "8:16 rbps=max wbps=1048576 riops=max wiops=max")]
    # The same disks: no restore, just the value.
    same = IoQos.decide(snap(BE, held={("be.slice", "io.max"): "8:16 rbps=max wbps=max riops=max wiops=max"}),
                        s, State())
    assert [a.value is None for a in same] == [False]


def dynamic(**kw):
    return settings(devices=["8:0"], be_io_max="wbps=100M rbps=max", dynamic=True, **kw)


def wbps_of(actions):
    [a] = [a for a in actions if a.knob == "io.max"]
    return blkio.parse_io_max(a.value)["8:0"]["wbps"]


def test_dynamic_cuts_at_once_and_raises_in_steps():
    s, state = dynamic(), State()
    ceiling = 100 << 20
    calm = CgroupSample("ls.slice", "LS", io_pressure=io(1.0))
    assert wbps_of(IoQos.decide(snap(BE, calm), s, state)) == ceiling          # at the ceiling already
    hot = CgroupSample("ls.slice", "LS", io_pressure=io(30.0))
    cut = IoQos.decide(snap(BE, hot), s, state)
    assert wbps_of(cut) == ceiling // 2 and cut[0].reason["knee"] == 1.0        # cut 50% at once
    assert wbps_of(IoQos.decide(snap(BE, hot), s, state)) == ceiling // 4
    for _ in range(20):
        IoQos.decide(snap(BE, hot), s, state)
    assert wbps_of(IoQos.decide(snap(BE, hot), s, state)) == round(ceiling * 0.05)   # the floor
    assert state.knee == 0.05                                                  # cut at the floor: the knee
    between = CgroupSample("ls.slice", "LS", io_pressure=io(9.5))               # under target, over 90% of it
    assert wbps_of(IoQos.decide(snap(BE, between), s, state)) == round(ceiling * 0.05)
    # Three calm rounds in a row (calm_rounds) before a raise; at the knee, it adds 10% of the limit.
    for _ in range(2):
        held = IoQos.decide(snap(BE, calm), s, state)
        assert wbps_of(held) == round(ceiling * 0.05) and held[0].reason["step"].startswith("hold (calm")
    raised = IoQos.decide(snap(BE, calm), s, state)
    assert wbps_of(raised) == round(ceiling * 0.055) and raised[0].reason["step"] == "raise"
    # Above the knee, calm: each raise adds the distance already come above it (at least 10%): it speeds up.
    fractions = []
    for _ in range(30):
        IoQos.decide(snap(BE, calm), s, state)
        fractions.append(state.fraction)
    steps = [b - a for a, b in zip(fractions, fractions[1:]) if b > a][:-1]     # the last one stops at 1.0
    assert steps == sorted(steps) and steps[-1] > 2 * steps[0]
    assert wbps_of(IoQos.decide(snap(BE, calm), s, state)) == ceiling
    # rbps was max in be_io_max: it stays max whatever the fraction.
    assert blkio.parse_io_max(IoQos.decide(snap(BE, hot), s, state)[0].value)["8:0"]["rbps"] is None


def test_dynamic_a_calm_round_right_after_a_cut_does_not_raise():
    s, state = dynamic(), State()
    hot = CgroupSample("ls.slice", "LS", io_pressure=io(30.0))
    calm = CgroupSample("ls.slice", "LS", io_pressure=io(1.0))
    between = CgroupSample("ls.slice", "LS", io_pressure=io(9.5))
    IoQos.decide(snap(BE, hot), s, state)
    assert state.fraction == 0.5 and state.knee == 1.0
    after = IoQos.decide(snap(BE, calm), s, state)
    assert state.fraction == 0.5 and after[0].reason["step"] == "hold (calm, fewer than calm_rounds)"
    assert after[0].reason["calm"] == 1
    # A round that is not calm starts the count again.
    IoQos.decide(snap(BE, between), s, state)
    IoQos.decide(snap(BE, calm), s, state)
    IoQos.decide(snap(BE, calm), s, state)
    assert state.fraction == 0.5
    # The third calm round in a row raises: half the way up to the knee (the limit that was cut).
    assert IoQos.decide(snap(BE, calm), s, state)[0].reason["step"] == "raise" and state.fraction == 0.75
    # calm_rounds = 1: the next calm round raises, as the old dynamic mode did.
    quick = State(fraction=0.5, knee=1.0)
    IoQos.decide(snap(BE, calm), dynamic(calm_rounds=1), quick)
    assert quick.fraction == 0.75


@pytest.mark.parametrize("fraction, knee, raised", [
    (0.25, 1.0, 0.625),       # far below the knee: half the way up to it
    (0.95, 1.0, 1.045),       # just under it: at least 10% of the limit, past the knee in one small step
    (0.4, 0.4, 0.44),         # at the knee: 10% of the limit
    (0.6, 0.4, 0.8),          # above it, calm: the distance already come above it
    (0.5, None, 0.55),        # no knee known: 10% of the limit
])
def test_dynamic_raise_sizes(fraction, knee, raised):
    from koordd_plugins.io_qos import raised as raise_of
    assert raise_of(fraction, knee, 0.10) == pytest.approx(raised)


def simulate(s, state, pressure_of, rounds):
    """(fraction, step) per round against a simulated LS whose io.pressure is pressure_of(BE's limit)."""
    out = []
    for _ in range(rounds):
        ls = CgroupSample("ls.slice", "LS", io_pressure=io(pressure_of(state.fraction)))
        step = IoQos.decide(snap(BE, ls), s, state)[0].reason["step"]
        out.append((state.fraction, step.split(":")[0].split(" ")[0]))
    return out


@pytest.mark.parametrize("calm_rounds", [1, 3, 5])
def test_dynamic_settles_under_the_knee_of_a_graded_ls(calm_rounds):
    # LS's pressure: 4% alone, growing with BE's limit: over the 10% target above 40% of be_io_max, over
    # 90% of it (no raise) above a third.
    s, state = dynamic(calm_rounds=calm_rounds), State()
    rounds = simulate(s, state, lambda f: 4 + 15 * f, 200)
    cuts = [i for i, (_, step) in enumerate(rounds) if step == "cut"]
    assert cuts and cuts[-1] < 20                      # it finds the knee, then cuts no more
    settled = {round(f, 6) for f, _ in rounds[30:]}
    assert len(settled) == 1 and 1 / 3 <= settled.pop() <= 0.4    # just under the knee, still


@pytest.mark.parametrize("calm_rounds, most", [(3, 0.03), (1, 0.06)])
def test_dynamic_converges_under_a_sharp_knee_and_probes_it_rarely(calm_rounds, most):
    # LS's pressure jumps over the target above 30% of be_io_max (no band in between to hold in).
    # The old dynamic mode alternated cut and raise every other round (here: a harmful round in two); now
    # the limit stays under the knee and tries it again (one harmful round, then a cut) less and less often.
    rounds = simulate(dynamic(calm_rounds=calm_rounds), State(), lambda f: 30.0 if f > 0.3 else 4.0, 400)
    late = rounds[100:]
    harmful = [f for f, _ in late if f > 0.3]
    assert 0 < len(harmful) <= most * len(late)       # it still tries, rarely
    assert all(0.15 <= f <= 0.35 for f, _ in late)
    steps = [step for _, step in late if step in ("cut", "raise")]
    alternations = sum(a == "cut" and b == "raise" and c == "cut" for a, b, c in zip(steps, steps[1:], steps[2:]))
    assert alternations == 0


def test_dynamic_finds_a_higher_knee_again():
    # The knee was at 30%; LS now tolerates BE up to 80%: the limit climbs past the old knee, faster and
    # faster, and settles under the new one.
    s, state = dynamic(), State()
    simulate(s, state, lambda f: 30.0 if f > 0.3 else 4.0, 200)
    rounds = simulate(s, state, lambda f: 30.0 if f > 0.8 else 4.0, 200)
    # At most 16 * calm_rounds rounds before it tries past the old knee, then a few raises.
    first_over = next(i for i, (f, _) in enumerate(rounds) if f > 0.8)
    assert first_over < 16 * 3 + 20
    assert all(0.4 <= f <= 0.9 for f, _ in rounds[first_over + 20:])


def test_dynamic_prefers_the_rounds_own_pressure_to_avg10():
    s, state = dynamic(), State()
    # avg10 still shows an old stall, but over the last round LS waited 2% of the time: raise, do not cut.
    state.fraction, state.calm = 0.5, 2
    ls = CgroupSample("ls.slice", "LS", io_pressure=io(40.0, growth=20_000.0))
    actions = IoQos.decide(snap(BE, ls), s, state)
    assert actions[0].reason["ls_io_pressure"] == 2.0 and actions[0].reason["step"] == "raise"


def test_dynamic_holds_without_any_ls_signal():
    s, state = dynamic(), State()
    state.fraction, state.calm = 0.3, 2
    actions = IoQos.decide(snap(BE, LS), s, state)
    assert state.fraction == 0.3 and actions[0].reason["step"] == "hold (no LS signal)" and state.calm == 0


def test_problems():
    assert "devices" in IoQos.problems(settings(be_io_max="wbps=1M"))
    assert "dynamic" in IoQos.problems(settings(devices=["8:0"], dynamic=True))
    assert "dynamic" in IoQos.problems(settings(devices=["8:0"], be_io_max="wbps=max", dynamic=True))
    assert IoQos.problems(dynamic()) == {}


def test_config_checks_the_options(tmp_path):
    registry = load_registry()
    ok = parse_config('[loops.io_qos]\nenabled = true\ndevices = ["/dev/vda", "254:00"]\nbe_io_max = "wbps=1M"\n',
                      tmp_path / "k.toml", registry)
    s = ok.loops["io_qos"]
    assert s.devices == ("/dev/vda", "254:0") and s.be_io_max == "rbps=max wbps=1048576 riops=max wiops=max"
    for bad, word in (('devices = ["vda"]', "neither"), ('be_io_max = "wbps=0"', "at least 1"),
                      ('be_io_max = "bps=1"', "expected"), ("ls_io_weight = 20000", "ls_io_weight"),
                      ('be_io_max = "wbps=1M"', "devices")):        # a limit with no disk to put it on
        with pytest.raises(ConfigError, match=word):
            parse_config(f'[loops.io_qos]\nenabled = true\n{bad}\n', tmp_path / "k.toml", registry)


# --- the knobs on fake trees, through the actuator ------------------------------------------------------

def kernel_merges_io_lines(monkeypatch):
    """What the kernel does and a fake tree cannot: a write to io.max or a v1 throttle file changes the
    line of the device it names (a line with no limit left disappears), not the whole file."""
    real_write = CgroupFS.write

    def write(self, controller, cgroup, filename, text):
        if filename != "io.max" and not filename.startswith("blkio.throttle."):
            return real_write(self, controller, cgroup, filename, text)
        path = os.path.join(self._dir(controller, cgroup), filename)
        dev, _, rest = text.strip().partition(" ")
        lines = {}
        if os.path.exists(path):
            for line in open(path).read().splitlines():
                if line.strip():
                    d, _, r = line.partition(" ")
                    lines[d] = r
        if filename == "io.max":
            merged = blkio.parse_limits(lines.get(dev, ""))
            merged.update({k: v for k, v in blkio.parse_limits(rest).items() if f"{k}=" in rest})
            lines[dev] = blkio.format_line(dev, merged).partition(" ")[2]
            if all(v is None for v in merged.values()):
                del lines[dev]
        elif rest == "0":
            lines.pop(dev, None)
        else:
            lines[dev] = rest
        real_write(self, controller, cgroup, filename, "".join(f"{d} {r}\n" for d, r in lines.items()))
    monkeypatch.setattr(CgroupFS, "write", write)


def io_tree(tmp_path, mode, monkeypatch):
    """A fake tree with io files: v2 io.max/io.weight, or a v1 blkio hierarchy with throttle and BFQ files."""
    tree = FakeCgroups(tmp_path, mode).add("be").add("ls")
    blk = tmp_path / "sysblock"
    for dev in ("8:0", "8:16"):
        (blk / dev).mkdir(parents=True)
    monkeypatch.setattr(cgroup_backend, "SYS_DEV_BLOCK", str(blk))
    kernel_merges_io_lines(monkeypatch)
    if mode == "v2":
        for cg in ("be", "ls"):
            tree.set(cg, "io", "io.max", "")
            tree.set(cg, "io", "io.weight", "default 100\n")
    else:
        root = tree.root / "blkio"
        for d in (root, root / "be", root / "ls"):
            d.mkdir(exist_ok=True)
            for name in ("cgroup.procs", "tasks", *cgroup_backend.V1_THROTTLE.values()):
                (d / name).write_text("")
            if d != root:
                (d / "blkio.bfq.weight").write_text("100\n")
    return tree


def actuator(tree, tmp_path):
    state = tmp_path / "state"
    return Actuator(tree.fs, RestoreJournal(state), DecisionLog(state, send=lambda message, **fields: None))


@pytest.mark.parametrize("mode", ["v2", "hybrid"])
def test_io_max_round_trip_and_per_device_restore(tmp_path, monkeypatch, mode):
    tree = io_tree(tmp_path, mode, monkeypatch)
    backend = CgroupBackend(tree.fs)
    v2 = mode == "v2"
    # Someone else limits 8:16 first: that line is not koordd's.
    backend.write("be", "io.max", "8:16 riops=77")
    assert backend.read("be", "io.max") == "8:16 rbps=max wbps=max riops=77 wiops=max"
    if not v2:
        assert tree.read("be", "blkio", "blkio.throttle.read_iops_device") == "8:16 77\n"
    act = actuator(tree, tmp_path)
    wanted = "8:0 rbps=2097152 wbps=1048576 riops=max wiops=300"
    [d] = act.apply("io_qos", [IoQosAction("be", wanted)])
    assert (d.outcome, d.old, d.new) == (APPLIED, "8:0 rbps=max wbps=max riops=max wiops=max", wanted)
    assert backend.read("be", "io.max") == wanted + "\n8:16 rbps=max wbps=max riops=77 wiops=max"
    if not v2:     # spread over the four throttle files
        assert tree.read("be", "blkio", "blkio.throttle.read_bps_device") == "8:0 2097152\n"
        assert tree.read("be", "blkio", "blkio.throttle.write_bps_device") == "8:0 1048576\n"
        assert tree.read("be", "blkio", "blkio.throttle.write_iops_device") == "8:0 300\n"
    [held] = act.journal.entries()
    assert held.original == "8:0 rbps=max wbps=max riops=max wiops=max"
    assert act.apply("io_qos", [IoQosAction("be", wanted)]) == []          # in place: nothing to do
    # Meanwhile the other agent changes its own device: not koordd's, so neither a conflict nor restored.
    backend.write("be", "io.max", "8:16 riops=88")
    [r] = act.restore_all("stop")
    assert r.outcome == RESTORED
    assert backend.read("be", "io.max") == "8:16 rbps=max wbps=max riops=88 wiops=max"
    assert act.journal.entries() == []


def test_io_max_changed_by_someone_else_on_koordds_device_is_left(tmp_path, monkeypatch):
    tree = io_tree(tmp_path, "v2", monkeypatch)
    act = actuator(tree, tmp_path)
    act.apply("io_qos", [IoQosAction("be", "8:0 wbps=1000")])
    CgroupBackend(tree.fs).write("be", "io.max", "8:0 wbps=5")
    [r] = act.restore_all("stop")
    assert r.outcome == LEFT and tree.read("be", "io", "io.max").startswith("8:0 rbps=max wbps=5")


@pytest.mark.parametrize("mode", ["v2", "hybrid"])
def test_io_weight_round_trip(tmp_path, monkeypatch, mode):
    tree = io_tree(tmp_path, mode, monkeypatch)
    act = actuator(tree, tmp_path)
    [d] = act.apply("io_qos", [IoQosAction("ls", "default 800", knob="io.weight")])
    assert (d.outcome, d.old, d.new) == (APPLIED, "default 100", "default 800")
    raw = tree.read("ls", "io" if mode == "v2" else "blkio", "io.weight" if mode == "v2" else "blkio.bfq.weight")
    assert raw.strip() == ("default 800" if mode == "v2" else "800")
    act.restore_all("stop")
    assert CgroupBackend(tree.fs).read("ls", "io.weight") == "default 100"


def test_v1_bfq_weight_above_1000_is_refused_naming_the_knob(tmp_path, monkeypatch):
    tree = io_tree(tmp_path, "hybrid", monkeypatch)
    [d] = actuator(tree, tmp_path).apply("io_qos", [IoQosAction("ls", "default 5000", knob="io.weight")])
    assert d.outcome == REFUSED and "blkio.bfq.weight" in d.error and "1000" in d.error


def test_io_max_on_a_device_the_host_lacks_or_a_partition_is_refused(tmp_path, monkeypatch):
    tree = io_tree(tmp_path, "v2", monkeypatch)
    part = tmp_path / "sysblock2"
    (part / "8:0").mkdir(parents=True)
    (part / "8:1").mkdir()
    (part / "8:1/partition").write_text("1\n")
    monkeypatch.setattr(cgroup_backend, "SYS_DEV_BLOCK", str(part))
    act = actuator(tree, tmp_path)
    [d] = act.apply("io_qos", [IoQosAction("be", "9:9 wbps=1")])
    assert d.outcome == REFUSED and "no block device 9:9" in d.error
    [d] = act.apply("io_qos", [IoQosAction("be", "8:1 wbps=1")])
    assert d.outcome == REFUSED and "8:1 is a partition" in d.error


def test_a_failed_second_line_keeps_what_landed_in_the_journal(tmp_path, monkeypatch):
    tree = io_tree(tmp_path, "v2", monkeypatch)
    merged_write = CgroupFS.write

    def write(self, controller, cgroup, filename, text):
        if text.startswith("8:16"):
            raise OSError(errno.ENODEV, "No such device")
        return merged_write(self, controller, cgroup, filename, text)
    monkeypatch.setattr(CgroupFS, "write", write)
    act = actuator(tree, tmp_path)
    [d] = act.apply("io_qos", [IoQosAction("be", "8:0 wbps=1000\n8:16 wbps=1000")])
    assert d.outcome == REFUSED
    [held] = act.journal.entries()     # 8:0 landed: the hold stays, so a restore gives it back
    assert held.original == "8:0 rbps=max wbps=max riops=max wiops=max\n8:16 rbps=max wbps=max riops=max wiops=max"
    monkeypatch.setattr(CgroupFS, "write", merged_write)
    act.restore_all("stop")
    assert tree.read("be", "io", "io.max") == ""


def test_the_guard_refuses_a_lower_io_max_on_ls_and_lets_weights_through(tmp_path, monkeypatch):
    tree = io_tree(tmp_path, "v2", monkeypatch)
    act = actuator(tree, tmp_path)
    act.protect({"ls": "LS", "be": "BE"})
    [d] = act.apply("io_qos", [IoQosAction("ls", "8:0 wbps=1000")])
    assert d.outcome == REFUSED and "protected: would cap the IO of ls" in d.error
    [d] = act.apply("io_qos", [IoQosAction("ls", "default 500", knob="io.weight")])
    assert d.outcome == APPLIED


def test_kubelet_owns_the_containers_io_knobs_not_the_qos_cgroups():
    rule = KubeletRule()
    container = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-ab.scope"
    for knob in ("io.max", "io.weight"):
        assert "blockio" in rule.refusal(container, knob)
        assert rule.refusal("kubepods.slice/kubepods-besteffort.slice", knob) is None


def test_doctor_line_on_a_hybrid_fake(tmp_path):
    tree = FakeCgroups(tmp_path, "hybrid").add("be")
    blk = tree.root / "blkio"
    (blk / "be").mkdir(parents=True)
    for d in (blk, blk / "be"):
        (d / "cgroup.procs").write_text("")
    (blk / "blkio.throttle.read_bps_device").write_text("")
    (blk / "be/blkio.bfq.weight").write_text("100\n")
    sys_root = tmp_path / "sys"
    (sys_root / "block/vda/queue").mkdir(parents=True)
    (sys_root / "block/vda/queue/scheduler").write_text("[none] mq-deadline kyber bfq\n")
    ok, detail = probe_io(Host(cgroup=tree.root, sys=sys_root))
    assert ok and "blkio.throttle: yes" in detail and "blkio.bfq.weight: yes" in detail
    assert "BFQ schedules no disk" in detail and "vda=none" in detail and "iocost: no (cgroup v2 only)" in detail


def IoQosAction(target, value, knob="io.max"):
    from koordd.core.loop import Action
    return Action(target, knob, value, {}, "test")


# --- iocost: the root's io.cost.qos / io.cost.model, per disk ---------------------------------------------

from koordd.backends.iocost import IocostBackend  # noqa: E402
from koordd.core.loop import NODE  # noqa: E402


@pytest.mark.parametrize("knob, text, canonical", [
    ("io.cost.qos", "rpct=95 enable=1", "enable=1 rpct=95.00"),
    ("io.cost.qos", "enable=1 ctrl=user rpct=95.00 rlat=5000 wpct=95.00 wlat=5000 min=50.00 max=150.00",
     "enable=1 ctrl=user rpct=95.00 rlat=5000 wpct=95.00 wlat=5000 min=50.00 max=150.00"),
    ("io.cost.model", "ctrl=user model=linear rbps=174019176 rseqiops=41708 rrandiops=370 wbps=178075866 "
                      "wseqiops=42705 wrandiops=378", None),
])
def test_iocost_canonical(knob, text, canonical):
    assert blkio.normalize_iocost(knob, text) == (canonical or text)


@pytest.mark.parametrize("knob, text, error", [("io.cost.qos", "enable=2", "enable must be 0 or 1"),
                                               ("io.cost.qos", "speed=1", "expected enable/"),
                                               ("io.cost.model", "model=quadratic", "model must be linear"),
                                               ("io.cost.qos", "", "no parameters")])
def test_iocost_bad_values_name_the_knob(knob, text, error):
    with pytest.raises(ValueError, match=f"{knob}: {error}" if error != "no parameters" else error):
        blkio.normalize_iocost(knob, text)


def iocost_host(tmp_path, monkeypatch, mode="v2"):
    tree = FakeCgroups(tmp_path, mode)
    blk = tmp_path / "sysblock"
    for dev in ("8:0", "8:16"):
        (blk / dev).mkdir(parents=True)
    if mode == "v2":
        tree.set("", None, "io.cost.qos", "8:16 enable=1 ctrl=user rpct=90.00 rlat=250 wpct=90.00 wlat=250 "
                                          "min=1.00 max=10000.00\n")
        tree.set("", None, "io.cost.model", "")
    backend = IocostBackend(tree.fs, str(blk))

    def kernel_writes(self, target, knob, value):    # the kernel's rule: a write changes the keys it names
        path = os.path.join(self.root, knob)
        lines = {ln.split()[0]: dict(t.split("=") for t in ln.split()[1:])
                 for ln in open(path).read().splitlines() if ln.strip()}
        defaults = {"io.cost.qos": "enable=0 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 "
                                   "max=10000.00", "io.cost.model": "ctrl=auto model=linear rbps=1 rseqiops=1 "
                                   "rrandiops=1 wbps=1 wseqiops=1 wrandiops=1"}[knob]
        line = lines.setdefault(target, dict(t.split("=") for t in defaults.split()))
        line.update(dict(t.split("=") for t in value.split()))
        open(path, "w").write("".join(f"{d} {' '.join(f'{k}={v}' for k, v in kv.items())}\n"
                                      for d, kv in lines.items()))
    monkeypatch.setattr(IocostBackend, "write", kernel_writes)
    return tree, backend


def test_iocost_backend_writes_its_keys_and_restores_only_them(tmp_path, monkeypatch):
    tree, backend = iocost_host(tmp_path, monkeypatch)
    assert backend.probe() == {}
    assert backend.read("8:0", "io.cost.qos") == "enable=0 ctrl=auto"        # never configured: off
    state = tmp_path / "state"
    act = Actuator(backend_set(tree, backend), RestoreJournal(state), DecisionLog(state, send=lambda m, **f: None))
    [d] = act.apply("io_qos", [IoQosAction("8:0", "enable=1 ctrl=auto", knob="io.cost.qos")])
    assert (d.outcome, d.old, d.new) == (APPLIED, "enable=0 ctrl=auto", "enable=1 ctrl=auto")
    assert act.apply("io_qos", [IoQosAction("8:0", "enable=1 ctrl=auto", knob="io.cost.qos")]) == []
    assert backend.read("8:0", "io.cost.qos").startswith("enable=1 ctrl=auto rpct=")
    [r] = act.restore_all("stop")
    assert r.outcome == RESTORED and backend.read("8:0", "io.cost.qos").startswith("enable=0 ctrl=auto")
    # The other disk's line, someone else's, is as it was.
    assert "8:16 enable=1 ctrl=user rpct=90.00" in tree.read("", None, "io.cost.qos")


def test_iocost_is_unsupported_without_v2_io_or_a_partition(tmp_path, monkeypatch):
    _, backend = iocost_host(tmp_path, monkeypatch, mode="hybrid")
    assert "cgroup v2" in backend.probe()["io.cost.qos"]
    tree, backend = iocost_host(tmp_path / "b", monkeypatch)
    (tmp_path / "b/sysblock/8:1").mkdir()
    (tmp_path / "b/sysblock/8:1/partition").write_text("1")
    with pytest.raises(InvalidValue, match="partition"):
        backend.validate("8:1", "io.cost.qos", "enable=1")
    with pytest.raises(InvalidValue, match="no block device 9:9"):
        backend.validate("9:9", "io.cost.qos", "enable=1")
    (tree.root / "io.cost.qos").unlink()
    assert "CONFIG_BLK_CGROUP_IOCOST" in backend.probe()["io.cost.model"]


def backend_set(tree, *extra):
    from koordd.backends.host_backends import builtin_backends
    from koordd.core.backend import Backends
    return Backends([b for b in builtin_backends(tree.fs) if b.kind != "iocost"] + list(extra))


IOCOST = ALL | {"io.cost.qos", "io.cost.model"}


def test_loop_iocost_per_disk_and_given_back_when_turned_off():
    s = settings(devices=["/dev/sda1", "/dev/sdb"], iocost_qos="enable=1 ctrl=auto", iocost_model="ctrl=auto")
    assert IoQos.writes(s) == {(NODE, "io.cost.qos"), (NODE, "io.cost.model")}
    actions = IoQos.decide(snap(BE, supported=IOCOST), s, State())
    assert triples(actions) == [("8:0", "io.cost.qos", "enable=1 ctrl=auto"),
                                ("8:16", "io.cost.qos", "enable=1 ctrl=auto"),
                                ("8:0", "io.cost.model", "ctrl=auto"), ("8:16", "io.cost.model", "ctrl=auto")]
    held = {("8:0", "io.cost.qos"): "enable=0 ctrl=auto", ("8:16", "io.cost.qos"): "enable=0 ctrl=auto"}
    off = IoQos.decide(snap(BE, held=held, supported=IOCOST), settings(devices=["/dev/sdb"], iocost_qos="enable=1"),
                       State())
    assert triples(off) == [("8:0", "io.cost.qos", None), ("8:16", "io.cost.qos", "enable=1")]
    assert triples(IoQos.decide(snap(BE, held=held), settings(), State())) == [("8:0", "io.cost.qos", None),
                                                                                ("8:16", "io.cost.qos", None)]
    # Without iocost on this host: nothing asked.
    assert IoQos.decide(snap(BE, supported=ALL), s, State()) == []
