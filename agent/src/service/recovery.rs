//! TransferVolumeOwnership: metadata-loss recovery of an adopted LV.
//!
//! Under the volume's lock, through the transaction helper: both
//! signatures and the digest, then an exact retry of a committed grant
//! (ALREADY_COMMITTED), then the windows, the agreement of grant and
//! snapshot, the agreement of the snapshot with the mark, the LV
//! re-observed idle, and finally one new mark. A refusal writes nothing.
use super::{adoption::identity_mismatch, describe, Agent};
use crate::{
    adopt::in_use,
    backend::BackendKind,
    error::AgentError,
    fence::{Call, Lifecycle, Token},
    marks::{AdoptedSource, RecoveryRecord},
    recovery::{authorization_digest, hex, rules, Recovery},
    volume::VolumeId,
};
use pillar_csi_proto::agent::v1 as pb;
use std::{sync::Arc, time::SystemTime};
use tracing::{info, warn};

/// What a transfer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transfer {
    /// The new mark is durable.
    Committed(Token),
    /// This exact grant was committed before; nothing changed.
    AlreadyCommitted(Token),
    /// The new mark was renamed into place but could not be made durable:
    /// nothing was rolled back; retry the identical request.
    Unknown(Token),
}

/// The refusal of a transfer (FAILED_PRECONDITION).
fn refused(id: &str, why: impl std::fmt::Display) -> AgentError {
    AgentError::FailedPrecondition(format!("recovery of volume {id} refused: {why}"))
}

/// Why the mark does not hold the lifecycle and pin the snapshot names, if so.
fn mark_agreement(
    mark: &crate::marks::FenceMark,
    snapshot: &pb::RecoverySnapshot,
    new_uid: &str,
) -> Result<(), String> {
    let Some(
        pin @ AdoptedSource::Lv {
            vg,
            lv,
            vg_uuid,
            lv_uuid,
            preserve_original,
        },
    ) = &mark.adopted
    else {
        return Err(format!(
            "not adopted: volume {} is not an LV adopted through import-lv; recovery covers only those",
            mark.volume_id
        ));
    };
    let pinned = pb::LvmIdentity {
        volume_group: vg.clone(),
        logical_volume: lv.clone(),
        volume_group_uuid: vg_uuid.clone(),
        logical_volume_uuid: lv_uuid.clone(),
    };
    if snapshot.lvm_source.as_ref() != Some(&pinned)
        || snapshot.preserve_original != *preserve_original
    {
        return Err(format!(
            "pinned: the snapshot names {} (preserve_original {}), the fence mark pins {}",
            rules::describe_identity(snapshot.lvm_source.as_ref()),
            snapshot.preserve_original,
            describe(pin)
        ));
    }
    match &mark.fence.live {
        None => Err(
            "no live lifecycle owns the volume (it was released or deleted); import the LV with import-lv instead"
                .into(),
        ),
        Some(Lifecycle {
            volume_uid,
            generation,
        }) if volume_uid != &snapshot.old_volume_uid || *generation != snapshot.old_generation => {
            Err(format!(
                "the live lifecycle is {volume_uid} at generation {generation}, not the snapshot's {} at {}; the state changed since the snapshot: inspect again",
                snapshot.old_volume_uid, snapshot.old_generation
            ))
        }
        Some(_) if mark.fence.ended_uids.contains(new_uid) => Err(format!(
            "new_volume_uid {new_uid} is a lifecycle that has already ended for this volume"
        )),
        Some(_) => Ok(()),
    }
}

impl Agent {
    /// The recovery configuration, when the agent was started with a trust anchor.
    pub fn recovery(&self) -> Option<&Arc<Recovery>> {
        self.recovery.as_ref()
    }

    /// TransferVolumeOwnership. `verified_caller`: the caller presented a
    /// client certificate the TLS layer verified.
    pub async fn transfer_volume_ownership(
        self: &Arc<Self>,
        request: pb::TransferVolumeOwnershipRequest,
        verified_caller: bool,
        now: SystemTime,
    ) -> Result<Transfer, AgentError> {
        let recovery = self.recovery.clone().ok_or_else(|| {
            AgentError::Unavailable(
                "recovery is not configured on this agent: start it with --recovery-trust-anchor"
                    .into(),
            )
        })?;
        let id = VolumeId::parse(&request.volume_id)?;
        if !verified_caller {
            return Err(refused(
                id.as_str(),
                "the caller has no verified mTLS client certificate; recovery needs mTLS",
            ));
        }
        let backend = self.backend(&id, Some(BackendKind::Lvm))?;
        let (Some(snapshot), Some(authorization)) = (request.snapshot, request.authorization)
        else {
            return Err(AgentError::InvalidArgument(format!(
                "volume {id}: TransferVolumeOwnership needs both snapshot and authorization"
            )));
        };
        if snapshot.volume_id != id.as_str() {
            return Err(refused(
                id.as_str(),
                format!("the snapshot is of volume {:?}", snapshot.volume_id),
            ));
        }
        rules::signatures(&recovery, &snapshot, &authorization)
            .map_err(|why| refused(id.as_str(), why))?;
        let digest = hex(&authorization_digest(&authorization));
        let new = Token {
            volume_uid: authorization.new_volume_uid.clone(),
            generation: authorization.new_generation,
        };
        self.detached(move |agent| async move {
            // The old lifecycle's token: admission under it proves the mark
            // still holds it (a refusal names the owner or the ended UID).
            let old = Token {
                volume_uid: snapshot.old_volume_uid.clone(),
                generation: snapshot.old_generation,
            };
            let done = |mark: &crate::marks::FenceMark| {
                mark.recovered
                    .as_ref()
                    .is_some_and(|r| r.authorization_digest == digest)
            };
            let txn = match agent.begin(&id, Some(&old), Call::Other).await {
                Ok(txn) if !done(&txn.mark) => txn,
                Ok(_) => return Ok(Transfer::AlreadyCommitted(new)),
                Err(e) => {
                    let committed = agent.committed_mark(&id).await?;
                    if committed.as_ref().is_some_and(done) {
                        return Ok(Transfer::AlreadyCommitted(new));
                    }
                    return Err(refused(id.as_str(), e));
                }
            };
            let on_disk = txn.on_disk.clone().ok_or_else(|| {
                refused(id.as_str(), "the agent has no fence mark for the volume; nothing to recover")
            })?;
            rules::windows(&snapshot, &authorization, now)
                .and_then(|()| rules::agreement(&snapshot, &authorization))
                .and_then(|()| mark_agreement(&on_disk, &snapshot, &new.volume_uid))
                .map_err(|why| refused(id.as_str(), why))?;
            agent.idle_for_transfer(&id, &backend, &on_disk).await?;
            let mut txn = txn;
            txn.mark = on_disk.clone();
            txn.mark.fence = on_disk.fence.end(None);
            txn.mark.fence.live = Some(Lifecycle {
                volume_uid: new.volume_uid.clone(),
                generation: new.generation,
            });
            txn.mark.recovered = Some(RecoveryRecord {
                authorization_digest: digest.clone(),
                old_volume_uid: old.volume_uid.clone(),
                old_generation: old.generation,
            });
            let outcome = match txn.commit_reporting().await? {
                None => Transfer::Committed(new.clone()),
                Some(why) => {
                    warn!(volume = %id, error = %why, "recovery mark renamed into place but not made durable");
                    Transfer::Unknown(new.clone())
                }
            };
            crate::crash::point("transfer-after-rename");
            info!(volume = %id, from = %old.volume_uid, to = %new.volume_uid, authorization = %digest, "volume ownership transferred");
            Ok(outcome)
        })
        .await
    }

    /// The mark as it is on disk, read under the volume's lock.
    async fn committed_mark(
        &self,
        id: &VolumeId,
    ) -> Result<Option<crate::marks::FenceMark>, AgentError> {
        let _guard = self.locks.lock(id.as_str()).await;
        let (marks, key) = (self.marks.clone(), id.as_str().to_owned());
        super::blocking(move || Ok(marks.load(&key)?)).await
    }

    /// The LV re-observed now: the pinned identity, no export admitting an
    /// initiator, no mount or holder, and the exclusive open succeeds.
    async fn idle_for_transfer(
        &self,
        id: &VolumeId,
        backend: &Arc<dyn crate::backend::Backend>,
        mark: &crate::marks::FenceMark,
    ) -> Result<(), AgentError> {
        let refuse = |why: String| refused(id.as_str(), why);
        let seen = self.observe_lv(id, backend).await.map_err(|e| match e {
            AgentError::FailedPrecondition(why) => refuse(format!("missing: {why}")),
            other => other,
        })?;
        if let Some(pin) = &mark.adopted {
            if let Some(why) = identity_mismatch(pin, &seen.lv) {
                return Err(refuse(why));
            }
        }
        if let Some(x) = seen.exports().into_iter().find(|x| x.admits()) {
            return Err(refuse(format!(
                "export: {} target {} still admits {}; unexport it under the old lifecycle's token first",
                x.protocol.as_str(),
                x.target_id,
                if x.allow_any_host {
                    "any initiator".to_owned()
                } else {
                    x.allowed_hosts.join(", ")
                }
            )));
        }
        if let Some(why) = in_use(&seen.usage, Some(&seen.own), true) {
            return Err(refuse(why));
        }
        Ok(())
    }
}
