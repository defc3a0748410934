//! Metadata-loss recovery, the controller's half (spec: adopt-lvm-lv.md,
//! "Recover after metadata loss").
//!
//! A PillarVolumeState born with `spec.recovery` is RecoveryPending until
//! the agent has moved the volume ID to the record's lifecycle: it serves
//! nothing, publish, expand and delete are refused ([`is_pending`]), and no
//! reaper may remove it. When CreateVolume comes for its claim, the record
//! is checked against itself and the spec (every refusal names the field at
//! fault, is posted on the claim and the record, and leaves it
//! RecoveryPending); then TransferVolumeOwnership is called with the
//! annotation's snapshot and the recorded grant, and the record turns Ready
//! with the new lifecycle's generation.
//!
//! Write-once: Kubernetes 1.20 has no CEL rules, so the controller latches
//! `newVolumeUID`, `authorizationDigest` and the grant's bytes (their
//! SHA-256) in `status.recoveryLatch` the first time a CreateVolume sees
//! all three set (before checking them), and refuses any later value that
//! differs: a record latched with a wrong value is started over, as a new
//! record.
use super::error::{Error, Result};
use super::events::Kind;
use super::resolve;
use super::volumes::{PVC_NAME, PVC_NAMESPACE};
use super::Controller;
use crate::volume_context;
use api::annotations::{
    IMPORT_LV_ANNOTATION, IMPORT_LV_POLICY_ANNOTATION, RECOVERY_SNAPSHOT_ANNOTATION,
};
use api::crd::{
    LvmSource, PillarVolumeState, PillarVolumeStateStatus, Recovery, RecoveryLatch, VolumePhase,
};
use api::handle::VolumeHandle;
use api::tokens::Backend;
use base64::{engine::general_purpose::STANDARD, Engine};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use pillar_csi_proto::agent::v1 as agent;
use pillar_csi_proto::csi::v1 as csi;
use prost::Message;
use std::collections::HashMap;

/// Whether a record is a metadata-loss recovery that has not committed:
/// `spec.recovery` is set and the record is not Ready. Such a record serves
/// nothing and must never be removed automatically (the abandoned-volume
/// reaper skips it).
pub fn is_pending(state: &PillarVolumeState) -> bool {
    state.spec.recovery.is_some()
        && state.status.as_ref().and_then(|s| s.phase) != Some(VolumePhase::Ready)
}

/// Lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256, lower-case hex.
fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// The digest a grant or a snapshot is named by: SHA-256 of its
/// deterministic encoding with `signature` cleared (prost encodes in
/// field-number order, as Go's deterministic marshalling does).
pub fn snapshot_digest(snapshot: &agent::RecoverySnapshot) -> Vec<u8> {
    let mut unsigned = snapshot.clone();
    unsigned.signature.clear();
    ring::digest::digest(&ring::digest::SHA256, &unsigned.encode_to_vec())
        .as_ref()
        .to_vec()
}

/// See [`snapshot_digest`]; hex, as `spec.recovery.authorizationDigest`.
pub fn authorization_digest(authorization: &agent::RecoveryAuthorization) -> String {
    let mut unsigned = authorization.clone();
    unsigned.signature.clear();
    sha256_hex(&unsigned.encode_to_vec())
}

/// The write-once fields as the record holds them now; the refusal names
/// the first one that is not set.
fn written(recovery: &Recovery) -> std::result::Result<RecoveryLatch, String> {
    let need = |value: &Option<String>, field: &str| {
        value
            .clone()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("spec.recovery.{field} is not set: sign the grant and set newVolumeUID, authorization and authorizationDigest in one patch"))
    };
    let new_volume_uid = need(&recovery.new_volume_uid, "newVolumeUID")?;
    let authorization = need(&recovery.authorization, "authorization")?;
    let authorization_digest = need(&recovery.authorization_digest, "authorizationDigest")?;
    Ok(RecoveryLatch {
        new_volume_uid,
        authorization_digest,
        authorization_sha256: sha256_hex(authorization.as_bytes()),
    })
}

/// A refusal when the record's write-once fields differ from the latch.
fn check_latch(latched: &RecoveryLatch, now: &RecoveryLatch) -> std::result::Result<(), String> {
    let changed = |field: &str, was: &str, is: &str| {
        format!("spec.recovery.{field} changed from {was:?} to {is:?} after it was set; it is write-once: restore it, or start the recovery over with a new record")
    };
    if latched.new_volume_uid != now.new_volume_uid {
        return Err(changed(
            "newVolumeUID",
            &latched.new_volume_uid,
            &now.new_volume_uid,
        ));
    }
    if latched.authorization_digest != now.authorization_digest {
        return Err(changed(
            "authorizationDigest",
            &latched.authorization_digest,
            &now.authorization_digest,
        ));
    }
    if latched.authorization_sha256 != now.authorization_sha256 {
        return Err(format!("spec.recovery.authorization changed after it was set (its bytes had SHA-256 {}, now {}); it is write-once: restore it, or start the recovery over with a new record", latched.authorization_sha256, now.authorization_sha256));
    }
    Ok(())
}

fn decode<M: Message + Default>(
    field: &str,
    b64: &str,
    kind: &str,
) -> std::result::Result<M, String> {
    let bytes = STANDARD
        .decode(b64.trim())
        .map_err(|e| format!("{field} is not base64: {e}"))?;
    M::decode(bytes.as_slice()).map_err(|e| format!("{field} does not decode as a {kind}: {e}"))
}

/// The record against itself: its handle, backend and agent volume ID
/// against `spec.recovery.source`; no `lvmSource` beside `recovery`.
fn check_record(state: &PillarVolumeState, recovery: &Recovery) -> std::result::Result<(), String> {
    let spec = &state.spec;
    if spec.lvm_source.is_some() {
        return Err("spec.lvmSource cannot be combined with spec.recovery: leave it out".into());
    }
    if spec.backend_type != Backend::LvmLv {
        return Err(format!(
            "spec.backendType is {}, recovery covers only lvm-lv",
            spec.backend_type
        ));
    }
    let source = &recovery.source;
    let expected = format!("{}/{}", source.volume_group, source.logical_volume);
    if spec.agent_volume_id != expected {
        return Err(format!(
            "spec.agentVolumeID {:?} is not spec.recovery.source's {expected:?}",
            spec.agent_volume_id
        ));
    }
    let handle = VolumeHandle::parse(&spec.volume_id).map_err(|e| format!("spec.volumeID: {e}"))?;
    if handle.agent() != spec.agent_ref
        || handle.protocol() != spec.protocol_type
        || handle.backend() != spec.backend_type
        || handle.volume().to_string() != spec.agent_volume_id
    {
        return Err(format!(
            "spec.volumeID {} does not agree with spec.agentRef {:?}, spec.protocolType {}, spec.backendType {} and spec.agentVolumeID {:?}",
            spec.volume_id, spec.agent_ref, spec.protocol_type, spec.backend_type, spec.agent_volume_id
        ));
    }
    Ok(())
}

fn identity_of(source: &LvmSource) -> agent::LvmIdentity {
    agent::LvmIdentity {
        volume_group: source.volume_group.clone(),
        logical_volume: source.logical_volume.clone(),
        volume_group_uuid: source.volume_group_uuid.clone(),
        logical_volume_uuid: source.logical_volume_uuid.clone(),
    }
}

/// The grant against the record: digest, volume, backend, LV, old and new
/// lifecycles, policy; then the snapshot against the grant's digest.
fn check_grant(
    state: &PillarVolumeState,
    recovery: &Recovery,
    latch: &RecoveryLatch,
    authorization: &agent::RecoveryAuthorization,
    snapshot: &agent::RecoverySnapshot,
) -> std::result::Result<(), String> {
    let uid = state.metadata.uid.clone().unwrap_or_default();
    if latch.new_volume_uid != uid {
        return Err(format!(
            "spec.recovery.newVolumeUID {:?} is not this record's metadata.uid {uid:?}",
            latch.new_volume_uid
        ));
    }
    let digest = authorization_digest(authorization);
    if latch.authorization_digest != digest {
        return Err(format!(
            "spec.recovery.authorizationDigest {} is not the digest {digest} of spec.recovery.authorization",
            latch.authorization_digest
        ));
    }
    let differ = |field: &str, grant: String, record: String| {
        format!("spec.recovery.authorization: its {field} {grant} does not match {record}")
    };
    if authorization.volume_id != state.spec.agent_volume_id {
        return Err(differ(
            "volume_id",
            format!("{:?}", authorization.volume_id),
            format!("spec.agentVolumeID {:?}", state.spec.agent_volume_id),
        ));
    }
    if authorization.backend_type != agent::BackendType::Lvm as i32 {
        return Err(differ(
            "backend_type",
            authorization.backend_type.to_string(),
            "BACKEND_TYPE_LVM".into(),
        ));
    }
    let source = identity_of(&recovery.source);
    if authorization.lvm_source.as_ref() != Some(&source) {
        return Err(differ(
            "lvm_source",
            format!("{:?}", authorization.lvm_source),
            format!("spec.recovery.source {source:?}"),
        ));
    }
    if authorization.old_volume_uid != recovery.old_volume_uid {
        return Err(differ(
            "old_volume_uid",
            format!("{:?}", authorization.old_volume_uid),
            format!("spec.recovery.oldVolumeUID {:?}", recovery.old_volume_uid),
        ));
    }
    if authorization.old_generation != recovery.old_generation {
        return Err(differ(
            "old_generation",
            authorization.old_generation.to_string(),
            format!("spec.recovery.oldGeneration {}", recovery.old_generation),
        ));
    }
    if authorization.new_volume_uid != uid {
        return Err(differ(
            "new_volume_uid",
            format!("{:?}", authorization.new_volume_uid),
            format!("this record's metadata.uid {uid:?}"),
        ));
    }
    if authorization.new_generation != recovery.new_generation {
        return Err(differ(
            "new_generation",
            authorization.new_generation.to_string(),
            format!("spec.recovery.newGeneration {}", recovery.new_generation),
        ));
    }
    if authorization.preserve_original != Some(recovery.source.preserve_original) {
        return Err(differ(
            "preserve_original",
            format!("{:?}", authorization.preserve_original),
            format!(
                "spec.recovery.source.preserveOriginal {}",
                recovery.source.preserve_original
            ),
        ));
    }
    let snapshot_digest = snapshot_digest(snapshot);
    if authorization.snapshot_digest != snapshot_digest {
        return Err(format!(
            "the {RECOVERY_SNAPSHOT_ANNOTATION} annotation holds a snapshot of digest {}, not the grant's snapshot_digest {}",
            hex(&snapshot_digest),
            hex(&authorization.snapshot_digest)
        ));
    }
    Ok(())
}

/// Everything the agent call needs, checked.
struct Checked {
    latch: RecoveryLatch,
    recovery: Recovery,
    request: agent::TransferVolumeOwnershipRequest,
}

/// Every check of the record before the agent is called; `Err` is the
/// reason (without the `recovery of ...` prefix).
fn check_all(state: &PillarVolumeState) -> std::result::Result<Checked, String> {
    let recovery = state
        .spec
        .recovery
        .as_ref()
        .ok_or("spec.recovery is not set")?;
    check_record(state, recovery)?;
    let latch = written(recovery)?;
    if let Some(latched) = state
        .status
        .as_ref()
        .and_then(|s| s.recovery_latch.as_ref())
    {
        check_latch(latched, &latch)?;
    }
    let annotation = state
        .annotations()
        .get(RECOVERY_SNAPSHOT_ANNOTATION)
        .ok_or_else(|| format!("the {RECOVERY_SNAPSHOT_ANNOTATION} annotation is not set: put the snapshot `recovery sign` printed there"))?;
    let authorization: agent::RecoveryAuthorization = decode(
        "spec.recovery.authorization",
        recovery.authorization.as_deref().unwrap_or_default(),
        "RecoveryAuthorization",
    )?;
    let snapshot: agent::RecoverySnapshot = decode(
        &format!("the {RECOVERY_SNAPSHOT_ANNOTATION} annotation"),
        annotation,
        "RecoverySnapshot",
    )?;
    check_grant(state, recovery, &latch, &authorization, &snapshot)?;
    Ok(Checked {
        latch,
        recovery: recovery.clone(),
        request: agent::TransferVolumeOwnershipRequest {
            volume_id: state.spec.agent_volume_id.clone(),
            backend_type: agent::BackendType::Lvm as i32,
            snapshot: Some(snapshot),
            authorization: Some(authorization),
        },
    })
}

impl Controller {
    /// CreateVolume for a claim whose record carries `spec.recovery`.
    pub(super) async fn recover(
        &self,
        req: &csi::CreateVolumeRequest,
        state: PillarVolumeState,
    ) -> Result<csi::Volume> {
        let handle = state.spec.volume_id.clone();
        if state.status.as_ref().and_then(|s| s.phase) == Some(VolumePhase::Ready) {
            return self.recovered_volume(req, &state).await;
        }
        let state = self.mark_pending(state).await?;
        match self.transfer(req, &state).await {
            Ok(volume) => Ok(volume),
            Err(refusal) => {
                let refusal = match refusal {
                    Refusal::Record(why) => Error::FailedPrecondition(format!(
                        "recovery of volume {handle} refused: {why}"
                    )),
                    Refusal::Other(e) => e,
                };
                self.tell_record(&state, &refusal).await;
                Err(refusal)
            }
        }
    }

    /// Writes phase RecoveryPending on a record first seen without it.
    async fn mark_pending(&self, state: PillarVolumeState) -> Result<PillarVolumeState> {
        let status = state.status.clone().unwrap_or_default();
        if status.phase == Some(VolumePhase::RecoveryPending) {
            return Ok(state);
        }
        self.states
            .set_status(
                &state,
                PillarVolumeStateStatus {
                    phase: Some(VolumePhase::RecoveryPending),
                    ..status
                },
            )
            .await
    }

    /// Posts a refusal on the record and keeps it in `status.message`.
    async fn tell_record(&self, state: &PillarVolumeState, refusal: &Error) {
        self.events
            .post(
                state,
                Kind::Warning,
                "RecoveryRefused",
                &refusal.to_string(),
            )
            .await;
        let patch = serde_json::json!({"status": {"message": refusal.to_string()}});
        if let Err(e) = Api::<PillarVolumeState>::all(self.client.clone())
            .patch_status(
                &state.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            tracing::warn!(record = %state.name_any(), error = %e, "could not record the refusal");
        }
    }

    /// The checks, the latch, the agent call, then Ready.
    async fn transfer(
        &self,
        req: &csi::CreateVolumeRequest,
        state: &PillarVolumeState,
    ) -> std::result::Result<csi::Volume, Refusal> {
        self.check_claim(&req.parameters, state).await?;
        let values = state
            .spec
            .recovery
            .as_ref()
            .ok_or_else(|| Refusal::Record("spec.recovery is not set".into()))
            .and_then(|r| written(r).map_err(Refusal::Record))?;
        let state = self.latch(state, &values).await?;
        let checked = check_all(&state).map_err(Refusal::Record)?;
        let agent = self.agent_of(&state).await?;
        let mut client = self.agents.client(&agent)?;
        let mut reply = None;
        for _ in 0..2 {
            let answer = client
                .client
                .transfer_volume_ownership(checked.request.clone())
                .await
                .map_err(client.fail())?
                .into_inner();
            if answer.outcome != agent::TransferOutcome::Unknown as i32 {
                reply = Some(answer);
                break;
            }
            tracing::warn!(volume = %state.spec.volume_id, "TransferVolumeOwnership outcome unknown; retrying the identical request");
        }
        let Some(reply) = reply else {
            return Err(Refusal::Other(Error::Unavailable(format!(
                "agent {}: TransferVolumeOwnership of volume {} answered TRANSFER_OUTCOME_UNKNOWN twice; the next CreateVolume retries the identical request",
                agent.name_any(),
                state.spec.volume_id
            ))));
        };
        let recovery = &checked.recovery;
        let expected = agent::FenceToken {
            volume_uid: checked.latch.new_volume_uid.clone(),
            generation: recovery.new_generation,
        };
        let committed = [
            agent::TransferOutcome::Committed as i32,
            agent::TransferOutcome::AlreadyCommitted as i32,
        ];
        if !committed.contains(&reply.outcome) || reply.fence.as_ref() != Some(&expected) {
            return Err(Refusal::Other(Error::Unavailable(format!(
                "agent {}: TransferVolumeOwnership of volume {} answered outcome {} with fence {:?}, not the new lifecycle {expected:?}",
                agent.name_any(),
                state.spec.volume_id,
                reply.outcome,
                reply.fence
            ))));
        }
        let status = PillarVolumeStateStatus {
            phase: Some(VolumePhase::Ready),
            publication_generation: Some(recovery.new_generation),
            message: None,
            ..state.status.clone().unwrap_or_default()
        };
        let state = self.states.set_status(&state, status).await?;
        self.events
            .post(
                &state,
                Kind::Normal,
                "Recovered",
                &format!(
                    "volume {} now belongs to lifecycle {} at generation {} (was {} at {})",
                    state.spec.volume_id,
                    expected.volume_uid,
                    expected.generation,
                    recovery.old_volume_uid,
                    recovery.old_generation
                ),
            )
            .await;
        Ok(self.recovered_volume(req, &state).await?)
    }

    /// The claim CreateVolume came for: it exists, is the record's
    /// `spec.claimRef`, and carries no import-lv annotation.
    async fn check_claim(
        &self,
        parameters: &HashMap<String, String>,
        state: &PillarVolumeState,
    ) -> std::result::Result<(), Refusal> {
        let (Some(name), Some(namespace)) =
            (parameters.get(PVC_NAME), parameters.get(PVC_NAMESPACE))
        else {
            return Err(Refusal::Record(format!(
                "CreateVolume names no claim ({PVC_NAME} and {PVC_NAMESPACE} are missing; run the external-provisioner with --extra-create-metadata)"
            )));
        };
        let claim = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(Error::kube(format!(
                "read PersistentVolumeClaim {namespace}/{name}"
            )))?
            .ok_or_else(|| {
                Refusal::Other(Error::FailedPrecondition(format!(
                    "PersistentVolumeClaim {namespace}/{name} does not exist"
                )))
            })?;
        for annotation in [IMPORT_LV_ANNOTATION, IMPORT_LV_POLICY_ANNOTATION] {
            if claim.annotations().contains_key(annotation) {
                return Err(Refusal::Record(format!(
                    "the claim {namespace}/{name} carries the {annotation} annotation; a recovery claim is a plain claim: remove it"
                )));
            }
        }
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        match &state.spec.claim_ref {
            Some(c) if c.uid == uid && c.namespace == *namespace && c.name == *name => Ok(()),
            Some(c) => Err(Refusal::Record(format!(
                "spec.claimRef names claim {}/{} with UID {}, not the claim {namespace}/{name} with UID {uid} this CreateVolume is for",
                c.namespace, c.name, c.uid
            ))),
            None => Err(Refusal::Record("spec.claimRef is not set: name the recovery claim (uid, namespace, name)".into())),
        }
    }

    /// Latches the write-once fields in the status the first time they are seen.
    async fn latch(
        &self,
        state: &PillarVolumeState,
        latch: &RecoveryLatch,
    ) -> Result<PillarVolumeState> {
        if state
            .status
            .as_ref()
            .and_then(|s| s.recovery_latch.as_ref())
            .is_some()
        {
            return Ok(state.clone());
        }
        let name = state.name_any();
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": state.metadata.resource_version},
            "status": {"recoveryLatch": latch},
        });
        Api::<PillarVolumeState>::all(self.client.clone())
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 409 => Error::Aborted(format!(
                    "PillarVolumeState {name:?} changed while this call ran; retry"
                )),
                e => Error::kube(format!("latch the recovery of PillarVolumeState {name:?}"))(e),
            })
    }

    /// The CSI volume of a recovered record: the lost PV's handle and the
    /// recorded capacity (with the class's filesystem, as CreateVolume gives).
    async fn recovered_volume(
        &self,
        req: &csi::CreateVolumeRequest,
        state: &PillarVolumeState,
    ) -> Result<csi::Volume> {
        let fs_type = match resolve::class_name(&req.parameters) {
            Ok(class) => resolve::placement(&self.client, class)
                .await?
                .class
                .spec
                .filesystem
                .map(|fs| fs.fs_type),
            Err(_) => None,
        };
        // A recovered volume holds the data of the lost one: never formatted.
        let context = volume_context::build(fs_type, Some(volume_context::Origin::Recovery));
        Ok(csi::Volume {
            capacity_bytes: i64::try_from(state.spec.capacity_bytes).unwrap_or(i64::MAX),
            volume_id: state.spec.volume_id.clone(),
            volume_context: context,
            ..Default::default()
        })
    }
}

/// Why a recovery did not commit: the record (or claim) disagrees, named
/// by its field; or another failure (API server, agent) with its own code.
enum Refusal {
    Record(String),
    Other(Error),
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Self {
        Refusal::Other(e)
    }
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
