//! ControllerPublishVolume and ControllerUnpublishVolume.
//!
//! A publication change first raises `status.publicationGeneration` (a
//! compare-and-swap on the record's resourceVersion), then calls the agent
//! with the raised fence token, so a controller holding an older view is
//! refused by the agent. The node stays listed until the agent has denied
//! it, so a retried Unpublish still reaches the agent.
//!
//! The recorded ACL (`spec.exportSpec.allowedInitiators`, what the resync
//! restores) never lists a node its Unpublish has begun to cut off:
//! Unpublish narrows it before it raises the generation, so a resync that
//! reads the record at any step sends the narrowed ACL (an older read's
//! ACL carries the older generation, which the agent refuses once the
//! denial is made). Each step is a compare-and-swap on the record the step
//! before wrote, and a node enters the ACL only through its own Publish.
use super::capabilities::{check, single_node};
use super::error::{Error, Result};
use super::state::{fence, generation};
use super::topology;
use super::{backend_type, protocol_type, Controller};
use crate::node_id::{FilesNodeId, InvalidNodeId, NodeId};
use crate::publish_context::PublishContext;
use api::crd::{PillarVolumeState, PillarVolumeStateStatus, PublishedNode};
use api::tokens::Protocol;
use pillar_csi_proto::agent::v1 as agent;
use pillar_csi_proto::csi::v1 as csi;
use pillar_csi_proto::csi::v1::volume_capability::access_mode::Mode;
use std::collections::HashMap;
use std::net::IpAddr;

/// A node as an export names it: its name, and the initiator its node ID
/// carries for the volume's protocol (the host NQN, the initiator IQN, the
/// NFS client address of a files node ID, or, node-local, the node's name).
struct Peer {
    name: String,
    initiator: String,
}

fn peer(node_id: &str, protocol: Protocol) -> std::result::Result<Peer, InvalidNodeId> {
    if protocol.is_filesystem() {
        let node = FilesNodeId::parse(node_id)?;
        let initiator = match protocol {
            Protocol::Local => node.name().to_owned(),
            _ => node.address().to_string(),
        };
        return Ok(Peer {
            name: node.name().to_owned(),
            initiator,
        });
    }
    let node = NodeId::parse(node_id)?;
    let initiator = match protocol {
        Protocol::Iscsi => node.initiator_iqn(),
        _ => node.host_nqn(),
    };
    Ok(Peer {
        name: node.name().to_owned(),
        initiator: initiator.to_owned(),
    })
}

/// The initiators of every node in `nodes` (skipping IDs that no longer parse).
fn initiators(nodes: &[PublishedNode], protocol: Protocol) -> Vec<String> {
    nodes
        .iter()
        .filter_map(|n| peer(&n.node_id, protocol).ok())
        .map(|p| p.initiator)
        .collect()
}

/// Where initiators reach an export: the address ExportVolume answered, or,
/// when the agent listens on every address (`0.0.0.0`, `::`, the chart's
/// default), the address its PillarAgent names (a DNS name resolved here):
/// a worker given the unspecified address would connect to itself.
async fn target_address(
    answered: &str,
    agent_address: &str,
) -> std::result::Result<IpAddr, String> {
    let ip: IpAddr = answered
        .parse()
        .map_err(|e| format!("ExportVolume answered address {answered:?}: {e}"))?;
    if !ip.is_unspecified() {
        return Ok(ip);
    }
    if let Ok(ip) = agent_address.parse::<IpAddr>() {
        return Ok(ip);
    }
    tokio::net::lookup_host((agent_address, 0))
        .await
        .ok()
        .and_then(|mut found| found.next())
        .map(|a| a.ip())
        .ok_or_else(|| {
            format!(
                "the agent listens on every address ({answered}) and its PillarAgent address {agent_address:?} does not resolve: set the agent's nvmeof/iscsi address or a resolvable PillarAgent address"
            )
        })
}

impl Controller {
    /// ControllerPublishVolume: returns the publish context.
    pub async fn publish(
        &self,
        req: csi::ControllerPublishVolumeRequest,
    ) -> Result<HashMap<String, String>> {
        if req.volume_id.is_empty() {
            return Err(Error::InvalidArgument("the volume ID is missing".into()));
        }
        if req.node_id.is_empty() {
            return Err(Error::InvalidArgument("the node ID is missing".into()));
        }
        // The targets cannot serve a volume read-only to one initiator, so
        // PUBLISH_READONLY is not offered and CSI has the CO send false; a
        // true is refused rather than published writable (a read-only
        // mount is NodePublishVolume's readonly).
        if req.readonly {
            return Err(Error::InvalidArgument(format!(
                "cannot publish volume {} readonly: this controller does not offer PUBLISH_READONLY; publish it with readonly false and ask NodePublishVolume for a read-only mount",
                req.volume_id
            )));
        }
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("the volume capability is missing".into()))?;
        check(self.driver, cap).map_err(Error::InvalidArgument)?;
        let mode = cap
            .access_mode
            .as_ref()
            .map(|m| Mode::try_from(m.mode).unwrap_or(Mode::Unknown))
            .unwrap_or(Mode::Unknown);
        let state = self.ready_state(&req.volume_id, "publish").await?;
        let node = peer(&req.node_id, state.spec.protocol_type)
            .map_err(|e| Error::NotFound(format!("node {:?}: {e}", req.node_id)))?;
        if state.spec.protocol_type == Protocol::Local {
            let agent = self.agent_of(&state).await?;
            topology::check_publish(&req.volume_id, &node.name, &agent)?;
        }
        let status = state.status.clone().unwrap_or_default();
        let state = if status
            .published_nodes
            .iter()
            .any(|n| n.node_id == req.node_id)
        {
            state
        } else {
            if single_node(mode) {
                if let Some(other) = status.published_nodes.first() {
                    return Err(Error::FailedPrecondition(format!(
                        "cannot publish volume {} to node {}: it is published to node {} and its access mode allows one node",
                        req.volume_id,
                        node.name,
                        peer(&other.node_id, state.spec.protocol_type)
                            .map(|n| n.name)
                            .unwrap_or_else(|_| other.node_id.clone())
                    )));
                }
            }
            let next = generation(&state) + 1;
            let mut nodes = status.published_nodes.clone();
            nodes.push(PublishedNode {
                node_id: req.node_id.clone(),
                generation: next,
            });
            self.states
                .set_status(
                    &state,
                    PillarVolumeStateStatus {
                        publication_generation: Some(next),
                        published_nodes: nodes,
                        ..status
                    },
                )
                .await?
        };
        self.export(&state, &node).await
    }

    /// Exports the volume under the record's present fence token to `node`
    /// and the listed nodes its recorded ACL admits (not one whose
    /// Unpublish has begun), and returns the publish context.
    async fn export(
        &self,
        state: &PillarVolumeState,
        node: &Peer,
    ) -> Result<HashMap<String, String>> {
        let protocol = state.spec.protocol_type;
        let nodes = state
            .status
            .as_ref()
            .map(|s| s.published_nodes.clone())
            .unwrap_or_default();
        let this = node.initiator.clone();
        let recorded = state.spec.export_spec.as_ref();
        let allowed: Vec<String> = initiators(&nodes, protocol)
            .into_iter()
            .filter(|i| *i == this || recorded.is_none_or(|e| e.allowed_initiators.contains(i)))
            .collect();
        let acl = recorded.is_none_or(|e| e.acl_enabled);
        let state = self
            .states
            .swap_spec(
                state,
                serde_json::json!({"exportSpec": {"aclEnabled": acl, "allowedInitiators": allowed}}),
            )
            .await?;
        let token = fence(&state, generation(&state));
        let agent = self.agent_of(&state).await?;
        let mut client = self.agents.client(&agent)?;
        let volume = state.spec.agent_volume_id.clone();
        let exported = client
            .client
            .export_volume(agent::ExportVolumeRequest {
                volume_id: volume.clone(),
                backend_type: backend_type(state.spec.backend_type),
                protocol_type: protocol_type(protocol),
                fence: Some(token.clone()),
                acl_enabled: acl,
                allowed_initiators: allowed.clone(),
                chap: None,
            })
            .await
            .map_err(client.fail())?
            .into_inner();
        if acl {
            for initiator in &allowed {
                client
                    .client
                    .allow_initiator(agent::AllowInitiatorRequest {
                        volume_id: volume.clone(),
                        protocol_type: protocol_type(protocol),
                        initiator_id: initiator.clone(),
                        fence: Some(token.clone()),
                    })
                    .await
                    .map_err(client.fail())?;
            }
        }
        let address = target_address(&exported.address, &agent.spec.address)
            .await
            .map_err(|e| Error::Agent {
                agent: client.name.clone(),
                status: tonic::Status::internal(e),
            })?;
        Ok(PublishContext {
            protocol,
            address,
            port: u16::try_from(exported.port).unwrap_or(0),
            target: exported.target_id,
            lun: exported.lun,
            device_identity: Some(exported.device_identity).filter(|i| !i.is_empty()),
            chap: None,
        }
        .to_map())
    }

    /// ControllerUnpublishVolume.
    pub async fn unpublish(&self, req: csi::ControllerUnpublishVolumeRequest) -> Result<()> {
        if req.volume_id.is_empty() {
            return Err(Error::InvalidArgument("the volume ID is missing".into()));
        }
        let Some(state) = self.states.by_handle(&req.volume_id).await? else {
            return Ok(());
        };
        let status = state.status.clone().unwrap_or_default();
        // An empty node ID means every node (CSI).
        let leaving: Vec<PublishedNode> = status
            .published_nodes
            .iter()
            .filter(|n| req.node_id.is_empty() || n.node_id == req.node_id)
            .cloned()
            .collect();
        if leaving.is_empty() {
            return Ok(());
        }
        let protocol = state.spec.protocol_type;
        let remaining: Vec<PublishedNode> = status
            .published_nodes
            .iter()
            .filter(|n| !leaving.contains(n))
            .cloned()
            .collect();
        let staying = initiators(&remaining, protocol);
        let acl = state
            .spec
            .export_spec
            .as_ref()
            .is_none_or(|e| e.acl_enabled);
        // 1. The narrowed ACL, before the generation that makes it current.
        let state = self
            .states
            .swap_spec(
                &state,
                serde_json::json!({"exportSpec": {"aclEnabled": acl, "allowedInitiators": staying}}),
            )
            .await?;
        // 2. The raised generation, on the record step 1 wrote.
        let next = generation(&state) + 1;
        let status = state.status.clone().unwrap_or_default();
        let state = self
            .states
            .set_status(
                &state,
                PillarVolumeStateStatus {
                    publication_generation: Some(next),
                    ..status
                },
            )
            .await?;
        // 3. The agent cuts the leaving nodes off under it.
        let agent = self.agent_of(&state).await?;
        let mut client = self.agents.client(&agent)?;
        for gone in initiators(&leaving, protocol) {
            if staying.contains(&gone) {
                continue;
            }
            client
                .client
                .deny_initiator(agent::DenyInitiatorRequest {
                    volume_id: state.spec.agent_volume_id.clone(),
                    protocol_type: protocol_type(protocol),
                    initiator_id: gone,
                    fence: Some(fence(&state, next)),
                })
                .await
                .map_err(client.fail())?;
        }
        // 4. The nodes leave the record, on the record step 2 wrote.
        let status = state.status.clone().unwrap_or_default();
        self.states
            .set_status(
                &state,
                PillarVolumeStateStatus {
                    published_nodes: remaining,
                    ..status
                },
            )
            .await?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::target_address;

    #[tokio::test]
    async fn an_agent_listening_everywhere_is_reached_at_its_pillar_agent_address() {
        let at = |a: &str, agent: &str| {
            let (a, agent) = (a.to_owned(), agent.to_owned());
            async move { target_address(&a, &agent).await }
        };
        assert_eq!(
            at("192.0.2.7", "192.0.2.1").await,
            Ok("192.0.2.7".parse().unwrap())
        );
        assert_eq!(
            at("0.0.0.0", "192.0.2.1").await,
            Ok("192.0.2.1".parse().unwrap())
        );
        assert_eq!(
            at("::", "2001:db8::1").await,
            Ok("2001:db8::1".parse().unwrap())
        );
        assert_eq!(
            at("0.0.0.0", "localhost").await.map(|ip| ip.is_loopback()),
            Ok(true)
        );
        let e = at("0.0.0.0", "no-such-host.invalid").await.unwrap_err();
        assert!(e.contains("does not resolve"), "{e}");
        assert!(at("not an ip", "192.0.2.1").await.is_err());
    }
}
