"""CRDs: rendered from files/crds/ when installCRDs, each kept on uninstall; the
examples/ validate against the generated openAPIV3Schema."""
import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

from chart import (CASES, CHART, EXAMPLES, chart_copy_with_crds, crd_files, find, render)

FIXTURE = (CHART.parents[1] / "tests" / "chart" / "fixtures" / "widget-crd.yaml").read_text()
PLURALS = {"pillaragents", "pillarstores", "pillarprotocols", "pillarstorageclasses",
           "pillarvolumestates", "pillarvolumereservations", "pillarsnapshots"}
WAITING = "waiting for the controller's generated CRDs in charts/pillar-csi/files/crds/"


def test_install_crds_renders_every_file_of_the_folder_as_it_is():
    with chart_copy_with_crds([FIXTURE]) as tmp:
        chart = Path(tmp) / "pillar-csi"
        crds = find(render(chart=chart), "CustomResourceDefinition")
        assert crds == [yaml.safe_load(FIXTURE)]
        assert find(render(CASES["install-crds-false"], chart=chart),
                    "CustomResourceDefinition") == []


def test_an_empty_crd_folder_renders_no_crd():
    with chart_copy_with_crds([]) as tmp:
        assert find(render(chart=Path(tmp) / "pillar-csi"), "CustomResourceDefinition") == []


def generated() -> list[dict]:
    files = crd_files()
    if not files:
        pytest.skip(WAITING)
    return [yaml.safe_load(f.read_text()) for f in files]


def test_generated_crds_are_the_six_kinds_each_kept_on_uninstall():
    crds = generated()
    assert {c["spec"]["names"]["plural"] for c in crds} == PLURALS
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", \
            crd["metadata"]["name"]
        assert crd["spec"]["group"] == "pillar-csi.bhyoo.com"
    pvst = next(c for c in crds if c["spec"]["names"]["plural"] == "pillarvolumestates")
    assert "pvst" in pvst["spec"]["names"].get("shortNames", [])


def test_defaults_render_the_generated_crds_and_install_crds_false_none():
    crds = generated()
    rendered = find(render(), "CustomResourceDefinition")
    assert sorted(c["metadata"]["name"] for c in rendered) == \
        sorted(c["metadata"]["name"] for c in crds)
    assert find(render(CASES["install-crds-false"]), "CustomResourceDefinition") == []


def strict(schema: dict) -> dict:
    """An openAPIV3Schema that refuses unknown fields, as a typo should be
    (the API server would prune them silently)."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(schema)
    schema["properties"].setdefault("apiVersion", {"type": "string"})
    schema["properties"].setdefault("kind", {"type": "string"})
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def example_files():
    return sorted(EXAMPLES.glob("*.yaml"))


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_example_validates_against_its_crd_schema(path):
    crds = generated()
    example = yaml.safe_load(path.read_text())
    group, version = example["apiVersion"].split("/")
    crd = next((c for c in crds if c["spec"]["group"] == group
                and c["spec"]["names"]["kind"] == example["kind"]), None)
    assert crd, f"{path.name}: no generated CRD for {example['kind']}"
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    jsonschema.validate(example, strict(served["schema"]["openAPIV3Schema"]))


def test_examples_cover_every_kind_an_operator_creates():
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in example_files()}
    assert kinds == {"PillarAgent", "PillarStore", "PillarProtocol", "PillarStorageClass"}
