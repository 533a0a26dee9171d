"""deploy/kubernetes: every field koordd relies on, the ConfigMap's koordd.toml through koordd's own loader
and classifier on both cgroup drivers (v1 and v2 trees), and the manifests against the Kubernetes OpenAPI
schema (kubernetes-validate bundles the schemas: no cluster, no network)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from koordtest.fakes.cgroup import FakeCgroups
from koordd.core.config import parse_config
from koordd.core.kubelet import KubeletRule
from koordd.core.catalogue import load_registry
from koordd.sensors.collect import find_classified

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
UNIT = Path(__file__).resolve().parents[2] / "systemd" / "koordd.service"
SECURITY = Path(__file__).resolve().parents[2] / "docs" / "security.md"
RESOURCES = ("namespace.yaml", "serviceaccount.yaml", "configmap.yaml", "daemonset.yaml")
UID = "8b3c7d2e_4f5a_6b7c_9d1e_3f4a5b6c7d8e"
CID = "f" * 64


def load(name):
    return yaml.safe_load((DEPLOY / name).read_text())


@pytest.fixture(scope="module")
def ds():
    return load("daemonset.yaml")


@pytest.fixture(scope="module")
def pod(ds):
    return ds["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def koordd(pod):
    [c] = [c for c in pod["containers"] if c["name"] == "koordd"]
    return c


@pytest.fixture(scope="module")
def toml_text():
    return load("configmap.yaml")["data"]["koordd.toml"]


@pytest.fixture(scope="module")
def config(toml_text):
    return parse_config(toml_text, "configmap.yaml:koordd.toml", load_registry())


def test_kustomization_lists_every_resource_in_one_namespace():
    k = load("kustomization.yaml")
    assert k["resources"] == list(RESOURCES)
    docs = [load(name) for name in RESOURCES]
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "ConfigMap", "DaemonSet"]
    assert {d["metadata"].get("namespace") for d in docs[1:]} == {docs[0]["metadata"]["name"]} == {"koordd"}
    # hostPID, hostPath and added capabilities pass only the "privileged" Pod Security Standard.
    assert docs[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_no_api_access(pod):
    sa = load("serviceaccount.yaml")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    assert not any(d for d in DEPLOY.glob("*.yaml") if load(d.name).get("kind") in ("Role", "ClusterRole"))


def test_host_namespaces_priority_tolerations_and_grace(ds, pod):
    assert pod["hostPID"] is True           # /proc shows every task; cgroup.procs pids are /proc's
    assert pod["hostNetwork"] is True       # net_shaping on the host's devices; the loopback metrics
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"]
    # koordd restores on SIGTERM; the systemd unit gives it TimeoutStopSec=30s.
    unit_stop = int(re.search(r"^TimeoutStopSec=(\d+)s$", UNIT.read_text(), re.M).group(1))
    assert pod["terminationGracePeriodSeconds"] >= unit_stop
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1


def mounts_by_path(container, pod):
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in container["volumeMounts"]}


@pytest.mark.parametrize("path, host, writable", [
    ("/sys/fs/cgroup", "/sys/fs/cgroup", True),          # the host's whole hierarchy, written
    ("/var/lib/koordd", "/var/lib/koordd", True),        # the restore journal outlives the pod
])
def test_host_paths(koordd, pod, path, host, writable):
    mount, volume = mounts_by_path(koordd, pod)[path]
    assert volume["hostPath"]["path"] == host
    assert bool(mount.get("readOnly")) is not writable


def test_no_kernel_headers_or_tracefs_from_the_host(koordd, pod):
    """koordd's BPF programs are CO-RE objects attached by BTF: the pod needs neither."""
    assert not {"/lib/modules", "/usr/src", "/sys/kernel/tracing"} & set(mounts_by_path(koordd, pod))


def test_state_dir_and_cgroup_root_are_what_the_config_says(koordd, pod, config):
    mounts = mounts_by_path(koordd, pod)
    assert config.daemon.state_dir in mounts and "hostPath" in mounts[config.daemon.state_dir][1]
    assert config.daemon.cgroup_root in ("", "/sys/fs/cgroup")      # "" detects under /sys/fs/cgroup
    assert mounts["/sys/fs/cgroup"][0]["mountPropagation"] == "HostToContainer"


def test_no_host_proc_and_no_bpffs(koordd, pod):
    """koordd reads /proc itself: with hostPID the container's procfs is the host's PID namespace. It
    pins nothing in bpffs (its BPF objects live as long as its fds)."""
    hosts = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert "/proc" not in hosts and "/sys/fs/bpf" not in hosts
    assert not any(m["mountPath"].startswith("/proc") for m in koordd["volumeMounts"])


def test_the_config_reaches_koordd_through_a_root_only_directory(koordd, pod):
    """koordd refuses a config in a world-writable directory (koordd/core/trust.py); a ConfigMap volume is one."""
    assert koordd["args"] == ["--config", "/etc/koordd/koordd.toml"]
    mounts = mounts_by_path(koordd, pod)
    _, volume = mounts["/etc/koordd"]
    assert "emptyDir" in volume and mounts["/etc/koordd"][0]["readOnly"] is True
    [init] = pod["initContainers"]
    script = init["command"][-1]
    assert "chmod 0755 /etc/koordd" in script and "install -m 0644 /config/koordd.toml /etc/koordd/koordd.toml" in script
    init_mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    assert init_mounts == {"/config": "config-map", "/etc/koordd": volume["name"]}
    assert {v["name"]: v for v in pod["volumes"]}["config-map"]["configMap"]["name"] == "koordd"
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def unit_capabilities() -> set[str]:
    line = re.search(r"^CapabilityBoundingSet=(.+)$", UNIT.read_text(), re.M).group(1)
    return {c.removeprefix("CAP_") for c in line.split()}


def test_capabilities_are_the_units_and_no_more(koordd):
    sc = koordd["securityContext"]
    assert sc["privileged"] is False and sc["readOnlyRootFilesystem"] is True and sc["runAsUser"] == 0
    assert sc["capabilities"]["drop"] == ["ALL"]
    added = set(sc["capabilities"]["add"])
    assert added == unit_capabilities()
    # docs/security.md's section on the pod gives a reason for each, by name.
    section = SECURITY.read_text().partition("## In a Kubernetes pod")[2].partition("\n## ")[0]
    for cap in added:
        assert f"`CAP_{cap}`" in section, cap
    # The API refuses allowPrivilegeEscalation: false together with SYS_ADMIN.
    assert "allowPrivilegeEscalation" not in sc


def test_probes_ask_the_metrics_endpoint_the_config_serves(koordd, config, toml_text):
    metrics = tomllib.loads(toml_text)["metrics"]
    assert metrics["enable"] is True
    host, port = config.metrics.listen.rsplit(":", 1)
    assert config.metrics.enable is True and host == "127.0.0.1"
    for probe in ("livenessProbe", "startupProbe"):
        get = koordd[probe]["httpGet"]
        assert (get["host"], get["port"], get["path"]) == (host, int(port), "/healthz")
    [port_decl] = koordd["ports"]
    assert port_decl["containerPort"] == port_decl["hostPort"] == int(port)


def test_resources_follow_the_overhead_figures(koordd):
    r = koordd["resources"]
    assert r["requests"]["cpu"] == "50m"            # 36-37 ms of CPU a second measured
    assert r["requests"]["memory"] == "64Mi"        # 26 MiB RSS with the eBPF sensor (scripts/bench-start)
    assert r["limits"]["memory"] == "256Mi"
    assert "cpu" not in r["limits"]                 # no quota on the daemon that sets quotas


def test_the_configmap_loads_with_koordds_loader_and_leaves_the_kubelet_its_knobs(config):
    assert config.daemon.kubelet_owned == "respect"
    assert config.daemon.state_dir == "/var/lib/koordd"
    assert config.loops["be_suppress"].enabled and config.loops["qos_baseline"].enabled
    assert config.loops["qos_baseline"].be_thread_idle_cgroups == ("kubepods.slice", "kubepods")
    assert not config.loops["memory_evict"].enabled


def test_every_loop_option_the_configmap_sets_is_a_real_one(toml_text):
    # parse_config already refuses unknown keys; this says the file is not a stale copy of the default.
    shipped = tomllib.loads((DEPLOY.parent.parent / "config" / "koordd.toml").read_text())
    ours = tomllib.loads(toml_text)
    assert set(ours["loops"]) == set(shipped["loops"])


# Example cgroups of both drivers (the same names on v1 hierarchies and on v2) -> the class koordd's
# classifier gives them (the class of the first classified cgroup on the way down).
SYSTEMD_PATHS = {
    f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID}.slice/cri-containerd-{CID}.scope": "BE",
    f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID}.slice/cri-containerd-{CID}.scope": "LS",
    f"kubepods.slice/kubepods-pod{UID}.slice/cri-containerd-{CID}.scope": "LS",
    "system.slice/kubelet.service": "SYSTEM",
    "system.slice/containerd.service": "SYSTEM",
    "kube.slice/kubelet.service": "SYSTEM",
    "user.slice/user-1000.slice": None,
}
CGROUPFS_PATHS = {
    f"kubepods/besteffort/pod{UID.replace('_', '-')}/{CID}": "BE",
    f"kubepods/burstable/pod{UID.replace('_', '-')}/{CID}": "LS",
    f"kubepods/pod{UID.replace('_', '-')}/{CID}": "LS",
    "system.slice/docker.service": "SYSTEM",
    "user.slice": None,
}


def class_of(found: dict[str, str], cgroup: str) -> str | None:
    parts = cgroup.split("/")
    for n in range(1, len(parts) + 1):
        if "/".join(parts[:n]) in found:
            return found["/".join(parts[:n])]
    return None


@pytest.mark.parametrize("mode", ["v2", "v1", "hybrid"])
@pytest.mark.parametrize("paths", [SYSTEMD_PATHS, CGROUPFS_PATHS], ids=["systemd", "cgroupfs"])
def test_pods_map_to_classes_with_both_drivers(tmp_path, config, mode, paths):
    tree = FakeCgroups(tmp_path, mode)
    for path in paths:
        parts = path.split("/")
        for n in range(1, len(parts) + 1):
            if not tree.dir("/".join(parts[:n]), "cpu").exists():
                tree.add("/".join(parts[:n]))
    depth = max(p.count("/") + 1 for rule in config.classes for p in rule.patterns)
    found = find_classified(tree.fs, config.classify, depth)
    assert {path: class_of(found, path) for path in paths} == paths
    # The class roots are the QoS cgroups and Guaranteed pods, never kubepods itself (it holds every class).
    assert not {"kubepods.slice", "kubepods"} & set(found)


def test_what_the_configmap_enables_is_not_the_kubelets(config):
    """The writes the enabled loops make by default on a kubelet's tree pass the kubelet rule."""
    rule = KubeletRule.of(config.daemon)
    assert rule.refusal("kubepods.slice/kubepods-besteffort.slice", "cpu.max") is None      # be_suppress
    assert rule.refusal("kubepods/besteffort", "cpu.max") is None
    # qos_baseline's BE idle is per thread under kubepods: the group's cpu.idle would be refused.
    assert rule.refusal("kubepods.slice/kubepods-besteffort.slice", "cpu.idle") is not None


kubernetes_validate = pytest.importorskip("kubernetes_validate")
# The oldest Kubernetes the DaemonSet claims (appArmorProfile in resctrl-patch.yaml is 1.30+) and the newest
# schema the package carries.
VERSIONS = ["1.30", kubernetes_validate.latest_version()]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", [n for n in RESOURCES])
def test_manifests_validate_against_the_kubernetes_schema(name, version):
    kubernetes_validate.validate(load(name), version, strict=True)


def test_the_schema_check_catches_a_misspelt_field():
    bad = load("daemonset.yaml")
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)


def test_the_resctrl_patch_is_a_valid_daemonset_once_merged():
    """resctrl-patch.yaml is a strategic-merge patch: merged by hand here (containers and volumes by name)."""
    base, patch = load("daemonset.yaml"), load("resctrl-patch.yaml")
    spec, pspec = base["spec"]["template"]["spec"], patch["spec"]["template"]["spec"]
    [pc] = pspec["containers"]
    [c] = [c for c in spec["containers"] if c["name"] == pc["name"]]
    c["securityContext"].update(pc["securityContext"])
    c["volumeMounts"] += pc["volumeMounts"]
    spec["volumes"] += pspec["volumes"]
    kubernetes_validate.validate(base, "1.30", strict=True)
    mount, volume = mounts_by_path(c, spec)["/sys/fs/resctrl"]
    assert volume["hostPath"]["path"] == "/sys/fs/resctrl" and not mount.get("readOnly")
