"""The files identity (files.pillar-csi.bhyoo.com) in the chart: off by
default; on, its CSIDriver, its sidecars on the controller's second socket,
its registration on every node, and what the agent needs to export
filesystem volumes with the host's NFS server."""
from chart import CASES, DATASETS, ZFS, agent_config, container, find, one, render

FILES = "files.pillar-csi.bhyoo.com"


def volumes(workload: dict) -> dict:
    return {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}


def test_off_by_default_nothing_of_it_renders():
    objects = render()
    assert not find(objects, "CSIDriver", FILES)
    controller = one(objects, "Deployment", "pillar-csi-controller")
    names = [c["name"] for c in controller["spec"]["template"]["spec"]["containers"]]
    assert not [n for n in names if "files" in n], names
    node = container(one(objects, "DaemonSet", "pillar-csi-node"), "node")
    assert not [a for a in node["args"] if "files" in a or "node-address" in a]
    agent = volumes(one(objects, "DaemonSet", "pillar-csi-agent"))
    assert "etc-exports-d" not in agent


def test_its_csidriver_attaches_and_never_changes_ownership():
    spec = one(render(CASES["files-enabled"]), "CSIDriver", FILES)["spec"]
    assert spec["attachRequired"] is True
    assert spec["fsGroupPolicy"] == "None"
    assert spec["volumeLifecycleModes"] == ["Persistent"]


def test_the_controller_serves_it_on_a_second_socket_with_its_own_sidecars():
    controller = one(render(CASES["files-enabled"]), "Deployment", "pillar-csi-controller")
    assert "--files-endpoint=unix:///csi/files.sock" in container(controller, "controller")["args"]
    for sidecar in ("provisioner", "attacher", "resizer"):
        block = container(controller, f"csi-{sidecar}")
        files = container(controller, f"csi-files-{sidecar}")
        assert "--csi-address=/csi/csi.sock" in block["args"]
        assert "--csi-address=/csi/files.sock" in files["args"]
        assert files["image"] == block["image"]
    assert "--extra-create-metadata" in container(controller, "csi-files-provisioner")["args"]
    # An Immediate NFS claim names no topology; a node-local class's allowedTopologies do.
    assert "--immediate-topology=false" in container(controller, "csi-files-provisioner")["args"]
    names = [c["name"] for c in controller["spec"]["template"]["spec"]["containers"]]
    assert "csi-files-snapshotter" not in names, "no snapshots of filesystem volumes yet"


def test_every_node_registers_it_and_mounts_from_its_own_address():
    objects = render({**CASES["files-enabled"], "files": {"enabled": True, "nfsVersion": "3"}})
    node = one(objects, "DaemonSet", "pillar-csi-node")
    plugin = container(node, "node")
    assert "--files-endpoint=unix:///csi-files/csi.sock" in plugin["args"]
    assert "--node-address=$(NODE_IP)" in plugin["args"]
    assert "--nfs-version=3" in plugin["args"]
    ip = next(e for e in plugin["env"] if e["name"] == "NODE_IP")
    assert ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    registrar = container(node, "files-node-driver-registrar")
    assert f"--kubelet-registration-path=/var/lib/kubelet/plugins/{FILES}/csi.sock" \
        in registrar["args"]
    assert volumes(node)["files-plugin-dir"]["hostPath"]["path"] == \
        f"/var/lib/kubelet/plugins/{FILES}"


def test_the_agent_shares_the_parents_mounts_and_the_hosts_export_table():
    objects = render(CASES["files-enabled"])
    assert agent_config(objects)["backends"] == [ZFS, DATASETS]
    assert agent_config(objects)["nfs"] == {"address": "0.0.0.0", "port": 2049}
    agent = one(objects, "DaemonSet", "pillar-csi-agent")
    mounts = {m["name"]: m for m in container(agent, "agent")["volumeMounts"]}
    assert mounts["filesystems-0"]["mountPath"] == "/tank/share"
    assert mounts["filesystems-0"]["mountPropagation"] == "Bidirectional"
    for name, path in [("etc-exports", "/etc/exports"), ("etc-exports-d", "/etc/exports.d"),
                       ("var-lib-nfs", "/var/lib/nfs")]:
        assert mounts[name]["mountPath"] == path
        assert volumes(agent)[name]["hostPath"]["path"] == path
    chosen = render({**CASES["files-enabled"],
                     "agent": {"backends": [DATASETS],
                               "nfs": {"address": "0.0.0.0", "port": 2049,
                                       "hostPaths": ["/srv/share"]}}})
    agent = one(chosen, "DaemonSet", "pillar-csi-agent")
    assert volumes(agent)["filesystems-0"]["hostPath"]["path"] == "/srv/share"
    assert "filesystems-1" not in volumes(agent)


def test_a_directory_backend_is_configured_and_its_path_shared():
    directory = {"directory": {"name": "dirs", "path": "/srv/xfs/volumes"}}
    objects = render({**CASES["files-enabled"],
                      "agent": {"backends": [DATASETS, directory]}})
    assert agent_config(objects)["backends"] == [DATASETS, directory]
    agent = one(objects, "DaemonSet", "pillar-csi-agent")
    paths = {v["hostPath"]["path"] for n, v in volumes(agent).items() if n.startswith("filesystems-")}
    assert paths == {"/tank/share", "/srv/xfs/volumes"}


def test_local_roots_are_shared_with_the_node_plugin_and_passed_as_flags():
    assert not [a for a in container(one(render(CASES["files-enabled"]), "DaemonSet",
                                         "pillar-csi-node"), "node")["args"]
                if a.startswith("--local-root")]
    objects = render({**CASES["files-enabled"],
                      "files": {"enabled": True, "localRoots": ["/srv/xfs/volumes"]}})
    node = one(objects, "DaemonSet", "pillar-csi-node")
    plugin = container(node, "node")
    assert "--local-root=/srv/xfs/volumes" in plugin["args"]
    mount = next(m for m in plugin["volumeMounts"] if m["name"] == "local-root-0")
    assert mount["mountPath"] == "/srv/xfs/volumes"
    assert mount["mountPropagation"] == "HostToContainer"
    assert volumes(node)["local-root-0"]["hostPath"] == {"path": "/srv/xfs/volumes",
                                                          "type": "Directory"}
    # Only with the files identity: the block node plugin never binds them.
    off = render({"files": {"enabled": False, "localRoots": ["/srv/xfs/volumes"]}})
    assert "local-root-0" not in volumes(one(off, "DaemonSet", "pillar-csi-node"))
