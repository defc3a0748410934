//! CreateVolume, DeleteVolume and ExpandVolume.
use super::{blocking, describe, recorded, sized, txn::Txn, Agent};
use crate::{
    backend::{Backend, BackendKind, CreateOptions, VolumeState},
    error::AgentError,
    export::Protocol,
    fence::{Admission, Call, FenceError, Token},
    marks::{AdoptedSource, BackendRecord},
    volume::VolumeId,
};
use std::{sync::Arc, time::Instant};
use tracing::{info, warn};

impl Agent {
    /// CreateVolume.
    pub async fn create_volume(
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        bytes: u64,
        options: CreateOptions,
        token: Option<&Token>,
    ) -> Result<VolumeState, AgentError> {
        let id = sized(id, bytes, "capacity_bytes")?;
        let backend = self.backend(&id, kind)?;
        let at = backend.locate(&id)?;
        let token = token.cloned();
        self.detached(move |agent| async move {
            agent
                .create_admitted(id, backend, at, bytes, options, token)
                .await
        })
        .await
    }

    async fn create_admitted(
        &self,
        id: VolumeId,
        backend: Arc<dyn Backend>,
        at: BackendRecord,
        bytes: u64,
        options: CreateOptions,
        token: Option<Token>,
    ) -> Result<VolumeState, AgentError> {
        let started = Instant::now();
        let mut txn = self.begin(&id, token.as_ref(), Call::Other).await?;
        if let Some(pin) = txn.mark.adopted.as_ref().filter(|p| p.preserves()) {
            return Err(AgentError::FailedPrecondition(format!(
                "volume {id} is an adopted logical volume pinned as {}; a CreateVolume without that import_lv cannot use it",
                describe(pin)
            )));
        }
        // The mark as it was before this call wrote an intent, if it did.
        let mut before_intent = None;
        let target = match txn.mark.backend.clone() {
            Some(recorded) => recorded,
            None => {
                // A volume already there that this agent did not create is
                // not taken over by a create: that is what import is for.
                let (b, probe) = (backend.clone(), at.clone());
                if blocking(move || b.device(&probe)).await?.is_some() {
                    return Err(AgentError::AlreadyExists(format!(
                        "volume {id}: {at} already exists and was not created by this agent; import it instead"
                    )));
                }
                // Record the intent first, so a crash between the create
                // and the mark leaves a volume this agent knows it made.
                before_intent = Some(txn.on_disk.clone());
                txn.mark.backend = Some(at.clone());
                txn.save().await?;
                at.clone()
            }
        };
        let b = backend.clone();
        let backend_started = Instant::now();
        let created = blocking(move || b.create(&target, bytes, &options)).await;
        let backend_ms = backend_started.elapsed().as_millis();
        let (record, state) = match created {
            Ok(done) => {
                crate::crash::point("create-backend-done");
                done
            }
            Err(e) => {
                if let Some(before) = before_intent {
                    // The intent is undone only when the backend shows no
                    // volume: a create that made the volume and then failed
                    // (a report after lvcreate, say) keeps it recorded, so
                    // a retry finishes it instead of calling it foreign.
                    let (b, probe) = (backend.clone(), at.clone());
                    match blocking(move || b.device(&probe)).await {
                        Ok(None) => txn.restore(before).await?,
                        Ok(Some(_)) => {
                            warn!(volume = %id, error = %e, "create failed after the volume appeared; its intent stays recorded")
                        }
                        Err(lookup) => {
                            warn!(volume = %id, error = %e, lookup = %lookup, "create failed and the backend could not be read; the intent stays recorded")
                        }
                    }
                }
                return Err(e);
            }
        };
        txn.mark.backend = Some(record);
        txn.commit().await?;
        info!(
            volume = %id,
            bytes = state.capacity_bytes,
            backend_ms,
            total_ms = started.elapsed().as_millis(),
            "volume created"
        );
        Ok(state)
    }

    /// DeleteVolume: removes the exports, destroys the volume (a missing one
    /// is success) and ends the lifecycle.
    pub async fn delete_volume(
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        token: Option<&Token>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(id)?;
        let backend = self.backend(&id, kind)?;
        backend.locate(&id)?;
        let token = token.cloned();
        self.detached(move |agent| async move { agent.delete_admitted(id, backend, token).await })
            .await
    }

    async fn delete_admitted(
        &self,
        id: VolumeId,
        backend: Arc<dyn Backend>,
        token: Option<Token>,
    ) -> Result<(), AgentError> {
        let txn = self.begin(&id, token.as_ref(), Call::Delete).await?;
        if txn.admission == Admission::RepeatsDelete {
            if txn
                .mark
                .adopted
                .as_ref()
                .is_some_and(AdoptedSource::preserves)
            {
                // A mark written before the exception was narrowed may record
                // the DeleteVolume that ended a preserved LV's lifecycle; that
                // delete destroyed nothing, so its retry is refused like any
                // other request with an ended token.
                return Err(FenceError::Ended {
                    volume_id: id.to_string(),
                    volume_uid: token.map(|t| t.volume_uid).unwrap_or_default(),
                }
                .into());
            }
            return Ok(());
        }
        self.delete_live(txn, backend, token).await
    }

    /// DeleteVolume of an admitted live lifecycle. A delete that destroys
    /// the volume (one this agent created, an imported zvol, a Managed LV)
    /// or finds none of this agent's records its token for identical
    /// retries; the delete of a PreserveOriginal LV, which ends the lifecycle
    /// and keeps the LV, does not, so a retry of it is refused like any
    /// other request with an ended token.
    async fn delete_live(
        &self,
        mut txn: Txn,
        backend: Arc<dyn Backend>,
        token: Option<Token>,
    ) -> Result<(), AgentError> {
        let id = txn.id.clone();
        let mark = txn.mark.clone();
        self.unexport_all(&id, &mark).await?;
        crate::crash::point("delete-unexported");
        txn.mark.exports.clear();
        if mark.adopted.as_ref().is_some_and(AdoptedSource::preserves) {
            // PreserveOriginal: the LV stays; only our records change. The
            // pin survives the lifecycle.
            txn.mark.fence = mark.fence.end(None);
            txn.mark.backend = None;
            txn.commit().await?;
            info!(volume = %id, "lifecycle of a preserved volume ended; the logical volume stays");
            return Ok(());
        }
        let Some(record) = mark.backend.clone() else {
            // Nothing was created under this ID by this agent: whatever
            // exists there is not ours. End the lifecycle, touch nothing.
            // As for a missing volume, the delete succeeded: its identical
            // retry succeeds too (a controller forgetting a refused import).
            txn.mark.fence = mark.fence.end(token);
            return txn.commit().await;
        };
        txn.mark.fence = mark.fence.end(token);
        let target = record.clone();
        if let Err(e) = blocking(move || backend.destroy(&target)).await {
            // Put the exports back: a failed delete changes nothing.
            if let Err(restore) = self.export_all(&id, &record, &mark).await {
                warn!(volume = %id, error = %restore, "could not restore exports after a failed delete");
            }
            return Err(e);
        }
        crate::crash::point("delete-backend-done");
        txn.mark.backend = None;
        // The adopted volume is destroyed: its pin protects nothing any more.
        txn.mark.adopted = None;
        txn.mark.import_probe = None;
        txn.commit().await?;
        info!(volume = %id, "volume deleted");
        Ok(())
    }

    /// ExpandVolume: grows the volume and revalidates its exports.
    pub async fn expand_volume(
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        bytes: u64,
        token: Option<&Token>,
    ) -> Result<u64, AgentError> {
        let id = sized(id, bytes, "requested_bytes")?;
        let backend = self.backend(&id, kind)?;
        backend.locate(&id)?;
        let token = token.cloned();
        self.detached(
            move |agent| async move { agent.expand_admitted(id, backend, bytes, token).await },
        )
        .await
    }

    async fn expand_admitted(
        &self,
        id: VolumeId,
        backend: Arc<dyn Backend>,
        bytes: u64,
        token: Option<Token>,
    ) -> Result<u64, AgentError> {
        let txn = self.begin(&id, token.as_ref(), Call::Other).await?;
        if let Some(pin) = txn.mark.adopted.as_ref().filter(|p| p.preserves()) {
            return Err(AgentError::FailedPrecondition(format!(
                "cannot expand volume {id}: it is the adopted logical volume {} kept PreserveOriginal, which is never resized; copy the data into a larger volume instead",
                describe(pin)
            )));
        }
        let record = recorded(&id, &txn.mark)?;
        let size = blocking(move || backend.expand(&record, bytes)).await?;
        crate::crash::point("expand-backend-done");
        for (name, record) in &txn.mark.exports {
            let Some(protocol) = Protocol::parse(name) else {
                continue;
            };
            let exporter = self.exporter(protocol)?;
            let (vid, record) = (id.clone(), record.clone());
            blocking(move || exporter.revalidate(&vid, &record)).await?;
        }
        txn.commit().await?;
        Ok(size)
    }
}
