"""A real Helm release on the lab API server (Helm 4's SDK, as `helm install`,
`helm upgrade`, `helm uninstall` run it): install, an upgrade that changes the
replica count, an upgrade with a typo that is refused and changes nothing, and
an uninstall that keeps the CRDs and the objects in them, after which a fresh
install adopts the kept CRDs (upgrade.md: "helm uninstall and a fresh install
is enough"). cert-manager is off: the lab server has no cert-manager CRDs."""
import json
import os
import pathlib

import helm_python as helm
import pytest
import yaml

from chart import CHART, EXAMPLES, NAMESPACE, RELEASE, crd_files
from kube import kubectl

VALUES = {"mtls": {"certManager": {"enabled": False}}}
# scripts/deps-sidecars.sh copies external-snapshotter's CRDs here.
SNAPSHOT_CRDS = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) \
    / "pillar-csi" / "go-bin" / "snapshot-crds"


def replicas(server) -> str:
    return kubectl(server, "-n", NAMESPACE, "get", "deploy", "pillar-csi-controller",
                   "-o", "jsonpath={.spec.replicas}")


def test_install_upgrade_uninstall_keeps_the_crds_and_their_objects(server):
    crds = sorted(yaml.safe_load(f.read_text())["metadata"]["name"] for f in crd_files())
    assert crds, "no CRDs in charts/pillar-csi/files/crds/"
    config = helm.Config(kubeconfig_path=str(server / "kubeconfig"), namespace=NAMESPACE)

    config.install(str(CHART), RELEASE, VALUES, namespace=NAMESPACE, timeout=120)
    assert replicas(server) == "1"
    for crd in crds:
        kubectl(server, "wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}")
    kubectl(server, "apply", "-f", str(EXAMPLES / "pillaragent.yaml"))
    kubectl(server, "apply", "-f", str(EXAMPLES / "pillarstore-zfs.yaml"))

    config.upgrade(str(CHART), RELEASE, {"controller": {"replicaCount": 2}},
                   namespace=NAMESPACE, reuse_values=True, timeout=120)
    assert replicas(server) == "2"

    with pytest.raises(helm.HelmReleaseError, match="additional properties 'replicas' not allowed"):
        config.upgrade(str(CHART), RELEASE, {"controller": {"replicas": 3}},
                       namespace=NAMESPACE, reuse_values=True, timeout=120)
    assert replicas(server) == "2"
    status = config.status(RELEASE)
    assert (status["revision"], status["status"]) == (2, "deployed"), status

    result = config.uninstall(RELEASE, timeout=120)
    for crd in crds:
        assert f"[CustomResourceDefinition] {crd}" in result["info"], result["info"]
    left = kubectl(server, "-n", NAMESPACE, "get", "deploy,ds,cm,sa", "-o", "name")
    assert left.split() == [], left
    assert sorted(kubectl(server, "get", "crd", "-o", "name").split()) == \
        [f"customresourcedefinition.apiextensions.k8s.io/{c}" for c in crds]
    agent = json.loads(kubectl(server, "get", "pillaragent", "storage-1", "-o", "json"))
    assert agent["spec"]["address"] == "192.0.2.10"
    kubectl(server, "get", "pillarstore", "storage-1-hot")

    config.install(str(CHART), RELEASE, VALUES, namespace=NAMESPACE, timeout=120)
    assert replicas(server) == "1"
    kubectl(server, "get", "pillaragent", "storage-1")


def test_with_the_snapshot_crds_the_release_serves_a_volume_snapshot_class(server):
    """On a cluster with external-snapshotter's CRDs (the ones `make deps` builds
    beside the sidecars) the release makes its VolumeSnapshotClass, as the
    values say, and an uninstall removes it."""
    for crd in sorted(SNAPSHOT_CRDS.glob("*.yaml")):
        kubectl(server, "apply", "-f", str(crd))
    for kind in ("volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"):
        kubectl(server, "wait", "--for=condition=Established", "--timeout=60s",
                f"crd/{kind}.snapshot.storage.k8s.io")
    config = helm.Config(kubeconfig_path=str(server / "kubeconfig"), namespace=NAMESPACE)
    if RELEASE in kubectl(server, "-n", NAMESPACE, "get", "secret", "-o", "name"):
        config.uninstall(RELEASE, timeout=120)
    values = {**VALUES, "snapshotClass": {"isDefault": True, "deletionPolicy": "Retain"}}
    config.install(str(CHART), RELEASE, values, namespace=NAMESPACE, timeout=120)
    snapshot_class = json.loads(kubectl(server, "get", "volumesnapshotclass", "pillar-csi",
                                        "-o", "json"))
    assert snapshot_class["driver"] == "pillar-csi.bhyoo.com"
    assert snapshot_class["deletionPolicy"] == "Retain"
    annotations = snapshot_class["metadata"]["annotations"]
    assert annotations["snapshot.storage.kubernetes.io/is-default-class"] == "true"
    config.uninstall(RELEASE, timeout=120)
    assert kubectl(server, "get", "volumesnapshotclass", "-o", "name").split() == []
