//! The controller's refusals that depend on a volume's state, against a
//! real kube-apiserver 1.20 and the simulated agent behind mTLS (see
//! `common`): a published volume is not deleted, and a volume being
//! deleted is neither published nor created again. Each refusal names the
//! volume and why, and reaches no agent.
mod common;

use api::crd::PillarVolumeState;
use common::*;
use csi::node_id::NodeId;
use kube::api::{Api, Patch, PatchParams};
use pillar_csi_proto::csi::v1 as pb;
use pillar_csi_proto::csi::v1::controller_server::Controller as _;
use std::collections::HashMap;
use tonic::{Code, Request};

const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:2f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a23";
const IQN: &str = "iqn.1993-08.org.debian:01:6e2f9a1b7c3d";

fn create() -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: "pvc-refusals".into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap("")],
        parameters: HashMap::from([("pillarStorageClass".to_owned(), "hot".to_owned())]),
        ..Default::default()
    }
}

fn publish(handle: &str, node: &NodeId) -> pb::ControllerPublishVolumeRequest {
    pb::ControllerPublishVolumeRequest {
        volume_id: handle.into(),
        node_id: node.to_string(),
        volume_capability: Some(mount_cap("")),
        ..Default::default()
    }
}

fn delete(handle: &str) -> pb::DeleteVolumeRequest {
    pb::DeleteVolumeRequest {
        volume_id: handle.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_published_volume_is_not_deleted_and_a_deleting_one_is_not_served() -> Result {
    let bed = bed().await?;
    let handle = bed
        .controller
        .create_volume(Request::new(create()))
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?
        .volume_id;
    let node = NodeId::new("worker-a", NQN, IQN)?;
    bed.controller
        .controller_publish_volume(Request::new(publish(&handle, &node)))
        .await?;

    // DeleteVolume of a published volume: refused, nothing asked of the agent.
    let calls = bed.agent_calls();
    let e = bed
        .controller
        .delete_volume(Request::new(delete(&handle)))
        .await
        .expect_err("a published volume was deleted");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        e.message(),
        format!("volume {handle} is still published to node {node}")
    );
    assert!(bed.agent_calls_since(calls).is_empty());
    assert_eq!(bed.zvols(), 1);

    // A delete that began (the controller marks the record first): the
    // volume is not published again, and its name is not created again.
    bed.controller
        .controller_unpublish_volume(Request::new(pb::ControllerUnpublishVolumeRequest {
            volume_id: handle.clone(),
            node_id: node.to_string(),
            ..Default::default()
        }))
        .await?;
    Api::<PillarVolumeState>::all(bed.client.clone())
        .patch_status(
            "pvc-refusals",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"deleting": true}})),
        )
        .await?;
    let calls = bed.agent_calls();
    let e = bed
        .controller
        .controller_publish_volume(Request::new(publish(&handle, &node)))
        .await
        .expect_err("a volume being deleted was published");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        e.message(),
        format!("cannot publish volume {handle}: it is being deleted")
    );
    let e = bed
        .controller
        .create_volume(Request::new(create()))
        .await
        .expect_err("a volume being deleted was created again");
    assert_eq!(e.code(), Code::Aborted, "{e:?}");
    assert_eq!(e.message(), "volume \"pvc-refusals\" is being deleted");
    assert!(bed.agent_calls_since(calls).is_empty());

    // The delete's retry completes it.
    bed.controller
        .delete_volume(Request::new(delete(&handle)))
        .await?;
    assert_eq!(bed.zvols(), 0);
    assert!(states(&bed).await?.is_empty());
    Ok(())
}

/// An encrypted PillarStorageClass: its volumes are asked of the agent
/// encrypted and recorded so; on an LVM store it is refused before any
/// record or agent call.
#[tokio::test]
async fn an_encrypted_class_asks_for_encryption_and_refuses_lvm() -> Result {
    let bed = bed().await?;
    let pp = kube::api::PostParams::default();
    let classes = Api::<api::crd::PillarStorageClass>::all(bed.client.clone());
    for (name, store) in [("sealed", "storage-1-hot"), ("sealed-lvm", "storage-1-lvm")] {
        let mut c = parts::class(name, store, &format!("pillar-{name}"), None);
        c.spec.encrypted = true;
        classes.create(&pp, &c).await?;
    }
    let request = |name: &str, class: &str| {
        let mut r = create();
        r.name = name.into();
        r.parameters = HashMap::from([("pillarStorageClass".to_owned(), class.to_owned())]);
        r
    };

    bed.controller
        .create_volume(Request::new(request("pvc-sealed", "sealed")))
        .await?;
    assert!(bed.last_create().ok_or("no create")?.encrypted);
    let record = state(&bed, "pvc-sealed").await?.ok_or("no record")?;
    assert!(record.spec.resolved.ok_or("not resolved")?.encrypted);

    let calls = bed.agent_calls();
    let e = bed
        .controller
        .create_volume(Request::new(request("pvc-sealed-lvm", "sealed-lvm")))
        .await
        .expect_err("an encrypted LVM volume");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(
        e.message(),
        "PillarStorageClass \"sealed-lvm\" is encrypted and its PillarStore \"storage-1-lvm\" has an LVM backend: encryption is ZFS native encryption of zvols"
    );
    assert!(bed.agent_calls_since(calls).is_empty());
    assert!(state(&bed, "pvc-sealed-lvm").await?.is_none());

    // A class that is not encrypted asks for no encryption.
    bed.controller
        .create_volume(Request::new(request("pvc-plain", "hot")))
        .await?;
    assert!(!bed.last_create().ok_or("no create")?.encrypted);
    Ok(())
}
