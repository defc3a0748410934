"""The names the spec's commands use (../shared/spec/): release pillar-csi in
namespace pillar-csi, with the default values and with cert-manager off."""
from chart import CASES, container, find, one, render


def pods_selected(objects, selector: dict) -> list[str]:
    """Workloads whose pods a `kubectl get pod -l` with `selector` lists."""
    return [o["metadata"]["name"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")
            and selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()]


def test_agent_pods_are_the_ones_labelled_component_agent():
    # kubectl -n pillar-csi get pod -l app.kubernetes.io/component=agent
    objects = render()
    assert pods_selected(objects, {"app.kubernetes.io/component": "agent"}) == ["pillar-csi-agent"]
    agent = one(objects, "DaemonSet", "pillar-csi-agent")
    assert agent["metadata"]["namespace"] == "pillar-csi"


def test_agent_daemonset_has_the_container_agent_listening_on_9500():
    # kubectl -n pillar-csi get ds pillar-csi-agent -o jsonpath='{...containers[?(@.name=="agent")].image}'
    agent = container(one(render(), "DaemonSet", "pillar-csi-agent"), "agent")
    assert agent["image"].startswith("ghcr.io/isac322/pillar-csi:")
    assert [p["containerPort"] for p in agent["ports"]] == [9500]


def test_exactly_one_controller_deployment_carries_component_and_instance():
    # kubectl -n pillar-csi get deploy pillar-csi-controller; upgrade.md finds it by label
    objects = render()
    deploy = one(objects, "Deployment", "pillar-csi-controller")
    labels = deploy["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "controller"
    assert labels["app.kubernetes.io/instance"] == "pillar-csi"
    assert [d["metadata"]["name"] for d in find(objects, "Deployment")
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == "controller"] == \
        ["pillar-csi-controller"]
    assert deploy["spec"]["replicas"] == 1


def test_agent_secret_is_pillar_csi_agent_mtls_with_cert_manager():
    # kubectl -n pillar-csi get secret pillar-csi-agent-mtls -o jsonpath='{.data.ca\.crt}'
    objects = render()
    cert = one(objects, "Certificate", "pillar-csi-agent-mtls")
    assert cert["spec"]["secretName"] == "pillar-csi-agent-mtls"
    # The CA issuer writes ca.crt into the Secret: the chart's own CA signs it.
    assert cert["spec"]["issuerRef"]["name"] == "pillar-csi-ca"
    assert one(objects, "Issuer", "pillar-csi-ca")["spec"]["ca"]["secretName"] == "pillar-csi-ca"
    # -servername pillar-csi-agent.pillar-csi.svc
    assert cert["spec"]["dnsNames"] == ["pillar-csi-agent.pillar-csi.svc"]


def test_agent_secret_is_pillar_agent_mtls_with_your_own_secrets():
    agent = one(render(CASES["cert-manager-off"]), "DaemonSet", "pillar-csi-agent")
    secrets = [v["secret"]["secretName"] for v in agent["spec"]["template"]["spec"]["volumes"]
               if "secret" in v]
    assert secrets == ["pillar-agent-mtls"]


def test_csi_driver_is_pillar_csi_bhyoo_com():
    driver = one(render(), "CSIDriver", "pillar-csi.bhyoo.com")["spec"]
    assert driver["attachRequired"] is True
    assert driver["volumeLifecycleModes"] == ["Persistent"]
