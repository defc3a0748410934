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
//! - it is not a recovery record (`spec.recovery` set, or `RecoveryPending`);
//! - it is not `Ready`, or it is `Ready` but its claim was never seen bound
//!   ([`import::seen_bound`]: never published). A Ready record of a bound
//!   claim without a PV is kept (deleting a Retain PV leaves the record, by
//!   the spec); one never bound is a CreateVolume whose answer the
//!   provisioner lost (it restarted) before its claim was deleted;
//! - it names its claim (`spec.claimRef`), and no claim of that namespace,
//!   name and UID exists;
//! - no PersistentVolume of the volume's name exists.
//!
//! The same lookups mark a Ready record whose claim is Bound to the
//! volume's PV ([`import::BOUND_CLAIM`]): seen bound once, it is kept.
//!
//! Then, under the record's own fence token:
//! 1. the agent is asked what it holds (ListVolumes). When the volume ID is
//!    held by another record's live lifecycle, the agent holds nothing of
//!    this claim and is not called again (another claim's live import is
//!    never touched).
//! 2. Otherwise the agent forgets the claim: an import (`importedFrom` or
//!    `lvmSource`, any policy) gets ReleaseVolume, which ends the lifecycle
//!    and removes exports but never destroys, resizes or formats; a volume
//!    the controller created for the claim gets DeleteVolume (it was never
//!    published: it holds no data of the claim). This is sent also when the
//!    agent holds nothing of the record yet: the record's lifecycle then
//!    ends at once (the agent keeps its UID as ended), so a CreateVolume of
//!    the record still on its way to the agent is refused there and never
//!    leaves a volume, or an import pinned to the record's UID, that no
//!    record names. An agent that answers the lifecycle has ended already
//!    holds nothing of it.
//! 3. The claim's PillarVolumeReservation (the one of its agent and
//!    volume ID whose `spec.ownerVolume` is the record) is deleted, then
//!    the record.
//!
//! An agent that cannot be reached, or refuses, leaves everything in place
//! for the next pass (the reason goes to the record's `status.message`).
use super::Reconcilers;
use crate::controller::error::Error;
use crate::controller::import;
use crate::controller::naming;
use crate::controller::reservations::Reservations;
use api::crd::{PillarAgent, PillarVolumeState, VolumePhase};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use pillar_csi_proto::agent::v1 as pb;

/// Why a record is kept, or `None` when it is a candidate (before the
/// Kubernetes lookups).
pub fn kept_because(record: &PillarVolumeState) -> Option<&'static str> {
    let phase = record.status.as_ref().and_then(|s| s.phase);
    if record.spec.recovery.is_some() || phase == Some(VolumePhase::RecoveryPending) {
        return Some("a recovery record");
    }
    if phase == Some(VolumePhase::Ready) && import::seen_bound(record) {
        return Some("provisioned for a claim that was bound");
    }
    if record.spec.claim_ref.is_none() {
        return Some("names no claim");
    }
    None
}

/// Whether the claim is Bound to the PersistentVolume `pv`.
fn bound_to(claim: &PersistentVolumeClaim, pv: &str) -> bool {
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    let volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
    phase == Some("Bound") && volume == Some(pv)
}

/// Whether the agent's answer shows the record's volume ID held by the
/// live lifecycle of another record.
fn held_by_another(volumes: &[pb::VolumeInfo], record: &PillarVolumeState) -> bool {
    let uid = record.metadata.uid.as_deref().unwrap_or_default();
    volumes.iter().any(|v| {
        v.volume_id == record.spec.agent_volume_id
            && !v.ended
            && v.fence.as_ref().is_some_and(|f| f.volume_uid != uid)
    })
}

/// Whether the agent refused because the record's lifecycle has ended (its
/// fencing refusal `... lifecycle <uid> has ended`): it holds nothing of it.
fn has_ended(e: &Error, record: &PillarVolumeState) -> bool {
    let uid = record.metadata.uid.as_deref().unwrap_or_default();
    matches!(e, Error::Agent { status, .. }
        if status.code() == tonic::Code::FailedPrecondition
            && status.message().contains(&format!("lifecycle {uid} has ended")))
}

impl Reconcilers {
    /// One pass; returns how many abandoned records could not be removed yet.
    pub async fn reap(&self) -> u64 {
        let states = Api::<PillarVolumeState>::all(self.client.clone());
        let records = match states.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %super::with_causes(&e), "reaper: list PillarVolumeStates");
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
                    tracing::warn!(record = %record.name_any(), error = %super::with_causes(&e), "reaper");
                    errors += 1;
                    continue;
                }
            }
            if let Err(e) = self.forget(&states, &record).await {
                tracing::warn!(record = %record.name_any(), error = %super::with_causes(&e), "reaper: kept for the next pass");
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

    /// Whether the record's claim and PV are both gone. A Ready record
    /// whose claim (of the recorded UID) is Bound to the volume's PV is
    /// marked [`import::BOUND_CLAIM`] on the way: from then on DeleteVolume
    /// of an import destroys it under reclaimPolicy Delete, and the record
    /// outlives a Retain PV deleted by hand.
    async fn abandoned(&self, record: &PillarVolumeState) -> Result<bool, Error> {
        let Some(claim) = &record.spec.claim_ref else {
            return Ok(false);
        };
        // The PV is named as CreateVolume's volume (the record keeps that
        // name when its own had to be derived from it).
        let name = record
            .annotations()
            .get(naming::CSI_NAME)
            .cloned()
            .unwrap_or_else(|| record.name_any());
        let pvc = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &claim.namespace)
            .get_opt(&claim.name)
            .await
            .map_err(Error::kube(format!(
                "read PersistentVolumeClaim {}/{}",
                claim.namespace, claim.name
            )))?
            .filter(|p| p.metadata.uid.as_deref() == Some(claim.uid.as_str()));
        if let Some(pvc) = pvc {
            let ready = record.status.as_ref().and_then(|s| s.phase) == Some(VolumePhase::Ready);
            if ready && bound_to(&pvc, &name) {
                self.mark_bound(record, &claim.uid).await?;
            }
            return Ok(false);
        }
        let pv = Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("read PersistentVolume {name:?}")))?;
        Ok(pv.is_none())
    }

    /// Writes [`import::BOUND_CLAIM`] on the record.
    async fn mark_bound(&self, record: &PillarVolumeState, uid: &str) -> Result<(), Error> {
        let name = record.name_any();
        let patch = serde_json::json!({"metadata": {"annotations": {import::BOUND_CLAIM: uid}}});
        Api::<PillarVolumeState>::all(self.client.clone())
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!(
                "mark PillarVolumeState {name:?} bound to its claim"
            )))?;
        tracing::info!(record = %name, claim = %uid, "claim seen bound to its volume");
        Ok(())
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
        if !held_by_another(&held, record) {
            // Never destroyed here: an import is only released.
            let import = record.spec.imported_from.is_some() || record.spec.lvm_source.is_some();
            match client.end_lifecycle(record, import).await {
                Err(e) if !has_ended(&e, record) => return Err(e),
                _ => {}
            }
        }
        Reservations::new(self.client.clone())
            .release_for(record)
            .await?;
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
