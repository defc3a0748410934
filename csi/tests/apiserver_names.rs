//! CreateVolume names that are not Kubernetes object names (capitals, `_`,
//! 128 bytes: what csi-sanity and COs other than Kubernetes send), against
//! a real kube-apiserver 1.20 and the simulated agent behind mTLS (see
//! `common`): each gets a record of a derived name that keeps the name it
//! came from, its own zvol, the same handle on a retry, and DeleteVolume
//! removes both.
mod common;

use api::crd::PillarVolumeState;
use common::*;
use csi::controller::naming::{record_name, CSI_NAME};
use kube::api::{Api, PostParams};
use kube::ResourceExt;
use pillar_csi_proto::csi::v1 as pb;
use pillar_csi_proto::csi::v1::controller_server::Controller as _;
use std::collections::HashMap;
use tonic::{Code, Request};

/// A CreateVolume of `bytes` (at most `limit`, 0: any) of class `hot`
/// without claim metadata, as csi-sanity sends it.
fn create(name: &str, bytes: i64, limit: i64) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes,
            limit_bytes: limit,
        }),
        volume_capabilities: vec![mount_cap("")],
        parameters: HashMap::from([("pillarStorageClass".to_owned(), "hot".to_owned())]),
        ..Default::default()
    }
}

async fn provision(
    bed: &Bed,
    req: pb::CreateVolumeRequest,
) -> std::result::Result<pb::Volume, tonic::Status> {
    Ok(bed
        .controller
        .create_volume(Request::new(req))
        .await?
        .into_inner()
        .volume
        .expect("CreateVolume answered without a volume"))
}

#[tokio::test]
async fn names_that_are_not_object_names_get_records_of_their_own() -> Result {
    let bed = bed().await?;
    let sanity = format!("sanity-Node-Stage_{}", "X".repeat(110));
    assert_eq!(sanity.len(), 128);
    let mut handles = Vec::new();
    for name in [sanity.as_str(), "Claim_A", "claim_a", "_", "-"] {
        let volume = provision(&bed, create(name, 64 << 20, 0)).await?;
        let record = state(&bed, &record_name(name))
            .await?
            .ok_or(format!("no record for {name:?}"))?;
        assert_eq!(record.annotations().get(CSI_NAME), Some(&name.to_owned()));
        assert_eq!(record.spec.volume_id, volume.volume_id);
        // The provisioner's retry: the same volume.
        let again = provision(&bed, create(name, 64 << 20, 0)).await?;
        assert_eq!(again.volume_id, volume.volume_id, "{name:?}");
        handles.push(volume.volume_id);
    }
    assert_eq!(bed.zvols(), 5, "one zvol per name: {handles:?}");
    assert_ne!(
        handles[1], handles[2],
        "names differing in case share a zvol"
    );

    for handle in &handles {
        bed.controller
            .delete_volume(Request::new(pb::DeleteVolumeRequest {
                volume_id: handle.clone(),
                ..Default::default()
            }))
            .await?;
    }
    assert_eq!(bed.zvols(), 0);
    assert!(states(&bed).await?.is_empty(), "records left after delete");
    Ok(())
}

#[tokio::test]
async fn a_size_outside_the_new_range_or_a_record_of_another_name_is_refused() -> Result {
    let bed = bed().await?;
    let volume = provision(&bed, create("Sized_Volume", 128 << 20, 0)).await?;
    let calls = bed.agent_calls();

    // Asked again with a limit below what exists.
    let err = provision(&bed, create("Sized_Volume", 64 << 20, 64 << 20))
        .await
        .expect_err("a smaller limit than the volume's size was accepted");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(
        err.message()
            .contains("already exists with 134217728 bytes, outside the range requested"),
        "{err:?}"
    );

    // The record a name derives to, held by another name (what a digest
    // collision would look like).
    let other = "Other_Volume";
    let mut taken: PillarVolumeState = state(&bed, &record_name("Sized_Volume"))
        .await?
        .ok_or("no record")?;
    taken.metadata = kube::api::ObjectMeta {
        name: Some(record_name(other)),
        annotations: Some([(CSI_NAME.to_owned(), "Someone_Else".to_owned())].into()),
        ..Default::default()
    };
    taken.status = None;
    Api::<PillarVolumeState>::all(bed.client.clone())
        .create(&PostParams::default(), &taken)
        .await?;
    let err = provision(&bed, create(other, 64 << 20, 0))
        .await
        .expect_err("a record of another name was taken over");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(
        err.message().contains("belongs to volume \"Someone_Else\""),
        "{err:?}"
    );
    assert!(
        bed.agent_calls_since(calls).is_empty(),
        "a refusal reached the agent"
    );
    assert_eq!(bed.zvols(), 1);
    assert_eq!(
        state(&bed, &record_name("Sized_Volume"))
            .await?
            .map(|s| s.spec.volume_id),
        Some(volume.volume_id)
    );
    Ok(())
}
