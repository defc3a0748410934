"""RBAC in the chart: the controller pod gets exactly the rules of files/rbac/
(the set the controller's API-server tests run with); the node plugin and the
agent get none; nothing is cluster-admin or a wildcard."""
import yaml

from chart import CASES, RBAC_DIR, find, one, render

CONTROLLER_FILES = ["controller-rules", "external-provisioner-rules",
                    "external-attacher-rules", "external-resizer-rules",
                    "external-snapshotter-rules"]


def rules_of(*names: str) -> list[dict]:
    rules = []
    for name in names:
        rules += yaml.safe_load((RBAC_DIR / f"{name}.yaml").read_text())
    return rules


def test_controller_cluster_role_is_the_rule_files_and_nothing_else():
    role = one(render(), "ClusterRole", "pillar-csi-controller")
    assert role["rules"] == rules_of(*CONTROLLER_FILES)


def test_secrets_are_read_only_with_read_import_key_secrets_and_only_get():
    secret_rules = lambda objects: [  # noqa: E731
        r for r in one(objects, "ClusterRole", "pillar-csi-controller")["rules"]
        if "secrets" in r["resources"]]
    assert secret_rules(render()) == []
    reading = render({"controller": {"readImportKeySecrets": True}})
    assert secret_rules(reading) == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    assert one(reading, "ClusterRole", "pillar-csi-controller")["rules"] == \
        rules_of(*CONTROLLER_FILES, "import-key-secrets-rules")


def test_leader_election_is_a_namespaced_role_on_leases():
    objects = render()
    role = one(objects, "Role", "pillar-csi-controller-leader-election")
    assert role["metadata"]["namespace"] == "pillar-csi"
    assert role["rules"] == rules_of("leader-election-rules")
    assert {r for rule in role["rules"] for r in rule["resources"]} == {"leases"}
    binding = one(objects, "RoleBinding", "pillar-csi-controller-leader-election")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pillar-csi-controller",
                                    "namespace": "pillar-csi"}]


def test_controller_rules_cover_the_custom_resources_and_their_status():
    rules = rules_of("controller-rules")
    granted = {(group, resource, verb) for r in rules for group in r["apiGroups"]
               for resource in r["resources"] for verb in r["verbs"]}
    for plural in ("pillaragents", "pillarstores", "pillarprotocols", "pillarstorageclasses",
                   "pillarvolumestates", "pillarvolumereservations"):
        for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
            assert ("pillar-csi.bhyoo.com", plural, verb) in granted
        assert ("pillar-csi.bhyoo.com", f"{plural}/status", "patch") in granted
    assert ("storage.k8s.io", "storageclasses", "create") in granted
    assert ("", "persistentvolumeclaims", "get") in granted
    assert ("events.k8s.io", "events", "create") in granted
    assert not [g for g in granted if g[1] in ("secrets", "pods/exec", "nodes/proxy")]


def test_no_wildcards_and_no_cluster_admin_in_any_case():
    for case, values in CASES.items():
        objects = render(values)
        for role in find(objects, "ClusterRole") + find(objects, "Role"):
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], f"{case}: {role['metadata']['name']} {rule}"
        for binding in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding"):
            assert binding["roleRef"]["name"] not in ("cluster-admin", "admin", "edit"), case


def test_node_and_agent_service_accounts_are_bound_to_nothing_and_get_no_token():
    objects = render()
    subjects = [s["name"] for b in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding")
                for s in b["subjects"]]
    assert set(subjects) == {"pillar-csi-controller"}
    for component in ("node", "agent"):
        account = one(objects, "ServiceAccount", f"pillar-csi-{component}")
        assert account["automountServiceAccountToken"] is False
        pod = one(objects, "DaemonSet", f"pillar-csi-{component}")["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == f"pillar-csi-{component}"
        assert pod["automountServiceAccountToken"] is False
    controller = one(objects, "Deployment", "pillar-csi-controller")["spec"]["template"]["spec"]
    assert controller["serviceAccountName"] == "pillar-csi-controller"
