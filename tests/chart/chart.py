"""Render the chart offline (Helm's Go SDK through helm-python-sdk) and the
render matrix every chart test runs over."""
from __future__ import annotations

import copy
import os
import pathlib
import shutil
import tempfile

import helm_python as helm
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pillar-csi"
CRD_DIR = CHART / "files" / "crds"
RBAC_DIR = CHART / "files" / "rbac"
EXAMPLES = CHART / "examples"
RELEASE = "pillar-csi"
NAMESPACE = "pillar-csi"

ZFS = {"zfs": {"pool": "tank", "parentDataset": "k8s"}}
LVM = {"lvm": {"volumeGroup": "data-vg", "thinPool": "thin0"}}
DATASETS = {"zfsDataset": {"pool": "tank", "parentDataset": "share"}}

# The render matrix: name -> values given to `helm install`.
CASES: dict[str, dict] = {
    "defaults": {},
    "cert-manager-on": {"mtls": {"certManager": {"enabled": True}}},
    "cert-manager-off": {
        "mtls": {"certManager": {"enabled": False}, "serverName": "storage.example.org"}
    },
    "zfs-only": {"agent": {"backends": [ZFS]}},
    "lvm-only": {"agent": {"backends": [LVM]}},
    "zfs-and-lvm": {"agent": {"backends": [ZFS, LVM]}},
    "replicas-2": {"controller": {"replicaCount": 2}},
    "install-crds-false": {"installCRDs": False},
    "insecure-plaintext": {"mtls": {"insecurePlaintext": True}},
    "encryption-kek": {"agent": {"keyEncryptionKeySecret": "pillar-csi-kek"}},
    "files-enabled": {"files": {"enabled": True}, "agent": {"backends": [ZFS, DATASETS]}},
}


def render(values: dict | None = None, chart: pathlib.Path = CHART,
           release: str = RELEASE, namespace: str = NAMESPACE) -> list[dict]:
    """Every object `helm install` would create, in template order."""
    manifests = helm.Chart.load(str(chart)).render(
        copy.deepcopy(values) if values else None,
        name=release, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def notes(values: dict | None = None) -> str:
    manifests = helm.Chart.load(str(CHART)).render(
        copy.deepcopy(values) if values else None,
        name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def lint(values: dict | None = None) -> dict:
    return helm.lint(str(CHART), copy.deepcopy(values) if values else None,
                     strict=True, namespace=NAMESPACE)


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict], kind: str, name: str) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}: " \
        f"{sorted((o['kind'], o['metadata']['name']) for o in objects)}"
    return found[0]


def container(workload: dict, name: str) -> dict:
    containers = workload["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if c["name"] == name]
    assert found, f"{workload['metadata']['name']} has no container {name}: " \
        f"{[c['name'] for c in containers]}"
    return found[0]


def agent_config(objects: list[dict]) -> dict:
    """The agent's --config file as the ConfigMap carries it."""
    return yaml.safe_load(one(objects, "ConfigMap", "pillar-csi-agent")["data"]["config.yaml"])


def pillar_csi_binary() -> pathlib.Path:
    """The built binary in Cargo's target folder (CARGO_TARGET_DIR, which the
    Makefile keeps outside the clone): the debug build `make chart` has just
    made, else a release build (the same libraries, the same parser)."""
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    for profile in ("debug", "release"):
        path = target / profile / "pillar-csi"
        if path.exists():
            return path
    raise AssertionError(f"no pillar-csi under {target}/debug nor {target}/release: build it "
                         "first (make chart does: cargo build --workspace --bins)")


def crd_files() -> list[pathlib.Path]:
    return sorted(CRD_DIR.glob("*.yaml"))


def chart_copy_with_crds(crds: list[str]) -> tempfile.TemporaryDirectory:
    """A temporary copy of the chart whose files/crds/ holds exactly `crds`
    (YAML texts): exercises the CRD rendering before, and apart from, the
    generated files."""
    tmp = tempfile.TemporaryDirectory()
    target = pathlib.Path(tmp.name) / "pillar-csi"
    shutil.copytree(CHART, target)
    for old in (target / "files" / "crds").glob("*.yaml"):
        old.unlink()
    for i, text in enumerate(crds):
        (target / "files" / "crds" / f"crd{i}.yaml").write_text(text)
    return tmp
