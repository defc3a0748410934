//! ControllerPublishVolume and ControllerUnpublishVolume on their failure
//! paths, against a real kube-apiserver 1.20 and the recording agent: a
//! resync that runs in the middle of an Unpublish, and an Unpublish after a
//! Publish whose export never reached the agent.
#![allow(clippy::unwrap_used)]
use api::crd::PillarVolumeState;
use csi::controller::{agents::Agents, Controller};
use csi::node_id::NodeId;
use kube::api::Api;
use pillar_csi_proto::csi::v1 as pb;
use pillar_csi_proto::csi::v1::controller_server::Controller as _;
use std::time::{Duration, Instant};
use tonic::Request;

mod common;

use common::{bed, claim, create_request, mount_cap, Bed, Hold, Result};

const NQN_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a21";
const NQN_B: &str = "nqn.2014-08.org.nvmexpress:uuid:1f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a22";
const IQN: &str = "iqn.1993-08.org.debian:01:5e2f9a1b7c3d";

/// A volume of class `hot` for the claim `ns/data` in a new bed; returns
/// its record's name and its handle.
async fn volume(bed: &Bed) -> Result<(String, String)> {
    bed.server.kubectl(&["create", "namespace", "ns"])?;
    let name = claim(bed, "ns", "data", &[]).await?;
    let volume = bed
        .controller
        .create_volume(Request::new(create_request(
            &name,
            64 << 20,
            "hot",
            "ns",
            "data",
        )))
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    Ok((name, volume.volume_id))
}

fn publish(handle: &str, node: &NodeId) -> pb::ControllerPublishVolumeRequest {
    pb::ControllerPublishVolumeRequest {
        volume_id: handle.into(),
        node_id: node.to_string(),
        volume_capability: Some(mount_cap("xfs")),
        ..Default::default()
    }
}

fn unpublish(handle: &str, node: &NodeId) -> pb::ControllerUnpublishVolumeRequest {
    pb::ControllerUnpublishVolumeRequest {
        volume_id: handle.into(),
        node_id: node.to_string(),
        ..Default::default()
    }
}

/// The initiators the simulated agent admits to the zvol `tank/<name>`.
fn admitted(bed: &Bed, name: &str) -> Vec<String> {
    bed.fixture
        .exporter
        .exports
        .lock()
        .unwrap()
        .get(&format!("tank/{name}"))
        .map(|r| r.allowed_initiators.iter().cloned().collect())
        .unwrap_or_default()
}

async fn published_nodes(bed: &Bed, name: &str) -> Result<Vec<String>> {
    let record = Api::<PillarVolumeState>::all(bed.client.clone())
        .get(name)
        .await?;
    Ok(record
        .status
        .unwrap_or_default()
        .published_nodes
        .into_iter()
        .map(|n| n.node_id)
        .collect())
}

#[tokio::test]
async fn a_resync_during_unpublish_does_not_admit_the_node_again() -> Result {
    let bed = bed().await?;
    let (name, handle) = volume(&bed).await?;
    let node = NodeId::new("worker-a", NQN_A, IQN)?;
    bed.controller
        .controller_publish_volume(Request::new(publish(&handle, &node)))
        .await?;
    assert_eq!(admitted(&bed, &name), [NQN_A]);

    // Unpublish, its DenyInitiator held after the agent denied the node;
    // meanwhile the periodic resync lists the record and sends its export.
    *bed.held_method.lock().unwrap() = "deny_initiator";
    bed.hold.send_replace(Hold::Reply);
    let unpublished = bed
        .controller
        .controller_unpublish_volume(Request::new(unpublish(&handle, &node)));
    let meanwhile = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while admitted(&bed, &name).contains(&NQN_A.to_owned()) {
            if Instant::now() > deadline {
                bed.hold.send_replace(Hold::None);
                return Err("the agent did not deny the node within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let failed = bed.reconcilers().await?.resync().await;
        bed.hold.send_replace(Hold::None);
        Result::Ok(failed)
    };
    let (unpublished, failed) = tokio::join!(unpublished, meanwhile);
    unpublished?;
    assert_eq!(failed?, 0, "the resync's export was applied");
    assert_eq!(
        admitted(&bed, &name),
        Vec::<String>::new(),
        "Unpublish answered OK: the node must stay out"
    );
    assert_eq!(published_nodes(&bed, &name).await?, Vec::<String>::new());
    Ok(())
}

/// The initiators the record's `exportSpec` admits (what a resync sends).
async fn recorded_acl(bed: &Bed, name: &str) -> Result<Vec<String>> {
    let record = Api::<PillarVolumeState>::all(bed.client.clone())
        .get(name)
        .await?;
    Ok(record
        .spec
        .export_spec
        .map(|e| e.allowed_initiators)
        .unwrap_or_default())
}

#[tokio::test]
async fn a_stale_unpublish_of_an_old_leader_does_not_cut_off_the_next_node() -> Result {
    let bed = bed().await?;
    let (name, handle) = volume(&bed).await?;
    let (node_a, node_b) = (
        NodeId::new("worker-a", NQN_A, IQN)?,
        NodeId::new("worker-b", NQN_B, IQN)?,
    );
    bed.controller
        .controller_publish_volume(Request::new(publish(&handle, &node_a)))
        .await?;
    // The old leader's Unpublish of A, held after the agent denied A.
    *bed.held_method.lock().unwrap() = "deny_initiator";
    bed.hold.send_replace(Hold::Reply);
    let old = bed
        .controller
        .controller_unpublish_volume(Request::new(unpublish(&handle, &node_a)));
    let new_leader = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while admitted(&bed, &name).contains(&NQN_A.to_owned()) {
            if Instant::now() > deadline {
                bed.hold.send_replace(Hold::None);
                return Err("the agent did not deny A within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Only that call stays held. The new leader unpublishes A (the
        // attacher's retry) and publishes the pod's new node B.
        *bed.held_method.lock().unwrap() = "none";
        let controller = Controller::new(
            bed.server.controller_client().await?,
            Agents::new(Some(&bed.certs.controller_tls()))?,
        );
        let done = async {
            controller
                .controller_unpublish_volume(Request::new(unpublish(&handle, &node_a)))
                .await?;
            controller
                .controller_publish_volume(Request::new(publish(&handle, &node_b)))
                .await?;
            Result::Ok(())
        }
        .await;
        bed.hold.send_replace(Hold::None);
        done
    };
    let (old, new_leader) = tokio::join!(old, new_leader);
    new_leader?;
    assert_eq!(
        recorded_acl(&bed, &name).await?,
        [NQN_B],
        "B stays in the recorded ACL"
    );
    assert_eq!(
        published_nodes(&bed, &name).await?,
        [node_b.to_string()],
        "B stays published"
    );
    let e = old.expect_err("the old leader's record changed under it");
    assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
    assert_eq!(bed.reconcilers().await?.resync().await, 0);
    assert_eq!(admitted(&bed, &name), [NQN_B], "B stays admitted");
    Ok(())
}

#[tokio::test]
async fn unpublish_after_a_publish_whose_export_failed_succeeds() -> Result {
    let bed = bed().await?;
    let (name, handle) = volume(&bed).await?;
    let node = NodeId::new("worker-a", NQN_A, IQN)?;
    // The agent unreachable: the record lists the node, no export is made.
    bed.agent_at(1)?;
    let e = bed
        .controller
        .controller_publish_volume(Request::new(publish(&handle, &node)))
        .await
        .expect_err("publish with the agent unreachable");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert_eq!(published_nodes(&bed, &name).await?, [node.to_string()]);
    // The agent back, the pod deleted before a retried publish: the CO
    // unpublishes a volume the node was never given.
    bed.agent_at(bed.agent_port)?;
    bed.controller
        .controller_unpublish_volume(Request::new(unpublish(&handle, &node)))
        .await?;
    assert_eq!(published_nodes(&bed, &name).await?, Vec::<String>::new());
    assert_eq!(admitted(&bed, &name), Vec::<String>::new());
    bed.controller
        .delete_volume(Request::new(pb::DeleteVolumeRequest {
            volume_id: handle,
            ..Default::default()
        }))
        .await?;
    Ok(())
}
