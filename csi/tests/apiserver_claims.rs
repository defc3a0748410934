//! A claim that goes while its volume is provisioned, against a real
//! kube-apiserver 1.20 and the simulated agent behind the recorder (see
//! `common`): an import is never completed, nor destroyed, for a claim
//! that was never bound to it; the reaper and a CreateVolume still on its
//! way to the agent never leave the agent holding what no record names;
//! a Ready volume whose PersistentVolume never came is reaped.
mod common;

use api::crd::*;
use common::*;
use csi::node_id::NodeId;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams};
use pillar_csi_proto::csi::v1 as pb;
use pillar_csi_proto::csi::v1::controller_server::Controller as _;
use tonic::{Code, Request};

const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a21";
const IQN: &str = "iqn.1993-08.org.debian:01:5e2f9a1b7c3d";
const ZVOL: &str = "pillar-csi.bhyoo.com/import-zvol";
const MIB: u64 = 1 << 20;

async fn create(
    bed: &Bed,
    pv: &str,
    claim: &str,
) -> std::result::Result<pb::Volume, tonic::Status> {
    bed.controller
        .create_volume(Request::new(create_request(
            pv,
            (64 * MIB) as i64,
            "hot",
            "db",
            claim,
        )))
        .await
        .map(|r| r.into_inner().volume.unwrap_or_default())
}

async fn delete(bed: &Bed, handle: &str) -> Result {
    bed.controller
        .delete_volume(Request::new(pb::DeleteVolumeRequest {
            volume_id: handle.into(),
            ..Default::default()
        }))
        .await?;
    Ok(())
}

fn phase(state: &PillarVolumeState) -> Option<VolumePhase> {
    state.status.as_ref().and_then(|s| s.phase)
}

#[tokio::test]
async fn an_import_whose_claim_went_before_it_bound_is_never_destroyed() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    // 1. The claim is deleted while the import is on its way to the agent:
    //    the agent adopts the zvol, but the CreateVolume is refused (final)
    //    and the record is not Ready; the reaper releases it.
    bed.add_zvol("inflight", 96 * MIB);
    let pv = claim(&bed, "db", "inflight", &[(ZVOL, "tank/k8s/inflight")]).await?;
    let answer = bed
        .held_while(
            create(&bed, &pv, "inflight"),
            bed.delete_claim("db", "inflight"),
        )
        .await?;
    let e = answer.expect_err("an import completed for a deleted claim");
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::FailedPrecondition,
            format!("PersistentVolumeClaim db/inflight does not exist; volume {pv:?} is not provisioned for a claim that is gone: its records are removed without destroying an imported volume").as_str()
        )
    );
    let record = state(&bed, &pv).await?.ok_or("no record")?;
    assert_ne!(phase(&record), Some(VolumePhase::Ready));
    let calls = bed.agent_calls();
    assert_eq!(bed.reconcilers().await?.reap().await, 0);
    assert_eq!(
        bed.agent_calls_since(calls),
        vec!["list_volumes", "release_volume"]
    );
    assert!(state(&bed, &pv).await?.is_none());
    assert!(reservations(&bed).await?.is_empty());
    assert_eq!(bed.zvol("inflight"), Some(96 * MIB));

    // 2. The import completed, then the claim went before it bound: the
    //    provisioner makes its PV anyway, the PV is Released, and under
    //    reclaimPolicy Delete DeleteVolume comes. The controller never saw
    //    the claim bound (never published): ReleaseVolume, the zvol stays.
    bed.add_zvol("unbound", 96 * MIB);
    let pv = claim(&bed, "db", "unbound", &[(ZVOL, "tank/k8s/unbound")]).await?;
    let volume = create(&bed, &pv, "unbound").await?;
    bed.delete_claim("db", "unbound").await?;
    let calls = bed.agent_calls();
    delete(&bed, &volume.volume_id).await?;
    assert_eq!(bed.agent_calls_since(calls), vec!["release_volume"]);
    assert_eq!(bed.zvol("unbound"), Some(96 * MIB));
    assert_eq!(bed.destroyed(), 0);
    assert!(state(&bed, &pv).await?.is_none());
    assert!(reservations(&bed).await?.is_empty());

    // 3. A claim the reaper's pass saw Bound to the volume's PV (never
    //    published): reclaimPolicy Delete destroys the import, as the spec
    //    says of every imported zvol.
    bed.add_zvol("bound", 96 * MIB);
    let pv = claim(&bed, "db", "bound", &[(ZVOL, "tank/k8s/bound")]).await?;
    let volume = create(&bed, &pv, "bound").await?;
    bind(&bed, "bound", &pv).await?;
    assert_eq!(bed.reconcilers().await?.reap().await, 0);
    let record = state(&bed, &pv).await?.ok_or("no record")?;
    assert!(csi::controller::import::seen_bound(&record), "{record:?}");
    bed.delete_claim("db", "bound").await?;
    let calls = bed.agent_calls();
    delete(&bed, &volume.volume_id).await?;
    assert_eq!(bed.agent_calls_since(calls), vec!["delete_volume"]);
    assert_eq!(bed.zvol("bound"), None);
    Ok(())
}

/// What the PV controller does when it binds the claim `db/<claim>` to
/// the PV `pv` (no kube-controller-manager runs here).
async fn bind(bed: &Bed, claim: &str, pv: &str) -> Result {
    let claims = Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), "db");
    claims
        .patch(
            claim,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"volumeName": pv}})),
        )
        .await?;
    claims
        .patch_status(
            claim,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Bound"}})),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_create_held_past_the_reaper_leaves_nothing_on_the_agent() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    bed.add_zvol("racy", 96 * MIB);
    let pv = claim(&bed, "db", "racy", &[(ZVOL, "tank/k8s/racy")]).await?;
    let r = bed.reconcilers().await?;
    // The CreateVolume passed its claim checks and wrote its record; before
    // the agent sees it, the claim goes and the reaper removes the record
    // and the reservation.
    let answer = bed
        .held_while(create(&bed, &pv, "racy"), async {
            bed.delete_claim("db", "racy").await?;
            assert_eq!(r.reap().await, 0);
            assert!(state(&bed, &pv).await?.is_none());
            Ok(())
        })
        .await?;
    // The agent refuses the dead record's lifecycle: a final refusal, and
    // no import pinned to a UID no record names.
    let e = answer.expect_err("an import for a removed record");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("has ended"), "{e:?}");
    assert!(states(&bed).await?.is_empty());
    assert!(reservations(&bed).await?.is_empty());
    assert_eq!(bed.zvol("racy"), Some(96 * MIB));
    // The next claim imports the zvol.
    let next = claim(&bed, "db", "next", &[(ZVOL, "tank/k8s/racy")]).await?;
    let volume = create(&bed, &next, "next").await?;
    assert_eq!(volume.capacity_bytes, (96 * MIB) as i64);
    Ok(())
}

#[tokio::test]
async fn a_ready_volume_whose_pv_never_came_is_reaped_after_its_claim() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    // Provisioned, then the provisioner restarted before it made the PVs,
    // and the claims were deleted: a created volume and an import.
    let made = claim(&bed, "db", "made", &[]).await?;
    create(&bed, &made, "made").await?;
    bed.add_zvol("legacy", 96 * MIB);
    let imported = claim(&bed, "db", "legacy", &[(ZVOL, "tank/k8s/legacy")]).await?;
    create(&bed, &imported, "legacy").await?;
    // A volume that was used (published, so bound) and whose Retain PV was
    // deleted by hand: kept, by the spec.
    let used = claim(&bed, "db", "used", &[]).await?;
    let volume = create(&bed, &used, "used").await?;
    let node = NodeId::new("worker-a", NQN, IQN)?;
    bed.controller
        .controller_publish_volume(Request::new(pb::ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: node.to_string(),
            volume_capability: Some(mount_cap("")),
            ..Default::default()
        }))
        .await?;
    bed.controller
        .controller_unpublish_volume(Request::new(pb::ControllerUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: node.to_string(),
            ..Default::default()
        }))
        .await?;
    // One whose claim was seen Bound (never published): kept too.
    let seen = claim(&bed, "db", "seen", &[]).await?;
    create(&bed, &seen, "seen").await?;
    bind(&bed, "seen", &seen).await?;
    let r = bed.reconcilers().await?;
    // While the claims exist, nothing happens (but the binding is seen).
    assert_eq!(r.reap().await, 0);
    assert_eq!(states(&bed).await?.len(), 4);
    for name in ["made", "legacy", "used", "seen"] {
        bed.delete_claim("db", name).await?;
    }
    let zvols = bed.zvols();
    assert_eq!(r.reap().await, 0);
    // The created volume is deleted, the import released.
    assert!(state(&bed, &made).await?.is_none(), "kept forever");
    assert!(state(&bed, &imported).await?.is_none(), "kept forever");
    assert!(reservations(&bed).await?.is_empty());
    assert_eq!(bed.zvols(), zvols - 1);
    assert_eq!(bed.zvol("legacy"), Some(96 * MIB));
    assert_eq!(bed.destroyed(), 1);
    for name in [&used, &seen] {
        let kept = state(&bed, name)
            .await?
            .ok_or("a bound volume was reaped")?;
        assert_eq!(phase(&kept), Some(VolumePhase::Ready));
    }
    Ok(())
}
