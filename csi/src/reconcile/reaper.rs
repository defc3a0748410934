//! The abandoned-volume reaper. A claim deleted before its volume was
//! provisioned gets no DeleteVolume (the external-provisioner calls it
//! only for a PV), so its PillarVolumeState would stay forever. The spec
//! ("Roll back: before the PVC binds"): "When the claim is deleted,
//! pillar-csi tells the agent to forget the claim and removes its records.
//! It never destroys, resizes or reformats a zvol whose import did not
//! complete, and it keeps retrying while the agent is unreachable." And:
//! a RecoveryPending record is never removed by the reaper.
//!
//! A record is abandoned when all hold:
//! - it is not `Ready` (provisioning never completed; a Ready record
//!   without a PV is kept: deleting a Retain PV leaves the record, by the spec);
//! - it is not a recovery record (`spec.recovery` set, or `RecoveryPending`);
//! - it names its claim (`spec.claimRef`), and no claim of that namespace,
//!   name and UID exists;
//! - no PersistentVolume of the record's name exists.
//!
//! Then, under the record's own fence token:
//! 1. the agent is asked what it holds (ListVolumes). When the volume ID
//!    has no fence mark, or its lifecycle is another record's or has
//!    ended, the agent holds nothing of this claim and is not called again
//!    (another claim's live import is never touched).
//! 2. Otherwise the agent forgets the claim: an import (`importedFrom` or
//!    `lvmSource`, any policy) gets ReleaseVolume, which ends the lifecycle
//!    and removes exports but never destroys, resizes or formats; a volume
//!    the controller created for the claim gets DeleteVolume (it was never
//!    Ready, so never published: it holds no data of the claim).
//! 3. The claim's PillarVolumeReservations (`spec.ownerVolume` = the
//!    record) are deleted, then the record.
//!
//! An agent that cannot be reached, or refuses, leaves everything in place
//! for the next pass (the reason goes to the record's `status.message`).
use super::Reconcilers;
use crate::controller::error::Error;
use crate::controller::recovery;
use api::crd::{PillarAgent, PillarVolumeReservation, PillarVolumeState, VolumePhase};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use pillar_csi_proto::agent::v1 as pb;

/// Why a record is kept, or `None` when it is a candidate (before the
/// Kubernetes lookups).
pub fn kept_because(record: &PillarVolumeState) -> Option<&'static str> {
    let phase = record.status.as_ref().and_then(|s| s.phase);
    if recovery::is_pending(record) || phase == Some(VolumePhase::RecoveryPending) {
        return Some("a recovery record");
    }
    if phase == Some(VolumePhase::Ready) {
        return Some("provisioned");
    }
    if record.spec.claim_ref.is_none() {
        return Some("names no claim");
    }
    None
}

/// Whether the agent's answer shows a live lifecycle of this record.
fn held_by(volumes: &[pb::VolumeInfo], record: &PillarVolumeState) -> bool {
    let uid = record.metadata.uid.as_deref().unwrap_or_default();
    volumes.iter().any(|v| {
        v.volume_id == record.spec.agent_volume_id
            && !v.ended
            && v.fence.as_ref().is_some_and(|f| f.volume_uid == uid)
    })
}

impl Reconcilers {
    /// One pass; returns how many abandoned records could not be removed yet.
    pub async fn reap(&self) -> u64 {
        let states = Api::<PillarVolumeState>::all(self.client.clone());
        let records = match states.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %e, "reaper: list PillarVolumeStates");
                return 1;
            }
        };
        let mut errors = 0;
        for record in records {
            if kept_because(&record).is_some() {
                continue;
            }
            match self.abandoned(&record).await {
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!(record = %record.name_any(), error = %e, "reaper");
                    errors += 1;
                    continue;
                }
            }
            if let Err(e) = self.forget(&states, &record).await {
                tracing::warn!(record = %record.name_any(), error = %e, "reaper: kept for the next pass");
                let patch = serde_json::json!({"status": {"message": format!(
                    "abandoned (its claim is gone); the reaper retries: {e}")}});
                let _ = states
                    .patch_status(
                        &record.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await;
                errors += 1;
            }
        }
        errors
    }

    /// Whether the record's claim and PV are both gone.
    async fn abandoned(&self, record: &PillarVolumeState) -> Result<bool, Error> {
        let Some(claim) = &record.spec.claim_ref else {
            return Ok(false);
        };
        let name = record.name_any();
        let pv = Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("read PersistentVolume {name:?}")))?;
        if pv.is_some() {
            return Ok(false);
        }
        let pvc = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &claim.namespace)
            .get_opt(&claim.name)
            .await
            .map_err(Error::kube(format!(
                "read PersistentVolumeClaim {}/{}",
                claim.namespace, claim.name
            )))?;
        Ok(pvc.is_none_or(|p| p.metadata.uid.as_deref() != Some(claim.uid.as_str())))
    }

    /// Tells the agent to forget the claim, then removes its records.
    async fn forget(
        &self,
        states: &Api<PillarVolumeState>,
        record: &PillarVolumeState,
    ) -> Result<(), Error> {
        let name = record.name_any();
        let agent = Api::<PillarAgent>::all(self.client.clone())
            .get_opt(&record.spec.agent_ref)
            .await
            .map_err(Error::kube(format!(
                "read PillarAgent {:?}",
                record.spec.agent_ref
            )))?
            .ok_or_else(|| {
                Error::Unavailable(format!(
                    "PillarAgent {:?} does not exist; the agent cannot be told to forget the claim",
                    record.spec.agent_ref
                ))
            })?;
        let mut client = self.agents.client(&agent)?;
        let held = client
            .client
            .list_volumes(pb::ListVolumesRequest {})
            .await
            .map_err(client.fail())?
            .into_inner()
            .volumes;
        if held_by(&held, record) {
            // Never destroyed here: an import is only released.
            let import = record.spec.imported_from.is_some() || record.spec.lvm_source.is_some();
            client.end_lifecycle(record, import).await?;
        }
        let reservations = Api::<PillarVolumeReservation>::all(self.client.clone());
        let owned = reservations
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("list PillarVolumeReservations"))?;
        for r in owned.items.iter().filter(|r| r.spec.owner_volume == name) {
            match reservations
                .delete(&r.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    return Err(Error::kube(format!(
                        "delete PillarVolumeReservation {:?}",
                        r.name_any()
                    ))(e))
                }
            }
        }
        // Only this very record: one re-created under the name meanwhile
        // is another volume's.
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: record.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match states.delete(&name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(Error::kube(format!("delete PillarVolumeState {name:?}"))(e)),
        }
        tracing::info!(record = %name, agent = %record.spec.agent_ref, "reaper: abandoned volume forgotten");
        Ok(())
    }
}
