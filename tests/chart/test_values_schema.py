"""values.schema.json: a typo or a wrong shape fails the install, naming the key."""
import json

import pytest
import yaml
from helm_python import HelmValuesError

from chart import CHART, render
from values_table import comments

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())

REFUSED = [
    ({"controler": {"replicaCount": 2}}, "additional properties 'controler' not allowed"),
    ({"mtls": {"insecurePlaintxt": True}}, "additional properties 'insecurePlaintxt' not allowed"),
    ({"agent": {"backends": [{"zfs": {"pol": "tank"}}]}}, "additional properties 'pol' not allowed"),
    ({"agent": {"backends": [{"btrfs": {"pool": "tank"}}]}}, "additional properties 'btrfs' not allowed"),
    ({"agent": {"backends": [{"lvm": {"thinPool": "thin0"}}]}}, "missing property 'volumeGroup'"),
    ({"agent": {"backends": [{"directory": {"name": "dirs"}}]}}, "missing property 'path'"),
    ({"agent": {"backends": [{"directory": {"name": "dirs", "path": "srv"}}]}},
     "/agent/backends/0/directory/path"),
    ({"agent": {"backends": []}}, "/agent/backends"),
    ({"controller": {"replicaCount": "two"}}, "/controller/replicaCount': got string, want integer"),
    ({"agent": {"port": 70000}}, "/agent/port"),
    ({"driverName": "other.example.org"}, "/driverName"),
    ({"csiDriver": {"fsGroupPolicy": "Sometimes"}}, "/csiDriver/fsGroupPolicy"),
]


@pytest.mark.parametrize("values,message", REFUSED, ids=[m for _, m in REFUSED])
def test_wrong_values_are_refused_with_the_key_named(values, message):
    with pytest.raises(HelmValuesError) as refused:
        render(values)
    assert message in str(refused.value)


def test_every_key_of_values_yaml_is_in_the_schema():
    """The schema's properties and values.yaml's keys are the same tree (an
    empty map such as issuerRef: {} stands for keys left to the user)."""
    def walk(node, schema_node, path):
        props = schema_node.get("properties")
        if not isinstance(node, dict) or not node or props is None:
            return
        assert set(node) == set(props), f"{path or '/'}: values.yaml {sorted(node)} " \
            f"vs schema {sorted(props)}"
        for key, child in node.items():
            walk(child, props[key], f"{path}/{key}")

    walk(VALUES, SCHEMA, "")


def test_every_chart_key_of_values_yaml_carries_a_comment_above_it():
    """values.yaml is documented key by key. Keys inside a free-form Kubernetes
    object (a securityContext, a probe) or a list item belong to their parent."""
    undocumented = [path for path, comment in comments().items()
                    if is_chart_key(path.split(".")) and not comment]
    assert not undocumented, f"keys of values.yaml without a comment: {undocumented}"


def is_chart_key(path: list[str]) -> bool:
    node = SCHEMA
    for key in path:
        props = node.get("properties")
        if props is None or key not in props:
            return False
        node = props[key]
    return True
