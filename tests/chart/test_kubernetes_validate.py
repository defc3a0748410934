"""Every rendered object validates strictly (unknown fields refused) against the
schemas of a current Kubernetes, with the `kubernetes-validate` command."""
import copy
import pathlib
import subprocess
import sys

import pytest
import yaml

from chart import CASES, one, render

KUBERNETES = "1.37.0"
# Kinds no Kubernetes schema covers: cert-manager's, checked by name in the
# render tests and by nothing stricter here (no cert-manager CRD on this machine).
NO_SCHEMA = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}
TOOL = pathlib.Path(sys.executable).with_name("kubernetes-validate")


def validate(objects: list[dict], tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump_all(objects))
    return subprocess.run([str(TOOL), "--strict", "-k", KUBERNETES, str(manifest)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_object_passes_strict_validation(case, tmp_path):
    objects = render(CASES[case])
    result = validate(objects, tmp_path)
    print(result.stdout + result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    for o in objects:
        kind = (o["apiVersion"], o["kind"])
        if kind in NO_SCHEMA:
            continue
        line = f"passed for resource {o['kind'].lower()}/{o['metadata']['name']} " \
               f"against version {KUBERNETES.rsplit('.', 1)[0]}"
        assert line in result.stdout, f"{case}: no '{line}' in\n{result.stdout}"
    warned = [line for line in (result.stdout + result.stderr).splitlines()
              if line.startswith("WARN")]
    unexpected = [w for w in warned
                  if not any(f"kind {k} with api version {v}" in w for v, k in NO_SCHEMA)]
    assert not unexpected, f"{case}: warnings beyond the cert-manager kinds: {unexpected}"


def test_strict_validation_refuses_an_unknown_field(tmp_path):
    """The check above can fail: a misspelt field in the node DaemonSet is refused."""
    objects = render()
    node = one(objects, "DaemonSet", "pillar-csi-node")
    broken = copy.deepcopy(node)
    broken["spec"]["template"]["spec"]["hostNetwrok"] = True
    result = validate([broken], tmp_path)
    assert result.returncode != 0
    assert "hostNetwrok" in result.stdout + result.stderr
