"""The render matrix: every case renders and lints, and says what its values ask."""
import pytest
import yaml

from chart import CASES, LVM, ZFS, agent_config, container, find, lint, notes, one, render

CERT_MANAGER_KINDS = {"Certificate", "Issuer"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_case_renders_the_three_workloads_and_lints_clean(case):
    objects = render(CASES[case])
    one(objects, "Deployment", "pillar-csi-controller")
    one(objects, "DaemonSet", "pillar-csi-node")
    one(objects, "DaemonSet", "pillar-csi-agent")
    one(objects, "CSIDriver", "pillar-csi.bhyoo.com")
    report = lint(CASES[case])
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, f"helm lint --strict on {case}: {problems}"


@pytest.mark.parametrize("case,backends", [
    ("zfs-only", [ZFS]), ("lvm-only", [LVM]), ("zfs-and-lvm", [ZFS, LVM])])
def test_backends_reach_the_agent_config_file_as_given(case, backends):
    assert agent_config(render(CASES[case]))["backends"] == backends


def test_cert_manager_on_issues_the_agent_and_controller_secrets():
    objects = render(CASES["cert-manager-on"])
    certs = {c["metadata"]["name"]: c["spec"] for c in find(objects, "Certificate")}
    agent = certs["pillar-csi-agent-mtls"]
    assert agent["secretName"] == "pillar-csi-agent-mtls"
    assert agent["dnsNames"] == ["pillar-csi-agent.pillar-csi.svc"]
    assert "server auth" in agent["usages"]
    assert "client auth" in certs["pillar-csi-controller-mtls"]["usages"]
    assert certs["pillar-csi-ca"]["isCA"] is True
    controller = container(one(objects, "Deployment", "pillar-csi-controller"), "controller")
    assert "--agent-tls-server-name=pillar-csi-agent.pillar-csi.svc" in controller["args"]
    assert secret_volumes(one(objects, "DaemonSet", "pillar-csi-agent")) == ["pillar-csi-agent-mtls"]
    assert secret_volumes(one(objects, "Deployment", "pillar-csi-controller")) == \
        ["pillar-csi-controller-mtls"]


def test_cert_manager_off_mounts_the_user_secrets_and_server_name():
    objects = render(CASES["cert-manager-off"])
    assert not [o for o in objects if o["kind"] in CERT_MANAGER_KINDS]
    assert secret_volumes(one(objects, "DaemonSet", "pillar-csi-agent")) == ["pillar-agent-mtls"]
    assert secret_volumes(one(objects, "Deployment", "pillar-csi-controller")) == \
        ["pillar-controller-mtls"]
    controller = container(one(objects, "Deployment", "pillar-csi-controller"), "controller")
    assert "--agent-tls-server-name=storage.example.org" in controller["args"]


def test_cert_manager_off_without_server_name_leaves_the_flag_out():
    objects = render({"mtls": {"certManager": {"enabled": False}}})
    controller = container(one(objects, "Deployment", "pillar-csi-controller"), "controller")
    assert not [a for a in controller["args"] if a.startswith("--agent-tls-server-name")]


def test_tls_is_on_unless_plaintext_is_asked_for():
    for case in sorted(set(CASES) - {"insecure-plaintext"}):
        config = agent_config(render(CASES[case]))
        assert "insecurePlaintext" not in config, case
        assert config["tls"] == {"cert": "/etc/pillar-csi/tls/tls.crt",
                                 "key": "/etc/pillar-csi/tls/tls.key",
                                 "clientCa": "/etc/pillar-csi/tls/ca.crt"}, case
    objects = render(CASES["insecure-plaintext"])
    config = agent_config(objects)
    assert config["insecurePlaintext"] is True and "tls" not in config
    assert not [o for o in objects if o["kind"] in CERT_MANAGER_KINDS]
    assert secret_volumes(one(objects, "DaemonSet", "pillar-csi-agent")) == []


def test_replica_count_reaches_the_deployment_and_sidecars_elect_a_leader():
    objects = render(CASES["replicas-2"])
    deploy = one(objects, "Deployment", "pillar-csi-controller")
    assert deploy["spec"]["replicas"] == 2
    for sidecar in ("csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"):
        assert "--leader-election" in container(deploy, sidecar)["args"], sidecar
    assert "--extra-create-metadata" in container(deploy, "csi-provisioner")["args"]
    assert "--extra-create-metadata" in container(deploy, "csi-snapshotter")["args"]


def test_extra_args_are_appended_to_the_agent():
    flag = "--recovery-trust-anchor=/var/lib/pillar-csi/agent/recovery-trust-anchor.pem"
    objects = render({"agent": {"extraArgs": [flag]}})
    args = container(one(objects, "DaemonSet", "pillar-csi-agent"), "agent")["args"]
    assert args == ["agent", "--config=/etc/pillar-csi/config.yaml", "--name=$(NODE_NAME)", flag]


def test_the_agent_is_named_for_its_node():
    """Its export targets' names carry it: unique per storage node."""
    agent = container(one(render({}), "DaemonSet", "pillar-csi-agent"), "agent")
    assert "--name=$(NODE_NAME)" in agent["args"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_name_and_namespace_overrides_rename_everything_namespaced():
    objects = render({"fullnameOverride": "storage", "namespaceOverride": "infra"})
    one(objects, "Deployment", "storage-controller")
    one(objects, "DaemonSet", "storage-agent")
    one(objects, "DaemonSet", "storage-node")
    namespaced = [o for o in objects if o["kind"] not in
                  {"CSIDriver", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"infra"}
    binding = one(objects, "ClusterRoleBinding", "storage-controller")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "storage-controller",
                                    "namespace": "infra"}]
    objects = render({"nameOverride": "storage"})
    one(objects, "Deployment", "pillar-csi-storage-controller")


def test_node_plugin_mounts_what_attach_and_mount_need():
    node = one(render(), "DaemonSet", "pillar-csi-node")
    plugin = container(node, "node")
    assert plugin["securityContext"]["privileged"] is True
    mounts = {m["mountPath"]: m for m in plugin["volumeMounts"]}
    assert mounts["/var/lib/kubelet"]["mountPropagation"] == "Bidirectional"
    for path in ("/dev", "/sys", "/etc/nvme", "/etc/iscsi", "/csi"):
        assert path in mounts, path
    # The node plugin writes a missing hostnqn or initiatorname, and iscsiadm its records.
    assert not mounts["/etc/nvme"].get("readOnly") and not mounts["/etc/iscsi"].get("readOnly")
    assert plugin["args"][:4] == ["node", "--endpoint=unix:///csi/csi.sock",
                                  "--node-name=$(NODE_NAME)",
                                  "--state-dir=/var/lib/pillar-csi/node"]
    assert "--iscsi" not in plugin["args"]
    with_iscsi = one(render({"node": {"iscsi": True}}), "DaemonSet", "pillar-csi-node")
    assert "--iscsi" in container(with_iscsi, "node")["args"]
    registrar = container(node, "node-driver-registrar")
    assert ("--kubelet-registration-path=/var/lib/kubelet/plugins/pillar-csi.bhyoo.com/csi.sock"
            in registrar["args"])


def test_agent_runs_on_storage_nodes_with_host_network_and_host_state():
    agent = one(render(), "DaemonSet", "pillar-csi-agent")
    spec = agent["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    assert spec["nodeSelector"] == {"pillar-csi.bhyoo.com/storage-node": "true"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["state"]["hostPath"]["path"] == "/var/lib/pillar-csi/agent"
    assert volumes["configfs"]["hostPath"]["path"] == "/sys/kernel/config"
    assert volumes["dev"]["hostPath"]["path"] == "/dev"
    assert container(agent, "agent")["ports"] == [
        {"name": "grpc", "containerPort": 9500, "protocol": "TCP"}]


def test_notes_tell_what_to_create_next_and_warn_of_plaintext():
    text = notes()
    for kind in ("PillarAgent", "PillarStore", "PillarProtocol", "PillarStorageClass"):
        assert kind in text
    assert "kubectl label node <storage node> pillar-csi.bhyoo.com/storage-node=true" in text
    assert "WARNING" not in text
    assert "WARNING: mtls.insecurePlaintext is true" in notes(CASES["insecure-plaintext"])
    assert "create Secrets pillar-agent-mtls and pillar-controller-mtls" in \
        notes(CASES["cert-manager-off"])
    assert "apply the pillar-csi.bhyoo.com CRDs yourself" in notes(CASES["install-crds-false"])


def secret_volumes(workload: dict) -> list[str]:
    return [v["secret"]["secretName"] for v in workload["spec"]["template"]["spec"]["volumes"]
            if "secret" in v]


def test_the_snapshot_class_waits_for_the_snapshot_api():
    """Offline there is no snapshot.storage.k8s.io/v1: an install on a cluster
    without the snapshot CRDs must not fail on a kind it does not know."""
    for case, values in CASES.items():
        assert find(render(values), "VolumeSnapshotClass") == [], case
    deploy = one(render(), "Deployment", "pillar-csi-controller")
    snapshotter = container(deploy, "csi-snapshotter")
    assert snapshotter["image"].startswith("registry.k8s.io/sig-storage/csi-snapshotter:v7.")
    assert "--csi-address=/csi/csi.sock" in snapshotter["args"]


def test_the_key_encryption_key_reaches_the_agent_alone_as_a_file():
    """The KEK Secret is a 0400 file of the agent's, named by its config file;
    no other workload mounts it, and no flag, env or ConfigMap holds it."""
    assert "keyEncryptionKeyFile" not in agent_config(render())
    assert "pillar-csi-kek" not in yaml.safe_dump_all(render())
    objects = render(CASES["encryption-kek"])
    assert agent_config(objects)["keyEncryptionKeyFile"] == "/etc/pillar-csi/kek/kek"
    agent = one(objects, "DaemonSet", "pillar-csi-agent")
    volume = next(v for v in agent["spec"]["template"]["spec"]["volumes"] if v["name"] == "kek")
    assert volume["secret"] == {"secretName": "pillar-csi-kek", "defaultMode": 0o400,
                                "items": [{"key": "kek", "path": "kek"}]}
    mounts = {m["name"]: m for m in container(agent, "agent")["volumeMounts"]}
    assert mounts["kek"] == {"name": "kek", "mountPath": "/etc/pillar-csi/kek", "readOnly": True}
    for kind, name in (("Deployment", "pillar-csi-controller"), ("DaemonSet", "pillar-csi-node")):
        assert "pillar-csi-kek" not in secret_volumes(one(objects, kind, name)), name
    for c in agent["spec"]["template"]["spec"]["containers"]:
        assert "kek" not in " ".join(c.get("args", [])), c["name"]
        assert "kek" not in str(c.get("env", [])).lower(), c["name"]


def test_a_rotation_mounts_the_previous_key_encryption_key_beside_the_current():
    values = {"agent": {"keyEncryptionKeySecret": "kek-2", "previousKeyEncryptionKeySecret": "kek-1"}}
    objects = render(values)
    config = agent_config(objects)
    assert config["keyEncryptionKeyFile"] == "/etc/pillar-csi/kek/kek"
    assert config["previousKeyEncryptionKeyFile"] == "/etc/pillar-csi/kek-previous/kek"
    agent = one(objects, "DaemonSet", "pillar-csi-agent")
    assert {"kek-2", "kek-1"} <= set(secret_volumes(agent))
    with pytest.raises(Exception, match="previousKeyEncryptionKeySecret needs"):
        render({"agent": {"previousKeyEncryptionKeySecret": "kek-1"}})


def test_a_change_of_the_volume_keys_is_asked_in_the_config_and_needs_the_key_encryption_key():
    assert "changeVolumeKeys" not in agent_config(render({"agent": {"keyEncryptionKeySecret": "kek"}}))
    config = agent_config(render({"agent": {"keyEncryptionKeySecret": "kek", "changeVolumeKeys": True}}))
    assert config["changeVolumeKeys"] is True
    with pytest.raises(Exception, match="changeVolumeKeys needs agent.keyEncryptionKeySecret"):
        render({"agent": {"changeVolumeKeys": True}})
