//! The recovery face of the gRPC service: the signed snapshot InspectVolume
//! adds for a verified mTLS caller, and TransferVolumeOwnership's reply.
use crate::{recovery::Recovery, service::Transfer};
use pillar_csi_proto::agent::v1 as pb;
use std::time::SystemTime;
use tonic::Request;

/// Whether the caller presented a client certificate the TLS layer verified
/// (a plaintext caller has none).
pub(crate) fn verified_caller<T>(request: &Request<T>) -> bool {
    request.peer_certs().is_some_and(|c| !c.is_empty())
}

/// The signed snapshot of an inspection, when it shows a live lifecycle of
/// an adopted LV; `None` otherwise.
pub(crate) fn snapshot(
    recovery: &Recovery,
    inspected: &pb::InspectVolumeResponse,
    now: SystemTime,
) -> Result<Option<pb::RecoverySnapshot>, String> {
    let (Some(fence), Some(lvm)) = (&inspected.fence, &inspected.lvm) else {
        return Ok(None);
    };
    if !fence.exists || fence.ended || fence.lvm_source.is_none() {
        return Ok(None);
    }
    let mut snapshot = pb::RecoverySnapshot {
        volume_id: inspected.volume_id.clone(),
        backend_type: pb::BackendType::Lvm as i32,
        lvm_source: lvm.identity.clone(),
        old_volume_uid: fence.volume_uid.clone(),
        old_generation: fence.generation,
        preserve_original: fence.preserve_original,
        exports: inspected.exports.clone(),
        consumers: inspected.consumers.clone(),
        exclusive_claim: lvm.exclusive_claim.clone(),
        agent_identity: recovery.signer.identity.clone(),
        agent_certificate_sha256: recovery.signer.certificate_sha256.clone(),
        issued_at: Some(prost_types::Timestamp::from(now)),
        signature: Vec::new(),
    };
    recovery.sign_snapshot(&mut snapshot)?;
    Ok(Some(snapshot))
}

/// The reply of a transfer.
pub(crate) fn transfer_reply(
    transfer: Transfer,
    authorization_digest: String,
) -> pb::TransferVolumeOwnershipResponse {
    let (outcome, token) = match transfer {
        Transfer::Committed(t) => (pb::TransferOutcome::Committed, t),
        Transfer::AlreadyCommitted(t) => (pb::TransferOutcome::AlreadyCommitted, t),
        Transfer::Unknown(t) => (pb::TransferOutcome::Unknown, t),
    };
    pb::TransferVolumeOwnershipResponse {
        outcome: outcome as i32,
        fence: Some(pb::FenceToken {
            volume_uid: token.volume_uid,
            generation: token.generation,
        }),
        authorization_digest,
    }
}
