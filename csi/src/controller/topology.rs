//! Node-local volumes (PillarProtocol `local`): the directories of an agent
//! whose node also runs pods. Such a volume is accessible from that node
//! only, the node its PillarAgent names in `nodeName`: CreateVolume
//! answers it as the volume's `accessible_topology` (the PV's node
//! affinity), and ControllerPublishVolume admits no other node.
use super::error::{Error, Result};
use api::crd::PillarAgent;
use api::tokens::{Backend, Protocol};
use api::TOPOLOGY_NODE_KEY;
use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
use kube::ResourceExt;
use pillar_csi_proto::csi::v1 as csi;

/// The node a new volume of `class` would be accessible from: `None` for a
/// volume every node reaches (block volumes, NFS), the agent's node for a
/// node-local one. Refuses a node-local class whose store is not a
/// directory store or whose agent names no node.
pub fn local_node(
    class: &str,
    agent: &PillarAgent,
    backend: Backend,
    protocol: Protocol,
) -> Result<Option<String>> {
    if protocol != Protocol::Local {
        return Ok(None);
    }
    if backend != Backend::Directory {
        return Err(Error::InvalidArgument(format!(
            "PillarStorageClass {class:?} pairs protocol local with a {backend} store: only the directories of a directory store are served node-local"
        )));
    }
    node_of(agent).map(Some)
}

/// The `allowedTopologies` of a StorageClass whose volumes are on `node`:
/// the scheduler then places a WaitForFirstConsumer claim's pods there,
/// and the external-provisioner asks for that node.
pub fn allowed_topologies(node: Option<String>) -> Option<Vec<TopologySelectorTerm>> {
    node.map(|node| {
        vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: TOPOLOGY_NODE_KEY.to_owned(),
                values: vec![node],
            }]),
        }]
    })
}

/// The node a node-local volume of `agent` is mounted on.
fn node_of(agent: &PillarAgent) -> Result<String> {
    agent.spec.node_name.clone().ok_or_else(|| {
        Error::FailedPrecondition(format!(
            "PillarAgent {:?} has no nodeName: its node-local volumes have no node to be mounted on (set spec.nodeName to the node the agent runs on)",
            agent.name_any()
        ))
    })
}

/// Whether `topology` names `node` under the node key.
fn names(topology: &csi::Topology, node: &str) -> bool {
    topology.segments.get(TOPOLOGY_NODE_KEY).map(String::as_str) == Some(node)
}

/// Refuses a node-local volume whose CreateVolume requires topologies of
/// which none is `node` (CSI's RESOURCE_EXHAUSTED: the request is valid,
/// the volume cannot be where it asks). Preferred topologies are a wish:
/// the volume is where its agent is.
pub fn check_requisite(
    volume: &str,
    node: &str,
    agent: &str,
    requirement: Option<&csi::TopologyRequirement>,
) -> Result<()> {
    let Some(requisite) = requirement.map(|r| &r.requisite).filter(|r| !r.is_empty()) else {
        return Ok(());
    };
    if requisite.iter().any(|t| names(t, node)) {
        return Ok(());
    }
    Err(Error::ResourceExhausted(format!(
        "volume {volume:?} would be on node {node} (PillarAgent {agent:?}'s nodeName), which none of the {} requisite topologies names ({TOPOLOGY_NODE_KEY})",
        requisite.len()
    )))
}

/// The `accessible_topology` of a volume on `node` (none: every node).
pub fn accessible(node: Option<String>) -> Vec<csi::Topology> {
    node.map(|node| csi::Topology {
        segments: [(TOPOLOGY_NODE_KEY.to_owned(), node)].into(),
    })
    .into_iter()
    .collect()
}

/// Refuses to publish node-local volume `volume` of `agent` to a node
/// other than the agent's.
pub fn check_publish(volume: &str, node: &str, agent: &PillarAgent) -> Result<()> {
    let local = node_of(agent)?;
    if node == local {
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "cannot publish volume {volume} to node {node}: it is node-local to node {local} (PillarAgent {:?}), the only node that can mount it",
        agent.name_any()
    )))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use api::crd::PillarAgentSpec;

    fn agent(node: Option<&str>) -> PillarAgent {
        PillarAgent::new(
            "storage-1",
            PillarAgentSpec {
                address: "192.0.2.10".into(),
                port: 9500,
                tls_server_name: None,
                node_name: node.map(str::to_owned),
            },
        )
    }

    fn on(node: &str) -> csi::Topology {
        accessible(Some(node.to_owned())).remove(0)
    }

    #[test]
    fn only_local_directory_classes_have_a_node() {
        let a = agent(Some("worker-1"));
        for p in [Protocol::Nfs, Protocol::Iscsi, Protocol::NvmeofTcp] {
            assert_eq!(local_node("c", &a, Backend::Directory, p).unwrap(), None);
        }
        let node = local_node("c", &a, Backend::Directory, Protocol::Local).unwrap();
        assert_eq!(node.as_deref(), Some("worker-1"));
        let e = local_node("c", &a, Backend::ZfsDataset, Protocol::Local).unwrap_err();
        assert!(e.to_string().contains("only the directories"), "{e}");
        let e = local_node("c", &agent(None), Backend::Directory, Protocol::Local).unwrap_err();
        assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
        assert!(e.to_string().contains("has no nodeName"), "{e}");
    }

    #[test]
    fn a_requisite_without_the_agents_node_is_refused() {
        let req = |nodes: &[&str]| csi::TopologyRequirement {
            requisite: nodes.iter().map(|n| on(n)).collect(),
            preferred: vec![on("worker-9")],
        };
        check_requisite("v", "worker-1", "s", None).unwrap();
        check_requisite("v", "worker-1", "s", Some(&req(&[]))).unwrap();
        check_requisite("v", "worker-1", "s", Some(&req(&["worker-2", "worker-1"]))).unwrap();
        let e = check_requisite("v", "worker-1", "s", Some(&req(&["worker-2"]))).unwrap_err();
        assert!(matches!(e, Error::ResourceExhausted(_)), "{e}");
        assert!(e.to_string().contains("node worker-1"), "{e}");
    }

    #[test]
    fn publish_admits_the_agents_node_only() {
        check_publish("v", "worker-1", &agent(Some("worker-1"))).unwrap();
        let e = check_publish("v", "worker-2", &agent(Some("worker-1"))).unwrap_err();
        assert!(e.to_string().contains("node-local to node worker-1"), "{e}");
        assert!(check_publish("v", "worker-1", &agent(None)).is_err());
        assert!(accessible(None).is_empty());
    }
}
