"""The strict config loader: literal TOML in, checked Config or exact error lines out."""
from __future__ import annotations

import copy
import dataclasses
import pickle
import textwrap

import pytest

from koordd.core.config import (CLASS_NAMES, ClassRule, ConfigError, DAEMON_OPTIONS, Settings, load_config,
    locate_keys, loop_options, make_settings, parse_config)
from koordd.core.health import DEFAULT_HEALTH, HealthTargets
from koordd.core.loop import Loop
from koordd.core.options import COMMON_LOOP_OPTIONS, Duration, Option
from koordd.core.slo import SloTarget


# Fake loops: the real plugins are not imported here.
class Suppress:
    options = (
        Option("threshold_percent", int, 65, "BE CPU ceiling", min=0, max=100),
        Option("policy", str, "cfs_quota", "how to suppress", choices=("cfs_quota", "cpuset")),
    )

    @staticmethod
    def writes(s):
        return frozenset({("BE", "cpu.max" if s.policy == "cfs_quota" else "cpuset.cpus")})


class MemQos:
    options = (Option("ratio", float, 0.9, "memory.high / limit", min=0, max=1),)

    @staticmethod
    def writes(s):
        return frozenset({("BE", "memory.high"), ("LS", "memory.high")})


class Quota:
    options = ()

    @staticmethod
    def writes(s):
        return frozenset({("BE", "cpu.max"), ("BE", "memory.high")})


REGISTRY = {"be_suppress": Suppress, "mem_qos": MemQos, "quota": Quota}


def parse(text):
    return parse_config(textwrap.dedent(text), "koordd.toml", REGISTRY)


def declared(config, what, cgroup):
    """What the rule of `cgroup` declares (its "health" or "slo"), or None."""
    rule = config.rule_for(cgroup)
    return getattr(rule, what) if rule else None


def errors(text):
    with pytest.raises(ConfigError) as ei:
        parse(text)
    return ei.value.errors


FULL = """\
[daemon]
cgroup_root = ""
state_dir = "/var/lib/koordd"
dry_run = true
log_level = "debug"

[[classes]]   # first match wins
name = "LS"
cgroups = ["kubepods.slice/*"]

[[classes]]
name = "BE"
cgroups = [
    "/be.slice/",
    "kubepods.slice/kubepods-besteffort.slice",
]

[loops.be_suppress]
enabled = true
interval = "500ms"
threshold_percent = 80
policy = "cpuset"
"""


def test_valid_file_round_trip():
    c = parse(FULL)
    assert str(c.path) == "koordd.toml" and isinstance(c.daemon, Settings)
    assert c.daemon.as_dict() == {"cgroup_root": "", "state_dir": "/var/lib/koordd", "dry_run": True,
                                  "log_level": "debug", "kubelet_owned": "respect", "kubelet_override": (),
                                  "kubelet_cgroups": ("kubepods.slice", "kubepods")}
    assert c.classes == (ClassRule("LS", ("kubepods.slice/*",)),
                         ClassRule("BE", ("be.slice", "kubepods.slice/kubepods-besteffort.slice")))
    s = c.loops["be_suppress"]
    assert s.as_dict() == {"enabled": True, "interval": 0.5, "threshold_percent": 80, "policy": "cpuset"}
    assert isinstance(s.interval, Duration)
    assert parse(FULL) == c  # reload of an unchanged file compares equal


def test_empty_file_gives_defaults_for_everything():
    c = parse("")
    assert c.daemon == make_settings(DAEMON_OPTIONS, {})
    assert c.daemon.state_dir == "/var/lib/koordd" and c.daemon.log_level == "info"
    assert c.classes == ()
    assert set(c.loops) == set(REGISTRY)


def test_absent_loops_get_defaults_and_are_disabled():
    c = parse(FULL)
    assert c.loops["mem_qos"].as_dict() == {"enabled": False, "interval": 1.0, "ratio": 0.9}
    assert c.loops["quota"] == make_settings(COMMON_LOOP_OPTIONS, {})
    with pytest.raises(TypeError):
        c.loops["quota"] = c.loops["mem_qos"]  # read-only mapping


@pytest.mark.parametrize("text, want", [
    # unknown names, with a suggestion when one is close
    ("[deamon]\n", ["koordd.toml:1: deamon: unknown table (did you mean 'daemon'?)"]),
    ("x = 1\n[daemon]\n", ["koordd.toml:1: x: unknown table (known: daemon, classes, loops, metrics, reclaimable, report)"]),
    ("[daemon]\nlog_levl = 'info'\n",
     ["koordd.toml:2: daemon.log_levl: unknown key (did you mean 'log_level'?)"]),
    ("[loops.be_supress]\nenabled = true\n",
     ["koordd.toml:1: loops.be_supress: unknown loop (did you mean 'be_suppress'?)"]),
    ("[loops.zzz]\n", ["koordd.toml:1: loops.zzz: unknown loop (known: be_suppress, mem_qos, quota)"]),
    ("[loops.be_suppress]\nenabled = true\n\ntreshold_percent = 70\n",
     ["koordd.toml:4: loops.be_suppress.treshold_percent: unknown key (did you mean 'threshold_percent'?)"]),
    ("[[classes]]\nname = 'BE'\ncgroups = ['be.slice']\npriority = 1\n",
     ["koordd.toml:4: classes[0].priority: unknown key (known: name, cgroups, health, slo)"]),
    # wrong types and ranges, at the key's own line
    ("[loops.be_suppress]\nenabled = true\nthreshold_percent = 150\n",
     ["koordd.toml:3: loops.be_suppress.threshold_percent: must be <= 100, got 150"]),
    ("[loops.be_suppress]\nthreshold_percent = 6.5\n",
     ["koordd.toml:2: loops.be_suppress.threshold_percent: expected an integer, got a number"]),
    ("[loops.be_suppress]\npolicy = 'freeze'\n",
     ["koordd.toml:2: loops.be_suppress.policy: must be one of 'cfs_quota', 'cpuset', got 'freeze'"]),
    ("[daemon]\ndry_run = 'yes'\n", ["koordd.toml:2: daemon.dry_run: expected true or false, got a string"]),
    ("[daemon]\nlog_level = 'trace'\n",
     ["koordd.toml:2: daemon.log_level: must be one of 'debug', 'info', 'warning', 'error', got 'trace'"]),
    ("[daemon]\nstate_dir = 'var/lib'\n",
     ["koordd.toml:2: daemon.state_dir: must be an absolute path, got 'var/lib'"]),
    ("[daemon]\ncgroup_root = 'sys/fs/cgroup'\n",
     ["koordd.toml:2: daemon.cgroup_root: must be an absolute path or \"\", got 'sys/fs/cgroup'"]),
    # wrong shapes
    ("daemon = 1\n", ["koordd.toml:1: daemon: expected a table, got an integer"]),
    ("[classes]\nname = 'BE'\n",
     ["koordd.toml:1: classes: expected an array of tables ([[classes]]), got a table"]),
    ("[loops]\nbe_suppress = true\n", ["koordd.toml:2: loops.be_suppress: expected a table, got a boolean"]),
    ("[[loops.be_suppress]]\n", ["koordd.toml:1: loops.be_suppress: expected a table, got an array"]),
    # class rules
    ("[[classes]]\nname = 'BE'\ncgroups = ['be.slice']\n[[classes]]\nname = 'be'\ncgroups = ['x']\n",
     ["koordd.toml:5: classes[1].name: must be one of SYSTEM, LSE, LSR, LS, BE, got 'be'"]),
    ("[[classes]]\nname = 'BE'\ncgroups = ['be.slice/../x']\n",
     ["koordd.toml:3: classes[0].cgroups[0]: cgroup path may not contain '..': 'be.slice/../x'"]),
    ("[[classes]]\nname = 'BE'\ncgroups = []\n",
     ["koordd.toml:3: classes[0].cgroups: expected a non-empty array of cgroup path patterns, got an empty array"]),
    ("[[classes]]\nname = 'BE'\ncgroups = 'be.slice'\n",
     ["koordd.toml:3: classes[0].cgroups: expected a non-empty array of cgroup path patterns, got a string"]),
    ("[[classes]]\nname = 'BE'\ncgroups = [\n  'a',\n  1,\n]\n",
     ["koordd.toml:3: classes[0].cgroups[1]: expected a string, got an integer"]),
    ("[[classes]]\nname = 'BE'\ncgroups = ['/']\n",
     ["koordd.toml:3: classes[0].cgroups[0]: pattern names the root cgroup: '/'"]),
    ("[[classes]]\ncgroups = ['a']\n",
     ["koordd.toml:1: classes[0]: missing 'name' (one of SYSTEM, LSE, LSR, LS, BE)"]),
    ("[[classes]]\n\n[[classes]]\nname = 'LS'\n",
     ["koordd.toml:1: classes[0]: missing 'name' (one of SYSTEM, LSE, LSR, LS, BE)",
      "koordd.toml:1: classes[0]: missing 'cgroups' (an array of cgroup path patterns)",
      "koordd.toml:3: classes[1]: missing 'cgroups' (an array of cgroup path patterns)"]),
    # health targets: LS classes only, checked like any option, at the key's own line
    ("[[classes]]\nname = 'BE'\ncgroups = ['be.slice']\n[classes.health]\nrunq_p99 = '5ms'\n",
     ["koordd.toml:4: classes[0].health: only LS, LSR and LSE classes declare health targets, not BE"]),
    ("[[classes]]\nname = 'LS'\ncgroups = ['ls.slice']\n[classes.health]\nrunq_p99 = 'soon'\nrunq_p90 = '1ms'\n",
     ["koordd.toml:5: classes[0].health.runq_p99: not a duration: 'soon' (use e.g. \"500ms\", \"2s\", \"1m\")",
      "koordd.toml:6: classes[0].health.runq_p90: unknown key (did you mean 'runq_p99'?)"]),
    ("[[classes]]\nname = 'LS'\ncgroups = ['ls.slice']\nhealth = 3\n",
     ["koordd.toml:4: classes[0].health: expected a table, got an integer"]),
    # an SLO: LS classes only, latency_p99 required, every key checked at its own line
    ("[[classes]]\nname = 'LS'\ncgroups = ['ls.slice']\n[classes.slo]\nlatency_p999 = '20ms'\n",
     ["koordd.toml:4: classes[0].slo: missing 'latency_p99' (the response time the class must meet at its 99th "
      "percentile, e.g. \"5ms\")"]),
    ("[[classes]]\nname = 'BE'\ncgroups = ['be.slice']\n[classes.slo]\nlatency_p99 = '5ms'\n",
     ["koordd.toml:4: classes[0].slo: only LS, LSR and LSE classes declare an SLO, not BE"]),
    ("[[classes]]\nname = 'SYSTEM'\ncgroups = ['system.slice']\nslo = { latency_p99 = '5ms' }\n",
     ["koordd.toml:4: classes[0].slo: only LS, LSR and LSE classes declare an SLO, not SYSTEM"]),
    ("[[classes]]\nname = 'LS'\ncgroups = ['ls.slice']\n[classes.slo]\nlatency_p99 = '5ms'\nlatency_p90 = '1ms'\n",
     ["koordd.toml:6: classes[0].slo.latency_p90: unknown key (did you mean 'latency_p99'?)"]),
    ("[[classes]]\nname = 'LS'\ncgroups = ['ls.slice']\n[classes.slo]\nlatency_p99 = '5ms'\n"
     "violation_target = 60\nsource = 'graphite'\n",
     ["koordd.toml:6: classes[0].slo.violation_target: must be <= 50, got 60",
      "koordd.toml:7: classes[0].slo.source: must be one of 'measured', 'prometheus', 'probe', got 'graphite'"]),
    ("[[classes]]\nname = 'LS'\ncgroups = ['ls.slice']\n[classes.slo]\nlatency_p99 = '5ms'\n"
     "violation_target = 0.001\n",
     ["koordd.toml:6: classes[0].slo.violation_target: must be >= 0.01, got 0.001"]),
    ("[[classes]]\nname = 'LS'\ncgroups = ['ls.slice']\n[classes.slo]\nlatency_p99 = '2m'\n",
     ["koordd.toml:5: classes[0].slo.latency_p99: must be <= 60, got 120"]),
    ("[[classes]]\nname = 'LS'\ncgroups = ['ls.slice']\n[classes.slo]\nlatency_p99 = '5ms'\nlatency_p999 = '2ms'\n",
     ["koordd.toml:6: classes[0].slo.latency_p999: must be 0 (none) or at least latency_p99, got 0.002s under "
      "0.005s"]),
    ("[[classes]]\nname = 'LS'\ncgroups = ['ls.slice']\nslo = 'fast'\n",
     ["koordd.toml:4: classes[0].slo: expected a table, got a string"]),
])
def test_errors(text, want):
    assert errors(text) == want


@pytest.mark.parametrize("text, line", [
    ("[daemon]\ndry_run = yes\n[deamon]\n", 2),     # the unknown table is not reported too
    ("[daemon]\nlog_level = 'info\n", 2),
    ("[daemon]\n\nstate_dir = \"\"\"/x\n", 3),        # at end of file: the last line
    ("[daemon]\nx = 1\nx = 2\n", 3),
])
def test_syntax_error_is_the_only_error(text, line):
    out = errors(text)
    # tomllib's wording varies between Python versions; the position format is ours.
    assert len(out) == 1 and out[0].startswith(f"koordd.toml:{line}: ") and "(at line" not in out[0], out


@pytest.mark.parametrize("text, want", [
    # multi-line arrays and strings hide key-looking lines; keys after them keep their lines
    ("[[classes]]\nname = 'BE'\ncgroups = [\n  'log_level = 1',\n  ['x'],\n]\n[daemon]\nlog_level = 3\n",
     ["koordd.toml:3: classes[0].cgroups[1]: expected a string, got an array",
      "koordd.toml:8: daemon.log_level: expected a string, got an integer"]),
    ("[daemon]\nstate_dir = '''\nlog_level = 1\n[loops.be_suppress]\n'''\nlog_level = 3\n",
     ["koordd.toml:2: daemon.state_dir: must be an absolute path, got 'log_level = 1\\n[loops.be_suppress]\\n'",
      "koordd.toml:6: daemon.log_level: expected a string, got an integer"]),
    ('[daemon]\nstate_dir = """/a\\"""\ndry_run = 1"""\nlog_level = 3 # x = [\n',
     ["koordd.toml:4: daemon.log_level: expected a string, got an integer"]),
    ("[daemon]\nstate_dir = \"/a[{\" # [\nlog_level = 3\n",
     ["koordd.toml:3: daemon.log_level: expected a string, got an integer"]),
    # dotted keys, quoted keys and whitespace in headers
    ("daemon.log_level = 3\n", ["koordd.toml:1: daemon.log_level: expected a string, got an integer"]),
    ("[daemon]\n\n  \"log_level\" = 3 # comment\n",
     ["koordd.toml:3: daemon.log_level: expected a string, got an integer"]),
    ("[ 'daemon' ]\nlog_level = 3\n", ["koordd.toml:2: daemon.log_level: expected a string, got an integer"]),
    ("[loops]\nbe_suppress.enabled = true\nquota.enabled = true\n",
     ["koordd.toml:3: loops.quota: loops 'be_suppress' and 'quota' both write knob 'cpu.max' of class BE;"
      " enable only one of them"]),
])
def test_error_lines_survive_tricky_toml(text, want):
    assert errors(text) == want


def test_locate_keys():
    text = textwrap.dedent("""\
        [daemon]
        a.b = 1
        [[classes]]
        name = "BE"
        [[classes]]
        name = "LS"
        [loops."be_suppress"]
        enabled = true
        """)
    assert locate_keys(text) == {
        ("daemon",): 1, ("daemon", "a"): 2, ("daemon", "a", "b"): 2,
        ("classes",): 3, ("classes", 0): 3, ("classes", 0, "name"): 4,
        ("classes", 1): 5, ("classes", 1, "name"): 6,
        ("loops",): 7, ("loops", "be_suppress"): 7, ("loops", "be_suppress", "enabled"): 8,
    }


def test_inline_table_keys_fall_back_to_their_table_line():
    assert errors("[loops]\nbe_suppress = { enabled = true, threshold_percent = 101 }\n") == [
        "koordd.toml:2: loops.be_suppress.threshold_percent: must be <= 100, got 101"]


def test_all_errors_reported_together_in_file_order():
    out = errors("""\
        [loops.be_suppress]
        threshold_percent = -1
        polcy = "cpuset"

        [daemon]
        dry_run = 1
        colour = true

        [[classes]]
        name = "XX"
        cgroups = ["a/../b"]
        """)
    assert out == [
        "koordd.toml:2: loops.be_suppress.threshold_percent: must be >= 0, got -1",
        "koordd.toml:3: loops.be_suppress.polcy: unknown key (did you mean 'policy'?)",
        "koordd.toml:6: daemon.dry_run: expected true or false, got an integer",
        "koordd.toml:7: daemon.colour: unknown key (known: cgroup_root, state_dir, dry_run, log_level, "
        "kubelet_owned, kubelet_override, kubelet_cgroups)",
        "koordd.toml:10: classes[0].name: must be one of SYSTEM, LSE, LSR, LS, BE, got 'XX'",
        "koordd.toml:11: classes[0].cgroups[0]: cgroup path may not contain '..': 'a/../b'",
    ]


def test_config_error_str_is_the_lines():
    err = ConfigError(["a:1: x", "a: y"])
    assert str(err) == "a:1: x\na: y" and err.errors == ["a:1: x", "a: y"]


@pytest.mark.parametrize("value, seconds", [
    ('"500ms"', 0.5), ('"2s"', 2.0), ('"1m"', 60.0), ('"1m30s"', 90.0), ('"1.5s"', 1.5), ("5", 5.0), ("0.25", 0.25),
])
def test_durations(value, seconds):
    s = parse(f"[loops.mem_qos]\ninterval = {value}\n").loops["mem_qos"]
    assert s.interval == pytest.approx(seconds) and isinstance(s.interval, Duration)


@pytest.mark.parametrize("value, message", [
    ('"fast"', "not a duration: 'fast' (use e.g. \"500ms\", \"2s\", \"1m\")"),
    ('"2 sec"', "not a duration: '2 sec' (use e.g. \"500ms\", \"2s\", \"1m\")"),
    ('"-1s"', "not a duration: '-1s' (use e.g. \"500ms\", \"2s\", \"1m\")"),
    ('""', "not a duration: '' (use e.g. \"500ms\", \"2s\", \"1m\")"),
    ('"0s"', "must be >= 0.05, got 0"),
    ('"2h"', "must be <= 3600, got 7200"),
    ("true", 'expected a duration such as "2s", got a boolean'),
])
def test_bad_durations(value, message):
    assert errors(f"[loops.mem_qos]\n\ninterval = {value}\n") == [
        f"koordd.toml:3: loops.mem_qos.interval: {message}"]


@pytest.mark.parametrize("cgroup, cls", [
    ("kubepods.slice/pod1", "LS"),          # glob, one level
    ("/kubepods.slice/pod1/", "LS"),        # slashes ignored
    ("kubepods.slice/kubepods-besteffort.slice", "LS"),  # earlier rule wins over the BE rule
    ("kubepods.slice/pod1/c1", None),       # "*" is one path component only
    ("be.slice", "BE"),
    ("be.slice/job", None),
    ("system.slice/sshd.service", "SYSTEM"),
    ("", None),
])
def test_classify_first_match_wins(cgroup, cls):
    c = parse("""\
        [[classes]]
        name = "SYSTEM"
        cgroups = ["system.slice/*.service"]
        [[classes]]
        name = "LS"
        cgroups = ["kubepods.slice/*"]
        [[classes]]
        name = "BE"
        cgroups = ["be.slice", "kubepods.slice/kubepods-besteffort.slice"]
        """)
    assert c.classify(cgroup) == cls


def test_each_ls_rule_declares_its_own_health_targets_and_the_rest_take_the_defaults():
    c = parse("""\
        [[classes]]
        name = "LS"
        cgroups = ["batch-api.slice"]
        [classes.health]
        runq_p99 = "10ms"
        [[classes]]
        name = "LS"
        cgroups = ["cache.slice"]
        [[classes]]
        name = "LSR"
        cgroups = ["db.slice"]
        health = { runq_p99 = "500us", runq_mean = "100us", cpu_pressure = 5 }
        """)
    assert declared(c, "health", "batch-api.slice") == HealthTargets(10_000.0, DEFAULT_HEALTH.runq_mean_us,
                                                           DEFAULT_HEALTH.cpu_pressure)
    assert declared(c, "health", "cache.slice") is None and declared(c, "health", "nowhere") is None      # the defaults apply
    assert declared(c, "health", "/db.slice/") == HealthTargets(500.0, 100.0, 5.0)
    assert DEFAULT_HEALTH == HealthTargets(2000.0, 500.0, 20.0)


def test_an_ls_rule_may_declare_an_slo_and_the_others_have_none():
    c = parse("""\
        [[classes]]
        name = "LS"
        cgroups = ["cache.slice"]
        [classes.slo]
        latency_p99 = "2ms"
        [[classes]]
        name = "LS"
        cgroups = ["batch-api.slice"]
        [[classes]]
        name = "LSR"
        cgroups = ["db.slice"]
        slo = { latency_p99 = "5ms", latency_p999 = "20ms", source = "measured", violation_target = 5 }
        """)
    assert declared(c, "slo", "cache.slice") == SloTarget(2000.0, 0.0, "measured", 1.0)
    assert declared(c, "slo", "cache.slice").quantile == pytest.approx(0.99) and declared(c, "slo", "cache.slice").section == "app_latency"
    assert declared(c, "slo", "/db.slice/") == SloTarget(5000.0, 20_000.0, "measured", 5.0)
    assert declared(c, "slo", "db.slice").quantile == pytest.approx(0.95)
    assert declared(c, "slo", "batch-api.slice") is None and declared(c, "slo", "nowhere") is None
    assert declared(c, "health", "cache.slice") is None        # an SLO leaves the health targets at their defaults


def test_class_names():
    assert CLASS_NAMES == ("SYSTEM", "LSE", "LSR", "LS", "BE")


def test_ownership_conflict_names_both_loops_class_and_knob():
    assert errors("""\
        [loops.be_suppress]
        enabled = true

        [loops.mem_qos]
        enabled = true

        [loops.quota]
        enabled = true
        """) == [
        "koordd.toml:7: loops.quota: loops 'be_suppress' and 'quota' both write knob 'cpu.max' of class BE;"
        " enable only one of them",
        "koordd.toml:7: loops.quota: loops 'mem_qos' and 'quota' both write knob 'memory.high' of class BE;"
        " enable only one of them",
    ]


@pytest.mark.parametrize("text", [
    # one of them disabled
    "[loops.be_suppress]\nenabled = true\n[loops.quota]\nenabled = false\n",
    "[loops.be_suppress]\n[loops.quota]\nenabled = true\n",
    # the settings decide what is written: cpuset policy leaves cpu.max free
    "[loops.be_suppress]\nenabled = true\npolicy = 'cpuset'\n[loops.quota]\nenabled = true\n",
])
def test_no_ownership_conflict(text):
    parse(text)


def test_settings_value_semantics():
    opts = COMMON_LOOP_OPTIONS + Suppress.options
    a = make_settings(opts, {"enabled": True, "interval": "2s"})
    b = make_settings(opts, {"interval": 2, "enabled": True, "threshold_percent": 65})
    assert a == b and hash(a) == hash(b)
    assert a != make_settings(opts, {"enabled": True})
    assert a != a.as_dict()
    assert a.interval == 2.0 and a.policy == "cfs_quota"
    assert repr(a) == "Settings(enabled=True, interval=2.0, threshold_percent=65, policy='cfs_quota')"
    assert copy.deepcopy(a) == a and pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(AttributeError):
        a.enabled = False
    with pytest.raises(AttributeError):
        del a.enabled
    with pytest.raises(AttributeError, match="no option 'treshold'"):
        a.treshold
    d = a.as_dict()
    d["enabled"] = False
    assert a.enabled is True  # as_dict is a copy


def test_loop_settings_are_a_frozen_dataclass_of_its_options():
    """A loop's settings are fields generated from its declared options, not a bag looked up by name."""
    class Typed(Loop):
        name = "typed"
        options = Suppress.options + (Option("limit", Duration, Duration(2.0), "how long", min=0, max=60),)

    cls = Typed.settings_type()
    assert dataclasses.is_dataclass(cls) and issubclass(cls, Settings)
    assert [f.name for f in dataclasses.fields(cls)] == ["enabled", "interval", "threshold_percent", "policy", "limit"]
    assert {f.name: f.type for f in dataclasses.fields(cls)}["limit"] is Duration
    s = parse_config("[loops.typed]\nlimit = \"5s\"\n", "koordd.toml", {"typed": Typed}).loops["typed"]
    assert type(s) is cls and s.limit == 5.0 and s.policy == "cfs_quota"
    assert cls() == make_settings(loop_options(Typed), {})      # the defaults are the options'
    with pytest.raises(TypeError):
        cls(treshold_percent=3)                                 # a name no option declares
    with pytest.raises(ValueError, match="unknown option"):
        make_settings(loop_options(Typed), {"treshold_percent": 3})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.limit = 1.0
    assert not hasattr(s, "__dict__")                           # slots: no attribute but the options


def test_make_settings_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown option"):
        make_settings(Suppress.options, {"nope": 1})
    with pytest.raises(ValueError, match="threshold_percent: must be <= 100, got 101"):
        make_settings(Suppress.options, {"threshold_percent": 101})


def test_settings_equal_across_reload_only_when_values_equal():
    old = parse(FULL)
    same = parse(FULL.replace('"500ms"', '"0.5s"'))
    changed = parse(FULL.replace("80", "81"))
    assert old.loops["be_suppress"] == same.loops["be_suppress"]
    assert old.loops["be_suppress"] != changed.loops["be_suppress"]
    assert old.daemon == changed.daemon


def test_load_config(tmp_path):
    p = tmp_path / "koordd.toml"
    p.write_text(FULL)
    assert load_config(p, REGISTRY) == parse_config(FULL, p, REGISTRY)
    p.write_text("[daemon]\ndry_run = 2\n")
    with pytest.raises(ConfigError) as ei:
        load_config(str(p), REGISTRY)
    assert ei.value.errors == [f"{p}:2: daemon.dry_run: expected true or false, got an integer"]


def test_load_config_unreadable(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as ei:
        load_config(missing, REGISTRY)
    assert ei.value.errors == [f"{missing}: cannot read: No such file or directory"]
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b"# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"cannot read: not UTF-8"):
        load_config(bad, REGISTRY)


def test_durations_take_microseconds_too():
    from koordd.runtime.docs import format_duration
    from koordd.core.options import parse_duration
    assert parse_duration("500us") == pytest.approx(0.0005) and parse_duration("1ms500us") == pytest.approx(0.0015)
    assert format_duration(0.0005) == "500us" and format_duration(0.0015) == "1ms500us" and format_duration(2) == "2s"
